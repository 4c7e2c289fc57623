// `scalelab train` and `scalelab scale` over MPI, end to end: the scalelab binary under
// `mpirun -np 2` (as root in CI: --allow-run-as-root --oversubscribe), one thread per rank.
//   - 2 ranks x micro-batch b train like 1 rank x micro-batch 2b (losses and saved weights, within
//     fp32 reduction-order tolerance), with and without gradient accumulation; ZeRO-1 like DDP;
//   - a rank that fails (unreadable data on rank 1 only) ends the job, naming it, within a bound;
//   - ranks launched with different flags refuse to run, naming the key;
//   - `scalelab scale --ranks 1,2` records both trials and `results` reproduces its table;
//   - `scalelab dpo` (full, LoRA, QLoRA; Llama and OPT; DDP and ZeRO-1): 2 ranks x b pairs train and
//     evaluate like 1 rank x 2b, and --save-every / --resume continue bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/subprocess.h"
#include "model/safetensors.h"

namespace scalelab {
namespace {

#ifdef SCALELAB_MPIRUN

namespace fs = std::filesystem;

// The bound a job must end within (a deadline of the child, not a timing assertion).
constexpr double kJobBound = 60;

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> mpirun_argv() {
  std::vector<std::string> argv;
  std::stringstream ss(SCALELAB_MPIRUN);
  for (std::string tok; std::getline(ss, tok, '|');) argv.push_back(tok);
  return argv;
}

// `scalelab <args>` on np ranks (np 0: directly, without mpirun).
SubprocessResult scalelab(int np, const std::string& args, std::vector<std::pair<std::string, std::string>> env = {}) {
  std::vector<std::string> argv;
  if (np > 0) {
    argv = mpirun_argv();
    for (const auto& [k, v] : env) {
      argv.push_back("-x");
      argv.push_back(k);
    }
    argv.push_back("-np");
    argv.push_back(std::to_string(np));
  }
  argv.push_back(SCALELAB_EXE);
  for (auto& w : split_words(args)) argv.push_back(w);
  SubprocessSpec o;
  o.argv = argv;
  o.timeout_s = kJobBound;
  o.env = env;
  o.env.emplace_back("OMP_NUM_THREADS", "1");
  return run_subprocess(o);
}

class TrainMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');  // a parameterized test's "Test/case"
    dir_ = fs::temp_directory_path() / ("scalelab_train_mpi_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Trains and returns the run record; the model is saved into <name>/.
  nlohmann::json train(int np, const std::string& name, const std::string& flags) {
    const SubprocessResult r = scalelab(np, "train " + kCommon + flags + " --json " + path(name + ".json") + " --save " +
                                             path(name));
    EXPECT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
    std::ifstream in(path(name + ".json"));
    if (!in) {
      ADD_FAILURE() << "no run record " << name;
      return {};
    }
    return nlohmann::json::parse(in);
  }

  // Largest and mean absolute difference between the weights saved in two directories.
  struct WeightDiff {
    double max = 0, mean = 0;
  };
  WeightDiff weight_diff(const std::string& a, const std::string& b) {
    const SafetensorsFile fa = SafetensorsFile::open(path(a) + "/model.safetensors");
    const SafetensorsFile fb = SafetensorsFile::open(path(b) + "/model.safetensors");
    EXPECT_EQ(fa.tensors().size(), fb.tensors().size());
    WeightDiff d;
    double sum = 0;
    std::size_t n = 0;
    for (const SafetensorsTensor& ta : fa.tensors()) {
      const SafetensorsTensor* tb = fb.find(ta.name);
      if (tb == nullptr || tb->numel() != ta.numel()) {
        ADD_FAILURE() << "tensor " << ta.name << " differs in presence or size";
        continue;
      }
      std::vector<float> x(static_cast<std::size_t>(ta.numel())), y(x.size());
      fa.read(ta, x.data(), DType::kF32);
      fb.read(*tb, y.data(), DType::kF32);
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double e = std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i]));
        d.max = std::max(d.max, e);
        sum += e;
      }
      n += x.size();
    }
    d.mean = n ? sum / static_cast<double>(n) : 0;
    return d;
  }
  double max_weight_diff(const std::string& a, const std::string& b) { return weight_diff(a, b).max; }

  // How far two AdamW runs from the same weights may drift apart when their gradients differ only
  // by rounding (a different reduction order: 2 ranks x b against 1 rank x 2b, all-reduce against
  // reduce-scatter). The drift cannot be bounded by the gradients' rounding: Adam divides by
  // sqrt(v), so an element whose gradient nearly cancels (|g| at rounding level, or near eps) gets
  // an O(1) different direction, and which elements do depends on the CPU's kernels (OpenBLAS picks
  // them per CPU) and thread counts. What is sound is the optimizer's own bound on a step:
  //   u_t = m̂_t / (sqrt(v̂_t) + eps),  m_t = (1-b1) Σ_k b1^k g_{t-k},  v_t = (1-b2) Σ_k b2^k g_{t-k}^2.
  // By Cauchy–Schwarz, |Σ a_k g_k| <= sqrt(Σ a_k^2 / c_k) sqrt(Σ c_k g_k^2) with a_k = (1-b1) b1^k,
  // c_k = (1-b2) b2^k, so for ANY gradients
  //   |u_t| <= B_t = sqrt(1-b2^t) / (1-b1^t) * sqrt(Σ_{k<t} (1-b1)^2 b1^{2k} / ((1-b2) b2^k))
  // (B_1 = 1: Adam's first step is sign(g); B_t ~ 1.007 at t = 4 with 0.9 / 0.999). Clipping
  // rescales g and the linear schedule lowers lr_t <= lr, neither raises the bound. The two runs'
  // updates differ by at most 2 lr B_t, and decoupled weight decay maps a difference d to
  // (1 - lr wd) d, so |Δw_T| <= Σ_t 2 lr B_t (wd = 0 here). This is loose (the largest move of a
  // weight is lr T), so the runs are also compared where rounding cannot hide a bug: the losses
  // (expect_same_losses) and the mean difference against the mean movement (a wrong reduction
  // moves every weight differently; rounding flips only the rare cancelling elements).
  static double adam_drift_bound(double lr, int steps, double b1 = 0.9, double b2 = 0.999) {
    double bound = 0;
    for (int t = 1; t <= steps; ++t) {
      double s = 0;
      for (int k = 0; k < t; ++k) s += (1 - b1) * (1 - b1) * std::pow(b1, 2 * k) / ((1 - b2) * std::pow(b2, k));
      bound += 2 * lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t)) * std::sqrt(s);
    }
    return bound * (1 + 1e-6);  // the bound's own rounding
  }
  static constexpr double kLr = 1e-3;  // kCommon's --lr
  static constexpr int kSteps = 4;     // kCommon's --max-steps

  // Weights of `a` and `b` (trained from `init`) agree as far as AdamW's math allows.
  void expect_same_weights(const std::string& a, const std::string& b, const std::string& init) {
    const WeightDiff d = weight_diff(a, b);
    const WeightDiff moved = weight_diff(init, a);
    EXPECT_LE(d.max, adam_drift_bound(kLr, kSteps)) << a << " vs " << b;
    // A rounding-level disagreement flips at most a few elements whose gradient cancels; if 2% of
    // all elements had moved in opposite directions by the full lr*T, the mean would reach this.
    EXPECT_LE(d.mean, 0.02 * moved.mean) << a << " vs " << b << " (mean movement " << moved.mean << ")";
    EXPECT_GT(moved.mean, 0.0);
  }

  // The first step's losses come from identical weights and differ only by the order of a sum of
  // positive per-token losses (at most 4 x 16 x 2 = 128 tokens, fp32: relative error
  // <= 128 * 2^-24 < 8e-6) and by rounding inside each token's row (a few ulps). Later steps
  // also see the AdamW drift above, but only in elements whose gradient is at rounding level, so
  // the loss moves by about Σ g Δw, which is second order: the same bound holds with room.
  static void expect_same_losses(const nlohmann::json& a, const nlohmann::json& b) {
    ASSERT_EQ(a["losses"].size(), b["losses"].size());
    for (std::size_t i = 0; i < a["losses"].size(); ++i) {
      const double x = a["losses"][i].get<double>(), y = b["losses"][i].get<double>();
      EXPECT_NEAR(x, y, 1e-5 * std::fabs(x)) << "step " << i + 1;
    }
  }

  // Small, multi-bucket (0.02 MiB buckets over 90k parameters), lr large enough that the weights
  // move well beyond the tolerance in 4 steps.
  const std::string kCommon =
      "--model llama-tiny --seq-len 16 --max-steps 4 --threads 1 --lr 1e-3 --bench-warmup-steps 1 --quiet "
      "--ddp-bucket-mb 0.02 ";
  fs::path dir_;
};

