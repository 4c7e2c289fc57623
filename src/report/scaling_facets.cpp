// #2 beyond devices: speedup and parallel efficiency against the batch size and against the
// sequence length, a line per device count, a facet per model, with the ideal (n / b devices
// for the speedup, 100 % for the efficiency). Every number comes from analysis.json (the scaling
// rows and the parameter columns); the page only draws them. (The cost and energy per token
// against devices are charts_stats.cpp's card, from analysis.json's scaling_curves.)
#include <algorithm>
#include <map>
#include <set>

#include "report/chart_util.h"

namespace scalelab::report::util {
namespace {

// The first of `names` that is a numeric parameter column of the table.
const Json* first_numeric(const Json& a, std::initializer_list<const char*> names) {
  for (const char* nm : names) {
    const Json* c = column(a, nm);
    if (c && (*c)["kind"] == "numeric") return c;
  }
  return nullptr;
}

std::string text_of(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return fmt(v.get<double>(), 6);
  return v.is_null() ? "" : v.dump();
}

}  // namespace

void scaling_facet_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("scaling")) return;
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < a["table"]["row_labels"].size(); ++i) index[a["table"]["row_labels"][i].get<std::string>()] = i;
  const Json* model = column(a, "model");
  double base = INFINITY;
  for (const auto& r : a["scaling"]["rows"])
    if (r["ranks"].is_number()) base = std::min(base, r["ranks"].get<double>());
  if (!std::isfinite(base)) return;
  struct Axis {
    const char* id;
    const char* what;
    const Json* col;
  };
  const Axis axes[] = {{"batch", "micro-batch size", first_numeric(a, {"micro_batch_size", "batch_size", "global_batch_size"})},
                       {"seq", "sequence length", first_numeric(a, {"seq_len", "sequence_length", "max_seq_len"})}};
  for (const Axis& ax : axes) {
    if (!ax.col) continue;
    const std::string xname = (*ax.col)["name"];
    // Rows: the scaling rows with an x value; the other parameters (not ranks, model, x) name
    // the line within a device count, so a line never joins two different configurations.
    Json rows = Json::array();
    std::set<double> xs, ranks;
    std::set<std::string> models;
    bool all_pos = true;
    for (const auto& r : a["scaling"]["rows"]) {
      auto it = index.find(r["row"].get<std::string>());
      if (it == index.end() || !r["ranks"].is_number()) continue;
      const std::size_t i = it->second;
      const Json& xv = (*ax.col)["values"][i];
      if (!xv.is_number()) continue;
      std::string rest;
      for (const auto& c : a["table"]["columns"]) {
        const std::string cn = c["name"];
        if (c["role"] != "parameter" || cn == "ranks" || cn == "model" || cn == xname) continue;
        rest += (rest.empty() ? "" : " ") + cn + "=" + text_of(c["values"][i]);
      }
      const std::string m = model ? text_of((*model)["values"][i]) : "all models";
      const double n = r["ranks"].get<double>();
      rows.push_back({{"row", r["row"]}, {"model", m}, {"x", xv}, {"ranks", n}, {"devices", fmt(n, 6) + (n == 1 ? " device" : " devices")},
                      {"series", fmt(n, 6) + "|" + rest}, {"rest", rest.empty() ? "—" : rest}, {"speedup", r["speedup"]},
                      {"efficiency_pct", r["efficiency_pct"]}, {"ideal_speedup", n / base}, {"ideal_eff", 100.0}});
      xs.insert(xv.get<double>());
      ranks.insert(n);
      models.insert(m);
      all_pos = all_pos && xv.get<double>() > 0;
    }
    if (xs.size() < 2 || ranks.size() < 2) continue;  // nothing varies against it
    const bool log2 = (*ax.col)["log2_axis"].get<bool>() && all_pos;
    // The ideal per device count (n / b for the speedup, 100 % for the efficiency): a dashed
    // level across each panel, one per device count the panel has.
    std::set<std::pair<std::string, double>> ideal_pairs;
    for (const auto& r : rows)
      if (r["speedup"].is_number()) ideal_pairs.insert({r["model"].get<std::string>(), r["ranks"].get<double>()});
    const int cw = 300, chh = 200;
    Json s = base_spec(cw, chh);
    s.erase("width");
    s.erase("height");
    s["signals"] = Json::array({{{"name", "metric"}, {"value", "speedup"},
                                 {"bind", {{"input", "radio"}, {"options", {"speedup", "efficiency_pct"}}, {"labels", {"speedup", "efficiency %"}}, {"name", "show "}}}}});
    s["data"] = Json::array({{{"name", "sf_rows"}, {"values", rows},
                              {"transform", Json::array({{{"type", "formula"}, {"as", "v"}, {"expr", "datum[metric]"}},
                                                         {{"type", "formula"}, {"as", "iv"}, {"expr", "metric === 'speedup' ? datum.ideal_speedup : datum.ideal_eff"}},
                                                         {{"type", "filter"}, {"expr", "isValid(datum.v)"}}})}}});
    Json xs_json = Json(std::vector<double>(xs.begin(), xs.end()));
    Json xscale = {{"name", "x"}, {"range", {0, cw}}, {"domain", {*xs.begin(), *xs.rbegin()}}};
    if (log2) xscale.update({{"type", "log"}, {"base", 2}});
    else xscale.update({{"type", "linear"}, {"nice", true}, {"zero", false}});
    s["layout"] = {{"columns", std::min<std::size_t>(models.size(), 3)}, {"padding", {{"row", 30}, {"column", 40}}}, {"bounds", "full"}};
    s["scales"] = Json::array({xscale,
                               {{"name", "y"}, {"type", "linear"}, {"zero", true}, {"nice", true}, {"range", {chh, 0}},
                                {"domain", {{"fields", Json::array({{{"data", "sf_rows"}, {"field", "v"}}, {{"data", "sf_rows"}, {"field", "iv"}}})}}}},
                               {{"name", "color"}, {"type", "ordinal"}, {"domain", {{"data", "sf_rows"}, {"field", "devices"}, {"sort", {{"field", "ranks"}, {"op", "min"}}}}},
                                {"range", "category"}}});
    s["legends"] = Json::array({{{"stroke", "color"}, {"title", "device count (dashed: ideal)"}, {"orient", "right"}}});
    Json xaxis = {{"orient", "bottom"}, {"scale", "x"}, {"title", xname + (log2 ? " (log2 axis)" : "")}};
    if (log2) xaxis.update({{"values", xs_json}, {"format", "~r"}});
    else if (xs.size() <= 10) xaxis.update({{"values", xs_json}, {"format", "~r"}});
    Json facet_marks = Json::array();
    facet_marks.push_back({{"type", "rule"}, {"name", "sf_ideal_rule"}, {"from", {{"data", "ideal_cell"}}},
                           {"encode", {{"update", {{"x", {{"value", 0}}}, {"x2", {{"value", cw}}}, {"y", {{"scale", "y"}, {"field", "v"}}},
                                                   {"stroke", {{"scale", "color"}, {"field", "devices"}}}, {"strokeDash", {{"value", {5, 4}}}}, {"strokeOpacity", {{"value", 0.7}}}}}}}});
    Json line = {{"type", "line"}, {"name", "sf_line"}, {"from", {{"data", "series_cell"}}}, {"sort", {{"field", "datum.x"}}},
                 {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "v"}}},
                                         {"stroke", {{"scale", "color"}, {"field", "devices"}}}, {"strokeWidth", {{"value", 2}}}}}}}};
    facet_marks.push_back({{"type", "group"}, {"from", {{"facet", {{"name", "series_cell"}, {"data", "cell"}, {"groupby", "series"}}}}}, {"marks", Json::array({line})}});
    facet_marks.push_back({{"type", "symbol"}, {"name", "sf_points"}, {"from", {{"data", "cell"}}},
                           {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "v"}}}, {"size", {{"value", 45}}},
                                                   {"fill", {{"scale", "color"}, {"field", "devices"}}},
                                                   {"stroke", {{"signal", "hl && hl[datum.row] ? '#e67e22' : null"}}}, {"strokeWidth", {{"value", 3}}},
                                                   {"tooltip", tooltip_signal({{"run", "datum.row"}, {"model", "datum.model"}, {"devices", "datum.ranks"}, {xname, "datum.x"},
                                                                               {"other parameters", "datum.rest"}, {"speedup", "format(datum.speedup, '.3f')"},
                                                                               {"efficiency", "format(datum.efficiency_pct, '.1f') + ' %'"}})}}}}}});
    Json cell = {{"type", "group"}, {"name", "sf_facet"}, {"from", {{"facet", {{"name", "cell"}, {"data", "sf_rows"}, {"groupby", "model"}}}}},
                 {"sort", {{"field", "model"}}},
                 {"title", {{"text", {{"signal", "'model: ' + parent.model"}}}, {"fontSize", 12}, {"frame", "group"}}},
                 {"encode", {{"update", {{"width", {{"value", cw}}}, {"height", {{"value", chh}}}, {"stroke", {{"value", "#ccc"}}}}}}},
                 {"data", Json::array({{{"name", "ideal_cell"}, {"source", "cell"},
                                        {"transform", Json::array({{{"type", "aggregate"}, {"groupby", Json::array({"devices"})}, {"fields", Json::array({"iv"})}, {"ops", Json::array({"max"})}, {"as", Json::array({"v"})}}})}}})},
                 {"axes", Json::array({xaxis, {{"orient", "left"}, {"scale", "y"}, {"title", {{"signal", "metric === 'speedup' ? 'speedup (× the ' + " + std::to_string(static_cast<long>(base)) + " + '-device run)' : 'parallel efficiency (%)'"}}}}})},
                 {"marks", facet_marks}};
    s["marks"] = Json::array({cell});
    // Finding: where the efficiency at the most devices is best and worst along x.
    const double top = *ranks.rbegin();
    double best_x = NAN, best_e = -1, worst_x = NAN, worst_e = INFINITY;
    long n_speedup = 0;
    for (const auto& r : rows) {
      n_speedup += r["speedup"].is_number();
      if (r["ranks"].get<double>() != top || !r["efficiency_pct"].is_number()) continue;
      const double e = r["efficiency_pct"].get<double>();
      if (e > best_e) best_e = e, best_x = r["x"].get<double>();
      if (e < worst_e) worst_e = e, worst_x = r["x"].get<double>();
    }
    std::string finding;
    if (best_e < 0) finding = "No efficiency at " + fmt(top, 6) + " devices.";
    else if (best_e - worst_e < 0.05)
      finding = "At " + fmt(top, 6) + " devices the efficiency is " + fmt(best_e, 3) + " % whatever the " + ax.what + "; dashed: ideal.";
    else
      finding = "At " + fmt(top, 6) + " devices the efficiency is highest (" + fmt(best_e, 3) + " %) at " + xname + " = " + fmt(best_x, 6) + " and lowest (" +
                fmt(worst_e, 3) + " %) at " + xname + " = " + fmt(worst_x, 6) + "; dashed: ideal.";
    Chart ch{std::string("scaling-vs-") + ax.id, "Scaling", std::string("Speedup and efficiency against the ") + ax.what + " (a line per device count, a panel per model)",
             finding, s, {{"sf_points", n_speedup}, {"sf_ideal_rule", static_cast<long>(ideal_pairs.size())}, {"sf_facet", static_cast<long>(models.size())}}};
    link_rows(ch, "sf_rows");
    out.push_back(std::move(ch));
  }
}

}  // namespace scalelab::report::util
