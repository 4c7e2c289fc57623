// `scalelab plan --stack hf-trainer` end to end: the table, the --json record, and exit 2 for
// what it does not model.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../cli/cli_run.h"

namespace scalelab::cli_test {
namespace {

const std::string kBase =
    "plan --stack hf-trainer --model llama-3.2-1b --seq-len 1024 --model-precision fp32 --attn eager ";

TEST(PlanHfCli, PrintsThePredictionAndWritesTheRecord) {
  const std::string path = std::string(SCALELAB_BINARY_DIR) + "/plan_hf_cli_test.json";
  std::remove(path.c_str());
  const CmdResult r = run(kBase + "--micro-batch-size 6 --device-memory 64GiB --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("max_memory_reserved"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("torch 2.11, transformers 5.17"), std::string::npos) << r.output;
  const auto j = read_json(path);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["largest_micro_batch"], 7);
  EXPECT_EQ(j["device_memory_bytes"], 64ull << 30);
  EXPECT_EQ(j["versions"]["transformers"], "5.17");
  EXPECT_GT(j["max_reserved_bytes"].get<std::uint64_t>(), j["max_allocated_bytes"].get<std::uint64_t>());
  EXPECT_TRUE(j["breakdown_at_peak_allocated"].contains("saved_activations"));
  ASSERT_FALSE(j["per_step"].empty());
  EXPECT_LE(j["per_step"][0]["large_segments"].get<std::uint64_t>(), j["per_step"][0]["segments"].get<std::uint64_t>());
  EXPECT_EQ(j["per_step"].back()["segments"], j["segments"]);
  EXPECT_EQ(j["per_step"].back()["large_segments"], j["large_segments"]);
}

// The reference practice's published point (Llama-3.2-1B, fp32, eager, seq 1024, adamw_torch, one
// 64 GB H100): micro-batch 6 read max_memory_reserved 61.89 GiB ("GB", printed from bytes / 1024^3)
// and micro-batch 7 ran out of memory. Its job ran under `torchrun --nproc_per_node 1` in NVIDIA's
// PyTorch 24.07 container (torch 2.4), so accelerate wrapped the model in DDP; the transformers
// release is not recorded (4.43 or later for Llama 3.2's RoPE; 4.45 here, whose reserved peak 4.46
// to 4.48 share). The goal the issue sets: reserved within 1 % of the measurement, the limit exact.
// And without torchrun the same job predicts a limit of 7: the launcher is what decides it.
TEST(PlanHfCli, ReproducesThePublishedPointUnderTorchrun) {
  const std::string path = std::string(SCALELAB_BINARY_DIR) + "/plan_hf_cli_published.json";
  const std::string job = kBase + "--device-memory 64GiB --torch-version 2.4.0a0+3bcc3cd --transformers-version 4.45.2 ";
  CmdResult r = run(job + "--micro-batch-size 6 --launcher torchrun --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("torchrun with one process"), std::string::npos) << r.output;
  auto j = read_json(path);
  EXPECT_EQ(j["launcher"], "torchrun");
  EXPECT_EQ(j["ddp"], true);
  EXPECT_EQ(j["versions"]["torch"], "2.4");
  const double published = 61.89 * static_cast<double>(1ull << 30);
  EXPECT_NEAR(j["max_reserved_bytes"].get<double>(), published, 0.01 * published);
  EXPECT_EQ(j["largest_micro_batch"], 6);
  // DDP's gradient buckets: a second copy of every (fp32) gradient, as large as the weights
  EXPECT_GE(j["breakdown_at_peak_allocated"]["ddp"].get<std::uint64_t>(),
            j["breakdown_at_peak_allocated"]["weights"].get<std::uint64_t>());
  r = run(job + "--micro-batch-size 7 --launcher torchrun --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("OUT OF MEMORY"), std::string::npos) << r.output;
  EXPECT_EQ(read_json(path)["status"], "oom");
  r = run(job + "--micro-batch-size 6 --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  j = read_json(path);
  EXPECT_EQ(j["launcher"], "python");
  EXPECT_EQ(j["largest_micro_batch"], 7);
}

// --transformers-version / --torch-version take a full version (its major.minor is the release),
// or auto: what PYTHON (here a stand-in script printing torch's and transformers' versions as the
// real import's one-liner would, after a warning) reports; an interpreter that cannot report them exits 2 saying so.
TEST(PlanHfCli, ReadsFullVersionsAndAutoFromThePython) {
  const CmdResult full =
      run(kBase + "--micro-batch-size 6 --device-memory 64GiB --torch-version 2.11.0+cu130 --transformers-version 4.45.2");
  ASSERT_EQ(full.code, 0) << full.output;
  EXPECT_NE(full.output.find("torch 2.11, transformers 4.45"), std::string::npos) << full.output;
  const std::string py = std::string(SCALELAB_BINARY_DIR) + "/plan_hf_cli_fake_python";
  {
    std::ofstream f(py);
    // an import warning on stderr first, as transformers prints some
    f << "#!/bin/sh\necho 'FutureWarning: something' >&2\necho 'scalelab-versions 2.11.0+cu130 4.47.1'\n";
  }
  std::filesystem::permissions(py, std::filesystem::perms::owner_all);
  setenv("PYTHON", py.c_str(), 1);
  const CmdResult autod = run(kBase + "--micro-batch-size 6 --device-memory 64GiB --torch-version auto "
                                      "--transformers-version auto");
  setenv("PYTHON", "/bin/false", 1);
  const CmdResult failed = run(kBase + "--micro-batch-size 6 --device-memory 64GiB --transformers-version auto");
  unsetenv("PYTHON");
  ASSERT_EQ(autod.code, 0) << autod.output;
  EXPECT_NE(autod.output.find("torch 2.11, transformers 4.47"), std::string::npos) << autod.output;
  EXPECT_EQ(failed.code, 2) << failed.output;
  EXPECT_NE(failed.output.find("/bin/false could not report torch and transformers"), std::string::npos)
      << failed.output;
}

// A Qwen2 config directory (Qwen2.5-0.5B's shapes, written here): its q/k/v biases are in the
// schedule, so the weights and gradients have 3 more tensors per layer than Llama's.
TEST(PlanHfCli, PredictsAQwen2ConfigDirectory) {
  const std::string dir = std::string(SCALELAB_BINARY_DIR) + "/plan_hf_cli_qwen2";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/config.json");
    f << R"({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
      "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
      "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
      "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": 32768, "max_window_layers": 21})";
  }
  const std::string path = dir + "/pred.json";
  const CmdResult r = run("plan --stack hf-trainer --model " + dir +
                          " --seq-len 1024 --micro-batch-size 4 --model-precision bf16 --mixed-precision bf16 "
                          "--attn flash --device-memory 80GiB --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = read_json(path);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_GT(j["largest_micro_batch"].get<int>(), 4);
  // bf16 weights: 494,032,768 parameters (Qwen2.5-0.5B, tied) x 2 bytes, in allocator blocks
  // (a block keeps its segment's unsplit remainder: at least the requests)
  EXPECT_GE(j["breakdown_at_peak_allocated"]["weights"].get<std::uint64_t>(), 494032768ull * 2);
}

// DDP per rank: the gradient buckets (one more copy of the gradients: gradient_as_bucket_view
// False) are in the breakdown, NCCL's memory is subtracted like the context, and the largest
// micro-batch is at most the single GPU's.
TEST(PlanHfCli, PredictsOneDdpRank) {
  const std::string one = std::string(SCALELAB_BINARY_DIR) + "/plan_hf_cli_ddp1.json";
  const std::string eight = std::string(SCALELAB_BINARY_DIR) + "/plan_hf_cli_ddp8.json";
  ASSERT_EQ(run(kBase + "--micro-batch-size 4 --device-memory 80GiB --json " + one).code, 0);
  const CmdResult r = run(kBase + "--micro-batch-size 4 --device-memory 80GiB --ranks 8 --nccl-memory 1GiB --json " + eight);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("per rank of 8"), std::string::npos) << r.output;
  const auto a = read_json(one), b = read_json(eight);
  EXPECT_EQ(b["ranks"], 8);
  EXPECT_EQ(b["allocator_limit_bytes"].get<std::uint64_t>() + (1ull << 30), a["allocator_limit_bytes"].get<std::uint64_t>());
  // llama-3.2-1b: 1,235,814,400 fp32 parameters: the buckets hold them all
  EXPECT_GE(b["breakdown_at_peak_allocated"]["ddp"].get<std::uint64_t>(), 1235814400ull * 4);
  EXPECT_GT(b["max_allocated_bytes"].get<std::uint64_t>(), a["max_allocated_bytes"].get<std::uint64_t>());
  EXPECT_LE(b["largest_micro_batch"].get<int>(), a["largest_micro_batch"].get<int>());
}

TEST(PlanHfCli, OutOfMemoryIsAPredictionNotAnError) {
  const CmdResult r = run(kBase + "--micro-batch-size 9 --device-memory 64GiB");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("OUT OF MEMORY"), std::string::npos) << r.output;
}

// Liger (--fused-kernels) on Qwen2, with gradient checkpointing and under autocast over fp32 weights: modelled from Liger-Kernel
// 0.8.5's source (docs/predict.md), accepted and predicted; checkpointing lowers the peak.
TEST(PlanHfCli, PredictsLigerOnQwen2AndWithCheckpointing) {
  const std::string path = std::string(SCALELAB_BINARY_DIR) + "/plan_hf_cli_liger.json";
  const std::string args =
      "plan --stack hf-trainer --model qwen2.5-0.5b --seq-len 1024 --micro-batch-size 8 --model-precision bf16 "
      "--mixed-precision bf16 --attn flash --device-memory 80GiB --fused-kernels --json " + path;
  std::remove(path.c_str());
  CmdResult r = run(args);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::uint64_t plain = read_json(path)["max_allocated_bytes"].get<std::uint64_t>();
  std::remove(path.c_str());
  r = run(args + " --activation-checkpointing");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = read_json(path);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_LT(j["max_allocated_bytes"].get<std::uint64_t>(), plain);
  r = run("plan --stack hf-trainer --model llama-3.2-1b --seq-len 1024 --micro-batch-size 4 --model-precision bf16 "
          "--attn flash --device-memory 80GiB --fused-kernels --activation-checkpointing");
  EXPECT_EQ(r.code, 0) << r.output;
  // The table's first line names what was predicted.
  EXPECT_NE(r.output.find("attn sdpa, Liger kernels, gradient checkpointing,"), std::string::npos) << r.output;
  // and under autocast over fp32 weights
  r = run(kBase + "--micro-batch-size 2 --device-memory 80GiB --fused-kernels --mixed-precision bf16");
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST(PlanHfCli, RefusesWithExitTwoNamingTheSupported) {
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"plan --stack deepspeed --model llama-3.2-1b", "scalelab, hf-trainer"},
      {kBase + "--device-memory 64GiB --transformers-version 4.40", "supported: 5.17"},
      {kBase + "--device-memory 64GiB --torch-version 2.3 --transformers-version 4.45", "supported: 2.4 to 2.11"},
      {kBase + "--device-memory 64GiB --torch-version 2.12", "supported: 2.4 to 2.11"},
      {kBase + "--device-memory 64GiB --torch-version 2.4", "transformers 5.17 needs torch 2.5 or later"},
      {kBase + "--device-memory 64GiB --torch-version 2.7 --attn flash", "eager attention only"},
      {kBase + "--device-memory 64GiB --launcher mpirun", "supported: python (one process), torchrun"},
      {kBase + "--device-memory 64GiB --ranks 2 --launcher python", "--ranks 2 runs under torchrun"},
      {kBase + "--device-memory 64GiB --micro-batch-size 0", "--micro-batch-size"},
      {kBase + "--micro-batch-size 1", "--device-memory is required"},
      {kBase + "--device-memory 64GiB --dropout 0.1", "OPT only"},
      {"plan --stack hf-trainer --model opt-1.3b --seq-len 1024 --device-memory 64GiB --fused-kernels",
       "no apply_liger_kernel_to_opt"},
      {kBase + "--device-memory 64GiB --world-size 8", "--ranks 8"},
      {kBase + "--device-memory 64GiB --ranks 8 --zero 1", "ZeRO-1 under the Trainer"},
      {kBase + "--device-memory 64GiB --ranks 0", "--ranks must be at least 1"},
      {kBase + "--device-memory 64GiB --ddp-bucket-cap-mb 10", "add --ranks N"},
      {kBase + "--device-memory 64GiB --ranks 2 --ddp-bucket-cap-mb 0", "--ddp-bucket-cap-mb must be at least 1"},
      {kBase + "--device-memory 64GiB --freeze q_proj", "--freeze"},
  };
  for (const auto& c : cases) {
    const CmdResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(PlanHfCli, AbsurdDimensionsAreRefusedAtOnce) {
  const CmdResult r = run(
      "plan --stack hf-trainer --model llama-3.2-1b --seq-len 131072 --micro-batch-size 4000000000 "
      "--device-memory 80GiB");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("2^62"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace scalelab::cli_test

namespace scalelab::cli_test {
namespace {

TEST(OomSearchPredict, StartsAtThePredictionAndProvesItWithTwoTrials) {
  const std::string dir = std::string(SCALELAB_BINARY_DIR) + "/oom_search_predict_test";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string workload = "python3 " + std::string(SCALELAB_SOURCE_DIR) +
                               "/tests/lab/fake_workload.py --batch_size {micro_batch_size} --seq_len {seq_len} "
                               "--oom_above 7";
  const CmdResult r = run("oom-search --db " + dir + "/o.db --log-dir " + dir + "/logs --no-telemetry --command '" +
                          workload + "' --predict hf-trainer --model llama-3.2-1b --seq-len 1024 --device-memory 64GiB");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Largest micro-batch that fits: 7 (verified: 7 fits, 8 runs out of memory)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[2] oom"), std::string::npos) << r.output;  // the second trial proves it
  EXPECT_EQ(r.output.find("[3]"), std::string::npos) << r.output;      // and there is no third
  const CmdResult bad = run("oom-search --db " + dir + "/p.db --command '" + workload + "' --predict deepspeed");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("supported: hf-trainer"), std::string::npos) << bad.output;
}

// The published point through the lab: a command started by torchrun (here a stand-in script of that
// name around the fake workload, which runs out of memory above 6) is planned with DDP over one
// process, so the search starts at 6 and two trials prove it (started by python the plan says 7).
TEST(OomSearchPredict, ATorchrunCommandIsPlannedAsDdp) {
  const std::string dir = std::string(SCALELAB_BINARY_DIR) + "/oom_search_torchrun_test";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  {
    std::ofstream f(dir + "/torchrun");
    f << "#!/bin/sh\nexec python3 " << SCALELAB_SOURCE_DIR << "/tests/lab/fake_workload.py \"$@\"\n";
  }
  std::filesystem::permissions(dir + "/torchrun", std::filesystem::perms::owner_all);
  const std::string workload = dir + "/torchrun --batch_size {micro_batch_size} --seq_len {seq_len} --oom_above 6";
  const CmdResult r = run("oom-search --db " + dir + "/o.db --log-dir " + dir + "/logs --no-telemetry --command '" +
                          workload + "' --predict hf-trainer --model llama-3.2-1b --seq-len 1024 --device-memory 64GiB "
                          "--transformers-version 4.45");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Largest micro-batch that fits: 6 (verified: 6 fits, 7 runs out of memory)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[1] running micro_batch_size=6"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[3]"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace scalelab::cli_test

namespace scalelab::cli_test {
namespace {

TEST(LadderPredict, EachRungShowsThePrediction) {
  const std::string dir = std::string(SCALELAB_BINARY_DIR) + "/ladder_predict_test";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string workload = "python3 " + std::string(SCALELAB_SOURCE_DIR) +
                               "/tests/lab/fake_workload.py --batch_size {micro_batch_size} --seq_len {seq_len} "
                               "--model_precision {model_precision} --mixed_precision {mixed_precision} --memory_gb 64";
  const CmdResult r = run("ladder --db " + dir + "/l.db --no-telemetry --command '" + workload +
                          "' --predict hf-trainer --model llama-3.2-1b --seq-len 1024 --device-memory 64GiB");
  EXPECT_NE(r.output.find("7 runs out of memory; plan estimated 7"), std::string::npos) << r.output;
  const CmdResult bad = run("ladder --db " + dir + "/m.db --command '" + workload + "' --predict x");
  EXPECT_EQ(bad.code, 2) << bad.output;
}

}  // namespace
}  // namespace scalelab::cli_test

#include "cli/hf_predict_plan.h"
#include "model/config.h"
#include "predict/hf_predict.h"

namespace scalelab::cli_test {
namespace {

// The lab's --predict hf-trainer reads every parameter the ladder's rungs set: the fused-kernels
// rung (fused_kernels = true) is predicted with Liger, not as the rung below it, and
// grad_accum_steps reaches the schedule; what the prediction does not model (Liger on OPT) says so
// and lets the search double instead.
TEST(LabPredict, ReadsTheFusedKernelsRungAndGradientAccumulation) {
  const lab::PlanFn plan = cli::hf_trainer_plan();
  lab::ParamMap p = {{"model", "llama-3.2-1b"}, {"seq_len", 1024}, {"device_memory", "64GiB"},
                     {"model_precision", "bf16"}, {"mixed_precision", "no"}, {"attn", "flash"},
                     {"fused_kernels", false}};
  predict::HfJob job;
  job.model = preset_config("llama-3.2-1b");
  job.model_precision = "bf16";
  job.attn = "sdpa";
  predict::HfPredictOptions o;
  o.device_memory = std::size_t{64} << 30;
  std::string note;
  const std::optional<int> plain = plan(p, &note);
  ASSERT_TRUE(plain.has_value()) << note;
  EXPECT_EQ(*plain, predict::largest_micro_batch(job, o));
  p["fused_kernels"] = true;
  const std::optional<int> liger = plan(p, &note);
  job.fused_kernels = true;
  ASSERT_TRUE(liger.has_value()) << note;
  EXPECT_EQ(*liger, predict::largest_micro_batch(job, o));
  EXPECT_GT(*liger, *plain);  // Liger's fused loss keeps no logits: a larger batch fits
  p["fused_kernels"] = "true";  // as a spec's text writes it
  EXPECT_EQ(plan(p, &note), liger);

  p["grad_accum_steps"] = 2;
  job.grad_accum_steps = 2;
  job.steps = 3;
  const std::optional<int> ga = plan(p, &note);
  ASSERT_TRUE(ga.has_value()) << note;
  EXPECT_EQ(*ga, predict::largest_micro_batch(job, o));

  p["model"] = "opt-1.3b";
  p.erase("grad_accum_steps");
  EXPECT_FALSE(plan(p, &note).has_value());
  EXPECT_NE(note.find("unavailable"), std::string::npos) << note;
}

// The spec's transformers_version reaches the prediction: 4.45 (Llama, eager) is predicted and says
// so; what 4.45 does not model (sdpa) says why and lets the search double; an unknown release too.
TEST(LabPredict, ReadsTheTransformersVersion) {
  const lab::PlanFn plan = cli::hf_trainer_plan();
  lab::ParamMap p = {{"model", "llama-3.2-1b"}, {"seq_len", 1024}, {"device_memory", "64GiB"},
                     {"model_precision", "fp32"}, {"attn", "eager"}, {"transformers_version", "4.45"}};
  std::string note;
  predict::HfJob job;
  job.model = preset_config("llama-3.2-1b");
  job.versions.transformers = predict::kOlderTransformers;
  predict::HfPredictOptions o;
  o.device_memory = std::size_t{64} << 30;
  const std::optional<int> b = plan(p, &note);
  ASSERT_TRUE(b.has_value()) << note;
  EXPECT_EQ(*b, predict::largest_micro_batch(job, o));
  EXPECT_NE(note.find("transformers 4.45"), std::string::npos) << note;
  p["attn"] = "flash";
  EXPECT_FALSE(plan(p, &note).has_value());
  EXPECT_NE(note.find("eager attention only"), std::string::npos) << note;
  p["attn"] = "eager";
  p["transformers_version"] = "4.40";
  EXPECT_FALSE(plan(p, &note).has_value());
  EXPECT_NE(note.find("not modelled"), std::string::npos) << note;
}

// A spec's "launcher" (plan's --launcher): the published point's job under torchrun with one
// process fits 6 and not 7, started by python 7 (PlanHfCli.ReproducesThePublishedPointUnderTorchrun).
TEST(LabPredict, ReadsTheLauncher) {
  const lab::PlanFn plan = cli::hf_trainer_plan();
  lab::ParamMap p = {{"model", "llama-3.2-1b"}, {"seq_len", 1024},          {"device_memory", "64GiB"},
                     {"model_precision", "fp32"}, {"attn", "eager"},        {"transformers_version", "4.45.2"},
                     {"torch_version", "2.4.0"},  {"launcher", "torchrun"}};
  std::string note;
  std::optional<int> b = plan(p, &note);
  ASSERT_TRUE(b.has_value()) << note;
  EXPECT_EQ(*b, 6);
  EXPECT_NE(note.find("torch 2.4, transformers 4.45, torchrun DDP"), std::string::npos) << note;
  p["launcher"] = "python";
  b = plan(p, &note);
  ASSERT_TRUE(b.has_value()) << note;
  EXPECT_EQ(*b, 7);
  p["launcher"] = "srun";
  EXPECT_FALSE(plan(p, &note).has_value());
  EXPECT_NE(note.find("--launcher srun"), std::string::npos) << note;
}

// oom-search / ladder --predict on an external workload: a command that runs torchrun (or python -m
// torch.distributed.run), behind srun or a shell, is planned as torchrun (DDP even for one process),
// unless the spec's parameters say otherwise.
TEST(LabPredict, TheLauncherFollowsTheCommand) {
  using lab::Json;
  EXPECT_EQ(cli::launcher_of_command(Json{{"command", "torchrun --nproc_per_node 1 train.py --bs {micro_batch_size}"}}),
            "torchrun");
  EXPECT_EQ(cli::launcher_of_command(Json{{"command", "srun python -m torch.distributed.run --nproc_per_node 4 t.py"}}),
            "torchrun");
  EXPECT_EQ(cli::launcher_of_command(Json{{"command", Json::array({"/opt/venv/bin/torchrun", "train.py"})}}), "torchrun");
  EXPECT_EQ(cli::launcher_of_command(Json{{"command", "bash -c 'torchrun train.py'"}}), "torchrun");
  EXPECT_EQ(cli::launcher_of_command(Json{{"command", "python train.py --torchrun-like-flag"}}), "python");
  EXPECT_EQ(cli::launcher_of_command(Json{{"kind", "native"}}), "python");
  lab::ParamMap p = {{"model", "llama-3.2-1b"}, {"seq_len", 1024},   {"device_memory", "64GiB"},
                     {"model_precision", "fp32"}, {"attn", "eager"}, {"transformers_version", "4.45"}};
  std::string note;
  EXPECT_EQ(cli::hf_trainer_plan("torchrun")(p, &note), std::optional<int>(6)) << note;
  p["launcher"] = "python";  // the spec's word wins
  EXPECT_EQ(cli::hf_trainer_plan("torchrun")(p, &note), std::optional<int>(7)) << note;
}

}  // namespace
}  // namespace scalelab::cli_test
