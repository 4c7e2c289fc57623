#include "lab/outcome.h"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace scalelab::lab {
namespace {

std::string trim(const std::string& s, std::size_t max_len = 300) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  auto e = s.find_last_not_of(" \t\r\n");
  std::string t = s.substr(b, e - b + 1);
  if (t.size() > max_len) t = t.substr(0, max_len) + "...";
  return t;
}

// Lines longer than this are not matched (std::regex recurses per character and long lines
// would exhaust the stack; training logs' interesting lines are short).
constexpr std::size_t kMaxMatchedLine = 4096;

template <typename F>
void for_each_line(const std::string& text, F&& f) {
  std::size_t start = 0;
  while (start < text.size()) {
    auto nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(start, nl - start);
    // Progress bars rewrite a line with '\r'; each piece is a line of its own.
    std::size_t p = 0;
    while (p <= line.size()) {
      auto cr = line.find('\r', p);
      if (cr == std::string::npos) cr = line.size();
      if (cr - p <= kMaxMatchedLine) f(line.substr(p, cr - p));
      p = cr + 1;
    }
    start = nl + 1;
  }
}

const char* const kMetricFields[] = {"tokens_per_s",     "tokens_per_s_per_device", "step_time_s",
                                     "max_allocated_bytes", "max_reserved_bytes",   "final_loss",
                                     "val_loss",          "val_perplexity",         "mfu",
                                     "params",            "trainable_params",       "frozen_params",
                                     "flops_per_token",
                                     // DPO runs (train --dpo / scalelab dpo): the last step's
                                     "final_reward_accuracy", "final_reward_margin", "final_rewards_chosen",
                                     "final_rewards_rejected",
                                     // and the last evaluation's on held-out pairs (--val-data)
                                     "val_reward_accuracy", "val_reward_margin", "val_rewards_chosen",
                                     "val_rewards_rejected"};

// "optimizer states" -> "optimizer_states": a plan item's name as part of a metric key.
std::string slug(const std::string& name) {
  std::string s;
  for (char c : name) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (alnum) s += c;
    else if (c >= 'A' && c <= 'Z') s += static_cast<char>(c - 'A' + 'a');
    else if (!s.empty() && s.back() != '_') s += '_';
  }
  while (!s.empty() && s.back() == '_') s.pop_back();
  return s;
}

// The run record's memory plan, part by part, as metrics: plan_<part>_bytes is what the part held
// at the plan's peak ("weights", "optimizer states", "activations", ... whatever the engine
// names), plan_total_bytes the planned peak. `results --view memory` shows them side by side.
void add_plan_metrics(const Json& record, Json& metrics) {
  auto it = record.find("memory_plan");
  if (it == record.end() || !it->is_object()) return;
  const Json& plan = *it;
  if (plan.contains("total_bytes") && plan["total_bytes"].is_number()) metrics["plan_total_bytes"] = plan["total_bytes"];
  if (!plan.contains("items") || !plan["items"].is_array()) return;
  for (const Json& item : plan["items"]) {
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) continue;
    auto at = item.find("at_peak_bytes");
    if (at == item.end() || !at->is_number()) continue;
    const std::string key = slug(item["name"].get<std::string>());
    if (!key.empty()) metrics["plan_" + key + "_bytes"] = *at;
  }
}

}  // namespace

Json extract_metrics(const std::vector<MetricRule>& rules, const std::string& log_text) {
  Json out = Json::object();
  for_each_line(log_text, [&](const std::string& line) {
    for (const auto& r : rules) {
      std::smatch m;
      if (!std::regex_search(line, m, r.regex) || m.size() < 2 || !m[1].matched) continue;
      std::string word = m[1].str();
      char* end = nullptr;
      double v = std::strtod(word.c_str(), &end);
      if (end == word.c_str() || !std::isfinite(v)) continue;
      out[r.name] = v;  // the last match wins: the final summary comes last
    }
  });
  return out;
}

std::string find_matching_line(const std::regex& re, const std::string& log_text) {
  std::string found;
  for_each_line(log_text, [&](const std::string& line) {
    if (found.empty() && std::regex_search(line, re)) found = trim(line);
  });
  return found;
}

std::string last_line(const std::string& text) {
  std::string last;
  for_each_line(text, [&](const std::string& line) {
    std::string t = trim(line);
    if (!t.empty()) last = t;
  });
  return last;
}

