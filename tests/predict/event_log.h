#pragma once
// Reading allocation event logs in the tests that set the generated schedule beside a recorded run:
// the CPU tracer's `.cpu.events`, the H200 traces' `.events` (tools/predict/trace_to_events.py) and
// the schedule's own text (schedule_text). All three are `a BYTES [...]` / `f N` lines (N numbers
// the allocations from 0) with `# PHASE` markers.
#include <algorithm>
#include <istream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace scalelab::predict::test {

// The requests and frees of at least `min_bytes`, as
// "a SIZE" / "f SIZE", from the `nth` (1-based) marker called `phase` up to the first marker in
// `ends` after it (or, with `ends` empty, the next marker that is not in `skip`). Markers in
// `skip` are read past (the ones only the schedule has: clip_grad_norm, zero_grad).
// `round`: sizes rounded to 512 bytes (the allocator's view; the CPU tracer's sizes are exact).
inline std::vector<std::string> phase_events(std::istream& in, const std::string& phase, int nth,
                                             std::size_t min_bytes, const std::set<std::string>& ends = {},
                                             const std::set<std::string>& skip = {}, bool round = true) {
  std::vector<std::size_t> sizes;
  std::vector<std::string> out;
  std::string line;
  int seen = 0;
  bool on = false;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string op;
    ls >> op;
    if (op == "#") {
      std::string ph;
      ls >> ph;
      if (skip.count(ph)) continue;
      if (on && (ends.empty() || ends.count(ph))) break;
      if (ph == phase && ++seen == nth) on = true;
      continue;
    }
    if (op != "a" && op != "f") continue;  // the H200 traces' `s ADDR`, `max_reserved` lines
    std::size_t v = 0;
    ls >> v;
    if (op == "a") sizes.push_back(round ? (v + 511) / 512 * 512 : v);
    const std::size_t bytes = op == "a" ? sizes.back() : sizes.at(v);
    if (on && bytes >= min_bytes) out.push_back(op + " " + std::to_string(bytes));
  }
  return out;
}

// The length of the longest common subsequence: how many of one sequence's events the other has
// in the same order.
inline std::size_t common_subsequence(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (std::size_t i = a.size(); i-- > 0;) {
    for (std::size_t k = b.size(); k-- > 0;) cur[k] = a[i] == b[k] ? prev[k + 1] + 1 : std::max(prev[k], cur[k + 1]);
    std::swap(prev, cur);
  }
  return prev[0];
}

}  // namespace scalelab::predict::test
