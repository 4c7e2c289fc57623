#include "lab/spec.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "core/error.h"
#include "lab/external_profile.h"

namespace scalelab::lab {
namespace {

namespace fs = std::filesystem;

std::string at(const std::string& source, const toml::source_region& r) {
  return source + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) append_item(out, s, ", ");
  return out;
}

void check_keys(const toml::table& t, const std::string& source, const std::string& where,
                const std::vector<std::string>& allowed) {
  for (auto&& [k, v] : t) {
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == k.str();
    if (!ok) {
      throw InvalidInput("[" + at(source, k.source()) + "] unknown key '" + std::string(k.str()) + "' in " + where +
                         " — allowed: " + join(allowed));
    }
  }
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "a list";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::string expect_string(const toml::node& n, const std::string& source, const std::string& what) {
  if (!n.is_string()) {
    throw InvalidInput("[" + at(source, n.source()) + "] " + what + " must be a string, not " + type_name(n));
  }
  return *n.value<std::string>();
}

// A scalar parameter value as JSON.
Json scalar(const toml::node& n, const std::string& source, const std::string& what) {
  if (n.is_string()) return *n.value<std::string>();
  if (n.is_integer()) return *n.value<std::int64_t>();
  if (n.is_floating_point()) return *n.value<double>();
  if (n.is_boolean()) return *n.value<bool>();
  throw InvalidInput("[" + at(source, n.source()) + "] " + what + " is " + type_name(n) +
                     " — a value is a string, a number, a boolean or a list of those");
}

// A value or a list of values.
std::vector<Json> values_of(const toml::node& n, const std::string& source, const std::string& what) {
  std::vector<Json> out;
  if (const auto* arr = n.as_array()) {
    if (arr->empty()) {
      throw InvalidInput("[" + at(source, n.source()) + "] " + what +
                         " is an empty list — give at least one value (or remove it)");
    }
    for (const auto& el : *arr) out.push_back(scalar(el, source, what + " element"));
  } else {
    out.push_back(scalar(n, source, what));
  }
  return out;
}

std::string value_list(const std::vector<Json>& values) {
  std::string out;
  for (const auto& v : values) append_item(out, param_text(v), ", ");
  return out;
}

Workload parse_workload(const toml::table* t, const std::string& source, const fs::path& base_dir) {
  if (!t) return Workload::native();
  std::string type = "native";
  if (const auto* n = t->get("type")) type = expect_string(*n, source, "workload.type");
  if (type == "native") {
    if (const auto* p = t->get("profile")) {
      throw InvalidInput("[" + at(source, p->source()) + "] workload.profile is for external commands — profile the "
                         "native engine's trials with `scalelab sweep --profile` (its own summaries and timeline)");
    }
    check_keys(*t, source, "[workload] (type = \"native\")", {"type"});
    return Workload::native();
  }
  if (type != "external") {
    throw InvalidInput("[" + at(source, t->get("type")->source()) + "] workload.type is '" + type +
                       "' — use \"native\" (scalelab train) or \"external\" (a command template)");
  }
  check_keys(*t, source, "[workload] (type = \"external\")",
             {"type", "command", "metrics", "oom_pattern", "required_metrics", "map", "env", "cwd", "profile",
              "profile_args", "profile_rank_env"});
  const toml::node* cmd = t->get("command");
  if (!cmd) {
    throw InvalidInput("[" + at(source, t->source()) + "] an external workload needs command = \"...\" "
                       "(a command line with {placeholders}, or a list of words)");
  }
  Workload w = Workload::external("true", source + ": workload.command");
  w.shell_command.reset();
  if (cmd->is_string()) {
    w.shell_command = CommandTemplate(*cmd->value<std::string>(), at(source, cmd->source()) + " workload.command");
  } else if (const auto* arr = cmd->as_array()) {
    if (arr->empty()) {
      throw InvalidInput("[" + at(source, cmd->source()) + "] workload.command is an empty list — give the "
                         "program and its arguments");
    }
    for (const auto& el : *arr) {
      std::string word = expect_string(el, source, "each word of workload.command");
      w.argv_command.emplace_back(word, at(source, el.source()) + " workload.command");
    }
  } else {
    throw InvalidInput("[" + at(source, cmd->source()) + "] workload.command must be a string or a list of "
                       "strings, not " + type_name(*cmd));
  }
  if (const auto* m = t->get("metrics")) {
    const auto* mt = m->as_table();
    if (!mt) throw InvalidInput("[" + at(source, m->source()) + "] workload.metrics must be a table of name = \"regex\"");
    for (auto&& [k, v] : *mt) {
      std::string pattern = expect_string(v, source, "workload.metrics." + std::string(k.str()));
      w.set_metric(std::string(k.str()), pattern, at(source, v.source()));
    }
  }
  if (const auto* o = t->get("oom_pattern")) {
    w.set_oom_pattern(expect_string(*o, source, "workload.oom_pattern"), at(source, o->source()));
  }
  if (const auto* r = t->get("required_metrics")) {
    w.required_metrics.clear();
    const auto* arr = r->as_array();
    if (!arr) throw InvalidInput("[" + at(source, r->source()) + "] workload.required_metrics must be a list of metric names");
    for (const auto& el : *arr) {
      std::string name = expect_string(el, source, "each of workload.required_metrics");
      bool known = false;
      for (const auto& m : w.metrics) known = known || m.name == name;
      if (!known) {
        std::vector<std::string> names;
        for (const auto& m : w.metrics) names.push_back(m.name);
        throw InvalidInput("[" + at(source, el.source()) + "] required metric '" + name +
                           "' has no pattern — known metrics: " + join(names) + "; add it to [workload.metrics]");
      }
      w.required_metrics.push_back(name);
    }
  }
  if (const auto* mp = t->get("map")) {
    const auto* mt = mp->as_table();
    if (!mt) throw InvalidInput("[" + at(source, mp->source()) + "] workload.map must hold tables: [workload.map.<parameter>]");
    for (auto&& [param, table] : *mt) {
      const auto* vt = table.as_table();
      if (!vt) {
        throw InvalidInput("[" + at(source, table.source()) + "] workload.map." + std::string(param.str()) +
                           " must be a table of value = \"text\"");
      }
      auto& dst = w.value_map[param_name(std::string(param.str()))];
      for (auto&& [value, text] : *vt) {
        dst[std::string(value.str())] =
            expect_string(text, source, "workload.map." + std::string(param.str()) + "." + std::string(value.str()));
      }
    }
  }
  if (const auto* e = t->get("env")) {
    const auto* et = e->as_table();
    if (!et) throw InvalidInput("[" + at(source, e->source()) + "] workload.env must be a table of NAME = \"value\"");
    for (auto&& [k, v] : *et) {
      std::string value = expect_string(v, source, "workload.env." + std::string(k.str()));
      w.env.emplace_back(std::string(k.str()), CommandTemplate(value, at(source, v.source()) + " workload.env"));
    }
  }
  if (const auto* c = t->get("cwd")) {
    fs::path dir = expect_string(*c, source, "workload.cwd");
    if (dir.is_relative()) dir = base_dir / dir;
    if (!fs::is_directory(dir)) {
      throw InvalidInput("[" + at(source, c->source()) + "] workload.cwd '" + dir.string() +
                         "' is not a directory — it is relative to the spec file");
    }
    w.cwd = dir.string();
  }
  if (const auto* p = t->get("profile")) {
    const std::string tool = expect_string(*p, source, "workload.profile");
    if (tool == "nsys" || tool == "nsys?") {
      w.profile.tool = ProfileTool::kNsys;
      w.profile.optional = tool == "nsys?";
    } else if (tool == "torch") {
      w.profile.tool = ProfileTool::kTorch;
    } else if (tool != "none") {
      throw InvalidInput("[" + at(source, p->source()) + "] workload.profile is '" + tool +
                         "' — use \"nsys\" (run each trial under nsys profile; nsys must be on PATH), \"nsys?\" "
                         "(the same, unprofiled where nsys is missing), \"torch\" (read the PyTorch profiler trace the "
                         "script writes to $SCALELAB_TORCH_TRACE) or \"none\"");
    }
  }
  for (const char* key : {"profile_args", "profile_rank_env"}) {
    const auto* n = t->get(key);
    if (n && w.profile.tool != ProfileTool::kNsys) {
      throw InvalidInput("[" + at(source, n->source()) + "] workload." + key + " needs profile = \"nsys\"");
    }
  }
  if (const auto* a = t->get("profile_args")) {
    const auto* arr = a->as_array();
    if (!arr) throw InvalidInput("[" + at(source, a->source()) + "] workload.profile_args must be a list of words (nsys profile options)");
    for (const auto& el : *arr) w.profile.args.push_back(expect_string(el, source, "each of workload.profile_args"));
  }
  if (const auto* r = t->get("profile_rank_env")) {
    w.profile.rank_env = expect_string(*r, source, "workload.profile_rank_env");
    if (w.profile.rank_env.empty() || !std::all_of(w.profile.rank_env.begin(), w.profile.rank_env.end(), [](char c) {
          return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
        })) {
      throw InvalidInput("[" + at(source, r->source()) + "] workload.profile_rank_env must be an environment variable "
                         "name (e.g. PMI_RANK)");
    }
  }
  validate_profile(w, source + ": [workload]");
  return w;
}

}  // namespace

bool ExcludeRule::matches(const ParamMap& params) const {
  for (const auto& [key, values] : match) {
    auto it = params.find(key);
    if (it == params.end()) return false;
    bool any = false;
    for (const auto& v : values) any = any || param_text(v) == param_text(it->second);
    if (!any) return false;
  }
  return true;
}

namespace {

// The combinations as indices into each parameter's values (mixed radix, the last parameter
// varying fastest), with the exclude rules precomputed per value: whether a combination is
// excluded is then a few table lookups, without building its ParamMap or comparing texts. For a
// spec of 100,000 combinations (kMaxSweepCombinations) this is what makes parsing and expanding
// cheap; expand() builds maps only for the combinations it keeps.
class Combinations {
 public:
  explicit Combinations(const SweepSpec& spec) : spec_(spec), index_(spec.parameters.size(), 0) {
    for (const auto& rule : spec.excludes) {
      Rule r;
      bool possible = true;
      for (const auto& [key, values] : rule.match) {
        // The parameter a ParamMap would hold under `key`: the last one of that name.
        std::size_t pi = spec.parameters.size();
        for (std::size_t i = 0; i < spec.parameters.size(); ++i)
          if (spec.parameters[i].first == key) pi = i;
        if (pi == spec.parameters.size()) {
          possible = false;  // ExcludeRule::matches: a key the combination lacks never matches
          break;
        }
        std::vector<char> allowed;
        for (const auto& d : spec.parameters[pi].second) {
          bool any = false;
          for (const auto& v : values) any = any || param_text(v) == param_text(d);
          allowed.push_back(any ? 1 : 0);
        }
        r.emplace_back(pi, std::move(allowed));
      }
      if (possible) rules_.push_back(std::move(r));
    }
    for (const auto& [name, values] : spec.parameters) done_ = done_ || values.empty();
  }