// LoRA (docs/finetuning.md) over 2 ranks: only the adapters' gradients are all-reduced (DDP) or
// reduce-scattered (ZeRO-1); 2 ranks x micro-batch 1 reproduce peft's trajectory on the golden
// case (micro-batch 2, accumulation 2) within 1e-5 relative, from peft's initial adapter.
TEST_F(TrainMpi, LoraOverTwoRanksMatchesPeft) {
  const std::string dir = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/lora/llama_gqa_tied_all_rslora_accum2";
  std::ifstream ein(dir + "/expected.json");
  const nlohmann::json e = nlohmann::json::parse(ein);
  const std::string flags =
      "train --model " + dir + " --data " + dir + "/tokens.bin --micro-batch-size 1 --seq-len 16 --max-steps 6 "
      "--warmup-steps 2 --grad-accum-steps 2 --lr 0.01 --weight-decay 0.1 --adam-epsilon 1e-8 --max-grad-norm 1 "
      "--threads 1 --quiet --ddp-bucket-mb 0.02 --lora-rank 8 --lora-alpha 16 --rslora "
      "--lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --adapter " + dir + "/adapter_init";
  for (const std::string zero : {"", " --zero 1"}) {
    const SubprocessResult r = scalelab(2, flags + zero + " --json " + path("lora.json"));
    ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
    std::ifstream in(path("lora.json"));
    const nlohmann::json rec = nlohmann::json::parse(in);
    ASSERT_EQ(rec["losses"].size(), e["losses"].size());
    for (std::size_t i = 0; i < rec["losses"].size(); ++i) {
      const double w = e["losses"][i].get<double>();
      EXPECT_NEAR(rec["losses"][i].get<double>(), w, 1e-5 * w) << zero << " step " << i + 1;
    }
    EXPECT_EQ(rec["trainable_params"], e["trainable_params"]);
  }
}

