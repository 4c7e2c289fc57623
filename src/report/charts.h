#pragma once
// The report's charts: Vega specs built from analysis.json (analysis/analyze.h), each with a title,
// a one-line finding and the mark counts the browser test checks (a named mark and the number of
// items it must draw: one per data row where that is defined).
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab::report {

using Json = nlohmann::json;

struct Chart {
  std::string id;       // "corr-heatmap", ...
  std::string section;  // card group
  std::string title;
  std::string finding;  // one line
  Json spec;            // a Vega spec
  std::map<std::string, long> expect_marks;  // mark name -> items
  // Set by util::link_rows: the chart has the `keep` / `hl` signals (the page's parameter filter
  // and the brushed runs); expect_marks then counts every row (no filter).
  bool linked = false;
  // The target the chart is about ("" for none); the page's target selector shows its cards.
  std::string target = {};
};

// Every chart the analysis supports, in report order. Sections without data produce no chart.
std::vector<Chart> build_charts(const Json& analysis);

}  // namespace scalelab::report
