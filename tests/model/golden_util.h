#pragma once
// The golden cases of tests/golden/data: where they are and the training options they were made
// with (from expected.json), shared by the golden and the switch tests.
#include <string>

#include "model_test_util.h"
#include "train/trainer.h"

namespace scalelab {

inline std::string golden_dir(const std::string& name) {
  return testing::source_dir() + "/tests/golden/data/" + name;
}

// The run that produced the golden trajectory: model, token file and every optimizer setting.
inline TrainOptions golden_train_options(const std::string& dir) {
  const auto expected = testing::read_json(dir + "/expected.json");
  const auto& tr = expected["training"];
  TrainOptions o;
  o.model = dir;
  o.data = dir + "/tokens.bin";
  o.seq_len = tr["seq_len"];
  o.micro_batch_size = tr["micro_batch_size"];
  o.grad_accum_steps = tr["grad_accum_steps"];
  o.max_steps = tr["max_steps"];
  o.warmup_steps = tr["warmup_steps"];
  o.lr = tr["lr"];
  o.lr_scheduler = tr["lr_scheduler"];
  o.weight_decay = tr["weight_decay"];
  o.adam_beta1 = tr["adam_beta1"];
  o.adam_beta2 = tr["adam_beta2"];
  o.adam_epsilon = tr["adam_epsilon"];
  o.max_grad_norm = tr["max_grad_norm"];
  o.freeze = tr.value("freeze", "");  // requires_grad=False on the matching names
  o.quiet = true;
  o.device = testing::test_device_name();  // SCALELAB_TEST_DEVICE (cpu by default)
  return o;
}

}  // namespace scalelab
