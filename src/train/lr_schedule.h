#pragma once
// Learning-rate schedules exactly as transformers defines them (get_scheduler), evaluated at the
// optimizer step index (0-based): the LR used by step k is lr · factor(k).
//   linear:               warmup k/W, then max(0, (N − k) / (N − W))
//   cosine:               warmup k/W, then max(0, ½(1 + cos(π · (k − W)/(N − W))))
//   constant:             1 (transformers' "constant" ignores warmup)
//   constant_with_warmup: warmup k/W, then 1
// With warmup, step 0 has LR 0.
#include <cstdint>
#include <string>

namespace scalelab {

enum class LrSchedule { kLinear, kCosine, kConstant, kConstantWithWarmup };

LrSchedule parse_lr_schedule(const std::string& name);  // throws InvalidInput listing the names
const char* lr_schedule_name(LrSchedule s);
double lr_factor(LrSchedule s, std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps);

}  // namespace scalelab
