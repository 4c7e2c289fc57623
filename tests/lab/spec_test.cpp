#include "lab/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::string& toml) {
  try {
    parse_sweep_spec(toml, "spec.toml");
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Spec, CartesianProductWithExcludesAndRepeats) {
  SweepSpec s = parse_sweep_spec(R"(
name = "grid"
repeats = 3
timeout = 90
[parameters]
model = "llama-small"
micro-batch-size = [1, 2, 4]
attn = ["eager", "flash"]
[[exclude]]
attn = "flash"
micro_batch_size = [1, 2]
)",
                                 "grid.toml");
  EXPECT_EQ(s.name, "grid");
  EXPECT_EQ(s.repeats, 3);
  ASSERT_TRUE(s.timeout_s);
  EXPECT_DOUBLE_EQ(*s.timeout_s, 90);
  EXPECT_TRUE(s.workload.is_native());
  auto combos = s.expand();
  ASSERT_EQ(combos.size(), 4u);  // 3 x 2 minus (flash, 1) and (flash, 2)
  EXPECT_EQ(combos[0].at("micro_batch_size"), 1);  // first parameter varies slowest
  EXPECT_EQ(combos[0].at("attn"), "eager");
  EXPECT_EQ(combos[3].at("micro_batch_size"), 4);
  EXPECT_EQ(combos[3].at("attn"), "flash");
  for (const auto& c : combos) EXPECT_EQ(c.at("model"), "llama-small");
  EXPECT_EQ(s.swept_parameters(), (std::vector<std::string>{"micro_batch_size", "attn"}));
  Json j = s.to_json();
  EXPECT_EQ(j["parameter_order"][0], "model");
  EXPECT_EQ(j["repeats"], 3);
}

TEST(Spec, NameDefaultsToFileStem) {
  SweepSpec s = parse_sweep_spec("[parameters]\nmodel = \"llama-tiny\"\n", "dir/my-sweep.toml");
  EXPECT_EQ(s.name, "my-sweep");
  EXPECT_EQ(s.expand().size(), 1u);
}

TEST(Spec, MalformedTomlNamesLineAndColumn) {
  std::string e = error_of("name = \"x\"\n[parameters]\nmicro_batch_size = [1, 2\n");
  EXPECT_THAT(e, HasSubstr("spec.toml:"));
  EXPECT_THAT(e, HasSubstr("malformed TOML"));
  // The error is on line 3 or 4 (toml++ reports where it noticed the unclosed array).
  EXPECT_THAT(e, ::testing::ContainsRegex("spec\\.toml:[34]:[0-9]+"));
  std::string e2 = error_of("name = \n");
  EXPECT_THAT(e2, HasSubstr("spec.toml:1:"));
}

TEST(Spec, UnknownKeysAreRefusedWithPosition) {
  EXPECT_THAT(error_of("repeat = 3\n[parameters]\na = 1\n"), HasSubstr("spec.toml:1:1] unknown key 'repeat'"));
  EXPECT_THAT(error_of("[workload]\ntype = \"native\"\ncommand = \"x\"\n[parameters]\na = 1\n"),
              HasSubstr("spec.toml:3:1] unknown key 'command'"));
  EXPECT_THAT(error_of("[workload]\ntype = \"external\"\ncommand = \"x\"\nregexes = 1\n[parameters]\na = 1\n"),
              HasSubstr("unknown key 'regexes'"));
  EXPECT_THAT(error_of("[workload]\ntype = \"docker\"\n[parameters]\na = 1\n"), HasSubstr("\"native\""));
}

TEST(Spec, EmptyListAndBadValues) {
  EXPECT_THAT(error_of("[parameters]\nmicro_batch_size = []\n"),
              HasSubstr("spec.toml:2:20] parameter 'micro_batch_size' is an empty list"));
  EXPECT_THAT(error_of("[parameters]\na = { b = 1 }\n"), HasSubstr("is a table"));
  EXPECT_THAT(error_of("[parameters]\na = [[1], [2]]\n"), HasSubstr("is a list"));
  EXPECT_THAT(error_of("name = \"x\"\n"), HasSubstr("[parameters]"));
  EXPECT_THAT(error_of("repeats = 0\n[parameters]\na = 1\n"), HasSubstr("repeats"));
  EXPECT_THAT(error_of("timeout = -1\n[parameters]\na = 1\n"), HasSubstr("timeout"));
  EXPECT_THAT(error_of("[parameters]\njson = \"x\"\n"), HasSubstr("set by the lab"));
  EXPECT_THAT(error_of("[parameters]\nseq-len = 1\nseq_len = 2\n"), HasSubstr("given twice"));
}