TEST_F(TrainMpi, TwoRanksTrainLikeOneRankWithTheDoubleBatch) {
  const nlohmann::json one = train(0, "one", "--micro-batch-size 4");
  const nlohmann::json two = train(2, "two", "--micro-batch-size 2");
  const nlohmann::json zero = train(2, "zero", "--micro-batch-size 2 --zero 1");
  ASSERT_FALSE(one.is_null() || two.is_null() || zero.is_null());
  expect_same_losses(one, two);
  expect_same_losses(two, zero);
  // The weights moved from their initialization (the comparisons below see them at all).
  const nlohmann::json init = train(0, "init", "--micro-batch-size 4 --lr 0");
  EXPECT_GT(max_weight_diff("init", "two"), 1e-4);
  expect_same_weights("one", "two", "init");
  expect_same_weights("two", "zero", "init");

  // The record: world, launcher, the job's throughput and every rank's figures.
  EXPECT_EQ(one["world_size"], 1);
  EXPECT_EQ(one["launcher"], "none");
  EXPECT_FALSE(one.contains("data_parallel"));
  EXPECT_EQ(two["world_size"], 2);
  EXPECT_EQ(two["launcher"], "openmpi");
  EXPECT_EQ(two["config"]["world_size"], 2);
  EXPECT_NEAR(two["tokens_per_s"].get<double>(), 2 * two["tokens_per_s_per_device"].get<double>(),
              1e-9 * two["tokens_per_s"].get<double>());
  ASSERT_EQ(two["ranks"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(two["ranks"][r]["rank"], r);
    EXPECT_GT(two["ranks"][r]["tokens_per_s"].get<double>(), 0);
    EXPECT_GE(two["ranks"][r]["comm_time_s"].get<double>(), two["ranks"][r]["comm_hidden_s"].get<double>());
  }
  const nlohmann::json& d = two["data_parallel"];
  EXPECT_EQ(d["mode"], "ddp");
  EXPECT_GT(d["buckets_per_step"].get<int>(), 2);
  // Every bucket went out from the model's grad-ready hook during backward, none from the end.
  EXPECT_EQ(d["buckets_launched_early"], d["buckets"]);
  EXPECT_EQ(d["synced_steps"], 4);
  EXPECT_GE(two["comm_hidden_fraction"].get<double>(), 0.0);
  EXPECT_LE(two["comm_hidden_fraction"].get<double>(), 1.0);

  // ZeRO-1: optimizer states for half the parameters (plus the shard's reduce-scatter output),
  // and the plan, which says so, is what the allocator measured on rank 0.
  EXPECT_EQ(zero["data_parallel"]["mode"], "zero1");
  const std::int64_t params = zero["params"].get<std::int64_t>();
  EXPECT_LE(zero["ranks"][0]["optimizer_state_elements"].get<std::int64_t>(), params / 2 + 16);
  std::size_t states = 0;
  for (const auto& it : zero["memory_plan"]["items"])
    if (it["name"] == "optimizer states") states = it["bytes"].get<std::size_t>();
  EXPECT_LE(states, (params / 2 + 16) * 2 * 4 + 1024);
  EXPECT_EQ(zero["ranks"][0]["max_reserved_bytes"], zero["memory_plan"]["total_bytes"]);
  EXPECT_EQ(two["ranks"][0]["max_reserved_bytes"], two["memory_plan"]["total_bytes"]);
  // Reserved bytes come in 2 MiB segments, which a tiny model fits either way; the bytes handed
  // out at the peak show the saving.
  EXPECT_LT(zero["ranks"][0]["max_allocated_bytes"].get<double>(), two["ranks"][0]["max_allocated_bytes"].get<double>());
}

// --freeze under DDP and ZeRO-1: buckets and shards cover the trainable buffer only; the job trains
// like one rank with the double batch, and ZeRO's plan still equals its measured peak.
TEST_F(TrainMpi, FrozenParametersTrainLikeOneRankUnderDdpAndZero) {
  const std::string freeze = "--freeze embed_tokens|layers\\.0\\. ";  // no shell: no quotes
  const nlohmann::json one = train(0, "fone", freeze + "--micro-batch-size 4");
  const nlohmann::json two = train(2, "ftwo", freeze + "--micro-batch-size 2");
  const nlohmann::json zero = train(2, "fzero", freeze + "--micro-batch-size 2 --zero 1");
  ASSERT_FALSE(one.is_null() || two.is_null() || zero.is_null());
  EXPECT_GT(one["frozen_params"].get<std::int64_t>(), 0);
  EXPECT_EQ(two["trainable_params"], one["trainable_params"]);
  expect_same_losses(one, two);
  expect_same_losses(two, zero);
  const nlohmann::json init = train(0, "finit", freeze + "--micro-batch-size 4 --lr 0");
  expect_same_weights("fone", "ftwo", "finit");
  expect_same_weights("ftwo", "fzero", "finit");
  EXPECT_LE(zero["ranks"][0]["optimizer_state_elements"].get<std::int64_t>(),
            one["trainable_params"].get<std::int64_t>() / 2 + 16);
  EXPECT_EQ(zero["ranks"][0]["max_reserved_bytes"], zero["memory_plan"]["total_bytes"]);
}

// --save-every / --resume under mpirun, DDP and ZeRO-1: rank 0 writes the checkpoint (ZeRO-1's
// optimizer shards gathered into the whole flat state, as a one-process checkpoint holds it), and
// 2 ranks resumed from step 2 continue bit for bit: the same losses and the same final weights as
// the uninterrupted run (same ranks, same threads: the same arithmetic in the same order).
TEST_F(TrainMpi, CheckpointsResumeBitForBitUnderDdpAndZero) {
  for (const std::string zero : {"", "--zero 1 "}) {
    const std::string tag = zero.empty() ? "ddp" : "zero";
    const nlohmann::json full = train(2, tag + "full", zero + "--micro-batch-size 2 --save-every 2");
    ASSERT_FALSE(full.is_null());
    const std::string ckpt = path(tag + "full") + "/checkpoint-2";
    ASSERT_TRUE(fs::exists(ckpt + "/model.safetensors")) << ckpt;
    const SafetensorsFile opt = SafetensorsFile::open(ckpt + "/optimizer.safetensors");
    ASSERT_NE(opt.find("exp_avg"), nullptr);
    EXPECT_EQ(opt.find("exp_avg")->numel(), full["trainable_params"].get<std::int64_t>()) << tag;
    const nlohmann::json resumed = train(2, tag + "resumed", zero + "--micro-batch-size 2 --resume " + ckpt);
    ASSERT_FALSE(resumed.is_null());
    EXPECT_EQ(resumed["resumed_from_step"], 2) << tag;
    ASSERT_EQ(resumed["losses"].size(), 2u) << tag;
    ASSERT_EQ(full["losses"].size(), 4u) << tag;
    for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(resumed["losses"][i], full["losses"][i + 2]) << tag << " step " << i + 3;
    EXPECT_EQ(max_weight_diff(tag + "full", tag + "resumed"), 0.0) << tag;
  }
  // A checkpoint of 2 ranks resumed by 1 is refused naming the difference (the data is split by rank).
  const SubprocessResult one = scalelab(0, "train " + kCommon + "--micro-batch-size 2 --resume " + path("ddpfull") +
                                               "/checkpoint-2 --save " + path("one"));
  EXPECT_EQ(one.exit_code(), 2) << one.output;
  EXPECT_NE(one.output.find("world_size"), std::string::npos) << one.output;
}

TEST_F(TrainMpi, GradientAccumulationCommunicatesOnceAndMatches) {
  const nlohmann::json one = train(0, "one", "--micro-batch-size 4 --grad-accum-steps 2");
  const nlohmann::json two = train(2, "two", "--micro-batch-size 2 --grad-accum-steps 2");
  ASSERT_FALSE(one.is_null() || two.is_null());
  expect_same_losses(one, two);
  train(0, "init", "--micro-batch-size 4 --grad-accum-steps 2 --lr 0");
  expect_same_weights("one", "two", "init");
  // One synchronized reduction per optimizer step, not per micro-step.
  const nlohmann::json& d = two["data_parallel"];
  EXPECT_EQ(d["synced_steps"], 4);
  EXPECT_EQ(d["buckets"].get<int>(), 4 * d["buckets_per_step"].get<int>());
}

TEST_F(TrainMpi, OneRankUnderMpirunIsTheSingleProcessRun) {
  const nlohmann::json direct = train(0, "direct", "--micro-batch-size 2");
  const nlohmann::json launched = train(1, "launched", "--micro-batch-size 2");
  ASSERT_FALSE(direct.is_null() || launched.is_null());
  EXPECT_EQ(direct["losses"], launched["losses"]);
  EXPECT_EQ(max_weight_diff("direct", "launched"), 0.0);
  EXPECT_EQ(launched["launcher"], "openmpi");
  EXPECT_EQ(launched["world_size"], 1);
}

TEST_F(TrainMpi, AFailingRankEndsTheJobNamingIt) {
  // Rank 1 cannot read its third micro-batch; the collective timeout (300 s) is far beyond the
  // bound, so only the failure notice can end the job in time.
  const SubprocessResult r =
      scalelab(2, "train " + kCommon + "--micro-batch-size 2 --comm-timeout 300 --json " + path("f.json"),
               {{"SCALELAB_INJECT_DATA_FAULT", "1:2"}});
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("cannot read micro-batch 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[dist] rank 1 failed"), std::string::npos) << r.output;
  std::ifstream in(path("f.json"));
  ASSERT_TRUE(in) << "rank 0 wrote no record";
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["status"], "error");
  EXPECT_NE(j["error"].get<std::string>().find("rank 1 failed"), std::string::npos) << j["error"];
}