  bool done() const { return done_; }
  bool excluded() const {
    for (const auto& r : rules_) {
      bool all = true;
      for (const auto& [pi, allowed] : r) all = all && allowed[index_[pi]];
      if (all) return true;
    }
    return false;
  }
  ParamMap params() const {
    ParamMap p;
    for (std::size_t i = 0; i < index_.size(); ++i) p[spec_.parameters[i].first] = spec_.parameters[i].second[index_[i]];
    // [presets.NAME]: the parameters the chosen value stands for join the combination.
    for (const auto& [name, table] : spec_.presets) {
      auto v = p.find(name);
      if (v == p.end()) continue;
      auto preset = table.find(param_text(v->second));
      if (preset == table.end()) continue;
      for (const auto& [k, val] : preset->second) p[k] = val;
    }
    return p;
  }
  void next() {
    for (std::size_t i = index_.size(); i-- > 0;) {
      if (++index_[i] < spec_.parameters[i].second.size()) return;
      index_[i] = 0;
    }
    done_ = true;
  }

 private:
  using Rule = std::vector<std::pair<std::size_t, std::vector<char>>>;
  const SweepSpec& spec_;
  std::vector<std::size_t> index_;
  std::vector<Rule> rules_;
  bool done_ = false;
};

// Whether any combination survives the exclude rules (without expanding them).
bool any_combination_kept(const SweepSpec& spec) {
  for (Combinations c(spec); !c.done(); c.next())
    if (!c.excluded()) return true;
  return false;
}

}  // namespace

std::vector<ParamMap> SweepSpec::expand() const {
  std::vector<ParamMap> kept;
  for (Combinations c(*this); !c.done(); c.next())
    if (!c.excluded()) kept.push_back(c.params());
  return kept;
}

std::vector<std::string> SweepSpec::swept_parameters() const {
  std::vector<std::string> out;
  for (const auto& [name, values] : parameters)
    if (values.size() > 1) out.push_back(name);
  return out;
}

Json SweepSpec::to_json() const {
  Json params = Json::object();
  Json order = Json::array();
  for (const auto& [name, values] : parameters) {
    params[name] = values.size() == 1 ? values[0] : Json(values);
    order.push_back(name);
  }
  Json ex = Json::array();
  for (const auto& r : excludes) {
    Json e = Json::object();
    for (const auto& [k, v] : r.match) e[k] = v;
    ex.push_back(e);
  }
  Json j{{"name", name},       {"description", description}, {"source", source},
         {"repeats", repeats}, {"workload", workload.describe()}, {"parameters", params},
         {"parameter_order", order},
         {"exclude", ex}};
  if (timeout_s) j["timeout_s"] = *timeout_s;
  if (oom_search.enabled)
    j["oom_search"] = {{"max_micro_batch", oom_search.max_micro_batch}, {"use_plan", oom_search.use_plan}};
  if (!presets.empty()) {
    Json pr = Json::object();
    for (const auto& [name, table] : presets)
      for (const auto& [value, params] : table) pr[name][value] = Json(params);
    j["presets"] = pr;
  }
  return j;
}

SweepSpec load_sweep_spec(const std::string& path, const std::set<std::string>& provided_by_runner) {
  std::ifstream f(path);
  if (!f) {
    throw InvalidInput("[sweep] cannot read the spec file " + path + " — check the path");
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_sweep_spec(ss.str(), path, provided_by_runner);
}

SweepSpec parse_sweep_spec(const std::string& text, const std::string& source,
                           const std::set<std::string>& provided_by_runner) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw InvalidInput("[" + at(source, e.source()) + "] malformed TOML: " + std::string(e.description()) +
                       " — fix the file at that line and column");
  }
  check_keys(root, source, "the top level",
             {"name", "description", "repeats", "timeout", "workload", "parameters", "exclude", "oom_search",
              "presets"});
  SweepSpec spec;
  spec.source = source;
  fs::path base_dir = fs::path(source).has_parent_path() ? fs::path(source).parent_path() : fs::path(".");

