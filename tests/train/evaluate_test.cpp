// Validation during training (--val-data, --eval-every, --eval-batches): the trajectory is the same
// bit for bit with and without it; the whole set counts each target once; the record carries it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

// Written under a temporary name, then renamed: ctest runs these tests as concurrent processes
// that share the file names, and rewriting a file in place under a process that has it mapped
// kills that process with SIGBUS; a rename leaves the mapped file intact.
std::string token_file(const std::string& name, std::uint32_t n, std::uint32_t period, std::uint32_t mult) {
  const std::string path = testing::TempDir() + name;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint32_t t = (i * mult) % period;
      out.write(reinterpret_cast<const char*>(&t), 4);
    }
  }
  std::filesystem::rename(tmp, path);
  return path;
}

TrainOptions tiny() {
  TrainOptions o;
  o.model = "llama-tiny";
  o.seq_len = 16;
  o.micro_batch_size = 2;
  o.max_steps = 6;
  o.lr = 3e-3;
  o.lr_scheduler = "constant";
  o.quiet = true;
  o.threads = 2;
  o.data = token_file("eval_train.bin", 17 * 64, 17, 1);
  return o;
}

TEST(Evaluation, LeavesTheTrainingTrajectoryBitForBit) {
  TrainOptions plain = tiny();
  TrainOptions with = tiny();
  with.val_data = token_file("eval_val.bin", 17 * 10 + 3, 17, 3);
  with.eval_every = 1;
  with.eval_batches = 2;
  const TrainResult a = run_training(plain), b = run_training(with);
  ASSERT_EQ(a.status, RunStatus::kOk);
  ASSERT_EQ(b.status, RunStatus::kOk);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << i;
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << i;
  }
  ASSERT_EQ(b.evals.size(), 6u);  // every step; the last step is not evaluated twice
  for (std::size_t i = 0; i < b.evals.size(); ++i) {
    EXPECT_EQ(b.evals[i].step, static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(b.evals[i].tokens, 2 * 2 * 16);  // --eval-batches 2 of micro-batch 2
    EXPECT_DOUBLE_EQ(b.evals[i].perplexity, std::exp(b.evals[i].loss));
  }
  const auto j = b.to_json();
  EXPECT_EQ(j["val_loss"].get<double>(), b.evals.back().loss);
  EXPECT_EQ(j["evals"].size(), 6u);
  EXPECT_TRUE(a.to_json()["val_loss"].is_null());
}

TEST(Evaluation, EveryNStepsAndAtTheEnd) {
  TrainOptions o = tiny();
  o.max_steps = 5;
  o.val_data = token_file("eval_val2.bin", 17 * 10, 17, 3);
  o.eval_every = 2;
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.evals.size(), 3u);  // after steps 2, 4 and the last (5)
  EXPECT_EQ(r.evals[0].step, 2);
  EXPECT_EQ(r.evals[1].step, 4);
  EXPECT_EQ(r.evals[2].step, 5);
  // The whole set (--eval-batches 0): 170 tokens hold 10 samples of 17; each target counts once.
  EXPECT_EQ(r.evals[2].tokens, 10 * 16);
  EXPECT_EQ(r.evals[2].batches, 5);
}

TEST(Evaluation, TokenWeightedMeanDoesNotDependOnTheMicroBatch) {
  // 7 samples: micro-batches of 1, 2 (last one half masked) and 4 see the same tokens; the
  // token-weighted mean is then the same number up to fp32 rounding of the per-batch means.
  TrainOptions o = tiny();
  o.max_steps = 1;
  o.lr = 0;
  o.val_data = token_file("eval_val3.bin", 17 * 7 + 5, 23, 5);
  double first = 0;
  for (std::int64_t mb : {1, 2, 4}) {
    o.micro_batch_size = mb;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.evals.size(), 1u);
    EXPECT_EQ(r.evals[0].tokens, 7 * 16);
    if (mb == 1) first = r.evals[0].loss;
    // A mean of 112 fp32 per-token losses summed in another grouping: ~1e-6 relative at most.
    EXPECT_NEAR(r.evals[0].loss, first, 1e-5 * first) << mb;
  }
}

TEST(Evaluation, BadFlagsAreInvalidInput) {
  TrainOptions o = tiny();
  o.eval_every = 2;  // without --val-data
  EXPECT_THROW(run_training(o), InvalidInput);
  o = tiny();
  o.eval_batches = -1;
  o.val_data = o.data;
  EXPECT_THROW(run_training(o), InvalidInput);
  o = tiny();
  o.val_data = token_file("eval_short.bin", 10, 17, 1);  // shorter than one sample of 17
  try {
    run_training(o);
    FAIL() << "a validation set shorter than one sample must be refused";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--val-data"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("eval_short.bin"), std::string::npos) << e.what();
  }
  o.val_data = "synthetic";  // endless: the whole set is undefined without --eval-batches
  EXPECT_THROW(run_training(o), InvalidInput);
  o.eval_batches = 2;
  EXPECT_EQ(run_training(o).evals.size(), 1u);
}

}  // namespace
}  // namespace scalelab