TEST_F(TrainMpi, RanksWithDifferentFlagsRefuseNamingTheKey) {
  std::vector<std::string> argv = mpirun_argv();
  for (const char* seq : {"16", "32"}) {
    if (std::string(seq) == "32") argv.push_back(":");
    argv.insert(argv.end(), {"-np", "1", SCALELAB_EXE, "train", "--model", "llama-tiny", "--max-steps", "1",
                             "--threads", "1", "--seq-len", seq});
  }
  SubprocessSpec o;
  o.argv = argv;
  o.timeout_s = kJobBound;
  o.env = {{"OMP_NUM_THREADS", "1"}};
  const SubprocessResult r = run_subprocess(o);
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("rank 1 differs from rank 0 in seq_len (rank 1: 32, rank 0: 16)"), std::string::npos)
      << r.output;
}

TEST_F(TrainMpi, ScaleRecordsEachRankCountAndResultsReproducesTheTable) {
  const std::vector<std::string> m = mpirun_argv();
  const std::string db = path("s.db");
  const std::string flags = "--ranks 1,2 --db " + db + " --name study --mpirun " + m.front() +
                            " --mpirun-arg=--oversubscribe --price-per-device-hour 2 --token-budget 1e6 "
                            "--model llama-tiny --seq-len 16 --max-steps 3 --micro-batch-size 2";
  const SubprocessResult r = scalelab(0, "scale " + flags);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  for (const char* s : {"tokens/s per device", "efficiency %", "Karp–Flatt", "cost per 1M tokens",
                        "shortest time:", "lowest cost:", "lowest energy:"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;

  const SubprocessResult again = scalelab(0, "results --db " + db + " --sweep study --format json");
  ASSERT_TRUE(again.ok()) << again.output;
  const std::string text = again.output.substr(again.output.find('['));
  const nlohmann::json rows = nlohmann::json::parse(text.substr(0, text.rfind(']') + 1));
  ASSERT_EQ(rows.size(), 2u) << again.output;
  EXPECT_EQ(rows[0]["ranks"], 1);
  EXPECT_EQ(rows[1]["ranks"], 2);
  EXPECT_EQ(rows[0]["status"], "ok");
  EXPECT_EQ(rows[1]["status"], "ok");
  EXPECT_DOUBLE_EQ(rows[0]["speedup"].get<double>(), 1.0);
  EXPECT_NEAR(rows[1]["efficiency_pct"].get<double>(), 100.0 * rows[1]["speedup"].get<double>() / 2, 1e-9);
  EXPECT_TRUE(rows[1]["karp_flatt"].is_number());
  EXPECT_TRUE(rows[1]["comm_time_s"].is_number());

  // Run again: both trials are found in the database, not run again.
  const SubprocessResult resumed = scalelab(0, "scale " + flags);
  ASSERT_TRUE(resumed.ok()) << resumed.output;
  EXPECT_EQ(resumed.output.find("running"), std::string::npos) << resumed.output;
}

// --trace under mpirun: a file per rank, the bucket all-reduces on the communication track, their
// launches inside the backward span (the overlap is visible), and one timeline after trace-merge.
TEST_F(TrainMpi, TraceWritesAFilePerRankWithLaunchesInsideBackward) {
  const std::string trace = path("run.trace.json");
  const SubprocessResult r = scalelab(2, "train " + kCommon + "--micro-batch-size 2 --trace " + trace);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = path("run.trace.rank" + std::to_string(rank) + ".json");
    std::ifstream in(file);
    ASSERT_TRUE(in) << file;
    const nlohmann::json t = nlohmann::json::parse(in);
    EXPECT_EQ(t["otherData"]["rank"], rank);
    EXPECT_EQ(t["otherData"]["world_size"], 2);
    std::vector<std::pair<double, double>> backward;
    std::vector<double> launches;
    int allreduce = 0;
    for (const auto& e : t["traceEvents"]) {
      if (e["ph"] != "X") continue;
      EXPECT_EQ(e["pid"], rank);
      const double ts = e["ts"].get<double>(), end = ts + e["dur"].get<double>();
      if (e["cat"] == "phase" && e["name"] == "backward") backward.emplace_back(ts, end);
      if (e["name"] == "all_reduce launch") launches.push_back(ts);
      if (e["name"] == "all_reduce") {
        ++allreduce;
        EXPECT_EQ(e["tid"], 1) << "the communication track";
        EXPECT_GT(e["args"]["bytes"].get<double>(), 0);
      }
    }
    EXPECT_EQ(backward.size(), 4u) << "one backward per step";
    EXPECT_GT(allreduce, 4) << "several buckets per step";
    int inside = 0;
    for (double l : launches)
      for (const auto& [b, e] : backward)
        if (l >= b && l <= e) ++inside;
    EXPECT_GT(inside, 0) << "bucket launches overlap backward";
  }
  const SubprocessResult m = scalelab(0, "trace-merge -o " + path("merged.json") + " " + path("run.trace.rank0.json") +
                                             " " + path("run.trace.rank1.json"));
  ASSERT_TRUE(m.ok()) << m.output;
  const SubprocessResult s = scalelab(0, "profile-summary " + path("merged.json"));
  ASSERT_TRUE(s.ok()) << s.output;
  EXPECT_NE(s.output.find("all_reduce"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("comm_hidden_fraction"), std::string::npos) << s.output;
}

// ZeRO-1 under --trace: its blocking reduce-scatter and update + all-gather on the communication
// track, each under a "zero wait" of the main thread, so the summary counts all of it exposed.
TEST_F(TrainMpi, ZeroTraceShowsItsCollectivesOnTheCommunicationTrack) {
  const std::string trace = path("zero.trace.json");
  const SubprocessResult r = scalelab(2, "train " + kCommon + "--micro-batch-size 2 --zero 1 --trace " + trace);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  std::ifstream in(path("zero.trace.rank1.json"));
  ASSERT_TRUE(in);
  const nlohmann::json t = nlohmann::json::parse(in);
  int scatters = 0, gathers = 0, waits = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["name"] == "reduce_scatter" || e["name"] == "update + all_gather") {
      (e["name"] == "reduce_scatter" ? scatters : gathers)++;
      EXPECT_EQ(e["tid"], 1) << "the communication track";
      EXPECT_GT(e["args"]["bytes"].get<double>(), 0);
    }
    if (e["name"] == "zero wait") {
      ++waits;
      EXPECT_EQ(e["tid"], 0);
    }
  }
  EXPECT_EQ(scatters, 4) << "one per step";
  EXPECT_EQ(gathers, 4);
  EXPECT_EQ(waits, 8);
  const SubprocessResult s = scalelab(0, "profile-summary --all-steps --format json " + path("zero.trace.rank1.json"));
  ASSERT_TRUE(s.ok()) << s.output;
  const nlohmann::json j = nlohmann::json::parse(s.output);
  const double total = j["derived"]["comm_time_s"].get<double>();
  EXPECT_GT(total, 0);
  EXPECT_NEAR(j["derived"]["comm_exposed_s"].get<double>(), total, 1e-9) << "ZeRO-1's collectives block the step";
}

