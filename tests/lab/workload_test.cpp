// Command templates, the default metric / OOM patterns, and how outcomes are classified.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "lab/command_template.h"
#include "lab/outcome.h"
#include "lab/workload.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;

TEST(CommandTemplate, PlaceholdersAndEscapes) {
  CommandTemplate t("run --bs {micro_batch_size} --name ${{HOME}}/{sweep} {{literal}}", "t");
  EXPECT_EQ(t.placeholders(), (std::vector<std::string>{"micro_batch_size", "sweep"}));
  std::string s = t.render([](const std::string& n) { return n == "sweep" ? "S" : "8"; });
  EXPECT_EQ(s, "run --bs 8 --name ${HOME}/S {literal}");
  EXPECT_THROW(CommandTemplate("run {", "t"), InvalidInput);
  EXPECT_THROW(CommandTemplate("run {}", "t"), InvalidInput);
  EXPECT_THROW(CommandTemplate("run {a b}", "t"), InvalidInput);
  EXPECT_THROW(CommandTemplate("run }", "t"), InvalidInput);
  EXPECT_TRUE(CommandTemplate("{x}", "t").is_single_placeholder());
}

TEST(CommandTemplate, ShellQuote) {
  EXPECT_EQ(shell_quote("abc-1.5/x=y"), "abc-1.5/x=y");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
}

TrialContext ctx() {
  TrialContext c;
  c.sweep = "sw";
  c.key = "k1";
  c.dir = "/logs";
  c.log_path = "/logs/k1.log";
  c.record_path = "/logs/k1.json";
  return c;
}

TEST(Workload, NativeLaunch) {
  Launch l = build_launch(Workload::native(), "/bin/eng", {{"micro_batch_size", 4}, {"fused_kernels", true}}, ctx());
  std::vector<std::string> want = {"/bin/eng", "train", "--fused-kernels", "--micro-batch-size", "4", "--json",
                                   "/logs/k1.json"};
  EXPECT_EQ(l.argv, want);
}

TEST(Workload, ExternalShellLaunchQuotesValuesAndMaps) {
  Workload w = Workload::external("bench --bs {micro_batch_size} --name {name} {fused_kernels} --log {log_path}", "c");
  w.value_map["fused_kernels"] = {{"true", "--use_liger"}, {"false", ""}};
  w.env.emplace_back("RUN", CommandTemplate("{sweep}-{repeat}", "env"));
  Launch l = build_launch(w, "", {{"micro_batch_size", 8}, {"name", "a b"}, {"fused_kernels", true}}, ctx());
  ASSERT_EQ(l.argv.size(), 3u);
  EXPECT_EQ(l.argv[0], "/bin/sh");
  EXPECT_EQ(l.argv[2], "bench --bs 8 --name 'a b' --use_liger --log /logs/k1.log");
  ASSERT_EQ(l.env.size(), 1u);
  EXPECT_EQ(l.env[0].second, "sw-0");
  EXPECT_THROW(build_launch(w, "", {{"micro_batch_size", 8}}, ctx()), InvalidInput);
}

TEST(Workload, ExternalArgvDropsEmptyPlaceholderWords) {
  Workload w = Workload::external("x", "c");
  w.shell_command.reset();
  for (const char* word : {"bench", "--bs={micro_batch_size}", "{fused_kernels}", "--name", "{name}"})
    w.argv_command.emplace_back(word, "c");
  w.value_map["fused_kernels"] = {{"false", ""}};
  Launch l = build_launch(w, "", {{"micro_batch_size", 2}, {"name", "a b"}, {"fused_kernels", false}}, ctx());
  std::vector<std::string> want = {"bench", "--bs=2", "--name", "a b"};
  EXPECT_EQ(l.argv, want);
  EXPECT_TRUE(w.uses_parameter("fused_kernels"));
  EXPECT_FALSE(w.uses_parameter("attn"));
  EXPECT_THROW(w.check_placeholders({"micro_batch_size", "name"}, "c"), InvalidInput);
  EXPECT_NO_THROW(w.check_placeholders({"micro_batch_size", "name", "fused_kernels"}, "c"));
}

TEST(Workload, DefaultPatternsReadReferenceAndEngineLines) {
  Workload w = Workload::external("x", "c");
  Json m = extract_metrics(w.metrics,
                           "step 1\nTraining throughput: 27542.25 Tokens/s/GPU\nMax reserved GPU Memory: 61.59\n");
  EXPECT_DOUBLE_EQ(m["tokens_per_s_per_device"].get<double>(), 27542.25);
  EXPECT_DOUBLE_EQ(m["max_reserved_gib"].get<double>(), 61.59);
  Json ours = extract_metrics(w.metrics,
                              "Training throughput: 1.5e3 tokens/s/device\nMax reserved memory: 3.25 GiB\n");
  EXPECT_DOUBLE_EQ(ours["tokens_per_s_per_device"].get<double>(), 1500);
  EXPECT_DOUBLE_EQ(ours["max_reserved_gib"].get<double>(), 3.25);
  // The last line wins (the final summary comes last), '\r' pieces count as lines.
  Json last = extract_metrics(w.metrics, "Training throughput: 1 tokens/s\rTraining throughput: 2 tokens/s\n");
  EXPECT_DOUBLE_EQ(last["tokens_per_s_per_device"].get<double>(), 2);
  EXPECT_TRUE(extract_metrics(w.metrics, "loss 3.2\n").empty());
}

