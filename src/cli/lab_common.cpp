#include "cli/lab_common.h"

#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "core/allocator.h"  // parse_bytes
#include "core/error.h"
#include "lab/external_profile.h"
#include "lab/spec.h"
#include "lab/trial_telemetry.h"

namespace scalelab::cli {
namespace {

std::atomic<bool> g_interrupted{false};
struct sigaction g_old_int, g_old_term;

extern "C" void on_interrupt(int sig) {
  g_interrupted.store(true);
  // A second signal acts as usual (kills the runner; the database stays consistent).
  ::signal(sig, SIG_DFL);
}

}  // namespace

void add_lab_flags(CLI::App* app, LabFlags& f) {
  app->add_option("--db", f.db, "Results database (SQLite; created when missing)")->capture_default_str();
  app->add_option("--log-dir", f.log_dir, "Directory for trial logs [default: logs/ beside the database]");
  app->add_option("--engine", f.engine,
                  "Native engine executable run as '<engine> train ...' [default: $SCALELAB_ENGINE, else this "
                  "scalelab]");
  app->add_option("--timeout", f.timeout_s, "Seconds a trial may run before its process group is killed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--kill-grace", f.kill_grace_s, "Seconds between SIGTERM and SIGKILL when a trial is stopped")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--max-log-size", f.max_log_size,
                  "Largest log a trial may write (its stdout and stderr) before it is stopped as an error, e.g. "
                  "512MiB; 0 for no limit")
      ->capture_default_str();
  app->add_flag("--wait", f.wait, "If another runner uses the database, wait for it instead of refusing");
  app->add_flag("--retry-failed", f.retry_failed, "Run again trials recorded as error or timeout");
  app->add_flag("--rerun", f.rerun, "Run every trial again, even those already recorded");
  app->add_flag("--no-telemetry", f.no_telemetry,
                "Do not sample the trials (by default each trial's process tree and every visible GPU are sampled "
                "and stored with it)");
  app->add_option("--telemetry-interval", f.telemetry_interval_ms, "Telemetry sampling interval of trials, in ms")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_flag("--profile", f.profile,
                "Profile every native trial: its op-family summaries are stored with it (`scalelab results "
                "--view profile`), its timeline is <log-dir>/<sweep>/<trial>.trace.json");
}

std::string resolve_engine(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* e = std::getenv("SCALELAB_ENGINE"); e && *e) return e;
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = '\0';
    return buf;
  }
  return "scalelab";
}

lab::LabOptions lab_options(const LabFlags& f, const std::atomic<bool>* cancel) {
  lab::LabOptions o;
  o.db_path = f.db;
  o.log_dir = f.log_dir;
  o.engine = resolve_engine(f.engine);
  o.timeout_s = f.timeout_s;
  o.kill_grace_s = f.kill_grace_s;
  o.max_log_bytes = f.max_log_size == "0" ? 0 : parse_bytes(f.max_log_size, "--max-log-size");
  o.retry_failed = f.retry_failed;
  o.rerun = f.rerun;
  o.wait_for_lock = f.wait;
  o.profile = f.profile;
  o.cancel = cancel;
  if (!f.no_telemetry) o.monitor = lab::telemetry_monitor_factory(std::chrono::milliseconds(f.telemetry_interval_ms));
  return o;
}