TEST_F(TrainMpi, ScaleDryRunPrintsTheLaunchesWithoutRunning) {
  const std::string db = path("dry.db");
  const SubprocessResult local =
      scalelab(0, "scale --dry-run --ranks 1,4 --db " + db + " --model llama-tiny --seq-len 16");
  ASSERT_TRUE(local.ok()) << local.output;
  EXPECT_NE(local.output.find("-np 4"), std::string::npos) << local.output;
  EXPECT_NE(local.output.find("train --model llama-tiny --seq-len 16"), std::string::npos) << local.output;
  const SubprocessResult slurm = scalelab(0, "scale --dry-run --launcher slurm --ranks 8 --gpus-per-node 4 --db " + db +
                                              " --model llama-tiny --seq-len 16");
  ASSERT_TRUE(slurm.ok()) << slurm.output;
  for (const char* s : {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                        "srun --mpi=pmix", "'train' '--model' 'llama-tiny'"})
    EXPECT_NE(slurm.output.find(s), std::string::npos) << s << "\n" << slurm.output;
  EXPECT_FALSE(fs::exists(db)) << "a dry run must not create the database";
}

// --val-data under mpirun: each rank evaluates its share of the set (the last global micro-batch's
// missing samples masked), the loss sums and token counts are reduced; the result is transformers'
// .loss on the whole set, as with one process (tests/golden/data/textgen).
TEST_F(TrainMpi, ValidationLossOverRanksEqualsOneProcessAndTransformers) {
  const std::string m = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/textgen/llama_gqa_untied";
  std::ifstream ex(m + "/expected.json");
  const auto expected = nlohmann::json::parse(ex);
  const std::string flags = "train --model " + m + " --data " + m + "/val.bin --val-data " + m +
                            "/val.bin --seq-len 12 --micro-batch-size 2 --max-steps 1 --lr 0 --threads 1 --json ";
  nlohmann::json rec[2];
  for (int np : {0, 2}) {
    const std::string json = path("val" + std::to_string(np) + ".json");
    const SubprocessResult r = scalelab(np, flags + json);
    ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
    std::ifstream in(json);
    rec[np / 2] = nlohmann::json::parse(in);
  }
  EXPECT_EQ(rec[1]["world_size"], 2);
  for (const auto& j : rec) {
    ASSERT_EQ(j["evals"].size(), 1u);
    EXPECT_EQ(j["evals"][0]["val_tokens"], 7 * 12);  // 7 samples, each once
    EXPECT_NEAR(j["val_loss"].get<double>(), expected["val_loss"].get<double>(), 1e-5);
  }
  EXPECT_EQ(rec[1]["evals"][0]["val_batches"], 2);  // ceil(7 / (2 ranks x 2)) per rank
}

