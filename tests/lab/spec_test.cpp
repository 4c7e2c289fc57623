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

TEST(Spec, OomSearchTable) {
  const char* base = "[parameters]\nmodel = \"llama-tiny\"\n";
  EXPECT_FALSE(parse_sweep_spec(base, "s.toml").oom_search.enabled);
  SweepSpec s = parse_sweep_spec(std::string(base) + "[oom_search]\nmax_micro_batch = 32\nuse_plan = false\n", "s.toml");
  EXPECT_TRUE(s.oom_search.enabled);
  EXPECT_EQ(s.oom_search.max_micro_batch, 32);
  EXPECT_FALSE(s.oom_search.use_plan);
  EXPECT_EQ(s.to_json()["oom_search"]["max_micro_batch"], 32);
  SweepSpec d = parse_sweep_spec(std::string(base) + "[oom_search]\n", "s.toml");
  EXPECT_TRUE(d.oom_search.enabled);
  EXPECT_EQ(d.oom_search.max_micro_batch, 4096);
  EXPECT_THAT(error_of("oom_search = 3\n" + std::string(base)), HasSubstr("oom_search must be a table"));
  EXPECT_THAT(error_of(std::string(base) + "[oom_search]\nmax_micro_batch = 0\n"), HasSubstr("from 1 to"));
  EXPECT_THAT(error_of(std::string(base) + "[oom_search]\nuse_plan = 1\n"), HasSubstr("true or false"));
  EXPECT_THAT(error_of(std::string(base) + "[oom_search]\nstart = 1\n"), HasSubstr("unknown key 'start'"));
}

// [presets.NAME]: each value of a parameter stands for parameters that join the combination; a
// native trial gets those as flags and not NAME itself.
TEST(Spec, PresetsExpandIntoTheirParameters) {
  SweepSpec s = parse_sweep_spec(R"(
[parameters]
model = "llama-small"
method = ["full", "lora", "qlora"]
[presets.method]
full = {}
lora = { lora_rank = 16, lora-alpha = 32 }
qlora = { lora_rank = 16, lora_alpha = 32, quantize_base = "nf4-bnb" }
)", "m.toml");
  const auto combos = s.expand();
  ASSERT_EQ(combos.size(), 3u);
  EXPECT_FALSE(combos[0].count("lora_rank"));
  EXPECT_EQ(combos[1].at("lora_rank"), 16);
  EXPECT_EQ(combos[1].at("lora_alpha"), 32);  // kebab case normalized
  EXPECT_EQ(combos[2].at("quantize_base"), "nf4-bnb");
  EXPECT_EQ(combos[2].at("method"), "qlora");
  TrialContext ctx;
  ctx.record_path = "r.json";
  const Launch l = build_launch(s.workload, "scalelab", combos[2], ctx);
  EXPECT_EQ(std::count(l.argv.begin(), l.argv.end(), "--method"), 0);
  EXPECT_EQ(std::count(l.argv.begin(), l.argv.end(), "--quantize-base"), 1);
  EXPECT_EQ(s.to_json()["presets"]["method"]["lora"]["lora_rank"], 16);
  // Errors name the place and the fix.
  const std::string head = "[parameters]\nmethod = [\"a\", \"b\"]\nseq_len = 8\n";
  EXPECT_THAT(error_of(head + "[presets.method]\na = {}\n"), HasSubstr("no entry for method = b"));
  EXPECT_THAT(error_of(head + "[presets.other]\na = {}\n"), HasSubstr("names no parameter"));
  EXPECT_THAT(error_of(head + "[presets.method]\na = {}\nb = { seq_len = 4 }\n"), HasSubstr("also a parameter"));
  EXPECT_THAT(error_of(head + "[presets.method]\na = {}\nb = 3\n"), HasSubstr("must be a table of parameters"));
  EXPECT_THAT(error_of(head + "[presets.method]\na = {}\nb = { x = [1, 2] }\n"), HasSubstr("a value is a string"));
}