// The default patterns are compiled once and shared between workloads (workload.cpp): a workload
// that overrides one leaves the others' as they were.
TEST(Workload, OverridingADefaultPatternChangesOnlyThatWorkload) {
  Workload a = Workload::external("x", "c");
  a.set_metric("tokens_per_s_per_device", "speed=([0-9]+)", "c");
  a.set_oom_pattern("no room", "c");
  Workload b = Workload::external("y", "c");
  EXPECT_EQ(b.metrics[0].pattern, kDefaultThroughputPattern);
  EXPECT_EQ(b.oom_pattern, kDefaultOomPattern);
  EXPECT_DOUBLE_EQ(extract_metrics(a.metrics, "speed=12\n")["tokens_per_s_per_device"].get<double>(), 12);
  EXPECT_TRUE(extract_metrics(b.metrics, "speed=12\n").empty());
  EXPECT_DOUBLE_EQ(extract_metrics(b.metrics, "Training throughput: 5 tokens/s\n")["tokens_per_s_per_device"].get<double>(), 5);
  EXPECT_TRUE(std::regex_search("CUDA out of memory", b.oom_regex));
  EXPECT_FALSE(std::regex_search("CUDA out of memory", a.oom_regex));
}

TEST(Workload, DefaultOomPatternMatchesPyTorchAndEngine) {
  Workload w = Workload::external("x", "c");
  for (const char* line :
       {"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total)",
        "RuntimeError: CUDA error: out of memory", "RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate",
        "scalelab train: error: [allocator] out of cpu memory for logits: tried to allocate 1.00 GiB"}) {
    EXPECT_FALSE(find_matching_line(w.oom_regex, std::string("noise\n") + line + "\n").empty()) << line;
  }
  EXPECT_TRUE(find_matching_line(w.oom_regex, "Training throughput: 10 tokens/s\nloss 2.0\n").empty());
}

SubprocessResult exited(int code) {
  SubprocessResult r;
  r.started = true;
  r.status.exited = true;
  r.status.code = code;
  return r;
}

TEST(Outcome, External) {
  Workload w = Workload::external("x", "c");
  auto ok = classify_external(w, exited(0), 10, "Training throughput: 5 tokens/s\n");
  EXPECT_EQ(ok.status, TrialStatus::kOk);
  auto oom = classify_external(w, exited(1), 10, "Traceback\ntorch.OutOfMemoryError: CUDA out of memory.\n");
  EXPECT_EQ(oom.status, TrialStatus::kOom);
  EXPECT_THAT(oom.reason, HasSubstr("CUDA out of memory"));
  auto none = classify_external(w, exited(0), 10, "done.\n");
  EXPECT_EQ(none.status, TrialStatus::kError);
  EXPECT_THAT(none.reason, HasSubstr("no tokens_per_s_per_device"));
  auto crash = classify_external(w, exited(1), 10, "Traceback\nRuntimeError: NCCL error\n");
  EXPECT_EQ(crash.status, TrialStatus::kError);
  EXPECT_EQ(crash.reason, "exit code 1: RuntimeError: NCCL error");
  auto refused = classify_external(w, exited(2), 10, "usage: bench.py\nbench.py: error: unrecognized arguments\n");
  EXPECT_TRUE(refused.refused);
  SubprocessResult hung = exited(0);
  hung.status = {};
  hung.timed_out = true;
  hung.status.signal = 15;
  auto t = classify_external(w, hung, 2, "step 1\n");
  EXPECT_EQ(t.status, TrialStatus::kTimeout);
  EXPECT_THAT(t.reason, HasSubstr("timed out after 2.0 s"));
  SubprocessResult segv;
  segv.started = true;
  segv.status.signal = 11;
  EXPECT_THAT(classify_external(w, segv, 2, "").reason, HasSubstr("killed by signal 11"));
}

