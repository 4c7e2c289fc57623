// #1: telemetry small multiples per trial (a panel per source.metric, a line per device, one
// shared time axis with drag-to-zoom, a tooltip per sample) and the GPU utilization bars with
// the idle/straggler flags.
#include <algorithm>
#include <map>
#include <set>

#include "report/chart_util.h"

namespace scalelab::report::util {
namespace {

// The row of the data table whose parameters a trial ran with (repeats share a row), or "".
std::string row_of_params(const Json& a, const Json& params) {
  const auto& cols = a["table"]["columns"];
  for (std::size_t i = 0; i < a["table"]["row_labels"].size(); ++i) {
    bool same = true;
    for (const auto& c : cols) {
      const std::string role = c["role"].get<std::string>(), name = c["name"].get<std::string>();
      if (role != "parameter" || !params.contains(name)) continue;
      const Json& p = params[name];
      const Json& v = c["values"][i];
      if (v.is_null()) continue;
      if (v.is_number()) same = p.is_number() && p.get<double>() == v.get<double>();
      else same = (p.is_string() ? p.get<std::string>() : p.dump()) == v.get<std::string>();
      if (!same) break;
    }
    if (same) return a["table"]["row_labels"][i].get<std::string>();
  }
  return "";
}

}  // namespace

void telemetry_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("telemetry") || a["telemetry"]["trials"].empty()) return;
  const auto& trials = a["telemetry"]["trials"];
  Json rows = Json::array(), options = Json::array(), labels = Json::array(), extent = Json::object(), trial_row = Json::object();
  long first = -1;
  long first_n = 0;
  std::set<std::string> keys;
  for (const auto& t : trials) {
    const long label = t["trial_id"].get<long>();
    options.push_back(label);
    labels.push_back("trial " + std::to_string(label) + ": " + t["config"].get<std::string>());
    const std::string row = row_of_params(a, t.value("params", Json::object()));
    trial_row[std::to_string(label)] = row;
    long n = 0;
    double t0 = INFINITY, t1 = -INFINITY;
    for (const auto& s : t["series"]) {
      const std::string key = s["source"].get<std::string>() + "." + s["metric"].get<std::string>();
      keys.insert(key);
      for (std::size_t i = 0; i < s["t"].size(); ++i) {
        rows.push_back({{"trial", label}, {"key", key}, {"device", s["device"]}, {"t", s["t"][i]}, {"v", s["v"][i]}});
        t0 = std::min(t0, s["t"][i].get<double>());
        t1 = std::max(t1, s["t"][i].get<double>());
        ++n;
      }
    }
    extent[std::to_string(label)] = t1 >= t0 ? Json::array({t0, t1 > t0 ? t1 : t0 + 1}) : Json::array({0, 1});
    if (first < 0) { first = label; first_n = n; }
  }
  const int cols = 3, cw = 260, chh = 120;
  Json s = base_spec(cw, chh);
  s.erase("width");
  s.erase("height");
  // Zoom: drag across a panel to zoom every panel to that time window (one shared time scale);
  // double-click to see the whole run again. `tsel` is the drag in pixels of the panel, `tzoom`
  // the zoomed window (null: all of it), reset when another trial is picked.
  const std::string px = "clamp(x() - tsel.ox, 0, " + std::to_string(cw) + ")";
  s["signals"] = Json::array({{{"name", "trial"}, {"value", first}, {"bind", {{"input", "select"}, {"options", options}, {"labels", labels}, {"name", "trial "}}}},
                              {{"name", "textent"}, {"value", extent}},
                              {{"name", "tsel"}, {"value", {{"down", false}, {"done", false}, {"ox", 0}, {"p0", 0}, {"p1", 0}}},
                               {"on", Json::array({{{"events", "@tel_bg:mousedown"}, {"update", "{down: true, done: false, ox: x() - x(group()), p0: x(group()), p1: x(group())}"}},
                                                   {{"events", "window:mousemove"}, {"update", "tsel.down ? {down: true, done: false, ox: tsel.ox, p0: tsel.p0, p1: " + px + "} : tsel"}},
                                                   {{"events", "window:mouseup"}, {"update", "{down: false, done: tsel.down, ox: tsel.ox, p0: tsel.p0, p1: tsel.p1}"}}})}},
                              {{"name", "tzoom"}, {"value", nullptr},
                               {"on", Json::array({{{"events", {{"signal", "tsel"}}},
                                                    {"update", "tsel.done && abs(tsel.p1 - tsel.p0) > 3 ? [tdom[0] + (tdom[1] - tdom[0]) * min(tsel.p0, tsel.p1) / " + std::to_string(cw) +
                                                                   ", tdom[0] + (tdom[1] - tdom[0]) * max(tsel.p0, tsel.p1) / " + std::to_string(cw) + "] : tzoom"}},
                                                   {{"events", "@tel_bg:dblclick"}, {"update", "null"}},
                                                   {{"events", {{"signal", "trial"}}}, {"update", "null"}}})}},
                              {{"name", "tdom"}, {"update", "tzoom || textent[trial + ''] || [0, 1]"}}});
  s["data"] = Json::array({{{"name", "tel_rows"}, {"values", rows}, {"transform", Json::array({{{"type", "filter"}, {"expr", "datum.trial == trial"}}})}},
                           {{"name", "tel_view"}, {"source", "tel_rows"}, {"transform", Json::array({{{"type", "filter"}, {"expr", "datum.t >= tdom[0] && datum.t <= tdom[1]"}}})}}});
  s["layout"] = {{"columns", cols}, {"padding", {{"row", 36}, {"column", 50}}}, {"bounds", "full"}};
  s["scales"] = Json::array({{{"name", "color"}, {"type", "ordinal"}, {"domain", {{"data", "tel_rows"}, {"field", "device"}}}, {"range", "category"}},
                             {{"name", "tx"}, {"type", "linear"}, {"domain", {{"signal", "tdom"}}}, {"range", {0, cw}}, {"zero", false}}});
  s["legends"] = Json::array({{{"stroke", "color"}, {"title", "device"}, {"orient", "top"}, {"direction", "horizontal"}}});
  Json line = {{"type", "line"}, {"name", "tel_line"}, {"from", {{"data", "dev_facet"}}}, {"interactive", false},
               {"encode", {{"update", {{"x", {{"scale", "tx"}, {"field", "t"}}}, {"y", {{"scale", "y"}, {"field", "v"}}}, {"stroke", {{"scale", "color"}, {"field", "device"}}},
                                       {"strokeWidth", {{"value", 1.5}}}}}}}};
  // Invisible points under the lines carry the tooltips (a line's own tooltip is its first point's).
  Json pts = {{"type", "symbol"}, {"name", "tel_points"}, {"from", {{"data", "cell"}}},
              {"encode", {{"update", {{"x", {{"scale", "tx"}, {"field", "t"}}}, {"y", {{"scale", "y"}, {"field", "v"}}}, {"size", {{"value", 40}}},
                                      {"fill", {{"value", "#000"}}}, {"fillOpacity", {{"value", 0}}},
                                      {"tooltip", tooltip_signal({{"series", "datum.key"}, {"device", "datum.device"}, {"t (s)", "format(datum.t, '.2f')"},
                                                                  {"value", "format(datum.v, '.4~s')"}})}}}}}};
  Json by_device = {{"type", "group"}, {"from", {{"facet", {{"name", "dev_facet"}, {"data", "cell"}, {"groupby", "device"}}}}}, {"marks", Json::array({line})}};
  Json bg = {{"type", "rect"}, {"name", "tel_bg"},
             {"encode", {{"enter", {{"x", {{"value", 0}}}, {"y", {{"value", 0}}}, {"width", {{"value", cw}}}, {"height", {{"value", chh}}},
                                    {"fill", {{"value", "#fff"}}}, {"cursor", {{"value", "crosshair"}}}}}}}};
  Json drag = {{"type", "rect"}, {"name", "tel_drag"}, {"interactive", false},
               {"encode", {{"update", {{"x", {{"signal", "tsel.down ? min(tsel.p0, tsel.p1) : 0"}}}, {"x2", {{"signal", "tsel.down ? max(tsel.p0, tsel.p1) : 0"}}},
                                       {"y", {{"value", 0}}}, {"y2", {{"value", chh}}}, {"fill", {{"value", "#e67e22"}}}, {"fillOpacity", {{"signal", "tsel.down ? 0.2 : 0"}}}}}}}};
  Json cell = {{"type", "group"}, {"name", "panel"}, {"from", {{"facet", {{"name", "cell"}, {"data", "tel_view"}, {"groupby", "key"}}}}},
               {"sort", {{"field", "key"}}},
               {"title", {{"text", {{"signal", "parent.key"}}}, {"fontSize", 11}, {"frame", "group"}}},
               {"encode", {{"update", {{"width", {{"value", cw}}}, {"height", {{"value", chh}}}, {"stroke", {{"value", "#ccc"}}}}}}},
               {"scales", Json::array({{{"name", "y"}, {"type", "linear"}, {"domain", {{"data", "cell"}, {"field", "v"}}}, {"range", {chh, 0}}, {"zero", false}, {"nice", true}}})},
               {"axes", Json::array({{{"orient", "bottom"}, {"scale", "tx"}, {"title", {{"signal", "tzoom ? 't (s), zoomed: double-click to reset' : 't (s)'"}}}, {"tickCount", 5}},
                                     {{"orient", "left"}, {"scale", "y"}, {"format", ".3~s"}, {"tickCount", 4}}})},
               {"marks", Json::array({bg, by_device, pts, drag})}};
  s["marks"] = Json::array({cell});
  // The finding: the device that idles longest in the steady window, else the most unbalanced trial.
  std::string finding;
  double worst_idle = 0, worst_ratio = 0;
  std::string idle_text, ratio_text;
  for (const auto& t : trials) {
    if (!t.contains("imbalance")) continue;
    for (const auto& dv : t["imbalance"]["devices"])
      if (d(dv["idle_fraction"], 0) > worst_idle) {
        worst_idle = d(dv["idle_fraction"]);
        idle_text = "GPU " + dv["device"].get<std::string>() + " of trial " + std::to_string(t["trial_id"].get<long>()) + " is idle " + fmt(100 * worst_idle, 3) +
                    " % of the steady window";
      }
    const double r = d(t["imbalance"].value("max_over_median", Json()), 0);
    if (r > worst_ratio) { worst_ratio = r; ratio_text = "trial " + std::to_string(t["trial_id"].get<long>()) + " has the largest max/median utilization (" + fmt(r, 3) + ")"; }
  }
  finding = !idle_text.empty() ? idle_text : (!ratio_text.empty() ? ratio_text : std::to_string(keys.size()) + " source.metric series per trial");
  finding += "; " + std::to_string(trials.size()) + " trials: pick one below, drag across a panel to zoom, double-click to reset.";
  const auto& fl = a["telemetry"]["flagged"];
  Chart tel{"telemetry", "Telemetry", "Telemetry per trial and device", finding, s, {{"tel_line", first_n}, {"tel_points", first_n}}};
  // The parameter filter: a trial's row through the trial -> row map (not a field per point); the
  // page also moves the trial selector to a trial the filter keeps (report.cpp reads `trial_row`).
  link_rows(tel, "");
  tel.spec["signals"].push_back({{"name", "trial_row"}, {"value", trial_row}});
  tel.spec["data"][0]["transform"].push_back({{"type", "filter"}, {"expr", "!keep || keep[trial_row[datum.trial + '']]"}});
  out.push_back(std::move(tel));

  // Imbalance bars.
  Json bars = Json::array();
  std::map<std::string, int> straggler_count, idle_count;
  for (const auto& t : trials) {
    if (!t.contains("imbalance")) continue;
    for (const auto& dv : t["imbalance"]["devices"]) {
      if (dv["straggler"].get<bool>()) ++straggler_count[dv["device"].get<std::string>()];
      if (dv["idle"].get<bool>()) ++idle_count[dv["device"].get<std::string>()];
      if (bars.size() < 48)
        bars.push_back({{"row", "trial " + std::to_string(dv["trial"].get<long>()) + " · GPU " + dv["device"].get<std::string>()},
                        {"util", dv["mean_util_pct"]}, {"flag", dv["straggler"].get<bool>() ? "straggler" : (dv["idle"].get<bool>() ? "idle" : "ok")},
                        {"idle", dv["idle_fraction"]}});
    }
  }
  if (bars.empty()) return;
  Json b = base_spec(380, static_cast<int>(bars.size()) * 16);
  b["data"] = Json::array({{{"name", "imb_rows"}, {"values", bars}}});
  Json domain = Json::array();
  for (const auto& r : bars) domain.push_back(r["row"]);
  b["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", domain}, {"range", "height"}, {"padding", 0.15}},
                             {{"name", "x"}, {"type", "linear"}, {"domain", {0, 100}}, {"range", "width"}},
                             {{"name", "color"}, {"type", "ordinal"}, {"domain", {"ok", "straggler", "idle"}}, {"range", {"#5dade2", "#e67e22", "#c0392b"}}}});
  b["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "mean GPU utilization over the steady window (%)"}, {"grid", true}}, {{"orient", "left"}, {"scale", "y"}}});
  b["legends"] = Json::array({{{"fill", "color"}, {"title", "flag"}}});
  b["marks"] = Json::array({{{"type", "rect"}, {"name", "bars"}, {"from", {{"data", "imb_rows"}}},
                             {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "row"}}}, {"height", {{"scale", "y"}, {"band", 1}}}, {"x", {{"scale", "x"}, {"value", 0}}},
                                                     {"x2", {{"scale", "x"}, {"field", "util"}}}, {"fill", {{"scale", "color"}, {"field", "flag"}}},
                                                     {"tooltip", tooltip_signal({{"device", "datum.row"}, {"util %", "format(datum.util, '.1f')"}, {"idle share", "format(datum.idle, '.0%')"}})}}}}}}});
  std::string f2;
  for (const auto& [dev, n] : straggler_count) f2 += (f2.empty() ? "" : "; ") + std::string("GPU ") + dev + " a straggler in " + std::to_string(n) + " of " + std::to_string(trials.size()) + " trials";
  for (const auto& [dev, n] : idle_count) f2 += (f2.empty() ? "" : "; ") + std::string("GPU ") + dev + " idle in " + std::to_string(n) + " trials";
  if (f2.empty()) f2 = "No idle GPU and no straggler (every device within 80 % of the median utilization).";
  else f2 += " (" + std::to_string(fl.size()) + " flagged device rows).";
  out.push_back({"imbalance", "Telemetry", "GPU utilization per trial and device" + std::string(bars.size() >= 48 ? " (first 48)" : ""), f2, b,
                 {{"bars", static_cast<long>(bars.size())}}});
}

}  // namespace scalelab::report::util