// DPO under mpirun: 2 ranks x 1 pair take the pairs one rank x 2 pairs takes (disjoint, in file
// order), average the gradients and the step's rewards, and evaluate the held-out pairs each its
// share (rank 1's third micro-batch is past the 5 pairs: not counted); the result is the PyTorch
// reference's (tests/golden/data/dpo/full_eval: micro-batch 2, one process) within 1e-5, DDP and ZeRO-1.
TEST_F(TrainMpi, DpoOverTwoRanksMatchesTheReference) {
  const std::string dir = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/dpo/full_eval";
  std::ifstream ein(dir + "/expected.json");
  const nlohmann::json e = nlohmann::json::parse(ein);
  const std::string flags = "dpo --model " + dir + " --pairs " + dir + "/pairs.jsonl --val-data " + dir +
                            "/pairs_val.jsonl --eval-every 2 --beta 0.1 --micro-batch-size 1 --seq-len 32 "
                            "--max-steps 5 --warmup-steps 1 --lr 0.002 --weight-decay 0.1 --threads 1 --quiet";
  for (const std::string zero : {"", " --zero 1"}) {
    const SubprocessResult r = scalelab(2, flags + zero + " --json " + path("dpo.json"));
    ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
    std::ifstream in(path("dpo.json"));
    const nlohmann::json rec = nlohmann::json::parse(in);
    EXPECT_EQ(rec["world_size"], 2);
    ASSERT_EQ(rec["losses"].size(), e["losses"].size());
    for (std::size_t i = 0; i < rec["losses"].size(); ++i) {
      EXPECT_NEAR(rec["losses"][i].get<double>(), e["losses"][i].get<double>(), 1e-5) << zero << " step " << i + 1;
      EXPECT_NEAR(rec["dpo"]["reward_margins"][i].get<double>(), e["reward_margins"][i].get<double>(), 1e-5) << zero;
      EXPECT_NEAR(rec["dpo"]["reward_accuracies"][i].get<double>(), e["reward_accuracies"][i].get<double>(), 1e-5)
          << zero;
    }
    ASSERT_EQ(rec["evals"].size(), e["evals"].size());
    for (std::size_t i = 0; i < rec["evals"].size(); ++i) {
      const auto& g = rec["evals"][i];
      const auto& w = e["evals"][i];
      EXPECT_EQ(g["val_pairs"], 5);
      EXPECT_EQ(g["val_batches"], 3);  // ceil(5 / (2 ranks x 1)) per rank
      EXPECT_NEAR(g["val_loss"].get<double>(), w["loss"].get<double>(), 1e-5) << zero << " eval " << i;
      EXPECT_NEAR(g["val_reward_margin"].get<double>(), w["reward_margin"].get<double>(), 1e-5) << zero;
      EXPECT_NEAR(g["val_reward_accuracy"].get<double>(), w["reward_accuracy"].get<double>(), 1e-5) << zero;
    }
  }
}

// DPO over ranks against one process. A golden case's flags (tests/golden/data/dpo/<dir>/expected.json)
// with the micro-batch given; LoRA starts from the case's adapter, and the held-out pairs are the
// case's pairs_val.jsonl, else its training pairs (any fixed set serves to compare two runs).
std::string dpo_case_flags(const std::string& dir, std::int64_t micro_batch, std::int64_t steps) {
  std::ifstream in(dir + "/expected.json");
  const nlohmann::json e = nlohmann::json::parse(in);
  const nlohmann::json& t = e["training"];
  auto s = [&](const char* k) { return std::to_string(t[k].get<double>()); };
  auto i = [&](const char* k) { return std::to_string(t[k].get<std::int64_t>()); };
  std::string f = "dpo --model " + dir + " --pairs " + dir + "/pairs.jsonl --beta " +
                  std::to_string(e["beta"].get<double>()) + " --label-smoothing " +
                  std::to_string(e["label_smoothing"].get<double>()) + " --micro-batch-size " +
                  std::to_string(micro_batch) + " --seq-len " + i("seq_len") + " --max-steps " +
                  std::to_string(steps) + " --warmup-steps " + i("warmup_steps") + " --grad-accum-steps " +
                  i("grad_accum_steps") + " --lr " + s("lr") + " --weight-decay " + s("weight_decay") +
                  " --threads 1 --bench-warmup-steps 0 --quiet --eval-every 2 --val-data " + dir +
                  (fs::exists(dir + "/pairs_val.jsonl") ? "/pairs_val.jsonl" : "/pairs.jsonl");
  if (!e["lora"].is_null()) {
    std::string targets;
    for (const auto& x : e["lora"]["targets"]) {
      if (!targets.empty()) targets += ',';
      targets += x.get<std::string>();
    }
    f += " --lora-rank " + std::to_string(e["lora"]["r"].get<int>()) + " --lora-alpha " +
         std::to_string(e["lora"]["alpha"].get<double>()) + " --lora-targets " + targets + " --adapter " + dir +
         "/adapter_init";
  }
  return f;
}

struct DpoMpiCase {
  const char* name;
  const char* golden;      // tests/golden/data/dpo/<golden>
  std::int64_t per_rank;   // the micro-batch of each rank (one process takes ranks x it)
  const char* extra;
  int ranks = 2;
};
// gtest prints the parameter in the test's listing (ctest's name): the case's name, not its bytes.
void PrintTo(const DpoMpiCase& c, std::ostream* os) { *os << c.name; }