// A native trial's engine subcommand: train (default) or dpo, not a flag.
TEST(Spec, NativeSubcommandParameter) {
  SweepSpec s = parse_sweep_spec("[parameters]\nsubcommand = [\"train\", \"dpo\"]\nlora_rank = 8\n", "s.toml");
  const auto combos = s.expand();
  ASSERT_EQ(combos.size(), 2u);
  TrialContext ctx;
  ctx.record_path = "r.json";
  const Launch a = build_launch(s.workload, "scalelab", combos[0], ctx);
  const Launch b = build_launch(s.workload, "scalelab", combos[1], ctx);
  EXPECT_EQ(a.argv[1], "train");
  EXPECT_EQ(b.argv[1], "dpo");
  EXPECT_EQ(std::count(b.argv.begin(), b.argv.end(), "--subcommand"), 0);
  EXPECT_THAT(error_of("[parameters]\nsubcommand = \"sweep\"\n"), HasSubstr("use \"train\" or \"dpo\""));
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

// expand() skips excluded combinations by index (spec.cpp, Combinations): it must keep exactly
// what the cartesian product filtered through ExcludeRule::matches keeps, in the same order.
TEST(Spec, ExpandKeepsWhatTheRulesKeepInOrder) {
  SweepSpec s;
  s.parameters = {{"a", {1, 2, 3}}, {"b", {"x", "y"}}, {"c", {1.5, true, "1"}}, {"d", {7}}};
  ExcludeRule r1;  // a = 2 and b = y
  r1.match = {{"a", {2}}, {"b", {"y"}}};
  ExcludeRule r2;  // c is "1" (the text of the string value) or true, and a in {1, 3}
  r2.match = {{"c", {"1", true}}, {"a", {1, 3}}};
  ExcludeRule r3;  // a key that is not a parameter: never matches
  r3.match = {{"zzz", {1}}, {"a", {1, 2, 3}}};
  ExcludeRule r4;  // one key twice (kebab and snake case in a file): both must hold
  r4.match = {{"b", {"x"}}, {"b", {"x", "y"}}, {"c", {1.5}}};
  s.excludes = {r1, r2, r3, r4};
  std::vector<ParamMap> want;
  for (const auto& a : s.parameters[0].second)
    for (const auto& b : s.parameters[1].second)
      for (const auto& c : s.parameters[2].second) {
        ParamMap p{{"a", a}, {"b", b}, {"c", c}, {"d", 7}};
        bool excluded = false;
        for (const auto& r : s.excludes) excluded = excluded || r.matches(p);
        if (!excluded) want.push_back(p);
      }
  ASSERT_EQ(want.size(), 4u);  // 18, minus 3 (r1), 8 (r2) and 3 (r4), which do not overlap
  EXPECT_EQ(s.expand(), want);
  // No parameters: one empty combination; a parameter without values: none.
  EXPECT_EQ(SweepSpec{}.expand(), std::vector<ParamMap>{ParamMap{}});
  SweepSpec empty;
  empty.parameters = {{"a", {1}}, {"b", {}}};
  EXPECT_TRUE(empty.expand().empty());
}

// The exclude check of a spec at the combination limit does not expand it (parsing stays cheap),
// and finds the one combination the rules leave, wherever it is.
TEST(Spec, ExcludeCheckAtTheCombinationLimit) {
  std::string grid = "[parameters]\n";
  for (const char* p : {"a", "b", "c", "d", "e"}) grid += std::string(p) + " = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n";
  SweepSpec s = parse_sweep_spec(grid + "[[exclude]]\na = [0, 1, 2, 3, 4, 5, 6, 7, 8]\n"
                                        "[[exclude]]\ne = [0, 1, 2, 3, 4, 5, 6, 7, 8]\n",
                                 "grid.toml");
  const auto combos = s.expand();
  EXPECT_EQ(combos.size(), 1000u);  // a = 9, e = 9
  EXPECT_EQ(combos.front().at("a"), 9);
  EXPECT_EQ(combos.back().at("e"), 9);
  EXPECT_THAT(error_of(grid + "[[exclude]]\na = [0, 1, 2, 3, 4, 5, 6, 7, 8]\n[[exclude]]\na = 9\n"),
              HasSubstr("remove every combination"));
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