// How the trial's process ended, with the trial's timeout (a launcher may have run it).
static std::string describe_end(const SubprocessResult& proc, double timeout_s) {
  if (!proc.started || !proc.timed_out) return proc.describe();
  char buf[128];
  std::snprintf(buf, sizeof buf, "timed out after %.1f s (its process group was killed)", timeout_s);
  return buf;
}

TrialOutcome classify_native(const SubprocessResult& proc, double timeout_s, const std::string& record_path,
                             const std::string& log_text) {
  TrialOutcome out;
  if (!proc.started || proc.log_overflow) {
    out.reason = describe_end(proc, timeout_s);
    return out;
  }
  if (proc.timed_out) {
    out.status = TrialStatus::kTimeout;
    out.reason = describe_end(proc, timeout_s);
    return out;
  }
  std::string record_problem;
  {
    std::ifstream f(record_path);
    if (f) {
      try {
        out.record = Json::parse(f);
        if (!out.record.is_object()) {
          record_problem = "the run record is not a JSON object";
          out.record = Json();
        }
      } catch (const Json::exception& e) {
        record_problem = std::string("the run record is not valid JSON (") + e.what() + ")";
      }
    } else {
      record_problem = "no run record was written";
    }
  }
  if (out.record.is_object()) {
    for (const char* k : kMetricFields) {
      auto it = out.record.find(k);
      if (it != out.record.end() && it->is_number()) out.metrics[k] = *it;
    }
    add_plan_metrics(out.record, out.metrics);
    if (out.metrics.contains("max_reserved_bytes")) {
      out.metrics["max_reserved_gib"] = out.metrics["max_reserved_bytes"].get<double>() / (1024.0 * 1024 * 1024);
    }
  }
  std::string record_status = out.record.is_object() ? out.record.value("status", "") : "";
  std::string record_error;
  if (out.record.is_object() && out.record.contains("error") && out.record["error"].is_string())
    record_error = out.record["error"].get<std::string>();
  const std::string end = describe_end(proc, timeout_s);

  if (proc.exit_code() == 0) {
    if (record_status == "ok") {
      out.status = TrialStatus::kOk;
      return out;
    }
    out.reason = "exit code 0 but " +
                 (record_problem.empty() ? "the run record's status is '" + record_status + "'" : record_problem);
    return out;
  }
  if (record_status == "oom" || proc.exit_code() == exit_code(ErrorKind::kOutOfMemory)) {
    out.status = TrialStatus::kOom;
    out.reason = !record_error.empty() ? record_error : last_line(log_text);
    if (out.reason.empty()) out.reason = end;
    return out;
  }
  out.refused = proc.exit_code() == exit_code(ErrorKind::kInvalidInput);
  std::string detail = !record_error.empty() ? record_error : last_line(log_text);
  out.reason = end + (detail.empty() ? "" : ": " + detail);
  return out;
}

TrialOutcome classify_external(const Workload& workload, const SubprocessResult& proc, double timeout_s,
                               const std::string& log_text) {
  TrialOutcome out;
  if (!proc.started || proc.log_overflow) {
    out.reason = describe_end(proc, timeout_s);
    return out;
  }
  out.metrics = extract_metrics(workload.metrics, log_text);
  if (proc.timed_out) {
    out.status = TrialStatus::kTimeout;
    out.reason = describe_end(proc, timeout_s);
    return out;
  }
  std::string missing;
  for (const auto& name : workload.required_metrics) {
    if (!out.metrics.contains(name)) append_item(missing, name, ", ");
  }
  const bool success = proc.exit_code() == 0;
  if (success && missing.empty()) {
    out.status = TrialStatus::kOk;
    return out;
  }
  std::string oom_line = find_matching_line(workload.oom_regex, log_text);
  if (!oom_line.empty()) {
    out.status = TrialStatus::kOom;
    out.reason = oom_line;
    return out;
  }
  const std::string end = describe_end(proc, timeout_s);
  if (success) {
    std::string patterns;
    for (const auto& r : workload.metrics) {
      if (missing.find(r.name) != std::string::npos) patterns += " /" + r.pattern + "/";
    }
    out.reason = "exit code 0 but the log has no " + missing + " (no line matched" + patterns +
                 ") — check the workload's output or its metric patterns";
    return out;
  }
  out.refused = proc.exit_code() == exit_code(ErrorKind::kInvalidInput);
  std::string detail = last_line(log_text);
  out.reason = end + (detail.empty() ? "" : ": " + detail);
  return out;
}

}  // namespace scalelab::lab