void add_search_flags(CLI::App* app, SearchFlags& f, const std::string& command, const std::string& json_what) {
  app->add_option("--name", f.name, "Record under this name [default: " + command + "-<model>-<hash of the config>]");
  app->add_option("--max-micro-batch", f.max_micro_batch, "Never try a larger micro-batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_flag("--no-plan", f.no_plan, "Do not ask the engine's memory plan (`scalelab plan`) for first guesses");
  app->add_option("--json", f.json, "Also write " + json_what + " to this file");
  app->add_option("--format", f.format, "Table format: md, csv or json")->capture_default_str();
}

void add_workload_flags(CLI::App* app, WorkloadFlags& f) {
  auto* cmd = app->add_option("--command", f.command,
                              "External workload: a shell command template with {placeholders}, e.g. "
                              "'torchrun benchmark.py --batch_size {micro_batch_size}'");
  auto* spec = app->add_option("--spec", f.spec, "Take the workload and fixed parameters from a sweep spec (TOML)");
  cmd->excludes(spec);
  app->add_option("--metric", f.metrics,
                  "External workload: NAME=REGEX, a metric read from the log (first capture group)");
  app->add_option("--oom-pattern", f.oom_pattern, "External workload: regex of an out-of-memory failure in the log");
}

ResolvedWorkload resolve_workload(const WorkloadFlags& f, const std::vector<std::string>& forwarded,
                                  const std::vector<std::string>& runner_params) {
  ResolvedWorkload out;
  std::set<std::string> provided(runner_params.begin(), runner_params.end());
  lab::ParamMap cli_params = lab::parse_flag_words(forwarded);
  for (const auto& [k, v] : cli_params) provided.insert(k);
  if (!f.spec.empty()) {
    lab::SweepSpec spec = lab::load_sweep_spec(f.spec, provided);
    for (const auto& [name, values] : spec.parameters) {
      if (values.size() != 1) {
        throw InvalidInput("[" + f.spec + "] parameter '" + name +
                           "' has a list of values; this command needs one value per parameter (use "
                           "'scalelab sweep' for lists)");
      }
      out.params[name] = values[0];
    }
    out.workload = spec.workload;
    out.spec_name = spec.name;
  } else if (!f.command.empty()) {
    out.workload = lab::Workload::external(f.command, "--command");
  } else {
    out.workload = lab::Workload::native();
  }
  for (const auto& [k, v] : cli_params) out.params[k] = v;  // the command line wins over the spec

  if (out.workload.is_native()) {
    if (!f.metrics.empty() || !f.oom_pattern.empty()) {
      throw InvalidInput("[lab] --metric and --oom-pattern apply to external workloads (--command or an external "
                         "--spec); the native engine reports its metrics in its run record");
    }
    if (out.params.count("json")) {
      throw InvalidInput("[lab] --json of the engine is set by the lab for each trial — give the command's own "
                         "--json before the train flags, or remove it");
    }
  } else {
    for (const auto& m : f.metrics) {
      auto eq = m.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw InvalidInput("[lab] --metric '" + m + "' is not NAME=REGEX (e.g. step_time_s='step time: ([0-9.]+)')");
      }
      out.workload.set_metric(lab::param_name(m.substr(0, eq)), m.substr(eq + 1), "--metric");
    }
    if (!f.oom_pattern.empty()) out.workload.set_oom_pattern(f.oom_pattern, "--oom-pattern");
    std::set<std::string> all = provided;
    for (const auto& [k, v] : out.params) all.insert(k);
    out.workload.check_placeholders(all, f.spec.empty() ? "--command" : f.spec);
    lab::nsys_available(out.workload);  // profile = "nsys" without nsys: exit 2 before the database is opened
  }
  return out;
}

void apply_default_steps(ResolvedWorkload& w) {
  if (w.workload.is_native() && !w.params.count("max_steps")) {
    w.params["max_steps"] = kDefaultSearchSteps;
    w.notes += "--max-steps not given: each trial runs " + std::to_string(kDefaultSearchSteps) + " steps\n";
  }
}

std::string default_sweep_name(const std::string& prefix, const ResolvedWorkload& w, const lab::Json& extra) {
  std::string model = "external";
  auto it = w.params.find("model");
  if (it != w.params.end()) model = lab::param_text(it->second);
  else if (!w.spec_name.empty()) model = w.spec_name;
  lab::Json id{{"workload", w.workload.identity()}, {"params", lab::Json(w.params)}, {"extra", extra}};
  return prefix + "-" + lab::safe_file_name(model) + "-" + lab::fnv1a_hex(id.dump()).substr(0, 8);
}

InterruptFlag::InterruptFlag() {
  g_interrupted.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptFlag::~InterruptFlag() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

const std::atomic<bool>* InterruptFlag::get() const { return &g_interrupted; }

}  // namespace scalelab::cli
