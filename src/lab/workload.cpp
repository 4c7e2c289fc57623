#include "lab/workload.h"

#include "core/error.h"
#include "lab/external_profile.h"

namespace scalelab::lab {

const char* const kDefaultThroughputPattern =
    R"(Training throughput:\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*tokens/s)";
const char* const kDefaultMemoryPattern =
    R"(Max reserved (?:GPU |device )?memory:\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?))";
const char* const kDefaultOomPattern =
    R"(out of (?:[a-z]+ )?memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation)";

const std::vector<std::string> kBuiltinPlaceholders = {"sweep",    "repeat",    "trial_key",
                                                       "log_path", "trial_dir", "profiler"};

std::regex compile_pattern(const std::string& pattern, const std::string& where, bool need_group) {
  // libstdc++'s regex compiler accumulates a number in a signed integer without checking it:
  // a back-reference "\\2222222222222222222" (found by fuzzing sweep specs) or a repeat count
  // "{2222222222222222222}" overflows it (undefined behaviour). Refuse numbers of more than 5
  // digits after '\\', '{' or ',' before compiling.
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' && pattern[i] != '{' && pattern[i] != ',') continue;
    std::size_t j = i + 1;
    while (j < pattern.size() && pattern[j] >= '0' && pattern[j] <= '9') ++j;
    if (j - i - 1 > 5) {
      throw InvalidInput("[" + where + "] the regular expression '" + pattern + "' has a number of " +
                         std::to_string(j - i - 1) + " digits after '" + pattern[i] +
                         "' (a back-reference or repeat count) — at most 5 digits");
    }
  }
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error& e) {
    throw InvalidInput("[" + where + "] the regular expression '" + pattern + "' does not compile (" +
                       e.what() + ") — fix it (ECMAScript syntax, as in JavaScript)");
  }
  if (need_group && re.mark_count() < 1) {
    throw InvalidInput("[" + where + "] the regular expression '" + pattern +
                       "' has no capture group — put the number in ( ), e.g. 'throughput: ([0-9.]+)'");
  }
  return re;
}

Workload Workload::native() { return Workload{}; }

Workload Workload::external(const std::string& command, const std::string& where) {
  Workload w;
  w.kind = WorkloadKind::kExternal;
  w.shell_command = CommandTemplate(command, where);
  // The default patterns are compiled once per process and copied (a copy of a std::regex shares
  // its compiled automaton): libstdc++'s compiler is slow (case-insensitive, each bracket
  // expression builds a 256-entry table through the locale; the three defaults took most of the
  // time of parsing a sweep spec), and every sweep spec or --command builds these.
  static const std::regex throughput = compile_pattern(kDefaultThroughputPattern, "default throughput pattern", true);
  static const std::regex memory = compile_pattern(kDefaultMemoryPattern, "default memory pattern", true);
  static const std::regex oom = compile_pattern(kDefaultOomPattern, "default oom pattern", false);
  w.metrics = {{"tokens_per_s_per_device", kDefaultThroughputPattern, throughput},
               {"max_reserved_gib", kDefaultMemoryPattern, memory}};
  w.oom_pattern = kDefaultOomPattern;
  w.oom_regex = oom;
  w.required_metrics = {"tokens_per_s_per_device"};
  return w;
}

void Workload::set_metric(const std::string& name, const std::string& pattern, const std::string& where) {
  MetricRule rule{name, pattern, compile_pattern(pattern, where + ": metric " + name, true)};
  for (auto& m : metrics) {
    if (m.name == name) {
      m = std::move(rule);
      return;
    }
  }
  metrics.push_back(std::move(rule));
}

void Workload::set_oom_pattern(const std::string& pattern, const std::string& where) {
  oom_regex = compile_pattern(pattern, where + ": oom pattern", false);
  oom_pattern = pattern;
}

std::set<std::string> Workload::placeholders() const {
  std::set<std::string> out;
  if (shell_command)
    for (const auto& n : shell_command->placeholders()) out.insert(n);
  for (const auto& t : argv_command)
    for (const auto& n : t.placeholders()) out.insert(n);
  for (const auto& [k, t] : env)
    for (const auto& n : t.placeholders()) out.insert(n);
  return out;
}

bool Workload::uses_parameter(const std::string& name) const {
  return is_native() || placeholders().count(name) > 0;
}

void Workload::check_placeholders(const std::set<std::string>& provided, const std::string& where) const {
  for (const auto& name : placeholders()) {
    if (provided.count(name)) continue;
    bool builtin = false;
    for (const auto& b : kBuiltinPlaceholders) builtin = builtin || b == name;
    if (builtin) continue;
    std::string known;
    for (const auto& p : provided) append_item(known, p, ", ");
    throw InvalidInput("[" + where + "] the command uses placeholder {" + name +
                       "} but nothing gives it a value (parameters: " + (known.empty() ? "none" : known) +
                       ") — add " + name + " to [parameters] (or pass --" + name +
                       "), or remove it from the command");
  }
}