TEST(Outcome, Native) {
  testing::TempDir dir;
  std::string rec = dir / "r.json";
  testing::write_text(rec, R"({"status":"ok","tokens_per_s":10.0,"tokens_per_s_per_device":10.0,
    "max_reserved_bytes":2147483648,"step_time_s":0.5,"final_loss":3.0,"mfu":null,"losses":[3.0],
    "val_loss":2.5,"val_perplexity":12.18})");
  auto ok = classify_native(exited(0), 10, rec, "");
  EXPECT_EQ(ok.status, TrialStatus::kOk);
  // Validation loss is a metric of the results store (an analysis target).
  EXPECT_DOUBLE_EQ(ok.metrics["val_loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(ok.metrics["val_perplexity"].get<double>(), 12.18);
  EXPECT_DOUBLE_EQ(ok.metrics["max_reserved_gib"].get<double>(), 2.0);
  EXPECT_FALSE(ok.metrics.contains("mfu"));  // null is not a number
  EXPECT_TRUE(ok.record.contains("losses"));
  EXPECT_FALSE(ok.metrics.contains("plan_total_bytes"));  // no memory plan in this record

  // A DPO run's figures: the last step's rewards and the last held-out evaluation's.
  testing::write_text(rec, R"({"status":"ok","tokens_per_s_per_device":10.0,"final_loss":0.6,
    "final_reward_accuracy":0.75,"final_reward_margin":0.2,"val_loss":0.65,"val_perplexity":null,
    "val_reward_accuracy":0.6,"val_reward_margin":0.1,"val_rewards_chosen":0.05,"val_rewards_rejected":-0.05})");
  auto dpo = classify_native(exited(0), 10, rec, "");
  EXPECT_DOUBLE_EQ(dpo.metrics["final_reward_accuracy"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(dpo.metrics["val_loss"].get<double>(), 0.65);
  EXPECT_DOUBLE_EQ(dpo.metrics["val_reward_accuracy"].get<double>(), 0.6);
  EXPECT_DOUBLE_EQ(dpo.metrics["val_reward_margin"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(dpo.metrics["val_rewards_chosen"].get<double>(), 0.05);
  EXPECT_DOUBLE_EQ(dpo.metrics["val_rewards_rejected"].get<double>(), -0.05);
  EXPECT_FALSE(dpo.metrics.contains("val_perplexity"));

  // The memory plan's parts become metrics (what each held at the planned peak), names slugged.
  testing::write_text(rec, R"J({"status":"ok","trainable_params":96,"frozen_params":1000,
    "memory_plan":{"total_bytes":4096,"items":[
      {"name":"weights","bytes":2048,"at_peak_bytes":2048},
      {"name":"optimizer states","bytes":512,"at_peak_bytes":512},
      {"name":"Reference  model (frozen)","bytes":1024,"at_peak_bytes":1024},
      {"name":"logits","bytes":640,"at_peak_bytes":0},
      {"name":7,"at_peak_bytes":1},{"name":"odd","at_peak_bytes":"x"}]}})J");
  auto planned = classify_native(exited(0), 10, rec, "");
  EXPECT_EQ(planned.metrics["plan_total_bytes"], 4096);
  EXPECT_EQ(planned.metrics["plan_weights_bytes"], 2048);
  EXPECT_EQ(planned.metrics["plan_optimizer_states_bytes"], 512);
  EXPECT_EQ(planned.metrics["plan_reference_model_frozen_bytes"], 1024);
  EXPECT_EQ(planned.metrics["plan_logits_bytes"], 0);
  EXPECT_FALSE(planned.metrics.contains("plan_odd_bytes"));
  EXPECT_EQ(planned.metrics["trainable_params"], 96);
  EXPECT_EQ(planned.metrics["frozen_params"], 1000);

  testing::write_text(rec, R"({"status":"oom","error":"[allocator] out of cpu memory: tried 1 GiB"})");
  auto oom = classify_native(exited(3), 10, rec, "");
  EXPECT_EQ(oom.status, TrialStatus::kOom);
  EXPECT_THAT(oom.reason, HasSubstr("out of cpu memory"));

  std::string missing = dir / "none.json";
  auto oom2 = classify_native(exited(3), 10, missing, "scalelab train: error: out of memory\n");
  EXPECT_EQ(oom2.status, TrialStatus::kOom);
  auto bad = classify_native(exited(2), 10, missing, "scalelab train: error: --attn flash is not supported\n");
  EXPECT_EQ(bad.status, TrialStatus::kError);
  EXPECT_TRUE(bad.refused);
  EXPECT_THAT(bad.reason, HasSubstr("exit code 2: scalelab train: error: --attn flash"));
  auto no_record = classify_native(exited(0), 10, missing, "");
  EXPECT_EQ(no_record.status, TrialStatus::kError);
  EXPECT_THAT(no_record.reason, HasSubstr("no run record"));
  testing::write_text(rec, "{not json");
  EXPECT_THAT(classify_native(exited(0), 10, rec, "").reason, HasSubstr("not valid JSON"));
}

TEST(Outcome, StatusNames) {
  for (auto s : {TrialStatus::kOk, TrialStatus::kOom, TrialStatus::kError, TrialStatus::kTimeout})
    EXPECT_EQ(parse_status(status_name(s)), s);
  EXPECT_FALSE(parse_status("running"));
}

}  // namespace
}  // namespace scalelab::lab
