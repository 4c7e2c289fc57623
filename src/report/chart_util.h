#pragma once
// Helpers the report's chart builders share (charts.cpp, parcoords.cpp, scaling_facets.cpp,
// telemetry_charts.cpp, objectives.cpp, memory_chart.cpp):
// number formatting, the base Vega spec, tooltips, and the page-wide row linking (the parameter
// filter and the brushed selection; see report.h).
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "report/charts.h"

namespace scalelab::report::util {

inline std::string fmt(double v, int sig = 3) {
  if (!std::isfinite(v)) return "—";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", sig, v);
  return buf;
}
inline double d(const Json& v, double fallback = NAN) { return v.is_number() ? v.get<double>() : fallback; }

// The frame column object of analysis.json by name, or null.
inline const Json* column(const Json& a, const std::string& name) {
  for (const auto& c : a["table"]["columns"])
    if (c["name"] == name) return &c;
  return nullptr;
}

// The parameters a sweep's [presets.NAME] stand for (analysis.json "presets"), when the preset's
// own column (its label) is in the table: the report folds them into that label.
inline std::map<std::string, std::string> folded_parameters(const Json& a) {
  std::map<std::string, std::string> out;  // parameter -> its preset
  if (!a.contains("presets")) return out;
  for (auto p = a["presets"].begin(); p != a["presets"].end(); ++p) {
    if (!column(a, p.key())) continue;
    for (const auto& k : p.value())
      if (column(a, k.get<std::string>())) out.emplace(k.get<std::string>(), p.key());
  }
  return out;
}

inline Json base_spec(int width, int height) {
  return {{"$schema", "https://vega.github.io/schema/vega/v5.json"},
          {"width", width},
          {"height", height},
          {"padding", 8},
          {"autosize", {{"type", "pad"}}},
          {"config", {{"axis", {{"labelFontSize", 11}, {"titleFontSize", 12}, {"labelLimit", 220}, {"labelOverlap", true}}},
                      {"legend", {{"labelFontSize", 11}, {"titleFontSize", 11}}},
                      {"text", {{"fontSize", 11}}}}}};
}

inline Json tooltip_signal(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string s = "{";
  for (std::size_t k = 0; k < fields.size(); ++k)
    s += (k ? ", " : "") + std::string("'") + fields[k].first + "': " + fields[k].second;
  return {{"signal", s + "}"}};
}

inline bool lower_better_name(const std::string& m) {
  for (const char* k : {"loss", "time", "bytes", "gib", "memory"})
    if (m.find(k) != std::string::npos) return true;
  return false;
}

// Row linking. A linked chart declares two signals the page sets through the Vega view API:
// `keep` (null, or an object whose keys are the row labels the parameter filter lets through)
// and `hl` (null, or the row labels brushed in the parallel coordinates). `link_rows` adds both
// and a filter on `keep` to the dataset `data_name` (its tuples carry the row label in `row`);
// a chart whose marks should show the brushed rows adds a dataset with `highlight_dataset`.
inline void link_rows(Chart& c, const std::string& data_name) {
  Json& s = c.spec;
  if (!s.contains("signals")) s["signals"] = Json::array();
  bool have = false;
  for (const auto& sig : s["signals"]) have = have || sig["name"] == "keep";
  if (!have) {
    s["signals"].push_back({{"name", "keep"}, {"value", nullptr}});
    s["signals"].push_back({{"name", "hl"}, {"value", nullptr}});
  }
  for (auto& dat : s["data"]) {
    if (dat["name"] != data_name) continue;
    if (!dat.contains("transform")) dat["transform"] = Json::array();
    const Json keep_filter = {{"type", "filter"}, {"expr", "!keep || keep[datum.row]"}};
    dat["transform"].insert(dat["transform"].begin(), keep_filter);
  }
  c.linked = true;
}

// The opacity of a per-run mark (its tuples carry `row`): while runs are brushed, the others dim
// to a quarter; the brushed ones are ringed by a `points_hl` mark over a `highlight_dataset`.
inline constexpr const char* kDimUnbrushed = "hl && !hl[datum.row] ? 0.25 : 1";

// A dataset of the brushed rows of `source` (named `name`) for a highlight layer.
inline Json highlight_dataset(const std::string& name, const std::string& source) {
  return {{"name", name}, {"source", source}, {"transform", Json::array({{{"type", "filter"}, {"expr", "hl && hl[datum.row]"}}})}};
}

// Charts added by this part of the report (declared here, defined in their own files).
void parcoords_chart(const Json& a, std::vector<Chart>& out);
void scaling_facet_charts(const Json& a, std::vector<Chart>& out);
void telemetry_charts(const Json& a, std::vector<Chart>& out);
void objective_importance_chart(const Json& a, std::vector<Chart>& out);  // objectives.cpp
void memory_parts_chart(const Json& a, std::vector<Chart>& out);          // memory_chart.cpp

}  // namespace scalelab::report::util