class DpoMpi : public TrainMpi, public ::testing::WithParamInterface<DpoMpiCase> {
 protected:
  std::string case_dir() const { return std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/dpo/" + GetParam().golden; }
  nlohmann::json run_dpo(int np, const std::string& flags, const std::string& name) {
    const SubprocessResult r = scalelab(np, flags + " --json " + path(name + ".json") + " --save " + path(name));
    EXPECT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
    std::ifstream in(path(name + ".json"));
    if (!in) {
      ADD_FAILURE() << "no run record " << name;
      return {};
    }
    return nlohmann::json::parse(in);
  }
};

// N ranks x b pairs per micro-step (N = 2; 3 in one case) against 1 process x N·b pairs: the same
// pairs per global micro-step (rank r takes pairs [r·b, (r+1)·b) of each N·b, in file order), the
// rewards' means over the ranks are the means over the N·b pairs, and the held-out pairs are evaluated each once either way (the
// wrapped pair past the end of the set not counted). Tolerance 1e-5 absolute on the loss, rewards,
// margin, accuracy and the evaluations: the two runs differ only in summation order (GEMMs over 2b
// rows against b, the gradient's sum over ranks against the one process's sum over rows). Step 1 is
// exact (policy = reference, z = 0 bit for bit); after it a row's log-probability sums ~10 completion
// tokens of |log p| <= ln V ~ 7 in fp32, each a few ulps (~4e-7 per ulp) off, independently: ~1e-6
// per row (1.7e-5 only if every error aligned), times beta <= 0.5 in z and the rewards; the weights'
// AdamW drift (expect_same_losses above) moves a loss at second order. 1e-5 is also the golden
// tests' tolerance against PyTorch: two scalelab runs must agree at least as well (measured <= 5e-7).
// The accuracy is a mean of 0/1 indicators: equal unless a pair's margin is within rounding of 0.
// The gradient norm: 1e-4 relative (a sum of squares in another order; measured <= 6e-6).
TEST_P(DpoMpi, RanksTrainAndEvaluateLikeOneProcessWithTheirBatchesTogether) {
  const DpoMpiCase c = GetParam();
  const nlohmann::json one = run_dpo(0, dpo_case_flags(case_dir(), c.ranks * c.per_rank, 5) + c.extra, "one");
  const nlohmann::json two = run_dpo(c.ranks, dpo_case_flags(case_dir(), c.per_rank, 5) + c.extra, "two");
  ASSERT_FALSE(one.is_null() || two.is_null());
  EXPECT_EQ(one["world_size"], 1);
  EXPECT_EQ(two["world_size"], c.ranks);
  EXPECT_EQ(two["data_parallel"]["mode"], std::string(c.extra).find("--zero 1") != std::string::npos ? "zero1" : "ddp");
  EXPECT_EQ(two["trainable_params"], one["trainable_params"]);
  ASSERT_EQ(one["losses"].size(), 5u);
  ASSERT_EQ(two["losses"].size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(two["losses"][i].get<double>(), one["losses"][i].get<double>(), 1e-5) << "step " << i + 1;
    for (const char* k : {"rewards_chosen", "rewards_rejected", "reward_margins", "reward_accuracies"})
      EXPECT_NEAR(two["dpo"][k][i].get<double>(), one["dpo"][k][i].get<double>(), 1e-5) << k << " step " << i + 1;
    const double gn = one["grad_norms"][i].get<double>();
    EXPECT_NEAR(two["grad_norms"][i].get<double>(), gn, 1e-4 * gn) << "grad norm, step " << i + 1;
  }
  // The weights moved: the later steps compare trained models, not the initial one.
  EXPECT_GT(std::fabs(one["losses"][4].get<double>() - one["losses"][0].get<double>()), 1e-3);
  // Evaluations after steps 2, 4 and 5 (the last), every held-out pair once.
  ASSERT_EQ(one["evals"].size(), 3u);
  ASSERT_EQ(two["evals"].size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    const auto &a = one["evals"][i], &b = two["evals"][i];
    EXPECT_EQ(b["step"], a["step"]);
    EXPECT_EQ(b["val_pairs"], a["val_pairs"]) << "eval " << i;
    EXPECT_EQ(b["val_batches"], a["val_batches"]) << "eval " << i;
    for (const char* k : {"val_loss", "val_rewards_chosen", "val_rewards_rejected", "val_reward_margin",
                          "val_reward_accuracy"})
      EXPECT_NEAR(b[k].get<double>(), a[k].get<double>(), 1e-5) << k << " eval " << i;
  }
  EXPECT_NEAR(two["val_loss"].get<double>(), one["val_loss"].get<double>(), 1e-5);
}

// --save-every 2 / --resume checkpoint-2 under mpirun -np 2 (3 in one case): the resumed job continues the
// uninterrupted one bit for bit (same ranks, same threads: the same arithmetic in the same order) —
// losses, gradient norms, rewards, the evaluations after the checkpoint and the saved model or
// adapter. Under full fine-tuning each rank rebuilds the reference from --model (checked against
// the CRC-32 in the checkpoint: a changed --model is refused); ZeRO-1's optimizer shards are gathered into the checkpoint and
// scattered again on resume. A multi-rank DPO checkpoint resumed by one process is refused (the pairs
// are split by rank).
// A DPO rank that fails mid-run (rank 1 cannot read its third micro-batch of pairs) ends the job
// naming it, within the bound, and rank 0's record says so (as TrainMpi.AFailingRankEndsTheJobNamingIt
// for SFT): the other rank waits in the gradient all-reduce, and only the failure notice ends it in time.
TEST_F(TrainMpi, AFailingDpoRankEndsTheJobNamingIt) {
  const std::string golden = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/dpo/";
  for (const std::string c : {"full_eval", "lora_qv_smoothing"}) {
    const std::string json = path(c + ".json");
    const SubprocessResult r = scalelab(2, dpo_case_flags(golden + c, 1, 5) + " --comm-timeout 300 --json " + json,
                                        {{"SCALELAB_INJECT_DATA_FAULT", "1:2"}});
    EXPECT_FALSE(r.timed_out) << c << "\n" << r.output;
    EXPECT_FALSE(r.ok()) << c << "\n" << r.output;
    EXPECT_NE(r.output.find("cannot read micro-batch 2 of pairs"), std::string::npos) << c << "\n" << r.output;
    EXPECT_NE(r.output.find("on rank 1"), std::string::npos) << c << "\n" << r.output;
    EXPECT_NE(r.output.find("[dist] rank 1 failed"), std::string::npos) << c << "\n" << r.output;
    std::ifstream in(json);
    ASSERT_TRUE(in) << c << ": rank 0 wrote no record";
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["status"], "error") << c;
    EXPECT_NE(j["error"].get<std::string>().find("rank 1 failed"), std::string::npos) << c << ": " << j["error"];
  }
}

class DpoMpiResume : public DpoMpi {};

