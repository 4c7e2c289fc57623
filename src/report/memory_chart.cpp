// Memory by part (issue 14): a stacked bar per configuration of the engine's memory plan at its
// planned peak, split by part (weights, gradients, optimizer states, activations, reference model,
// NF4 tiles, ...), with the measured peak as a marker — `results --view memory` as a chart, from
// analysis.json's "memory" section (analysis/memory.h). Bars are labelled by what varies (a
// preset's label, e.g. method=qlora, in place of the parameters it sets). Linked to the page's
// filter and brush through the configuration's run row.
#include <algorithm>
#include <cmath>
#include <map>

#include "report/chart_util.h"

namespace scalelab::report::util {

void memory_parts_chart(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("memory") || a["memory"]["rows"].empty()) return;
  const Json& mem = a["memory"];
  double top = 0;
  for (const auto& r : mem["rows"]) top = std::max({top, d(r["plan_total_bytes"], 0), d(r["measured_peak_bytes"], 0)});
  // The unit the numbers read best in.
  const bool gib = top >= 1024.0 * 1024 * 1024;
  const double unit = gib ? 1024.0 * 1024 * 1024 : 1024.0 * 1024;
  const std::string uname = gib ? "GiB" : "MiB";
  Json segs = Json::array(), peaks = Json::array(), domain = Json::array(), part_titles = Json::array();
  std::map<std::string, std::string> title_of;
  for (const auto& p : mem["parts"]) {
    std::string t = p.get<std::string>();
    std::replace(t.begin(), t.end(), '_', ' ');
    title_of[p.get<std::string>()] = t;
    part_titles.push_back(t);
  }
  long n_seg = 0, n_peak = 0, n_ok = 0, matching = 0;
  std::string biggest_label, smallest_label;
  double biggest = -1, smallest = INFINITY;
  for (const auto& r : mem["rows"]) {
    const std::string label = r["label"].get<std::string>() + (r["status"] == "ok" ? "" : " (" + r["status"].get<std::string>() + ")");
    domain.push_back(label);
    double x = 0;
    for (const auto& p : mem["parts"]) {
      const std::string part = p.get<std::string>();
      if (!r["parts"].contains(part)) continue;
      const double v = d(r["parts"][part]) / unit;
      segs.push_back({{"row", r["row"]}, {"label", label}, {"part", title_of[part]}, {"v", v}, {"x0", x}, {"x1", x + v}});
      x += v;
      ++n_seg;
    }
    const double plan = d(r["plan_total_bytes"]), meas = d(r["measured_peak_bytes"]);
    if (std::isfinite(meas)) {
      peaks.push_back({{"row", r["row"]}, {"label", label}, {"measured", meas / unit}, {"plan", plan / unit}, {"status", r["status"]}});
      ++n_peak;
      n_ok += r["status"] == "ok";
      matching += r["status"] == "ok" && plan == meas;
    }
    if (std::isfinite(plan) && r["status"] == "ok") {
      if (plan > biggest) biggest = plan, biggest_label = r["label"].get<std::string>();
      if (plan < smallest) smallest = plan, smallest_label = r["label"].get<std::string>();
    }
  }
  if (segs.empty()) return;
  Json s = base_spec(460, static_cast<int>(domain.size()) * 30 + 10);
  s["config"]["axis"]["labelLimit"] = 320;
  // The parts are stacked in C++ (x0, x1: running sums of the plan's own numbers), in the plan's
  // display order, so every bar reads weights first.
  s["data"] = Json::array({{{"name", "mem_segs"}, {"values", segs}}, {{"name", "mem_peaks"}, {"values", peaks}}});
  s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", domain}, {"range", "height"}, {"padding", 0.25}},
                             {{"name", "x"}, {"type", "linear"}, {"nice", true}, {"zero", true}, {"range", "width"},
                              {"domain", {{"fields", Json::array({{{"data", "mem_segs"}, {"field", "x1"}}, {{"data", "mem_peaks"}, {"field", "measured"}}})}}}},
                             {{"name", "color"}, {"type", "ordinal"}, {"domain", part_titles}, {"range", {{"scheme", "tableau10"}}}}});
  s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "planned peak by part (" + uname + "); black tick: measured peak"}, {"grid", true}},
                           {{"orient", "left"}, {"scale", "y"}, {"labelOverlap", false}}});
  s["legends"] = Json::array({{{"fill", "color"}, {"title", "part of the plan"}, {"orient", "right"}}});
  s["marks"] = Json::array(
      {{{"type", "rect"}, {"name", "mem_parts"}, {"from", {{"data", "mem_segs"}}},
        {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "label"}}}, {"height", {{"scale", "y"}, {"band", 1}}},
                                {"x", {{"scale", "x"}, {"field", "x0"}}}, {"x2", {{"scale", "x"}, {"field", "x1"}}}, {"fill", {{"scale", "color"}, {"field", "part"}}},
                                {"stroke", {{"signal", "hl && hl[datum.row] ? '#e67e22' : '#fff'"}}}, {"strokeWidth", {{"signal", "hl && hl[datum.row] ? 2 : 0.5"}}},
                                {"opacity", {{"signal", kDimUnbrushed}}},
                                {"tooltip", tooltip_signal({{"configuration", "datum.label"}, {"part", "datum.part"}, {uname, "format(datum.v, '.4~f')"}})}}}}}},
       {{"type", "rect"}, {"name", "mem_peak"}, {"from", {{"data", "mem_peaks"}}},
        {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "label"}, {"band", -0.1}}}, {"y2", {{"scale", "y"}, {"field", "label"}, {"band", 1.1}}},
                                {"x", {{"scale", "x"}, {"field", "measured"}, {"offset", -1.5}}}, {"width", {{"value", 3}}}, {"fill", {{"value", "#111"}}},
                                {"tooltip", tooltip_signal({{"configuration", "datum.label"}, {"measured peak " + uname, "format(datum.measured, '.4~f')"},
                                                            {"planned peak " + uname, "format(datum.plan, '.4~f')"}, {"status", "datum.status"}})}}}}}}});
  std::string finding;
  if (biggest >= 0 && biggest_label != smallest_label)
    finding = biggest_label + " plans the most memory (" + fmt(biggest / unit, 4) + " " + uname + "), " + smallest_label + " the least (" +
              fmt(smallest / unit, 4) + " " + uname + ", " + fmt(100 * smallest / biggest, 3) + " %); ";
  finding += "the measured peak equals the plan in " + std::to_string(matching) + " of " + std::to_string(n_ok) + " finished configuration(s).";
  Chart ch{"memory-parts", "Memory by part", "Planned peak memory by part, per configuration", finding, s,
           {{"mem_parts", n_seg}, {"mem_peak", n_peak}}};
  link_rows(ch, "mem_segs");
  link_rows(ch, "mem_peaks");
  out.push_back(std::move(ch));
}

}  // namespace scalelab::report::util
