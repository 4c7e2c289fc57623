#include "core/context.h"

#include <algorithm>

namespace scalelab {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kData: return "data";
    case Phase::kComm: return "comm";
    case Phase::kOther: return "other";
  }
  return "?";
}

void Profiler::add(const std::string& family, Phase phase, double seconds) {
  auto& e = entries_[{family, phase}];
  e.seconds += seconds;
  e.calls += 1;
}

std::vector<Profiler::Row> Profiler::rows() const {
  std::vector<Row> out;
  for (const auto& [key, e] : entries_) out.push_back(Row{key.first, key.second, e});
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.entry.seconds > b.entry.seconds; });
  return out;
}

double Profiler::total_seconds() const {
  double t = 0;
  for (const auto& [key, e] : entries_) t += e.seconds;
  return t;
}

}  // namespace scalelab
