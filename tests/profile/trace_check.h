#pragma once
// Checks shared by the trace tests: complete events nest properly per (pid, tid).
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab::testing_trace {

// An empty string when every thread's complete events nest (each event ends before the event
// that encloses its start ends); else the first offence.
inline std::string nesting_error(const nlohmann::json& trace) {
  struct Ev {
    double ts, end;
    std::string name;
  };
  std::map<std::pair<int, int>, std::vector<Ev>> by_thread;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const double ts = e["ts"].get<double>();
    by_thread[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back({ts, ts + e["dur"].get<double>(), e["name"]});
  }
  constexpr double eps = 1e-3;  // microseconds
  for (auto& [key, v] : by_thread) {
    std::sort(v.begin(), v.end(), [](const Ev& a, const Ev& b) { return a.ts != b.ts ? a.ts < b.ts : a.end > b.end; });
    std::vector<const Ev*> stack;
    for (const Ev& e : v) {
      while (!stack.empty() && stack.back()->end <= e.ts + eps) stack.pop_back();
      if (!stack.empty() && e.end > stack.back()->end + eps) {
        return "pid " + std::to_string(key.first) + " tid " + std::to_string(key.second) + ": '" + e.name + "' [" +
               std::to_string(e.ts) + ", " + std::to_string(e.end) + "] overlaps the end of '" + stack.back()->name +
               "' [" + std::to_string(stack.back()->ts) + ", " + std::to_string(stack.back()->end) + "]";
      }
      stack.push_back(&e);
    }
  }
  return "";
}

}  // namespace scalelab::testing_trace