TEST(Spec, ExcludeRulesAreChecked) {
  EXPECT_THAT(error_of("[parameters]\na = [1, 2]\n[[exclude]]\nb = 1\n"), HasSubstr("'b', which is not a parameter"));
  EXPECT_THAT(error_of("[parameters]\na = [1, 2]\n[[exclude]]\na = 3\n"), HasSubstr("not one of the parameter's values"));
  EXPECT_THAT(error_of("[parameters]\na = [1, 2]\n[[exclude]]\na = [1, 2]\n"), HasSubstr("remove every combination"));
}

TEST(Spec, ExternalWorkload) {
  SweepSpec s = parse_sweep_spec(R"(
[workload]
type = "external"
command = "torchrun --nproc_per_node {nproc} benchmark.py --batch_size {micro_batch_size} {fused_kernels}"
oom_pattern = "OOM!"
required_metrics = ["tokens_per_s_per_device", "loss"]
[workload.metrics]
loss = 'loss ([0-9.]+)'
[workload.map.fused_kernels]
true = "--use_liger"
false = ""
[workload.env]
RUN_NAME = "{sweep}-{micro_batch_size}"
[parameters]
nproc = 1
micro_batch_size = [4, 8]
fused_kernels = [false, true]
)",
                                 "ext.toml");
  ASSERT_FALSE(s.workload.is_native());
  EXPECT_TRUE(s.workload.uses_parameter("micro_batch_size"));
  EXPECT_FALSE(s.workload.uses_parameter("attn"));
  EXPECT_EQ(s.workload.metrics.size(), 3u);  // two defaults + loss
  EXPECT_EQ(s.workload.oom_pattern, "OOM!");
  EXPECT_EQ(s.expand().size(), 4u);
}

TEST(Spec, PlaceholderWithoutValue) {
  std::string e = error_of("[workload]\ntype = \"external\"\ncommand = \"run --bs {micro_batch_size} --n {nproc}\"\n"
                           "[parameters]\nmicro_batch_size = [1, 2]\n");
  EXPECT_THAT(e, HasSubstr("placeholder {nproc}"));
  EXPECT_THAT(e, HasSubstr("add nproc to [parameters]"));
  EXPECT_THAT(error_of("[workload]\ntype = \"external\"\ncommand = \"run {bad\"\n[parameters]\na = 1\n"),
              HasSubstr("unclosed placeholder"));
  EXPECT_THAT(error_of("[workload]\ntype = \"external\"\n[parameters]\na = 1\n"), HasSubstr("needs command"));
  // A runner that supplies micro_batch_size itself (oom-search, ladder) accepts it.
  EXPECT_NO_THROW(parse_sweep_spec("[workload]\ntype = \"external\"\ncommand = \"run {micro_batch_size}\"\n",
                                   "s.toml", {"micro_batch_size"}));
}

TEST(Spec, BadRegexIsRefused) {
  std::string e = error_of("[workload]\ntype = \"external\"\ncommand = \"x {a}\"\n[workload.metrics]\n"
                           "tokens = 'throughput: ([0-9.]+'\n[parameters]\na = 1\n");
  EXPECT_THAT(e, HasSubstr("does not compile"));
  EXPECT_THAT(e, HasSubstr("spec.toml:5:"));
  EXPECT_THAT(error_of("[workload]\ntype = \"external\"\ncommand = \"x {a}\"\noom_pattern = '(unclosed'\n"
                       "[parameters]\na = 1\n"),
              HasSubstr("does not compile"));
  EXPECT_THAT(error_of("[workload]\ntype = \"external\"\ncommand = \"x {a}\"\n[workload.metrics]\n"
                       "tokens = 'throughput: [0-9.]+'\n[parameters]\na = 1\n"),
              HasSubstr("no capture group"));
  EXPECT_THAT(error_of("[workload]\ntype = \"external\"\ncommand = \"x {a}\"\nrequired_metrics = [\"loss\"]\n"
                       "[parameters]\na = 1\n"),
              HasSubstr("required metric 'loss' has no pattern"));
}

TEST(Spec, ExamplesParse) {
  for (const char* f : {"examples/batch-sweep.toml", "examples/torchrun-sweep.toml", "examples/fake-external-sweep.toml"}) {
    SCOPED_TRACE(f);
    SweepSpec s = load_sweep_spec(testing::source_path(f));
    EXPECT_FALSE(s.expand().empty());
  }
  EXPECT_THROW(load_sweep_spec("/nonexistent/spec.toml"), InvalidInput);
}

}  // namespace
}  // namespace scalelab::lab
