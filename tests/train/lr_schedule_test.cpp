#include "train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace scalelab {
namespace {

TEST(LrSchedule, LinearWithWarmupAsTransformers) {
  // get_linear_schedule_with_warmup(num_warmup_steps=2, num_training_steps=10)
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kLinear, 0, 2, 10), 0.0);
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kLinear, 1, 2, 10), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kLinear, 2, 2, 10), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kLinear, 6, 2, 10), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kLinear, 10, 2, 10), 0.0);
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kLinear, 0, 0, 10), 1.0);
}

TEST(LrSchedule, CosineAndConstant) {
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kCosine, 0, 2, 10), 0.0);
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kCosine, 2, 2, 10), 1.0);
  EXPECT_NEAR(lr_factor(LrSchedule::kCosine, 6, 2, 10), 0.5, 1e-12);
  EXPECT_NEAR(lr_factor(LrSchedule::kCosine, 10, 2, 10), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kConstant, 0, 5, 10), 1.0);  // transformers ignores warmup here
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kConstantWithWarmup, 1, 4, 10), 0.25);
  EXPECT_DOUBLE_EQ(lr_factor(LrSchedule::kConstantWithWarmup, 7, 4, 10), 1.0);
  EXPECT_THROW(parse_lr_schedule("step"), InvalidInput);
}

}  // namespace
}  // namespace scalelab
