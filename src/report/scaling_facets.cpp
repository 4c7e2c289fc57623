// #2 beyond devices: the scaling curves against the micro-batch size and against the sequence
// length — a panel per model, a line per device count (and per value of the other parameters, so
// a line never joins two configurations), the ideal dashed per device count, and a toggle over
// every figure of analysis.json's "scaling_curves" rows: speedup (ideal p = n/b), parallel
// efficiency (ideal 100 %, the 80 % mark), the Karp–Flatt serial fraction, and the cost per 1M
// tokens and the energy per token where the analysis has them. The one card of these curves
// (it replaced charts_stats.cpp's per-model efficiency cards). Linked to the page's filter and
// brush: brushed runs are ringed, the others dimmed. Every number comes from analysis.json; the
// page only draws it. (The cost and energy per token against devices are charts_stats.cpp's card.)
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "report/chart_util.h"

namespace scalelab::report::util {

void scaling_facet_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("scaling_curves")) return;
  const Json& sc = a["scaling_curves"];
  struct Axis {
    const char* id;
    const char* field;
    const char* what;
    const char* other;
  };
  const Axis axes[] = {{"batch", "micro_batch_size", "micro-batch size", "seq_len"}, {"seq", "seq_len", "sequence length", "micro_batch_size"}};
  for (const Axis& ax : axes) {
    bool listed = false;
    for (const auto& x : sc["x_axes"]) listed = listed || x == ax.field;
    if (!listed) continue;
    Json rows = Json::array();
    std::set<double> xs, ranks;
    std::set<std::string> models;
    bool all_pos = true;
    long n_cost = 0, n_energy = 0, n_kf = 0;
    for (const auto& r : sc["rows"]) {
      if (!r[ax.field].is_number() || !r["devices"].is_number()) continue;
      const double x = d(r[ax.field]), n = d(r["devices"]), s = d(r["speedup"]), e = d(r["efficiency_pct"]);
      // The ideal speedup p = n / b (b: the fewest devices of the same configuration) is the
      // analysis' S / (E / 100); the efficiency's ideal is 100 %.
      const Json ideal_speedup = std::isfinite(s) && e > 0 ? Json(s / (e / 100.0)) : Json();
      std::string line = r["series"].get<std::string>();
      if (r[ax.other].is_number()) line.append(" ").append(ax.other).append("=").append(fmt(d(r[ax.other]), 6));
      rows.push_back({{"row", r["row"]}, {"model", r["model"]}, {"x", x}, {"ranks", n}, {"devices", fmt(n, 6) + (n == 1 ? " device" : " devices")},
                      {"series", line}, {"rest", r["other"].is_string() && !r["other"].get<std::string>().empty() ? r["other"] : Json("—")},
                      {"speedup", r["speedup"]}, {"efficiency_pct", r["efficiency_pct"]}, {"karp_flatt", r["karp_flatt"]},
                      {"cost", r["cost_per_million_tokens"]}, {"jpt", r["j_per_token"]}, {"ideal_speedup", ideal_speedup}, {"ideal_eff", 100.0}});
      xs.insert(x);
      ranks.insert(n);
      models.insert(r["model"].get<std::string>());
      // A log2 axis for powers of two (1, 2, 4, ... or 128, 256, ...).
      all_pos = all_pos && x > 0 && std::exp2(std::round(std::log2(x))) == x;
      n_cost += r["cost_per_million_tokens"].is_number();
      n_energy += r["j_per_token"].is_number();
      n_kf += r["karp_flatt"].is_number();
    }
    if (xs.size() < 2 || ranks.size() < 2) continue;  // nothing varies against it
    // The figures the toggle offers: those some row has.
    Json options = Json::array({"speedup", "efficiency_pct"}), labels = Json::array({"speedup", "efficiency %"});
    if (n_kf) options.push_back("karp_flatt"), labels.push_back("Karp–Flatt");
    if (n_cost) options.push_back("cost"), labels.push_back("cost / 1M tokens");
    if (n_energy) options.push_back("jpt"), labels.push_back("J/token");
    // The ideal per device count and panel (speedup and efficiency only): a dashed level each.
    std::set<std::pair<std::string, double>> ideal_pairs;
    for (const auto& r : rows)
      if (r["speedup"].is_number()) ideal_pairs.insert({r["model"].get<std::string>(), r["ranks"].get<double>()});
    const int cw = 300, chh = 200;
    Json s = base_spec(cw, chh);
    s.erase("width");
    s.erase("height");
    s["signals"] = Json::array({{{"name", "metric"}, {"value", "speedup"}, {"bind", {{"input", "radio"}, {"options", options}, {"labels", labels}, {"name", "show "}}}},
                                {{"name", "ytitles"}, {"value", {{"speedup", "speedup (× the run on the fewest devices)"}, {"efficiency_pct", "parallel efficiency (%)"},
                                                                 {"karp_flatt", "Karp–Flatt serial fraction"}, {"cost", "cost per 1M tokens"}, {"jpt", "J per token"}}}}});
    s["data"] = Json::array({{{"name", "sf_rows"}, {"values", rows},
                              {"transform", Json::array({{{"type", "formula"}, {"as", "v"}, {"expr", "datum[metric]"}},
                                                         {{"type", "formula"}, {"as", "iv"},
                                                          {"expr", "metric === 'speedup' ? datum.ideal_speedup : metric === 'efficiency_pct' ? datum.ideal_eff : null"}},
                                                         {{"type", "filter"}, {"expr", "isValid(datum.v)"}}})}},
                             {{"name", "mark80"}, {"values", Json::array({{{"v", 80}}})}, {"transform", Json::array({{{"type", "filter"}, {"expr", "metric === 'efficiency_pct'"}}})}}});
    Json xs_json = Json(std::vector<double>(xs.begin(), xs.end()));
    const bool log2 = all_pos;
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
    Json xaxis = {{"orient", "bottom"}, {"scale", "x"}, {"title", std::string(ax.field) + (log2 ? " (log2 axis)" : "")}};
    if (log2 || xs.size() <= 10) xaxis.update({{"values", xs_json}, {"format", ".6~r"}});
    Json facet_marks = Json::array();
    facet_marks.push_back({{"type", "rule"}, {"name", "sf_ideal_rule"}, {"from", {{"data", "ideal_cell"}}},
                           {"encode", {{"update", {{"x", {{"value", 0}}}, {"x2", {{"value", cw}}}, {"y", {{"scale", "y"}, {"field", "v"}}},
                                                   {"stroke", {{"scale", "color"}, {"field", "devices"}}}, {"strokeDash", {{"value", {5, 4}}}}, {"strokeOpacity", {{"value", 0.7}}}}}}}});
    // The 80 % mark of the efficiency: an item only while the efficiency shows (a hidden rule at
    // y = 80 on a speedup axis would still stretch the panels' bounds).
    facet_marks.push_back({{"type", "rule"}, {"name", "sf_mark80"}, {"interactive", false}, {"from", {{"data", "mark80"}}},
                           {"encode", {{"update", {{"x", {{"value", 0}}}, {"x2", {{"value", cw}}}, {"y", {{"scale", "y"}, {"field", "v"}}}, {"stroke", {{"value", "#e67e22"}}},
                                                   {"strokeDash", {{"value", {2, 3}}}}}}}}});
    Json line = {{"type", "line"}, {"name", "sf_line"}, {"from", {{"data", "series_cell"}}}, {"sort", {{"field", "datum.x"}}},
                 {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "v"}}},
                                         {"stroke", {{"scale", "color"}, {"field", "devices"}}}, {"strokeWidth", {{"value", 2}}},
                                         {"strokeOpacity", {{"signal", "hl ? 0.35 : 1"}}}}}}}};
    facet_marks.push_back({{"type", "group"}, {"from", {{"facet", {{"name", "series_cell"}, {"data", "cell"}, {"groupby", "series"}}}}}, {"marks", Json::array({line})}});
    facet_marks.push_back({{"type", "symbol"}, {"name", "sf_points"}, {"from", {{"data", "cell"}}},
                           {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "v"}}}, {"size", {{"value", 45}}},
                                                   {"fill", {{"scale", "color"}, {"field", "devices"}}}, {"opacity", {{"signal", kDimUnbrushed}}},
                                                   {"tooltip", tooltip_signal({{"run", "datum.row"}, {"model", "datum.model"}, {"devices", "datum.ranks"}, {ax.field, "datum.x"},
                                                                               {"other parameters", "datum.rest"}, {"speedup", "format(datum.speedup, '.3f')"},
                                                                               {"efficiency", "format(datum.efficiency_pct, '.1f') + ' %'"},
                                                                               {"Karp–Flatt", "isValid(datum.karp_flatt) ? format(datum.karp_flatt, '.3f') : '—'"},
                                                                               {"cost / 1M tokens", "isValid(datum.cost) ? format(datum.cost, '.4g') : '—'"},
                                                                               {"J/token", "isValid(datum.jpt) ? format(datum.jpt, '.4g') : '—'"}})}}}}}});
    // The brushed runs: a ring around their points.
    facet_marks.push_back({{"type", "symbol"}, {"name", "points_hl"}, {"from", {{"data", "cell_hl"}}}, {"interactive", false},
                           {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "v"}}}, {"size", {{"value", 150}}},
                                                   {"fill", {{"value", "transparent"}}}, {"stroke", {{"value", "#e67e22"}}}, {"strokeWidth", {{"value", 2.5}}}}}}}});
    Json cell = {{"type", "group"}, {"name", "sf_facet"}, {"from", {{"facet", {{"name", "cell"}, {"data", "sf_rows"}, {"groupby", "model"}}}}},
                 {"sort", {{"field", "model"}}},
                 {"title", {{"text", {{"signal", "'model: ' + parent.model"}}}, {"fontSize", 12}, {"frame", "group"}}},
                 {"encode", {{"update", {{"width", {{"value", cw}}}, {"height", {{"value", chh}}}, {"stroke", {{"value", "#ccc"}}}}}}},
                 {"data", Json::array({{{"name", "ideal_cell"}, {"source", "cell"},
                                        {"transform", Json::array({{{"type", "filter"}, {"expr", "isValid(datum.iv)"}},
                                                                   {{"type", "aggregate"}, {"groupby", Json::array({"devices"})}, {"fields", Json::array({"iv"})}, {"ops", Json::array({"max"})}, {"as", Json::array({"v"})}}})}},
                                       highlight_dataset("cell_hl", "cell")})},
                 {"axes", Json::array({xaxis, {{"orient", "left"}, {"scale", "y"}, {"title", {{"signal", "ytitles[metric]"}}}}})},
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
      finding = "At " + fmt(top, 6) + " devices the efficiency is highest (" + fmt(best_e, 3) + " %) at " + ax.field + " = " + fmt(best_x, 6) + " and lowest (" +
                fmt(worst_e, 3) + " %) at " + ax.field + " = " + fmt(worst_x, 6) + "; dashed: ideal.";
    std::string more = "Karp–Flatt";
    if (n_cost) more += ", cost per 1M tokens";
    if (n_energy) more += ", J/token";
    finding += " Toggle: efficiency (dotted: 80 %), " + more + ".";
    Chart ch{std::string("scaling-vs-") + ax.id, "Scaling",
             std::string("Speedup, efficiency, ") + more + " against the " + ax.what + " (a line per device count, a panel per model)", finding, s,
             {{"sf_points", n_speedup}, {"sf_ideal_rule", static_cast<long>(ideal_pairs.size())}, {"sf_facet", static_cast<long>(models.size())}}};
    link_rows(ch, "sf_rows");
    out.push_back(std::move(ch));
  }
}

}  // namespace scalelab::report::util
