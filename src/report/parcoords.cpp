// Parallel coordinates of the runs: an axis per parameter and per target, a line per row of the
// data table. Dragging along an axis brushes an interval on it; the rows inside every brushed
// interval are the selection, which the page (report.cpp) sends to the other charts (`hl`) and
// the runs table. Double-click an axis to clear its brush.
#include <algorithm>
#include <cmath>
#include <set>

#include "report/chart_util.h"

namespace scalelab::report::util {
namespace {

constexpr std::size_t kMaxDims = 14;

struct Dim {
  std::string name;
  const Json* col;
  bool categorical;
  bool log2;
  Json levels;  // point-scale domain of a categorical/binary axis
};

std::string brush_on(std::size_t k) {
  const std::string b = "brush_" + std::to_string(k);
  return "(isArray(" + b + ") && abs(" + b + "[1] - " + b + "[0]) > 2)";
}

}  // namespace

void parcoords_chart(const Json& a, std::vector<Chart>& out) {
  const std::size_t n = a["table"]["rows"].get<std::size_t>();
  if (n < 2) return;
  // Axes: the features (parameters), then the targets.
  std::vector<Dim> dims;
  std::set<std::string> seen;
  // A preset's parameters are shown through its label (e.g. method=lora, not lora_rank=16).
  const auto folded = folded_parameters(a);
  auto add = [&](const std::string& name) {
    if (dims.size() >= kMaxDims || seen.count(name) || folded.count(name)) return;
    const Json* c = column(a, name);
    if (!c) return;
    Dim dm{name, c, (*c)["kind"] != "numeric", (*c)["log2_axis"].get<bool>(), Json::array()};
    long present = 0;
    std::set<std::string> lv;
    for (const auto& v : (*c)["values"]) {
      if (v.is_null()) continue;
      ++present;
      if (dm.categorical) lv.insert(v.is_string() ? v.get<std::string>() : v.dump());
      else if (dm.log2 && v.get<double>() <= 0) dm.log2 = false;
    }
    if (present == 0) return;
    if (dm.categorical) {
      if (c->contains("levels")) dm.levels = (*c)["levels"];
      else for (const auto& l : lv) dm.levels.push_back(l);
    }
    seen.insert(name);
    dims.push_back(dm);
  };
  for (const auto& f : a["options"]["features"]) add(f.get<std::string>());
  const std::size_t n_params = dims.size();
  for (const auto& t : a["options"]["targets"]) add(t.get<std::string>());
  if (dims.size() < 2) return;
  const std::size_t D = dims.size();

  // Wide rows (the scale domains) and long rows (one tuple per row and axis, drawn as a line per
  // row; each carries its row's values so that the brush test needs no lookup).
  Json wide = Json::array(), longr = Json::array();
  std::vector<std::string> dkey(D), skey(D);
  for (std::size_t k = 0; k < D; ++k) {
    dkey[k] = std::string("d").append(std::to_string(k));
    skey[k] = std::string("y_").append(std::to_string(k));
  }
  for (std::size_t i = 0; i < n; ++i) {
    Json w{{"row", a["table"]["row_labels"][i]}};
    for (std::size_t k = 0; k < D; ++k) w[dkey[k]] = (*dims[k].col)["values"][i];
    wide.push_back(w);
    for (std::size_t k = 0; k < D; ++k) {
      Json l = w;
      l["k"] = k;
      l["v"] = w[dkey[k]];
      l["sk"] = skey[k];
      longr.push_back(l);
    }
  }
  const int width = std::max(520, static_cast<int>(D - 1) * 105), height = 280;
  Json s = base_spec(width, height);
  // The axis names are centred on their axes: the outer ones need room (about 3.3 px a
  // character at 11 px) so that "micro_batch_size (log2)" is not cut at the edge.
  auto half = [&](std::size_t k) { return static_cast<int>((dims[k].name.size() + (dims[k].log2 ? 7 : 0)) * 3.4) + 8; };
  s["padding"] = {{"top", 40}, {"left", std::max(60, half(0))}, {"right", std::max(110, half(D - 1))}, {"bottom", 8}};
  s["autosize"] = "none";
  s["width"] = width;
  s["height"] = height;
  Json signals = Json::array();
  signals.push_back({{"name", "pc_drag"}, {"value", -1},
                     {"on", Json::array({{{"events", "@pc_hit:mousedown"}, {"update", "datum.k"}}, {{"events", "window:mouseup"}, {"update", "-1"}}})}});
  std::string active, sel;
  Json dims_data = Json::array();
  Json scales = Json::array({{{"name", "dim"}, {"type", "point"}, {"domain", Json::array()}, {"range", "width"}}});
  Json axes = Json::array();
  Json marks = Json::array();
  for (std::size_t k = 0; k < D; ++k) {
    const std::string K = std::to_string(k), b = "brush_" + K;
    scales[0]["domain"].push_back(k);
    const std::string y = "clamp(y(), 0, height)";
    signals.push_back({{"name", b}, {"value", nullptr},
                       {"on", Json::array({{{"events", "@pc_hit:mousedown"}, {"update", "datum.k === " + K + " ? [" + y + ", " + y + "] : " + b}},
                                           {{"events", "window:mousemove"}, {"update", "pc_drag === " + K + " && isArray(" + b + ") ? [" + b + "[0], " + y + "] : " + b}},
                                           {{"events", "@pc_hit:dblclick"}, {"update", "datum.k === " + K + " ? null : " + b}}})}});
    active += (k ? " || " : "") + brush_on(k);
    sel += (k ? " && " : "") + std::string("(!") + brush_on(k) + " || inrange(scale('y_" + K + "', datum.d" + K + "), " + b + "))";
    const Dim& dm = dims[k];
    std::string title = dm.name + (dm.log2 ? " (log2)" : "");
    dims_data.push_back({{"k", k}, {"name", title}, {"target", k >= n_params}});
    Json sc{{"name", "y_" + K}, {"range", {height, 0}}};
    Json ax{{"orient", "left"}, {"scale", "y_" + K}, {"offset", {{"scale", "dim"}, {"value", k}, {"mult", -1}}}, {"zindex", 1},
            {"labelLimit", 90}, {"labelFontSize", 10}, {"tickCount", 6}};
    if (dm.categorical) {
      sc["type"] = "point";
      sc["domain"] = dm.levels;
      sc["padding"] = 0.5;
    } else if (dm.log2) {
      // Powers of two: a log2 scale with a tick at each value, labelled 1, 2, 4, 8, ...
      sc["type"] = "log";
      sc["base"] = 2;
      sc["domain"] = {{"data", "pc_all"}, {"field", "d" + K}};
      std::set<double> vals;
      for (const auto& v : (*dm.col)["values"])
        if (v.is_number()) vals.insert(v.get<double>());
      ax["values"] = Json(std::vector<double>(vals.begin(), vals.end()));
      ax["format"] = "~r";
    } else {
      sc["type"] = "linear";
      sc["zero"] = false;
      sc["nice"] = true;
      sc["domain"] = {{"data", "pc_all"}, {"field", "d" + K}};
      std::set<double> vals;
      double big = 0;
      for (const auto& v : (*dm.col)["values"])
        if (v.is_number()) vals.insert(v.get<double>()), big = std::max(big, std::fabs(v.get<double>()));
      // A parameter with a few values: a tick at each; SI prefixes only for large numbers (a
      // learning rate of 0.0002 must not read "0.2m").
      if (k < n_params && vals.size() <= 8) {
        sc["nice"] = false;
        ax["values"] = Json(std::vector<double>(vals.begin(), vals.end()));
      }
      // An explicit precision: without one Vega's linear tick format picks it from the tick step
      // (128 and 256 on a 6-tick axis read "130" and "260").
      ax["format"] = big >= 1e3 ? "~s" : ".6~r";
    }
    scales.push_back(sc);
    axes.push_back(ax);
    // The brush of this axis.
    marks.push_back({{"type", "rect"}, {"name", "pc_brush_" + K}, {"interactive", false},
                     {"encode", {{"update", {{"x", {{"signal", "scale('dim', " + K + ") - 9"}}}, {"width", {{"value", 18}}},
                                             {"y", {{"signal", "isArray(" + b + ") ? " + b + "[0] : 0"}}}, {"y2", {{"signal", "isArray(" + b + ") ? " + b + "[1] : 0"}}},
                                             {"fill", {{"value", "#e67e22"}}}, {"fillOpacity", {{"signal", brush_on(k) + " ? 0.3 : 0"}}},
                                             {"stroke", {{"value", "#e67e22"}}}, {"strokeOpacity", {{"signal", brush_on(k) + " ? 1 : 0"}}}}}}}});
  }
  signals.push_back({{"name", "pc_active"}, {"update", "(" + active + ") ? true : false"}});
  s["signals"] = signals;
  s["data"] = Json::array({{{"name", "pc_all"}, {"values", wide}},
                           {{"name", "pc_long"}, {"values", longr}, {"transform", Json::array({{{"type", "formula"}, {"as", "sel"}, {"expr", sel}}})}},
                           {{"name", "pc_selected"}, {"source", "pc_long"},
                            {"transform", Json::array({{{"type", "filter"}, {"expr", "pc_active && datum.sel && datum.k === 0"}}})}},
                           {{"name", "pc_dims"}, {"values", dims_data}}});
  s["scales"] = scales;
  s["axes"] = axes;
  // The lines under the axes, the hit bands (drag to brush) and the brushes over them.
  Json line = {{"type", "line"}, {"name", "run_line"}, {"from", {{"data", "pc_row"}}}, {"sort", {{"field", "datum.k"}}},
               {"encode", {{"update", {{"x", {{"scale", "dim"}, {"field", "k"}}}, {"y", {{"scale", {{"datum", "sk"}}}, {"field", "v"}}},
                                       {"defined", {{"signal", "isValid(datum.v)"}}},
                                       {"stroke", {{"signal", "pc_active && datum.sel ? '#d35400' : '#2471a3'"}}},
                                       {"strokeWidth", {{"signal", "pc_active && datum.sel ? 2 : 1.2"}}},
                                       {"strokeOpacity", {{"signal", "pc_active ? (datum.sel ? 0.95 : 0.12) : 0.55"}}},
                                       {"tooltip", {{"signal", "{'run': datum.row}"}}}}}}}};
  Json runs = {{"type", "group"}, {"name", "runs"}, {"from", {{"facet", {{"name", "pc_row"}, {"data", "pc_long"}, {"groupby", "row"}}}}},
               {"marks", Json::array({line})}};
  Json hit = {{"type", "rect"}, {"name", "pc_hit"}, {"from", {{"data", "pc_dims"}}},
              {"encode", {{"enter", {{"x", {{"signal", "scale('dim', datum.k) - 12"}}}, {"width", {{"value", 24}}}, {"y", {{"value", 0}}}, {"y2", {{"signal", "height"}}},
                                     {"fill", {{"value", "#7f8c8d"}}}, {"fillOpacity", {{"value", 0.06}}}, {"cursor", {{"value", "ns-resize"}}},
                                     {"tooltip", {{"signal", "datum.name + ': drag to select runs, double-click to clear'"}}}}}}}};
  Json names = {{"type", "text"}, {"name", "pc_names"}, {"from", {{"data", "pc_dims"}}}, {"interactive", false},
                {"encode", {{"enter", {{"x", {{"signal", "scale('dim', datum.k)"}}}, {"y", {{"signal", "datum.k % 2 ? -10 : -24"}}},
                                       {"align", {{"value", "center"}}}, {"fontSize", {{"value", 11}}}, {"fontWeight", {{"signal", "datum.target ? 'bold' : 'normal'"}}},
                                       {"text", {{"field", "name"}}}}}}}};
  Json all = Json::array({runs, hit, names});
  for (auto& m : marks) all.push_back(m);
  s["marks"] = all;

  // The finding: the best row of the first target, with its parameters.
  const std::string target = dims[n_params < D ? n_params : 0].name;
  const Json* tc = column(a, target);
  const bool lower = lower_better_name(target);
  long best = -1;
  for (std::size_t i = 0; i < n; ++i) {
    const Json& v = (*tc)["values"][i];
    if (!v.is_number()) continue;
    if (best < 0 || (lower ? v.get<double>() < (*tc)["values"][best].get<double>() : v.get<double>() > (*tc)["values"][best].get<double>())) best = static_cast<long>(i);
  }
  std::string finding = std::to_string(n) + " runs over " + std::to_string(n_params) + " parameter(s) and " + std::to_string(D - n_params) + " target(s)";
  if (best >= 0 && (*tc)["kind"] == "numeric") {
    std::string ps;
    for (std::size_t k = 0; k < n_params; ++k) {
      const Json& v = (*dims[k].col)["values"][best];
      ps += (ps.empty() ? "" : ", ") + dims[k].name + "=" + (v.is_string() ? v.get<std::string>() : (v.is_number() ? fmt(v.get<double>(), 6) : v.dump()));
    }
    finding += "; " + std::string(lower ? "lowest " : "highest ") + target + " " + fmt((*tc)["values"][best].get<double>(), 4) + " at " +
               a["table"]["row_labels"][best].get<std::string>() + (ps.empty() ? "" : " (" + ps + ")");
  }
  finding += ". Bold: targets. Drag along an axis to select runs: they are shaded in the runs table and ringed on every per-run chart, the others dim.";
  Chart ch{"parcoords", "Runs at a glance", "Parallel coordinates of the runs (parameters, then targets)", finding, s,
           {{"runs", static_cast<long>(n)}, {"run_line", static_cast<long>(n * D)}}};
  link_rows(ch, "pc_long");
  out.push_back(std::move(ch));
}

}  // namespace scalelab::report::util