  spec.name = fs::path(source).stem().string();
  if (const auto* n = root.get("name")) spec.name = expect_string(*n, source, "name");
  if (spec.name.empty()) throw InvalidInput("[" + source + "] name is empty — give the sweep a name");
  if (const auto* n = root.get("description")) spec.description = expect_string(*n, source, "description");
  if (const auto* n = root.get("repeats")) {
    auto v = n->value<std::int64_t>();
    if (!n->is_integer() || !v || *v < 1 || *v > 1000) {
      throw InvalidInput("[" + at(source, n->source()) + "] repeats must be an integer from 1 to 1000");
    }
    spec.repeats = static_cast<int>(*v);
  }
  if (const auto* n = root.get("timeout")) {
    auto v = n->value<double>();
    if (!(n->is_integer() || n->is_floating_point()) || !v || *v <= 0) {
      throw InvalidInput("[" + at(source, n->source()) + "] timeout must be a positive number of seconds");
    }
    spec.timeout_s = *v;
  }

  if (const auto* n = root.get("oom_search")) {
    const toml::table* t = n->as_table();
    if (!t) throw InvalidInput("[" + at(source, n->source()) + "] oom_search must be a table: [oom_search]");
    check_keys(*t, source, "[oom_search]", {"max_micro_batch", "use_plan"});
    spec.oom_search.enabled = true;
    if (const auto* m = t->get("max_micro_batch")) {
      auto v = m->value<std::int64_t>();
      if (!m->is_integer() || !v || *v < 1 || *v > 1000000) {
        throw InvalidInput("[" + at(source, m->source()) + "] oom_search.max_micro_batch must be an integer from 1 to 1000000");
      }
      spec.oom_search.max_micro_batch = static_cast<int>(*v);
    }
    if (const auto* u = t->get("use_plan")) {
      if (!u->is_boolean()) throw InvalidInput("[" + at(source, u->source()) + "] oom_search.use_plan must be true or false");
      spec.oom_search.use_plan = u->value_or(true);
    }
  }

