#pragma once
// Memory by part in the analysis (issue 14's comparison of fine-tuning methods): per configuration
// of a sweep, the engine's memory plan split by part at the planned peak (the run record's
// plan_<part>_bytes metrics: weights, gradients, optimizer states, activations, reference model,
// NF4 tiles, ...) beside the measured peak — the numbers of `scalelab results --view memory`
// (lab/views.h), which the report draws as a stacked bar per configuration with the measured peak
// as a marker. Also the sweep's [presets.NAME] (what each preset label stands for), which label
// the bars and fold the runs table's columns.
#include <string>

#include "analysis/analyze.h"

namespace scalelab::lab {
class ResultsStore;
}

namespace scalelab::analysis {

// Adds a.json["presets"] = {NAME: [the parameters its values set]} when the sweep's spec has
// presets, and a.json["memory"] = {"parts": [in the plan's display order], "rows": [{"row",
// "label", "trial_id", "status", "parts": {part: bytes}, "plan_total_bytes",
// "measured_peak_bytes"}], "notes": [...]} with the table "memory" when a trial of the sweep holds
// a memory plan: one row per configuration (its first finished trial with a plan, else its first
// trial with one), labelled by the parameters that vary (a preset's label in place of the
// parameters it sets); "row" is the analysis table's row label of that configuration ("trial N").
void add_memory(Analysis& a, const lab::ResultsStore& store, const std::string& sweep);

}  // namespace scalelab::analysis
