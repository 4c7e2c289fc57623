#pragma once
// Scaling curves (#2): speedup and parallel efficiency against batch size and against sequence
// length, a line per device count and a facet per model, with the Karp–Flatt serial fraction, the
// cost per token and the energy per token of every configuration, and their distribution per
// model x device count. Data "ready to facet": one row per configuration that has a speedup (the
// frame's scaling columns: the sweep varies a numeric `ranks` parameter), with
//   model            the `model` parameter ("all" when the sweep has one model)
//   devices          ranks
//   micro_batch_size, seq_len   the x axes (NaN when the sweep does not vary them: the column is
//                    constant and dropped); global_batch = micro_batch_size x ranks x
//                    grad_accum_steps (the sweep's value when it is constant, 1 when absent)
//   series           "<devices> devices" plus the other varying parameters, so a line joins rows
//                    that differ only on the x axis
// and the numbers, per configuration (repeats averaged):
//   speedup S = T(n)/T(b), efficiency_pct = 100 S/p, karp_flatt = (1/S - 1/p)/(1 - 1/p) for p = n/b > 1
//       (T the total tokens/s, b the fewest ranks with the same other parameters: analysis/frame.h)
//   cost_per_million_tokens = price x n / (3600 T(n)) x 10^6, price per GPU-hour from
//       --price-per-gpu-hour, else the scale study's stored --price-per-device-hour; none without
//   j_per_token = P / T(n) per trial, averaged over the repeats: P = the sum over devices of each
//       device's mean power over the steady window, the trapezoid integral of its power samples
//       (NVML's power_w, else nvidia-smi's) over t >= t0 + 0.1 (t1 - t0) of that device's series
//       (all samples when it has fewer than 10) divided by their time span. A trial without power
//       samples, or a device with fewer than 2 steady samples, has no energy figure.
// Summary per model x device count over the configurations: efficiency min, q25, median, q75, max
// (numpy's linear quantiles), the median speedup, Karp–Flatt, cost and energy.
#include <optional>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "lab/store.h"

namespace scalelab::analysis {

// Energy per token of one trial from its samples (see above); nullopt with the reason in `why`.
std::optional<double> trial_j_per_token(const std::vector<lab::TelemetrySample>& samples, double tokens_per_s, std::string* why = nullptr);

struct ScalingCurveInputs {
  std::vector<double> j_per_token;             // per frame row; NaN: none
  std::optional<double> price_per_gpu_hour;
  std::string price_source;                    // where the price came from (for the JSON and docs)
  std::vector<std::string> energy_notes;       // why some rows have no energy figure
  double grad_accum_steps = 1;                 // when the table has no grad_accum_steps column (constant over the sweep)
};

// Adds "scaling_curves" to analysis.json, scaling_curves.csv, scaling_summary.csv and a Markdown
// section when the frame has scaling columns; otherwise does nothing.
void add_scaling_curves(Analysis& a, const Frame& frame, const ScalingCurveInputs& inputs);

// The same for a sweep of the database: J/token from its telemetry (the trials of each row), the
// price from `price_per_gpu_hour` or the sweep's stored spec.
void add_scaling_curves(Analysis& a, const Frame& frame, const lab::ResultsStore& store, const std::string& sweep,
                        std::optional<double> price_per_gpu_hour);

}  // namespace scalelab::analysis
