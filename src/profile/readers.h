#pragma once
// Readers that turn a profile into the nsys-shaped tables of profile/summary.h.
//
//   scalelab trace   (`train --trace`, one rank or merged): tables "op_families" (category "op"
//                    by family), "op_phases" (family (phase)), "regions" (steps and phases),
//                    "layers" (layer N (phase)), "communication"; derived: steps, median step
//                    time, communication total / hidden / exposed (all-reduce time outside /
//                    inside the DDP wait), op time as a fraction of step time.
//                    By default only the measured steps (from otherData.measured_from_us, after
//                    --bench-warmup-steps): the same steps as `--profile`.
//   PyTorch trace    (torch.profiler export_chrome_trace): "cpu_ops", "user_annotations",
//                    "kernels", "cuda_api" (runtime + driver), "gpu_memory_ops" (memcpy/memset by
//                    kind), "communication" (NCCL kernels); derived: device idle fraction between
//                    the first and last kernel (launch-bound), time in launch and synchronize
//                    calls, NCCL kernel time hidden behind / exposed from compute kernels,
//                    memcpy bytes by kind.
//   nsys stats CSV   (`nsys stats --format csv`, one or several reports, with or without the
//                    " ** Title (report):" lines nsys prints between them): each report as a
//                    table, its rows as nsys computed them; derived: launch / synchronize API
//                    time, host-to-device copy time, NCCL kernel time.
#include <string>

#include <nlohmann/json.hpp>

#include "profile/summary.h"

namespace scalelab::profile {

// `source` names the trace in errors: an event whose ts, dur or bytes is not a finite figure of at
// most 1e18 is refused with InvalidInput (a corrupt file; sums of such would not fit in JSON).
Report summarize_scalelab_trace(const nlohmann::json& trace, bool all_steps = false,
                                const std::string& source = "the trace");
Report summarize_torch_trace(const nlohmann::json& trace, const std::string& source = "the trace");
// `name_hint`: the file (named in errors; nsys names its files "<name>_<report>.csv" with --output,
// so the report of a file without a title line comes from the file name).
Report summarize_nsys_csv(const std::string& text, const std::string& name_hint = "");

// Reads `path` and picks the reader: a JSON object with otherData.generator "scalelab", another
// Chrome trace (PyTorch), or CSV (nsys). Throws InvalidInput naming the file and what it expected.
Report summarize_file(const std::string& path, bool all_steps = false);

}  // namespace scalelab::profile