TEST_P(DpoMpiResume, CheckpointsResumeBitForBit) {
  const DpoMpiCase c = GetParam();
  const std::string flags = dpo_case_flags(case_dir(), c.per_rank, 5) + c.extra;
  const nlohmann::json full = run_dpo(c.ranks, flags + " --save-every 2", "full");
  ASSERT_FALSE(full.is_null());
  const std::string ckpt = path("full") + "/checkpoint-2";
  ASSERT_TRUE(fs::exists(ckpt + "/trainer_state.json")) << ckpt;
  const nlohmann::json resumed = run_dpo(c.ranks, flags + " --resume " + ckpt, "resumed");
  ASSERT_FALSE(resumed.is_null());
  EXPECT_EQ(resumed["resumed_from_step"], 2);
  EXPECT_EQ(resumed["world_size"], c.ranks);
  ASSERT_EQ(full["losses"].size(), 5u);
  ASSERT_EQ(resumed["losses"].size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed["losses"][i].get<double>(), full["losses"][i + 2].get<double>()) << "step " << i + 3;
    EXPECT_EQ(resumed["grad_norms"][i].get<double>(), full["grad_norms"][i + 2].get<double>()) << "step " << i + 3;
    for (const char* k : {"rewards_chosen", "rewards_rejected", "reward_margins", "reward_accuracies"})
      EXPECT_EQ(resumed["dpo"][k][i].get<double>(), full["dpo"][k][i + 2].get<double>()) << k << " step " << i + 3;
  }
  ASSERT_EQ(full["evals"].size(), 3u);
  ASSERT_EQ(resumed["evals"].size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    nlohmann::json a = full["evals"][i + 1], b = resumed["evals"][i];
    a.erase("seconds");
    b.erase("seconds");
    EXPECT_EQ(a, b) << "eval " << i;
  }
  const bool lora = flags.find("--lora-rank") != std::string::npos;
  const std::string saved = lora ? "/adapter_model.safetensors" : "/model.safetensors";
  auto bytes = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string a = bytes(path("full") + saved), b = bytes(path("resumed") + saved);
  EXPECT_FALSE(a.empty()) << saved;
  EXPECT_TRUE(a == b) << "the saved result " << saved;

  const SubprocessResult alone = scalelab(0, flags + " --resume " + ckpt + " --save " + path("alone"));
  EXPECT_EQ(alone.exit_code(), 2) << alone.output;
  EXPECT_NE(alone.output.find("world_size"), std::string::npos) << alone.output;

  if (std::string(c.name) != "llama_full") return;
  // Full fine-tuning rebuilds the reference from --model on each rank: a model with the same config
  // and one weight changed is refused by the checksum (exit 2, the job ended by mpirun).
  const std::string other = path("other");
  fs::create_directories(other);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json"})
    fs::copy_file(case_dir() + "/" + f, other + "/" + f);
  {
    const std::string file = other + "/model.safetensors";
    std::size_t at = 0;
    {
      const SafetensorsFile f = SafetensorsFile::open(file);
      const SafetensorsTensor* t = f.find("model.layers.1.mlp.down_proj.weight");
      ASSERT_NE(t, nullptr);
      std::uint64_t header = 0;
      std::ifstream in(file, std::ios::binary);
      in.read(reinterpret_cast<char*>(&header), 8);  // the header's length (little-endian)
      at = 8 + header + t->begin;
    }
    std::fstream out(file, std::ios::in | std::ios::out | std::ios::binary);
    const float v = 0.5f;
    out.seekp(static_cast<std::streamoff>(at));
    out.write(reinterpret_cast<const char*>(&v), 4);
  }
  std::string moved = flags;
  moved.replace(moved.find("--model " + case_dir()), 8 + case_dir().size(), "--model " + other);
  const SubprocessResult refused = scalelab(2, moved + " --resume " + ckpt + " --save " + path("refused"));
  EXPECT_FALSE(refused.timed_out) << refused.output;
  EXPECT_EQ(refused.exit_code(), 2) << refused.output;
  EXPECT_NE(refused.output.find("the DPO reference model (the initial weights) rebuilt from --model"),
            std::string::npos)
      << refused.output;
}

// fp32 compute (the cases compared with one process).
std::vector<DpoMpiCase> dpo_fp32_cases() {
  return {{"llama_full", "full_eval", 1, ""},
          {"llama_full_zero1", "full_eval", 1, " --zero 1"},
          {"llama_full_accum2", "full_accum2", 1, ""},
          {"llama_lora", "lora_qv_smoothing", 2, ""},
          {"llama_qlora", "lora_qv_smoothing", 2, " --quantize-base nf4-bnb"},
          {"llama_lora_zero1", "lora_qv_smoothing", 2, " --zero 1"},
          {"opt_lora", "opt_lora_eval", 2, ""},
          {"opt_full_accum2", "opt_full_eval", 1, ""},
          // 3 ranks: 8 training pairs wrap around mid micro-batch, 5 held-out pairs leave rank 1 and 2
          // a last micro-batch past the set (not counted).
          {"opt_lora_3ranks", "opt_lora_eval", 1, "", 3}};
}
auto dpo_case_name = [](const ::testing::TestParamInfo<DpoMpiCase>& i) { return std::string(i.param.name); };
INSTANTIATE_TEST_SUITE_P(Cases, DpoMpi, ::testing::ValuesIn(dpo_fp32_cases()), dpo_case_name);

// Resume adds bf16 autocast (bit for bit needs no tolerance). Not compared with one process: bf16
// rounds every matmul's output to 8 bits, so a rounding-level difference of two fp32 accumulations
// can become a bf16 ulp (2^-8 relative) — measured 1.9e-5 on the loss (Llama full), no bound derived.
std::vector<DpoMpiCase> dpo_resume_cases() {
  std::vector<DpoMpiCase> v = dpo_fp32_cases();
  v.push_back({"llama_full_bf16", "full_eval", 1, " --mixed-precision bf16"});
  v.push_back({"llama_lora_bf16", "lora_qv_smoothing", 2, " --mixed-precision bf16"});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Cases, DpoMpiResume, ::testing::ValuesIn(dpo_resume_cases()), dpo_case_name);

#endif  // SCALELAB_MPIRUN

}  // namespace
}  // namespace scalelab