  const toml::table* wt = nullptr;
  if (const auto* n = root.get("workload")) {
    wt = n->as_table();
    if (!wt) throw InvalidInput("[" + at(source, n->source()) + "] workload must be a table: [workload]");
  }
  spec.workload = parse_workload(wt, source, base_dir);

  const auto* pn = root.get("parameters");
  if (pn && !pn->is_table()) {
    throw InvalidInput("[" + at(source, pn->source()) + "] parameters must be a table: [parameters]");
  }
  if (provided_by_runner.empty() && (!pn || pn->as_table()->empty())) {
    throw InvalidInput("[" + (pn ? at(source, pn->source()) : source) +
                       "] the spec needs a [parameters] table with at least one parameter");
  }
  std::set<std::string> names;
  // toml++ tables iterate in key order; the spec's order (table columns, which parameter
  // varies slowest) is the order in the file.
  std::vector<std::pair<const toml::key*, const toml::node*>> entries;
  if (pn)
    for (auto&& [k, v] : *pn->as_table()) entries.emplace_back(&k, &v);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    const auto& x = a.first->source().begin;
    const auto& y = b.first->source().begin;
    return x.line != y.line ? x.line < y.line : x.column < y.column;
  });
  for (const auto& [kp, vp] : entries) {
    const toml::key& k = *kp;
    const toml::node& v = *vp;
    std::string name = param_name(std::string(k.str()));
    if (name.empty()) throw InvalidInput("[" + at(source, k.source()) + "] empty parameter name");
    if (!names.insert(name).second) {
      throw InvalidInput("[" + at(source, k.source()) + "] parameter '" + name +
                         "' is given twice (as kebab and snake case?) — give it once");
    }
    if (spec.workload.is_native() && name == "json") {
      throw InvalidInput("[" + at(source, k.source()) + "] parameter 'json' is set by the lab (each trial's run "
                         "record) — remove it");
    }
    spec.parameters.emplace_back(name, values_of(v, source, "parameter '" + name + "'"));
  }

  // [presets.NAME]: what each value of parameter NAME stands for — parameters that join the
  // trial (a native workload gets them as flags, and not NAME itself): one sweep over "methods"
  // that set different flags (full fine-tuning, LoRA, QLoRA, ...).
  if (const auto* prn = root.get("presets")) {
    const auto* pt = prn->as_table();
    if (!pt) throw InvalidInput("[" + at(source, prn->source()) + "] presets must be tables: [presets.PARAMETER]");
    for (auto&& [pk, pv] : *pt) {
      const std::string name = param_name(std::string(pk.str()));
      const std::vector<Json>* domain = nullptr;
      for (const auto& [pname, pvalues] : spec.parameters)
        if (pname == name) domain = &pvalues;
      if (!domain) {
        throw InvalidInput("[" + at(source, pk.source()) + "] [presets." + name + "] names no parameter — parameters: " +
                           join(std::vector<std::string>(names.begin(), names.end())));
      }
      const auto* vt = pv.as_table();
      if (!vt) throw InvalidInput("[" + at(source, pv.source()) + "] presets." + name + " must be a table: [presets." + name + "]");
      std::map<std::string, ParamMap> table;
      for (auto&& [vk, vv] : *vt) {
        const auto* set = vv.as_table();
        if (!set) {
          throw InvalidInput("[" + at(source, vv.source()) + "] presets." + name + "." + std::string(vk.str()) +
                             " must be a table of parameters, e.g. " + std::string(vk.str()) + " = { lora_rank = 16 }");
        }
        ParamMap params;
        for (auto&& [k, v] : *set) {
          const std::string pname = param_name(std::string(k.str()));
          if (names.count(pname) || pname == name) {
            throw InvalidInput("[" + at(source, k.source()) + "] presets." + name + "." + std::string(vk.str()) + " sets '" +
                               pname + "', which is also a parameter — set it in one place");
          }
          if (spec.workload.is_native() && (pname == "json" || pname == kSubcommandParam)) {
            throw InvalidInput("[" + at(source, k.source()) + "] presets cannot set '" + pname + "' — " +
                               (pname == "json" ? "the lab sets it" : "give it in [parameters]"));
          }
          params[pname] = scalar(v, source, "presets." + name + "." + std::string(vk.str()) + "." + pname);
        }
        table[std::string(vk.str())] = std::move(params);
      }
      for (const auto& v : *domain) {
        if (!table.count(param_text(v))) {
          throw InvalidInput("[" + at(source, pv.source()) + "] [presets." + name + "] has no entry for " + name + " = " +
                             param_text(v) + " — add `" + param_text(v) + " = { ... }` (an empty table: no parameters)");
        }
      }
      spec.presets[name] = std::move(table);
      spec.workload.label_params.insert(name);
    }
  }

  if (const auto* en = root.get("exclude")) {
    const auto* arr = en->as_array();
    if (!arr) throw InvalidInput("[" + at(source, en->source()) + "] exclude must be written as [[exclude]] tables");
    for (const auto& el : *arr) {
      const auto* et = el.as_table();
      if (!et || et->empty()) {
        throw InvalidInput("[" + at(source, el.source()) + "] each [[exclude]] must be a non-empty table of "
                           "parameter = value(s)");
      }
      ExcludeRule rule;
      for (auto&& [k, v] : *et) {
        std::string name = param_name(std::string(k.str()));
        const std::vector<Json>* domain = nullptr;
        for (const auto& [pname, pvalues] : spec.parameters)
          if (pname == name) domain = &pvalues;
        if (!domain) {
          throw InvalidInput("[" + at(source, k.source()) + "] exclude names '" + name +
                             "', which is not a parameter — parameters: " + join(std::vector<std::string>(names.begin(), names.end())));
        }
        auto values = values_of(v, source, "exclude." + name);
        for (const auto& val : values) {
          bool known = false;
          for (const auto& d : *domain) known = known || param_text(d) == param_text(val);
          if (!known) {
            throw InvalidInput("[" + at(source, v.source()) + "] exclude value " + name + " = " + param_text(val) +
                               " is not one of the parameter's values (" + value_list(*domain) + ")");
          }
        }
        rule.match.emplace_back(name, std::move(values));
      }
      spec.excludes.push_back(std::move(rule));
    }
  }

  if (!spec.workload.is_native()) {
    std::set<std::string> provided = names;
    provided.insert(provided_by_runner.begin(), provided_by_runner.end());
    spec.workload.check_placeholders(provided, source);
    // Map keys must name parameters, or they are probably a typo.
    for (const auto& [param, m] : spec.workload.value_map) {
      if (!provided.count(param)) {
        throw InvalidInput("[" + source + "] [workload.map." + param + "] names no parameter — parameters: " +
                           join(std::vector<std::string>(provided.begin(), provided.end())));
      }
    }
  }
  // The combinations are expanded in memory: refuse a product no one means to run before it
  // exhausts memory (found by fuzzing: 8 lists of 10 values).
  std::uint64_t combinations = 1;
  for (const auto& [name, values] : spec.parameters) {
    combinations *= std::max<std::uint64_t>(values.size(), 1);
    if (combinations > kMaxSweepCombinations) {
      throw InvalidInput("[" + source + "] the parameter lists make more than " +
                         std::to_string(kMaxSweepCombinations) +
                         " combinations — split the sweep into several specs, or use fewer values");
    }
  }
  if (!any_combination_kept(spec)) {
    throw InvalidInput("[" + source + "] the exclude rules remove every combination — nothing would run");
  }
  // A native workload's "subcommand" parameter picks `scalelab train` or `scalelab dpo`.
  if (spec.workload.is_native()) {
    for (const auto& [name, values] : spec.parameters) {
      if (name != kSubcommandParam) continue;
      for (const auto& v : values) {
        try {
          native_subcommand(ParamMap{{name, v}});
        } catch (const InvalidInput& e) {
          throw InvalidInput("[" + source + "] " + std::string(e.what()).substr(6));
        }
      }
    }
  }
  return spec;
}

}  // namespace scalelab::lab
