#pragma once
// What a trial runs: the native engine (`<engine> train <flags> --json <record>`) or an external
// command template (e.g. a `torchrun benchmark.py ...` job) whose metrics and out-of-memory
// failures are read from its log with regular expressions.
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lab/command_template.h"
#include "lab/params.h"

namespace scalelab::lab {

enum class WorkloadKind { kNative, kExternal };

// How the lab profiles an external workload's trials ([workload] profile = ..., see
// lab/external_profile.h and docs/profiling.md).
enum class ProfileTool { kNone, kNsys, kTorch };

struct WorkloadProfile {
  ProfileTool tool = ProfileTool::kNone;
  // "nsys?": when nsys is not on PATH the trials run unprofiled (their profile is "skipped")
  // instead of the runner refusing to start.
  bool optional = false;
  std::vector<std::string> args;  // profile_args: more `nsys profile` options, before the command
  // profile_rank_env: the environment variable holding a rank's number, for per-rank report names
  // under {profiler} ("" = by launcher: OMPI_COMM_WORLD_RANK for mpirun/mpiexec, SLURM_PROCID for
  // srun, the process id otherwise).
  std::string rank_env;
};

// A metric read from an external workload's log: the first capture group of the last line that
// matches (case-insensitive, ECMAScript syntax), as a number.
struct MetricRule {
  std::string name;
  std::string pattern;
  std::regex regex;
};

// Default patterns. They read the reference benchmark's lines ("Training throughput: 27542.25
// Tokens/s/GPU", "Max reserved GPU Memory: 61.59") and scalelab train's own ("Training throughput:
// X tokens/s/device", "Max reserved memory: Y GiB").
extern const char* const kDefaultThroughputPattern;
extern const char* const kDefaultMemoryPattern;
// PyTorch's out-of-memory messages ("CUDA out of memory", "torch.OutOfMemoryError",
// "CUDA error: out of memory", CUBLAS/cuDNN allocation failures) and the allocator's
// "out of cpu memory"/"out of cuda memory".
extern const char* const kDefaultOomPattern;

// Placeholders every trial provides besides its parameters.
// sweep, repeat, trial_key, log_path, trial_dir, profiler (the `nsys profile ...` words where a
// launcher starts each rank: `mpirun -np 4 {profiler} python train.py`; empty when not profiling)
extern const std::vector<std::string> kBuiltinPlaceholders;

// Compiles `pattern` case-insensitively; InvalidInput naming `where` when it does not compile or
// (with need_group) has no capture group.
std::regex compile_pattern(const std::string& pattern, const std::string& where, bool need_group);

struct Workload {
  WorkloadKind kind = WorkloadKind::kNative;

  // External: either a shell command (run with /bin/sh -c; substituted parameter values are
  // shell-quoted) or an argv list (exec'd directly; an element that is only a placeholder and
  // renders empty is dropped).
  std::optional<CommandTemplate> shell_command;
  std::vector<CommandTemplate> argv_command;
  std::vector<MetricRule> metrics;
  std::string oom_pattern;
  std::regex oom_regex;
  std::vector<std::string> required_metrics;  // an exit-0 trial without these is an error
  // value_map[param][value text] = text substituted instead (e.g. fused_kernels true -> "--liger").
  // Mapped text is inserted as written (not quoted).
  std::map<std::string, std::map<std::string, std::string>> value_map;
  std::vector<std::pair<std::string, CommandTemplate>> env;  // extra environment, templated
  std::string cwd;                                            // working directory ("" = runner's)
  WorkloadProfile profile;                                    // external only
  // Parameters that only label a preset ([presets.NAME] of the spec): a native trial does not
  // pass them as flags (their presets' parameters are). External commands may still use {NAME}.
  std::set<std::string> label_params;

  // A native workload.
  static Workload native();
  // An external shell command with the default metric and OOM patterns.
  static Workload external(const std::string& command, const std::string& where);

  bool is_native() const { return kind == WorkloadKind::kNative; }
  // Every placeholder of the command and environment templates.
  std::set<std::string> placeholders() const;
  // Whether changing parameter `name` reaches the workload (native: always).
  bool uses_parameter(const std::string& name) const;
  // Throws InvalidInput for the first placeholder that is neither in `provided` nor builtin.
  void check_placeholders(const std::set<std::string>& provided, const std::string& where) const;
  // Sets (or adds) a metric rule; InvalidInput when the pattern is bad.
  void set_metric(const std::string& name, const std::string& pattern, const std::string& where);
  void set_oom_pattern(const std::string& pattern, const std::string& where);

  // What identifies the workload in a trial's config (and so its hash): the kind and, for an
  // external command, the template text. Not the engine path, so a rebuilt engine resumes.
  Json identity() const;
  // Everything about the workload, for the sweep's stored spec.
  Json describe() const;
};

// Where a trial's files go and the builtin placeholder values.
struct TrialContext {
  std::string sweep;
  int repeat = 0;
  std::string key;          // unique within the sweep's log directory
  std::string dir;          // the sweep's log directory
  std::string log_path;     // <dir>/<key>.log
  std::string record_path;  // <dir>/<key>.json (native run record)
  // Native trials under `--profile`: the engine also runs with --profile (op-family summaries in
  // the run record, hence in the database) and --trace <dir>/<key>.trace.json (its timeline).
  bool profile = false;
  std::string trace_path() const { return dir + "/" + key + ".trace.json"; }
  // External trials with [workload] profile = "nsys" when nsys is on PATH: the command runs under
  // `nsys profile` (lab/external_profile.h), its reports in profile_dir().
  bool nsys = false;
  // Where an external trial's profile goes: <dir>/<key>.profile/
  std::string profile_dir() const { return dir + "/" + key + ".profile"; }
};

struct Launch {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string cwd;
  std::string display;  // the command as one line, for logs and the database
};

// The command for one trial. Native: {engine, "train", flags..., "--json", record_path}.
// External with ctx.nsys: the command under `nsys profile ...` (nsys_profile_words), either the
// whole command or, where it has {profiler}, each rank the launcher starts.
// Throws InvalidInput when a placeholder has no value.
Launch build_launch(const Workload& workload, const std::string& engine, const ParamMap& params,
                    const TrialContext& ctx);

}  // namespace scalelab::lab
