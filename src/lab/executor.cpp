#include "lab/executor.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/subprocess.h"
#include "lab/external_profile.h"
#include "lab/interrupted.h"
#include "lab/log_tail.h"
#include "lab/outcome.h"
#include "scalelab/version.h"

namespace scalelab::lab {
namespace {

namespace fs = std::filesystem;

// Log tails read for metrics and reasons: the final summary and errors are at the end.
constexpr std::size_t kLogTailBytes = 8u << 20;

std::string key_of(const std::string& hash, int repeat) { return hash + "/" + std::to_string(repeat); }

}  // namespace

Json trial_config(const Workload& workload, const ParamMap& params) {
  Json p = Json::object();
  for (const auto& [k, v] : params) p[k] = v;
  return Json{{"params", p}, {"workload", workload.identity()}};
}

std::string safe_file_name(const std::string& name) {
  std::string out;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.';
    out += ok ? c : '_';
  }
  if (out.empty() || out[0] == '.') out = "_" + out;
  return out;
}

std::string trial_summary(const TrialRow& row) {
  if (row.status != TrialStatus::kOk) {
    std::string r = row.reason;
    if (r.size() > 200) r = r.substr(0, 200) + "...";
    return r;
  }
  char buf[128];
  std::string out;
  if (row.metrics.contains("tokens_per_s_per_device")) {
    std::snprintf(buf, sizeof buf, "%.1f tokens/s/device", row.metrics["tokens_per_s_per_device"].get<double>());
    out += buf;
  }
  if (row.metrics.contains("max_reserved_gib")) {
    std::snprintf(buf, sizeof buf, "%s%.2f GiB", out.empty() ? "" : ", ", row.metrics["max_reserved_gib"].get<double>());
    out += buf;
  }
  return out;
}

TrialExecutor::TrialExecutor(ResultsStore& store, std::int64_t sweep_id, std::string sweep_name, Workload workload,
                             LabOptions options, Progress& progress)
    : store_(store),
      sweep_id_(sweep_id),
      sweep_name_(std::move(sweep_name)),
      workload_(std::move(workload)),
      options_(std::move(options)),
      progress_(progress) {
  if (options_.profile && !workload_.is_native()) {
    throw InvalidInput("[--profile] profiles the native engine's trials; for an external command, set "
                       "[workload] profile = \"nsys\" (or \"torch\") in its spec (docs/profiling.md), or profile it "
                       "with its own tools and read the result with `scalelab profile-summary FILE`");
  }
  nsys_ = nsys_available(workload_);  // InvalidInput when the spec needs nsys and it is missing
  if (!workload_.is_native() && workload_.profile.tool == ProfileTool::kNsys && !nsys_) {
    progress_.note("nsys is not on PATH: the trials run unprofiled (profile = \"nsys?\")");
  }
  if (workload_.is_native() && find_executable(options_.engine).empty()) {
    throw InvalidInput("[lab] the engine '" + options_.engine +
                       "' is not an executable file — pass --engine PATH or set SCALELAB_ENGINE");
  }
  std::string base = options_.log_dir.empty() ? default_log_dir_for(options_.db_path) : options_.log_dir;
  dir_ = (fs::path(base) / safe_file_name(sweep_name_)).string();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    throw InvalidInput("[lab] cannot create the log directory " + dir_ + " (" + ec.message() +
                       ") — pass --log-dir with a writable directory");
  }
}

std::optional<TrialRow> TrialExecutor::recorded(const ParamMap& params, int repeat) const {
  Json config = trial_config(workload_, params);
  std::string hash = fnv1a_hex(config.dump());
  auto row = store_.find_trial(sweep_id_, hash, repeat);
  if (!row) return std::nullopt;
  if (ran_now_.count(key_of(hash, repeat))) return row;
  if (options_.rerun) return std::nullopt;
  if (options_.retry_failed && (row->status == TrialStatus::kError || row->status == TrialStatus::kTimeout)) return std::nullopt;
  return row;
}

std::string reused_trial_note(const std::string& recorded_rev, const std::string& this_rev) {
  if (recorded_rev.empty() || this_rev.empty() || this_rev == "unknown" || recorded_rev == "unknown") return "";
  if (recorded_rev != this_rev) {
    return "reusing trials recorded by scalelab " + recorded_rev + " (this build is " + this_rev +
           "): their figures are that build's — pass --rerun to measure them with this one";
  }
  const std::string dirty = "-dirty";
  if (this_rev.size() > dirty.size() && this_rev.compare(this_rev.size() - dirty.size(), dirty.size(), dirty) == 0) {
    return "reusing trials of a build with uncommitted changes (" + this_rev +
           "): this build may differ from the one that measured them — pass --rerun to measure them with this one";
  }
  return "";
}

