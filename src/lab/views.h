#pragma once
// The tables `scalelab results` prints, built from the database alone: the list of sweeps, a
// sweep's summary (one row per configuration, repeats as median / min / max), raw trials, an OOM
// search, a ladder, and telemetry samples. Filters ("status=ok", "micro_batch_size>=4") select
// trials (or, for a ladder, rungs) by any column, parameter or metric.
#include <map>
#include <string>
#include <vector>

#include "lab/store.h"
#include "lab/table.h"

namespace scalelab::lab {

struct Filter {
  std::string key;
  std::string op;  // = != < <= > >=
  std::string value;
};
// "key=value", "key!=value", "key>=4", ... InvalidInput on anything else.
Filter parse_filter(const std::string& text);
// Numbers compare as numbers, anything else as text; a missing key matches only "!=".
bool filter_matches(const Json& object, const Filter& f);
// Keeps the objects matching every filter. InvalidInput when a filter's key is in none of them
// (a typo), listing the keys there are.
std::vector<Json> apply_filters(const std::vector<Json>& objects, const std::vector<Filter>& filters);

// A trial as one flat object: its columns, then its parameters, then its metrics
// (tokens_per_s_per_device, max_reserved_gib, ...), then "memory_gib" for tables.
Json flatten_trial(const TrialRow& row);

// [presets.NAME] of a sweep's spec: each preset parameter (e.g. `method`) and the parameters its
// values stand for (lora_rank, lora_alpha, quantize_base, ...), in name order; empty without
// presets.
std::map<std::string, std::vector<std::string>> preset_parameters(const SweepRow& sweep);
// Folds a table's columns of parameters a preset stands for: the preset's own column (its label,
// e.g. method=lora) stays, theirs are marked `folded` — left out of the Markdown table, kept in
// CSV and JSON — and a note names them. Tables of sweeps without presets are unchanged.
void fold_preset_columns(Table& t, const SweepRow& sweep);

Table sweeps_table(const ResultsStore& store);
// One row per trial. Parameter columns: those that vary among `rows` (before filtering), the
// ones in `param_order` first.
Table trials_table(const std::vector<TrialRow>& rows, const std::vector<Filter>& filters,
                   const std::vector<std::string>& param_order = {});
// One row per configuration of the sweep (in trial order), repeats aggregated.
Table summary_table(const std::vector<TrialRow>& rows, const std::vector<Filter>& filters,
                    const std::vector<std::string>& param_order = {});
// The trials of a sweep's current configurations: its stored membership (spec order, repeats below
// the spec's), so not an [oom_search]'s probes nor configurations a later spec dropped; every trial
// of the sweep when it stores no membership (an older database, a ladder, an OOM search).
std::vector<TrialRow> member_trials(const SweepRow& sweep, const ResultsStore& store);
// A sweep's summary: its current configurations (the stored membership, in spec order, with
// repeats below the spec's), parameters in spec order, a preset's parameters folded into its label.
Table sweep_summary_table(const SweepRow& sweep, const ResultsStore& store, const std::vector<Filter>& filters);
// The parameter order a sweep's spec gives (its "parameter_order"), or none.
std::vector<std::string> parameter_order(const SweepRow& sweep);
// The probes of an OOM search and its conclusion (from the sweep's stored result).
Table oom_search_table(const SweepRow& sweep, const ResultsStore& store, const std::vector<Filter>& filters);
// A ladder sweep's rungs (lab/ladder.h), filtered by rung columns.
Table ladder_sweep_table(const SweepRow& sweep, const ResultsStore& store, const std::vector<Filter>& filters);
Table telemetry_table(const std::vector<TelemetrySample>& samples);
// One row per trial run with `--profile` (its record holds the engine's op-family summary): the
// varying parameters, the median step time and each op family's share of the measured steps, the
// families in columns ordered by their total time over the trials, so trials compare side by side.
// A note counts the trials without a profile.
// External trials profiled with [workload] profile = "nsys" / "torch" show their GPU kernels
// instead (the 8 with the most time over the trials).
Table profile_table(const std::vector<TrialRow>& rows, const std::vector<Filter>& filters,
                    const std::vector<std::string>& param_order);
// One row per trial (profiled or not): its parameters, throughput, its profile's status
// ("ok", "failed", "skipped", "none") and the derived figures of its summary side by side —
// launch_api_s, sync_api_s, memcpy_htod_s, nccl_kernel_s (nsys), device_idle_fraction (PyTorch),
// step_time_median_s, op_time_fraction_of_steps (native), communication hidden / exposed — and a
// failed profile's reason. `with_sweep`: a sweep column (trials of several sweeps). Filters see
// the figures and "profile", "profile_tool", "profile_reason" too.
Table profile_compare_table(const std::vector<TrialRow>& rows, const std::vector<Filter>& filters,
                            const std::vector<std::string>& param_order, bool with_sweep);

// One row per trial: its varying parameters, trainable parameters, step time, throughput,
// validation loss, measured and planned peak, and the plan's parts at the peak (weights, gradients,
// optimizer states, activations, ... — the run record's memory plan, stored as plan_<part>_bytes
// metrics), so methods (full fine-tuning, LoRA, QLoRA, ...) compare part by part. Columns only for
// the parts some trial holds.
Table memory_table(const std::vector<TrialRow>& rows, const std::vector<Filter>& filters,
                   const std::vector<std::string>& param_order);

}  // namespace scalelab::lab
