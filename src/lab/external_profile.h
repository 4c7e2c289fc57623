#pragma once
// Profiles of external workloads' trials ([workload] profile = "nsys" | "nsys?" | "torch"), stored
// with the trial as a native `--profile` trial's summaries are (record.profile.summary), so
// `scalelab results --view profile|profile-compare` lays them side by side.
//
//   nsys   The trial's command runs under
//            nsys profile -o <dir>/<key>.profile/profile --force-overwrite=true
//                 --trace=cuda,nvtx,osrt[,mpi] [profile_args...] <command>
//          (the whole command; with a launcher in front — mpirun, mpiexec, srun — the spec puts
//          {profiler} where each rank's program begins and every rank writes its own report,
//          profile.rank<N>.nsys-rep, with `mpi` traced under mpirun/mpiexec). After the trial,
//          `nsys stats --format=csv --report=<kNsysStatsReports> <report>` summarizes each report
//          (profile/readers.h). Rank 0's (the first report's) summary is the trial's; every
//          rank's derived figures are kept too.
//   torch  The lab sets SCALELAB_TORCH_TRACE=<dir>/<key>.profile/torch_trace.json for the trial;
//          a workload that writes a PyTorch profiler Chrome trace there (export_chrome_trace)
//          has it summarized after the trial.
//
// A profile that cannot be made or read never changes the trial's outcome: the trial is recorded
// as it ended, its profile {"status": "failed", "reason": ...}.
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "core/subprocess.h"
#include "lab/params.h"
#include "lab/workload.h"

namespace scalelab::lab {

// The reports `nsys stats` is asked for (comma-separated, as nsys takes them).
extern const char* const kNsysStatsReports;
// The environment variable that tells a torch workload where to write its trace.
inline constexpr const char* kTorchTraceEnv = "SCALELAB_TORCH_TRACE";

const char* profile_tool_name(ProfileTool tool);  // "none", "nsys", "torch"

// The launcher in front of an external command ("mpirun", "mpiexec", "orterun", "srun"), from its
// first word (after VAR=value assignments and `exec`); "" when none.
std::string command_launcher(const Workload& workload);

// Checks the profile settings of a parsed workload (no environment needed): InvalidInput naming
// `where` when {profiler} is not a whole word of an argv command, or when a launcher is in front
// of an nsys-profiled command that has no {profiler}.
void validate_profile(const Workload& workload, const std::string& where);

// Whether the trials of `workload` run under nsys: false when it does not ask for nsys, or asks
// for "nsys?" and nsys is not on PATH; InvalidInput (exit 2) when it asks for "nsys" and nsys is
// not on PATH.
bool nsys_available(const Workload& workload);

// The words in front of a trial's program: nsys profile -o ... --trace ... [args]. `per_rank`:
// for {profiler} (a report per rank, named by the rank).
std::vector<std::string> nsys_profile_words(const Workload& workload, const TrialContext& ctx, bool per_rank);

// The trial's log without the lines nsys itself prints ("Generating '...'", "Generated:", the
// report path, progress bars, "The target application returned non-zero exit code"), so the
// trial's reason is its own last line.
std::string strip_nsys_lines(const std::string& log_text);

struct ProfileRun {
  double timeout_s = 0;                 // per `nsys stats` run (0: none)
  double kill_grace_s = 5;
  const std::atomic<bool>* cancel = nullptr;
  std::function<void()> tick;
};

// After the trial: the object stored as record.profile. {"tool", "status": "ok" | "failed" |
// "skipped", "reason" (unless ok), "dir", "reports", "stats" (the CSV files), "summary" (the
// profile-summary JSON of rank 0's report), "ranks": [{"report", "derived"}] (nsys)}.
// `proc` is how the trial ended (a timed-out trial's missing report is explained).
// Returns with cancelled = true when options.cancel fired during `nsys stats`.
Json collect_external_profile(const Workload& workload, const TrialContext& ctx, const SubprocessResult& proc,
                              const ProfileRun& options, bool& cancelled);

}  // namespace scalelab::lab