TrialExecutor::Result TrialExecutor::run(const ParamMap& params, int repeat, const std::string& role,
                                         const std::string& label_in) {
  if (auto row = recorded(params, repeat)) {
    // A trial recorded by another build measured that build: say so once per build, so that a
    // table mixing them is not read as this build's figures (--rerun measures them again).
    const std::string note = reused_trial_note(row->git_rev, SCALELAB_GIT_REV);
    if (!note.empty() && other_builds_.insert(row->git_rev).second) progress_.note(note);
    return {*row, true};
  }
  if (options_.cancel && options_.cancel->load()) throw Interrupted("[lab] interrupted");

  const std::string label = label_in.empty() ? params_label(params) : label_in;
  TrialRecord rec;
  rec.config = trial_config(workload_, params);
  rec.config_hash = fnv1a_hex(rec.config.dump());
  rec.repeat = repeat;
  rec.role = role;

  TrialContext ctx;
  ctx.sweep = sweep_name_;
  ctx.repeat = repeat;
  ctx.dir = dir_;
  std::string stem = rec.config_hash.substr(0, 12) + "-r" + std::to_string(repeat);
  ctx.key = stem;
  for (int attempt = 2; fs::exists(fs::path(dir_) / (ctx.key + ".log")); ++attempt) {
    ctx.key = stem + "-" + std::to_string(attempt);
  }
  ctx.log_path = (fs::path(dir_) / (ctx.key + ".log")).string();
  ctx.record_path = (fs::path(dir_) / (ctx.key + ".json")).string();
  ctx.profile = options_.profile;
  ctx.nsys = nsys_;
  const bool external_profile = !workload_.is_native() && workload_.profile.tool != ProfileTool::kNone;
  if (external_profile && (workload_.profile.tool == ProfileTool::kTorch || ctx.nsys)) {
    std::error_code ec;
    fs::create_directories(ctx.profile_dir(), ec);
    if (ec) throw InvalidInput("[lab] cannot create the profile directory " + ctx.profile_dir() + " (" + ec.message() + ")");
  }

  Launch launch = options_.launcher ? options_.launcher->launch(workload_, options_.engine, params, ctx)
                                   : build_launch(workload_, options_.engine, params, ctx);
  rec.command = launch.display;
  rec.log_path = ctx.log_path;
  rec.host = host_name();
  rec.scalelab_version = SCALELAB_VERSION;
  rec.git_rev = SCALELAB_GIT_REV;

  SubprocessSpec ps;
  ps.argv = launch.argv;
  ps.env = launch.env;
  ps.env.emplace_back("SCALELAB_SWEEP", sweep_name_);
  ps.env.emplace_back("SCALELAB_TRIAL_KEY", ctx.key);
  if (!workload_.is_native() && workload_.profile.tool == ProfileTool::kTorch)
    ps.env.emplace_back(kTorchTraceEnv, ctx.profile_dir() + "/torch_trace.json");
  ps.cwd = launch.cwd;
  ps.log_path = ctx.log_path;
  ps.log_header = "# scalelab " SCALELAB_VERSION " trial of '" + sweep_name_ + "' (" + label + ", repeat " +
                  std::to_string(repeat) + ")\n# $ " + launch.display + "\n";
  ps.timeout_s = options_.timeout_s;
  ps.kill_grace_s = options_.kill_grace_s;
  ps.max_log_bytes = options_.max_log_bytes;

  std::unique_ptr<TrialMonitor> monitor = options_.monitor ? options_.monitor() : nullptr;
  if (monitor) ps.on_start = [&monitor](pid_t pid) { monitor->start(static_cast<int>(pid)); };

  progress_.trial_started(label);
  rec.started_at = utc_now_iso();
  const std::function<void()> tick = [this] { progress_.tick(); };
  SubprocessResult proc = options_.launcher ? options_.launcher->run(ps, params, ctx, options_.cancel, tick)
                                            : run_subprocess(ps, options_.cancel, tick);
  std::vector<TelemetrySample> samples;
  if (monitor && proc.started) monitor->stop(samples, rec.telemetry_summary);
  rec.ended_at = utc_now_iso();
  rec.duration_s = proc.wall_s;
  if (proc.cancelled) {
    progress_.finish();
    throw Interrupted("[lab] interrupted during trial " + label + " (not recorded; it runs again on resume)");
  }
  Json profile;
  if (external_profile) {
    ProfileRun pr;
    pr.timeout_s = options_.timeout_s;
    pr.kill_grace_s = options_.kill_grace_s;
    pr.cancel = options_.cancel;
    pr.tick = tick;
    bool cancelled = false;
    profile = collect_external_profile(workload_, ctx, proc, pr, cancelled);
    if (cancelled) {
      progress_.finish();
      throw Interrupted("[lab] interrupted while summarizing the profile of trial " + label +
                        " (not recorded; it runs again on resume)");
    }
  }

  std::string log_text = read_file_tail(ctx.log_path, kLogTailBytes);
  if (log_text.rfind(ps.log_header, 0) == 0) log_text = log_text.substr(ps.log_header.size());
  if (ctx.nsys) log_text = strip_nsys_lines(log_text);
  TrialOutcome out = workload_.is_native() ? classify_native(proc, ps.timeout_s, ctx.record_path, log_text)
                                           : classify_external(workload_, proc, ps.timeout_s, log_text);
  rec.status = out.status;
  rec.reason = out.reason;
  rec.metrics = out.metrics;
  rec.record = out.record;
  if (!profile.is_null()) {
    // Where a native trial's --profile summary is (record.profile.summary), so the views read both.
    if (!rec.record.is_object()) rec.record = Json::object();
    rec.record["profile"] = profile;
  }
  if (proc.exited()) rec.exit_code = proc.exit_code();
  if (proc.started && !proc.status.exited) rec.signal = proc.status.signal;

  std::int64_t id = store_.insert_trial(sweep_id_, rec, samples);
  ran_now_.insert(key_of(rec.config_hash, repeat));
  auto row = store_.trial(id);
  SCALELAB_CHECK(row.has_value(), "[lab] trial " + std::to_string(id) + " vanished after insert");
  progress_.trial_finished(label, row->status, trial_summary(*row), row->duration_s);
  return {*row, false};
}

}  // namespace scalelab::lab
