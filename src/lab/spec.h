#pragma once
// Sweep specifications in TOML. A sweep is a workload and parameters; a parameter whose value is
// a list is swept, and the sweep is the cartesian product of all lists minus the `exclude` rules,
// each combination run `repeats` times.
//
//   name = "batch-sweep"             # default: the file name without .toml
//   description = "..."
//   repeats = 3                      # default 1; tables report median, min, max
//   timeout = 600                    # seconds per trial (default: the command's --timeout)
//
//   [workload]                       # default: type = "native"
//   type = "native"                  # `scalelab train` with the parameters as flags
//   # type = "external"
//   # command = "torchrun ... --batch_size {micro_batch_size}"   (or a list of argv words)
//   # oom_pattern = "..."            # default: PyTorch's and scalelab's out-of-memory messages
//   # required_metrics = ["tokens_per_s_per_device"]
//   # cwd = "..."                    # relative to this file
//   # [workload.metrics]   name = "regex with (one group)"
//   # [workload.map.fused_kernels]   true = "--use_liger"  false = ""
//   # [workload.env]       NAME = "value with {placeholders}"
//   # profile = "nsys"               # or "nsys?" (unprofiled where nsys is missing), "torch", "none"
//   # profile_args = ["--sample=none"]   # more `nsys profile` options
//   # profile_rank_env = "PMI_RANK"  # per-rank report names under {profiler} (lab/external_profile.h)
//
//   [parameters]
//   model = "llama-small"
//   micro_batch_size = [1, 2, 4, 8]
//   attn = ["eager", "flash"]
//
//   [[exclude]]                      # drops combinations matching every key (a list: any of)
//   attn = "eager"
//   micro_batch_size = [4, 8]
//
//   [presets.method]                 # what each value of a parameter stands for: parameters that
//   full = {}                        # join the trial (native: flags; `method` itself is not one)
//   lora = { lora_rank = 16 }        # every value of `method` needs an entry
//
//   [oom_search]                     # optional: after the trials, each configuration's largest
//   max_micro_batch = 256            # micro-batch that fits (lab/oom_search.h), found with real
//   use_plan = true                  # trials, from the engine's plan where one exists; shown as
//                                    # a "max micro-batch" column of the summary
//
// Every malformed input is an InvalidInput naming file:line:column.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lab/params.h"
#include "lab/workload.h"

namespace scalelab::lab {

// The most combinations (before `exclude`, without repeats) a spec may expand to.
inline constexpr std::uint64_t kMaxSweepCombinations = 100000;

struct ExcludeRule {
  std::vector<std::pair<std::string, std::vector<Json>>> match;  // every key must equal one of its values
  bool matches(const ParamMap& params) const;
};

// [oom_search]: one OOM search per configuration (its parameters without micro_batch_size).
struct SweepOomSearch {
  bool enabled = false;
  int max_micro_batch = 4096;
  bool use_plan = true;  // native workloads: start from the engine's plan (`plan --json`)
};

struct SweepSpec {
  std::string name;
  std::string description;
  std::string source;  // the file it came from
  int repeats = 1;
  std::optional<double> timeout_s;
  Workload workload;
  std::vector<std::pair<std::string, std::vector<Json>>> parameters;  // file order
  std::vector<ExcludeRule> excludes;
  SweepOomSearch oom_search;
  // [presets.NAME]: for parameter NAME, each value's parameters (joined into the combinations).
  std::map<std::string, std::map<std::string, ParamMap>> presets;

  // The combinations, the first parameter varying slowest, excluded ones dropped.
  std::vector<ParamMap> expand() const;
  // Parameters with more than one value (the table's columns).
  std::vector<std::string> swept_parameters() const;
  // Everything above, for the database.
  Json to_json() const;
};

// `provided_by_runner`: parameters the command supplies itself (oom-search and ladder set
// micro_batch_size, attn, ...): placeholders may use them and [parameters] may then be empty.
SweepSpec load_sweep_spec(const std::string& path, const std::set<std::string>& provided_by_runner = {});
// `source` names the text in messages and resolves a relative workload cwd.
SweepSpec parse_sweep_spec(const std::string& toml_text, const std::string& source,
                           const std::set<std::string>& provided_by_runner = {});

}  // namespace scalelab::lab