Json Workload::identity() const {
  if (is_native()) return Json{{"kind", "native"}};
  Json id{{"kind", "external"}};
  if (shell_command) id["command"] = shell_command->text();
  else {
    Json argv = Json::array();
    for (const auto& t : argv_command) argv.push_back(t.text());
    id["command"] = argv;
  }
  if (!value_map.empty()) id["map"] = value_map;
  if (!env.empty()) {
    Json e = Json::object();
    for (const auto& [k, t] : env) e[k] = t.text();
    id["env"] = e;
  }
  if (!cwd.empty()) id["cwd"] = cwd;
  // A profiled trial is another measurement (the profiler's overhead): turning profiling on runs
  // the trials again rather than reusing unprofiled ones. "nsys?" and "nsys" are the same.
  if (profile.tool != ProfileTool::kNone) {
    id["profile"] = profile_tool_name(profile.tool);
    if (!profile.args.empty()) id["profile_args"] = profile.args;
    if (!profile.rank_env.empty()) id["profile_rank_env"] = profile.rank_env;
  }
  return id;
}

Json Workload::describe() const {
  Json d = identity();
  if (!is_native()) {
    Json m = Json::object();
    for (const auto& r : metrics) m[r.name] = r.pattern;
    d["metrics"] = m;
    d["oom_pattern"] = oom_pattern;
    d["required_metrics"] = required_metrics;
    if (profile.optional) d["profile_optional"] = true;
  }
  return d;
}

namespace {

std::string join_display(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) append_item(out, shell_quote(a), " ");
  return out;
}

}  // namespace

Launch build_launch(const Workload& workload, const std::string& engine, const ParamMap& params,
                    const TrialContext& ctx) {
  Launch launch;
  if (workload.is_native()) {
    launch.argv = {engine, native_subcommand(params)};
    std::vector<std::string> skip(workload.label_params.begin(), workload.label_params.end());
    skip.push_back(kSubcommandParam);
    for (auto& f : params_to_flags(params, skip)) launch.argv.push_back(std::move(f));
    launch.argv.push_back("--json");
    launch.argv.push_back(ctx.record_path);
    if (ctx.profile) {
      for (const char* a : {"--profile", "--trace"}) launch.argv.emplace_back(a);
      launch.argv.push_back(ctx.trace_path());
    }
    launch.display = join_display(launch.argv);
    return launch;
  }

  // {profiler}: the nsys words in front of each rank's program (when nsys wraps this trial).
  bool in_command = workload.shell_command && workload.shell_command->uses("profiler");
  for (const auto& t : workload.argv_command) in_command = in_command || t.uses("profiler");
  const bool per_rank = ctx.nsys && in_command;
  const std::vector<std::string> profiler = per_rank ? nsys_profile_words(workload, ctx, true) : std::vector<std::string>{};
  bool quote = false;
  auto value = [&](const std::string& name) -> std::string {
    if (name == "profiler") return join_display(profiler);
    if (name == "sweep") return quote ? shell_quote(ctx.sweep) : ctx.sweep;
    if (name == "repeat") return std::to_string(ctx.repeat);
    if (name == "trial_key") return quote ? shell_quote(ctx.key) : ctx.key;
    if (name == "log_path") return quote ? shell_quote(ctx.log_path) : ctx.log_path;
    if (name == "trial_dir") return quote ? shell_quote(ctx.dir) : ctx.dir;
    auto it = params.find(name);
    if (it == params.end()) {
      throw InvalidInput("[lab] placeholder {" + name +
                         "} has no value in this trial — add it to the parameters or remove it from the command");
    }
    std::string text = param_text(it->second);
    auto map = workload.value_map.find(name);
    if (map != workload.value_map.end()) {
      auto m = map->second.find(text);
      if (m != map->second.end()) return m->second;
    }
    return quote ? shell_quote(text) : text;
  };

  if (workload.shell_command) {
    quote = true;
    std::string cmd = workload.shell_command->render(value);
    launch.argv = {"/bin/sh", "-c", cmd};
    launch.display = cmd;
  } else {
    for (const auto& t : workload.argv_command) {
      if (t.is_single_placeholder() && t.uses("profiler")) {
        launch.argv.insert(launch.argv.end(), profiler.begin(), profiler.end());
        continue;
      }
      std::string word = t.render(value);
      if (word.empty() && t.is_single_placeholder()) continue;
      launch.argv.push_back(word);
    }
    launch.display = join_display(launch.argv);
  }
  if (ctx.nsys && !per_rank) {
    // The whole command under nsys (it follows the processes the command starts: torchrun's
    // workers, a shell's children).
    std::vector<std::string> argv = nsys_profile_words(workload, ctx, false);
    argv.insert(argv.end(), launch.argv.begin(), launch.argv.end());
    launch.argv = std::move(argv);
    launch.display = join_display(launch.argv);
  }
  quote = false;
  for (const auto& [k, t] : workload.env) launch.env.emplace_back(k, t.render(value));
  launch.cwd = workload.cwd;
  return launch;
}

}  // namespace scalelab::lab
