#pragma once
// The optimization ladder: from an unoptimized baseline (fp32 weights, no mixed precision, eager
// attention, unfused kernels) up one switch at a time, reinvesting freed memory in a larger
// micro-batch, each step measured with real trials:
//   baseline -> its OOM limit -> bf16 mixed precision -> full bf16 -> larger batch
//   -> flash attention -> larger batch -> fused kernels -> larger batch
// A switch rung runs at the micro-batch inherited from the rung before; if that no longer fits
// it searches down. A "larger batch" rung runs the OOM search (lab/oom_search.h). A rung whose
// switch the workload refuses (exit code 2) or cannot express (an external command without the
// placeholder) is "n/a" with the reason, and the ladder goes on without it.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lab/executor.h"
#include "lab/oom_search.h"
#include "lab/table.h"

namespace scalelab::lab {

// The parameters the ladder controls; a user may not set them (micro_batch_size: the baseline's).
extern const std::vector<std::string> kLadderParameters;  // micro_batch_size, model_precision, ...

struct RungSpec {
  std::string name;
  ParamMap set;         // parameters this rung switches (empty for the baseline / search rungs)
  bool search = false;  // re-search the largest micro-batch
};
std::vector<RungSpec> default_rungs();
// The baseline's values of the switched parameters.
ParamMap ladder_baseline();

// How a rung ended: measured, nothing fits, failed, or not applicable (already in effect, not
// expressible by the workload, refused by it). Named "ok", "oom", "error", "n/a" in JSON and tables.
enum class RungStatus { kOk, kOom, kError, kNotApplicable };
const char* rung_status_name(RungStatus s);
// nullopt for a name that is not a rung status.
std::optional<RungStatus> parse_rung_status(const std::string& name);

struct RungResult {
  std::string name;
  RungStatus status = RungStatus::kError;
  std::string note;    // why n/a / error, or what happened (batch lowered, limit verified)
  ParamMap params;     // the configuration measured (with micro_batch_size)
  int micro_batch_size = 0;
  std::optional<std::int64_t> trial_id;  // the measurement
  std::optional<int> plan_estimate;
};

struct LadderResult {
  std::vector<RungResult> rungs;
  Json to_json() const;
  static LadderResult from_json(const Json& j);
};

struct LadderRequest {
  ParamMap base;                 // the workload's fixed parameters (model, seq_len, device_memory, ...)
  int start_micro_batch = 1;     // the baseline's micro-batch
  int max_micro_batch = 4096;
  bool use_plan = true;
  std::vector<RungSpec> rungs = default_rungs();
  // Called after each rung with the rungs so far (to store partial results).
  std::function<void(const LadderResult&)> on_rung;
};

LadderResult run_ladder(TrialExecutor& exec, const LadderRequest& request, const PlanFn& plan);

// The seeds' table: rung, devices, micro-batch, model precision, mixed precision, attention,
// fused, tokens/s/device, memory GiB, speedup over the baseline, note; its notes name the largest
// single jump between consecutive measured rungs. Metrics come from the trials in `store`, so the
// table is reproducible from the database alone.
Table ladder_table(const LadderResult& ladder, const ResultsStore& store);

}  // namespace scalelab::lab
