#pragma once
// The scaling study (`scalelab scale`): one training configuration at 1, 2, 4, ... ranks (the
// per-rank micro-batch fixed, so the global batch grows), each rank count a trial of a sweep of
// kind "scale", and the table of the reference practice built from the database alone (the
// command prints it; `scalelab results --sweep NAME` prints it again).
#include <optional>
#include <string>
#include <vector>

#include "analysis/scaling.h"
#include "lab/executor.h"
#include "lab/store.h"
#include "lab/table.h"

namespace scalelab::lab {

inline constexpr const char* kScaleKind = "scale";

// What a study asked for; stored as the sweep's spec.
struct ScaleSpec {
  std::vector<int> ranks;       // in the order given, duplicates removed
  int repeats = 1;
  std::string launcher = "mpirun";  // "mpirun" (this machine) or "slurm"
  std::optional<double> price_per_device_hour;
  double token_budget = 1e9;
  ParamMap params;              // the train flags, without ranks/launcher
  int threads_per_rank = 0;     // what the launcher gave each rank (0: the engine's default)

  Json to_json() const;
  static ScaleSpec from_json(const Json& j);
};

// Parses "1,2,4" style lists (already split by the CLI) into ranks: positive, duplicates
// removed, order kept. InvalidInput for an empty list or a count below 1.
std::vector<int> parse_rank_list(const std::vector<int>& ranks);

// The trial parameters for one rank count.
ParamMap scale_trial_params(const ScaleSpec& spec, int ranks);

// Threads each rank gets: the train flags' --threads when given (0 when it is not an integer);
// with mpirun on this machine (`cores` of them) an equal share of the cores for the largest rank
// count, the same for every rank count (weak scaling: a device is a fixed share of the machine);
// 0 (the engine's default) on SLURM, where each rank has its node's cores.
int scale_threads_per_rank(const ScaleSpec& spec, int cores);

// A SLURM --time of at least `seconds`: "HH:MM:00", whole minutes, one to spare.
std::string slurm_time_limit(double seconds);

// The trial was refused by the engine (an error with exit code 2, InvalidInput's): every other
// rank count would be refused too.
bool refused_by_engine(const TrialRow& row);

// What a finished study says: refused (the configuration is invalid), or the rank counts without a
// successful trial (the table gives their reasons); ok when neither.
struct ScaleVerdict {
  bool refused = false;
  std::vector<int> missing_ranks;
  bool ok() const { return !refused && missing_ranks.empty(); }
};
ScaleVerdict scale_verdict(const ScaleSpec& spec, const std::vector<TrialRow>& rows);

// Runs the trials (each repeat over the rank counts in order), resuming recorded ones; stops at a
// trial the engine refused (exit code 2). Returns the trials' rows in order.
std::vector<TrialRow> run_scale(TrialExecutor& exec, const ScaleSpec& spec);

// The study's table from trial rows: one row per rank count (repeats averaged) with per-device
// and total throughput, speedup, parallel efficiency, cost efficiency, cost per 1M tokens (with a
// price), J/token (with telemetry), the Karp–Flatt serial fraction, communication per step and
// the hidden share; rank counts with no successful trial are listed with their failure. Notes:
// the recommendations per purpose for the token budget, and the baseline when it is not 1.
Table scale_table(const std::vector<TrialRow>& trials, const ScaleSpec& spec);
// The same from the database (the sweep's current trials and stored spec).
Table scale_sweep_table(const SweepRow& sweep, const ResultsStore& store);

}  // namespace scalelab::lab
