#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace scalelab {

LrSchedule parse_lr_schedule(const std::string& name) {
  if (name == "linear") return LrSchedule::kLinear;
  if (name == "cosine") return LrSchedule::kCosine;
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "constant_with_warmup") return LrSchedule::kConstantWithWarmup;
  throw InvalidInput("[--lr-scheduler] unknown schedule '" + name +
                     "' — use linear, cosine, constant or constant_with_warmup");
}

const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::kLinear: return "linear";
    case LrSchedule::kCosine: return "cosine";
    case LrSchedule::kConstant: return "constant";
    case LrSchedule::kConstantWithWarmup: return "constant_with_warmup";
  }
  return "?";
}

double lr_factor(LrSchedule s, std::int64_t step, std::int64_t warmup, std::int64_t total) {
  const double k = static_cast<double>(step), W = static_cast<double>(warmup), N = static_cast<double>(total);
  if (s == LrSchedule::kConstant) return 1.0;
  if (step < warmup) return k / std::max(1.0, W);
  switch (s) {
    case LrSchedule::kLinear: return std::max(0.0, (N - k) / std::max(1.0, N - W));
    case LrSchedule::kCosine: {
      const double progress = (k - W) / std::max(1.0, N - W);
      return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * 0.5 * 2.0 * progress)));
    }
    default: return 1.0;
  }
}

}  // namespace scalelab
