// Checkpoints during training: --save-every writes an HF-loadable directory plus the optimizer and
// trainer state; --resume continues bit for bit (same thread count); --save-total-limit rotates;
// resuming under another model or configuration is refused naming what differs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/checkpoint.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

namespace fs = std::filesystem;

// Temporary name + rename: the tests of this file run as concurrent processes (ctest) sharing
// the name, and rewriting the file in place under one that has it mapped kills it with SIGBUS.
std::string token_file(const std::string& name) {
  const std::string path = testing::TempDir() + name;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    for (std::uint32_t i = 0; i < 4000; ++i) {
      const std::uint32_t t = (i * 7 + i / 13) % 101;
      out.write(reinterpret_cast<const char*>(&t), 4);
    }
  }
  fs::rename(tmp, path);
  return path;
}

TrainOptions base(const std::string& save) {
  TrainOptions o;
  o.model = "llama-tiny";
  o.seq_len = 16;
  o.micro_batch_size = 2;
  o.grad_accum_steps = 2;
  o.max_steps = 7;
  o.warmup_steps = 2;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.quiet = true;
  o.threads = 2;
  o.data = token_file("resume_tokens.bin");
  o.save = save;
  return o;
}

void expect_continuation(TrainOptions o, std::int64_t k) {
  const std::string root = o.save;
  fs::remove_all(root);
  o.save_every = k;
  const TrainResult full = run_training(o);
  ASSERT_EQ(full.status, RunStatus::kOk) << full.error;
  ASSERT_EQ(full.steps.size(), static_cast<std::size_t>(o.max_steps));
  const std::string ck = root + "/checkpoint-" + std::to_string(k);
  ASSERT_TRUE(fs::exists(ck + "/config.json"));
  ASSERT_TRUE(fs::exists(ck + "/model.safetensors"));
  ASSERT_TRUE(fs::exists(ck + "/optimizer.safetensors"));
  ASSERT_TRUE(fs::exists(ck + "/trainer_state.json"));
  TrainOptions r = o;
  r.save_every = 0;
  r.save = root + "/resumed";
  r.resume = ck;
  const TrainResult cont = run_training(r);
  ASSERT_EQ(cont.status, RunStatus::kOk) << cont.error;
  EXPECT_EQ(cont.resumed_from_step, k);
  ASSERT_EQ(cont.steps.size(), static_cast<std::size_t>(o.max_steps - k));
  for (std::size_t i = 0; i < cont.steps.size(); ++i) {
    EXPECT_EQ(cont.steps[i].loss, full.steps[static_cast<std::size_t>(k) + i].loss) << "step " << k + 1 + i;
    EXPECT_EQ(cont.steps[i].grad_norm, full.steps[static_cast<std::size_t>(k) + i].grad_norm) << "step " << k + 1 + i;
    EXPECT_EQ(cont.steps[i].lr, full.steps[static_cast<std::size_t>(k) + i].lr) << "step " << k + 1 + i;
  }
}

TEST(Resume, ContinuesBitForBit) { expect_continuation(base(testing::TempDir() + "resume_fp32"), 3); }

TEST(Resume, ContinuesBitForBitInBf16WithStochasticRounding) {
  TrainOptions o = base(testing::TempDir() + "resume_bf16");
  o.model_precision = "bf16";
  expect_continuation(o, 4);
}

TEST(Resume, ContinuesBitForBitWithMixedPrecisionAndDropout) {
  TrainOptions o = base(testing::TempDir() + "resume_opt");
  o.model = "opt-tiny";
  o.mixed_precision = "bf16";
  o.dropout = 0.1;
  expect_continuation(o, 2);
}

TEST(Resume, CheckpointIsAHuggingFaceDirectoryAndRotates) {
  TrainOptions o = base(testing::TempDir() + "resume_rotate");
  fs::remove_all(o.save);
  o.save_every = 2;
  o.save_total_limit = 2;
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.status, RunStatus::kOk);
  EXPECT_EQ(r.checkpoints.size(), 3u);  // steps 2, 4, 6
  EXPECT_FALSE(fs::exists(o.save + "/checkpoint-2"));
  EXPECT_TRUE(fs::exists(o.save + "/checkpoint-4"));
  EXPECT_TRUE(fs::exists(o.save + "/checkpoint-6"));
  for (const auto& e : fs::directory_iterator(o.save))  // no temporary left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  // The checkpoint loads as a model directory (the engine's own loader reads what transformers
  // reads: config.json + model.safetensors).
  TrainOptions from = base(testing::TempDir() + "resume_from_ck");
  from.model = o.save + "/checkpoint-6";
  from.max_steps = 1;
  from.save.clear();
  EXPECT_EQ(run_training(from).status, RunStatus::kOk);
}

TEST(Resume, AnotherConfigurationIsRefusedNamingWhatDiffers) {
  TrainOptions o = base(testing::TempDir() + "resume_refuse");
  fs::remove_all(o.save);
  o.save_every = 2;
  o.max_steps = 4;
  ASSERT_EQ(run_training(o).status, RunStatus::kOk);
  auto expect_refused = [&](TrainOptions r, const std::string& what, const std::string& ck = "checkpoint-2") {
    r.save_every = 0;
    r.save.clear();
    r.resume = o.save + "/" + ck;
    try {
      run_training(r);
      FAIL() << "resume with another " << what << " must be refused";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  TrainOptions a = o;
  a.seq_len = 8;
  expect_refused(a, "seq_len 16 in the checkpoint, 8 now");
  TrainOptions b = o;
  b.model = "opt-tiny";
  expect_refused(b, "model_family");
  TrainOptions c = o;
  c.lr = 1e-3;
  expect_refused(c, "lr");
  TrainOptions d = o;
  d.max_steps = 2;  // the schedule would change
  expect_refused(d, "max_steps 4 in the checkpoint, 2 now");
  expect_refused(o, "nothing left to run", "checkpoint-4");  // the last step's checkpoint
  TrainOptions e = o;
  e.resume = o.save;  // the root, not a checkpoint
  e.save_every = 0;
  e.save.clear();
  EXPECT_THROW(run_training(e), InvalidInput);
  TrainOptions f = o;
  f.save_every = 2;
  f.save.clear();
  EXPECT_THROW(run_training(f), InvalidInput);  // --save-every without --save
}

}  // namespace
}  // namespace scalelab
