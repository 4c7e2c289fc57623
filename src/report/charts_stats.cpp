#include "report/charts_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "report/chart_util.h"

namespace scalelab::report {
namespace {

using util::d;
using util::fmt;
Json spec(int width, int height) { return util::base_spec(width, height); }
Json tooltip(const std::vector<std::pair<std::string, std::string>>& fields) { return util::tooltip_signal(fields); }

std::string model_title(const Json& r) { return r["model"] == "random_forest" ? "random forest" : "gradient boosting"; }

// #2: cost per 1M tokens and energy per token against the device count (the medians over each
// model's configurations), a line per model; a toggle between the two where both exist.
void cost_energy_chart(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("scaling_curves")) return;
  Json rows = Json::array();
  long n_cost = 0, n_energy = 0;
  double max_dev = 1;
  for (const auto& r : a["scaling_curves"]["summary"]) {
    rows.push_back({{"model", r["model"]}, {"devices", r["devices"]}, {"cost", r["cost_per_million_tokens_median"]}, {"jpt", r["j_per_token_median"]}});
    n_cost += r["cost_per_million_tokens_median"].is_number();
    n_energy += r["j_per_token_median"].is_number();
    max_dev = std::max(max_dev, d(r["devices"]));
  }
  if (n_cost == 0 && n_energy == 0) return;
  std::vector<std::string> options;
  if (n_cost) options.push_back("cost");
  if (n_energy) options.push_back("energy");
  Json s = spec(380, 220);
  s["signals"] = Json::array({{{"name", "per_token"}, {"value", options.front()}, {"bind", {{"input", "radio"}, {"options", options}, {"name", "per token "}}}}});
  s["data"] = Json::array({{{"name", "ce_rows"}, {"values", rows},
                            {"transform", Json::array({{{"type", "formula"}, {"as", "v"}, {"expr", "per_token == 'cost' ? datum.cost : datum.jpt"}},
                                                       {{"type", "filter"}, {"expr", "isValid(datum.v)"}}})}}});
  s["scales"] = Json::array({{{"name", "x"}, {"type", "log"}, {"base", 2}, {"range", "width"}, {"domain", {1, std::max(2.0, max_dev)}}},
                             {{"name", "y"}, {"type", "linear"}, {"zero", true}, {"nice", true}, {"range", "height"}, {"domain", {{"data", "ce_rows"}, {"field", "v"}}}},
                             {{"name", "color"}, {"type", "ordinal"}, {"domain", {{"data", "ce_rows"}, {"field", "model"}}}, {"range", "category"}}});
  s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "devices (log2 axis)"}},
                           {{"orient", "left"}, {"scale", "y"}, {"title", {{"signal", "per_token == 'cost' ? 'cost per 1M tokens (median)' : 'J per token (median)'"}}}}});
  s["legends"] = Json::array({{{"stroke", "color"}, {"title", "model"}, {"orient", "right"}}});
  Json enc = {{"x", {{"scale", "x"}, {"field", "devices"}}}, {"y", {{"scale", "y"}, {"field", "v"}}}};
  Json line_enc = enc;
  line_enc["stroke"] = {{"scale", "color"}, {"field", "model"}};
  line_enc["strokeWidth"] = {{"value", 2}};
  Json sym_enc = enc;
  sym_enc["fill"] = {{"scale", "color"}, {"field", "model"}};
  sym_enc["size"] = {{"value", 50}};
  sym_enc["tooltip"] = tooltip({{"model", "datum.model"}, {"devices", "datum.devices"}, {"cost / 1M tokens", "isValid(datum.cost) ? format(datum.cost, '.4g') : '—'"},
                                {"J/token", "isValid(datum.jpt) ? format(datum.jpt, '.4g') : '—'"}});
  s["marks"] = Json::array({{{"type", "group"}, {"from", {{"facet", {{"name", "ce_facet"}, {"data", "ce_rows"}, {"groupby", "model"}}}}},
                             {"marks", Json::array({{{"type", "line"}, {"from", {{"data", "ce_facet"}}}, {"sort", {{"field", "datum.devices"}}}, {"encode", {{"update", line_enc}}}},
                                                    {{"type", "symbol"}, {"name", "points"}, {"from", {{"data", "ce_facet"}}}, {"encode", {{"update", sym_enc}}}}})}}});
  const Json& sc = a["scaling_curves"];
  std::string finding = n_cost ? "Price " + fmt(d(sc["price_per_gpu_hour"]), 4) + " per GPU-hour (" + sc["price_source"].get<std::string>() + ")"
                               : std::string("No price (give --price-per-gpu-hour)");
  finding += n_energy ? "; energy from the power telemetry over the steady window." : "; no power telemetry for the energy.";
  out.push_back({"scaling-cost-energy", "Scaling curves", "Cost and energy per token against devices", finding, s,
                 {{"points", options.front() == "cost" ? n_cost : n_energy}}});
}

// #12: mean |SHAP interaction| heatmap per tree model.
void interaction_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("trees")) return;
  for (const auto& r : a["trees"]) {
    if (r.contains("error") || !r.contains("interaction_mean_abs")) continue;
    const Json& m = r["interaction_mean_abs"];
    const std::size_t p = m.size();
    if (p == 0) continue;
    Json cells = Json::array();
    double best = -1;
    std::string best_pair;
    for (std::size_t j = 0; j < p; ++j)
      for (std::size_t k = 0; k < p; ++k) {
        cells.push_back({{"a", r["features"][j]}, {"b", r["features"][k]}, {"v", m[j][k]}, {"main", j == k}});
        if (k > j && d(m[j][k]) > best) {
          best = d(m[j][k]);
          best_pair = r["features"][j].get<std::string>() + " × " + r["features"][k].get<std::string>();
        }
      }
    const int side = static_cast<int>(std::min<std::size_t>(p * 40, 440));
    Json s = spec(side, side);
    // The colour scale spans the interactions only: the main effects (diagonal, grey) are
    // usually far larger and would wash the interactions out; their values are in the tooltips.
    s["data"] = Json::array({{{"name", "inter_cells"}, {"values", cells}},
                             {{"name", "inter_off"}, {"source", "inter_cells"}, {"transform", Json::array({{{"type", "filter"}, {"expr", "!datum.main"}}})}}});
    s["scales"] = Json::array({{{"name", "x"}, {"type", "band"}, {"domain", r["features"]}, {"range", "width"}},
                               {{"name", "y"}, {"type", "band"}, {"domain", r["features"]}, {"range", "height"}},
                               {{"name", "color"}, {"type", "linear"}, {"scheme", "blues"}, {"zero", true}, {"domain", {{"data", "inter_off"}, {"field", "v"}}}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"labelAngle", -40}, {"labelAlign", "right"}, {"labelOverlap", false}},
                             {{"orient", "left"}, {"scale", "y"}, {"labelOverlap", false}}});
    s["legends"] = Json::array({{{"fill", "color"}, {"title", "mean |φ| (off-diagonal)"}, {"orient", "right"}}});
    s["marks"] = Json::array({{{"type", "rect"}, {"name", "cells"}, {"from", {{"data", "inter_cells"}}},
                               {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "a"}}}, {"width", {{"scale", "x"}, {"band", 1}}},
                                                       {"y", {{"scale", "y"}, {"field", "b"}}}, {"height", {{"scale", "y"}, {"band", 1}}},
                                                       {"fill", {{"signal", "datum.main ? '#d5d8dc' : scale('color', datum.v)"}}}, {"stroke", {{"value", "#fff"}}},
                                                       {"tooltip", tooltip({{"pair", "datum.a + ' × ' + datum.b"}, {"mean |SHAP interaction|", "format(datum.v, '.4g')"},
                                                                            {"kind", "datum.main ? 'main effect' : 'interaction (half of the pair)'"}})}}}}}}});
    const std::string finding = best >= 0 ? "Strongest interaction: " + best_pair + " (mean |φ| " + fmt(best) + " each way; grey diagonal: main effects; additivity error " +
                                                fmt(d(r["interaction_additivity_max_abs_error"])) + ")."
                                          : "One feature: no interactions.";
    out.push_back({"shap-interactions-" + r["model"].get<std::string>() + "-" + r["target"].get<std::string>(), "SHAP and stability (xgboost)",
                   "SHAP interactions, " + model_title(r) + ": " + r["target"].get<std::string>(), finding, s, {{"cells", static_cast<long>(p * p)}}});
  }
}

// #12: the bootstrap mean of mean |SHAP| per feature with its 95 % percentile interval.
void stability_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("trees")) return;
  for (const auto& r : a["trees"]) {
    if (r.contains("error") || !r.contains("stability")) continue;
    const Json& st = r["stability"]["shap_mean_abs"];
    Json rows = Json::array();
    for (std::size_t k = 0; k < r["features"].size(); ++k)
      rows.push_back({{"feature", r["features"][k]}, {"mean", st["mean"][k]}, {"low", st["low"][k]}, {"high", st["high"][k]},
                      {"rank", st["mean_rank"][k]}, {"top3", st["top3_share"][k]}, {"full", r["shap_mean_abs"][k]}});
    Json s = spec(360, static_cast<int>(rows.size()) * 24 + 10);
    s["data"] = Json::array({{{"name", "stab_rows"}, {"values", rows}}});
    s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", {{"data", "stab_rows"}, {"field", "feature"}, {"sort", {{"field", "rank"}, {"op", "min"}, {"order", "ascending"}}}}},
                                {"range", "height"}, {"padding", 0.3}},
                               {{"name", "x"}, {"type", "linear"}, {"zero", true}, {"nice", true}, {"range", "width"},
                                {"domain", {{"fields", Json::array({{{"data", "stab_rows"}, {"field", "high"}}, {{"data", "stab_rows"}, {"field", "full"}}})}}}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "mean |SHAP| (bootstrap mean, 95 % interval)"}, {"grid", true}}, {{"orient", "left"}, {"scale", "y"}}});
    Json tip = tooltip({{"feature", "datum.feature"}, {"bootstrap mean", "format(datum.mean, '.4g')"}, {"95 % interval", "format(datum.low, '.4g') + ' – ' + format(datum.high, '.4g')"},
                        {"mean rank", "format(datum.rank, '.2f')"}, {"top-3 share", "format(datum.top3 * 100, '.0f') + ' %'"}, {"all rows", "format(datum.full, '.4g')"}});
    s["marks"] = Json::array(
        {{{"type", "rect"}, {"name", "bars"}, {"from", {{"data", "stab_rows"}}},
          {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "feature"}}}, {"height", {{"scale", "y"}, {"band", 1}}}, {"x", {{"scale", "x"}, {"value", 0}}},
                                  {"x2", {{"scale", "x"}, {"field", "mean"}}}, {"fill", {{"value", "#a9cce3"}}}, {"tooltip", tip}}}}}},
         {{"type", "rule"}, {"name", "intervals"}, {"from", {{"data", "stab_rows"}}},
          {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "feature"}, {"band", 0.5}}}, {"x", {{"scale", "x"}, {"field", "low"}}},
                                  {"x2", {{"scale", "x"}, {"field", "high"}}}, {"stroke", {{"value", "#1f4e79"}}}, {"strokeWidth", {{"value", 2}}}}}}}}});
    const Json& g = r["stability"]["gain"];
    const std::string finding = "Over " + std::to_string(r["stability"]["resamples"].get<int>()) + " bootstrap resamples the top feature (SHAP) stays on top in " +
                                fmt(100 * d(st["top1_share"])) + " % of them; Spearman ρ with the all-rows ranking " + fmt(d(st["spearman_mean"])) +
                                " (SHAP), " + fmt(d(g["spearman_mean"])) + " (gain).";
    out.push_back({"stability-" + r["model"].get<std::string>() + "-" + r["target"].get<std::string>(), "SHAP and stability (xgboost)",
                   "Importance stability, " + model_title(r) + ": " + r["target"].get<std::string>(), finding, s,
                   {{"bars", static_cast<long>(rows.size())}, {"intervals", static_cast<long>(rows.size())}}});
  }
}

// #12: SHAP dependence of the top feature (value against its contribution), coloured by the
// feature it interacts with most.
void dependence_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("trees")) return;
  for (const auto& r : a["trees"]) {
    if (r.contains("error") || !r.contains("dependence") || r["dependence"].empty()) continue;
    const Json& dep = r["dependence"][0];
    Json pts = Json::array();
    const Json* color = dep.contains("color_x") && dep["color_x"].size() == dep["x"].size() ? &dep["color_x"] : nullptr;
    for (std::size_t i = 0; i < dep["x"].size(); ++i)
      if (dep["x"][i].is_number())
        pts.push_back({{"x", dep["x"][i]}, {"shap", dep["shap"][i]}, {"c", color ? (*color)[i] : Json()}});
    if (pts.empty()) continue;
    Json s = spec(360, 220);
    s["data"] = Json::array({{{"name", "dep_rows"}, {"values", pts}}});
    Json scales = Json::array({{{"name", "x"}, {"type", "linear"}, {"zero", false}, {"nice", true}, {"range", "width"}, {"domain", {{"data", "dep_rows"}, {"field", "x"}}}},
                               {{"name", "y"}, {"type", "linear"}, {"nice", true}, {"range", "height"}, {"domain", {{"data", "dep_rows"}, {"field", "shap"}}}}});
    if (color) scales.push_back({{"name", "color"}, {"type", "linear"}, {"scheme", "viridis"}, {"domain", {{"data", "dep_rows"}, {"field", "c"}}}});
    s["scales"] = scales;
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", dep["name"]}}, {{"orient", "left"}, {"scale", "y"}, {"title", "SHAP value"}}});
    Json enc = {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "shap"}}}, {"size", {{"value", 50}}},
                {"tooltip", tooltip({{dep["name"].get<std::string>(), "datum.x"}, {"SHAP", "format(datum.shap, '.4g')"}})}};
    if (color) {
      enc["fill"] = {{"scale", "color"}, {"field", "c"}};
      s["legends"] = Json::array({{{"fill", "color"}, {"title", dep["color_by_name"]}, {"orient", "right"}}});
    } else {
      enc["fill"] = {{"value", "#2e86c1"}};
    }
    s["marks"] = Json::array({{{"type", "symbol"}, {"name", "points"}, {"from", {{"data", "dep_rows"}}}, {"encode", {{"update", enc}}}}});
    const std::string finding = "Top feature by mean |SHAP|: " + dep["name"].get<std::string>() +
                                (dep["color_by_name"].is_string() ? "; it interacts most with " + dep["color_by_name"].get<std::string>() +
                                                                        (color ? " (colour)" : "")
                                                                  : std::string()) + ".";
    out.push_back({"shap-dependence-" + r["model"].get<std::string>() + "-" + r["target"].get<std::string>(), "SHAP and stability (xgboost)",
                   "SHAP dependence, " + model_title(r) + ": " + r["target"].get<std::string>(), finding, s, {{"points", static_cast<long>(pts.size())}}});
  }
}

// #6: a target's histogram per level of a categorical on common edges (the bars of the levels
// overlaid, translucent) with each level's ECDF as a step line on the right axis.
void grouped_histogram_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("groups")) return;
  for (const auto& g : a["groups"]) {
    if (g.contains("error") || !g.contains("histogram") || g["histogram"]["levels"].empty()) continue;
    const Json& edges = g["histogram"]["edges"];
    Json bars = Json::array(), steps = Json::array();
    for (const auto& l : g["histogram"]["levels"]) {
      for (std::size_t k = 0; k + 1 < edges.size(); ++k)
        bars.push_back({{"level", l["level"]}, {"low", edges[k]}, {"high", edges[k + 1]}, {"count", l["counts"][k]}});
      for (std::size_t k = 0; k < l["ecdf"]["x"].size(); ++k) steps.push_back({{"level", l["level"]}, {"x", l["ecdf"]["x"][k]}, {"f", l["ecdf"]["f"][k]}});
    }
    Json s = spec(380, 200);
    s["data"] = Json::array({{{"name", "gh_bars"}, {"values", bars}}, {{"name", "gh_ecdf"}, {"values", steps}}});
    s["scales"] = Json::array({{{"name", "x"}, {"type", "linear"}, {"zero", false}, {"range", "width"}, {"domain", {edges.front(), edges.back()}}},
                               {{"name", "y"}, {"type", "linear"}, {"nice", true}, {"range", "height"}, {"domain", {{"data", "gh_bars"}, {"field", "count"}}}},
                               {{"name", "f"}, {"type", "linear"}, {"range", "height"}, {"domain", {0, 1}}},
                               {{"name", "color"}, {"type", "ordinal"}, {"domain", g["levels"]}, {"range", "category"}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", g["value"]}, {"format", "~s"}},
                             {{"orient", "left"}, {"scale", "y"}, {"title", "rows"}, {"tickMinStep", 1}},
                             {{"orient", "right"}, {"scale", "f"}, {"title", "ECDF"}, {"format", "%"}}});
    s["legends"] = Json::array({{{"fill", "color"}, {"title", g["group"]}, {"orient", "right"}, {"offset", 50}}});
    s["marks"] = Json::array(
        {{{"type", "rect"}, {"name", "bars"}, {"from", {{"data", "gh_bars"}}},
          {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "low"}}}, {"x2", {{"scale", "x"}, {"field", "high"}}}, {"y", {{"scale", "y"}, {"field", "count"}}},
                                  {"y2", {{"scale", "y"}, {"value", 0}}}, {"fill", {{"scale", "color"}, {"field", "level"}}}, {"fillOpacity", {{"value", 0.45}}},
                                  {"tooltip", tooltip({{"level", "datum.level"}, {"bin", "format(datum.low, '.4g') + ' – ' + format(datum.high, '.4g')"}, {"rows", "datum.count"}})}}}}}},
         {{"type", "group"}, {"from", {{"facet", {{"name", "gh_level"}, {"data", "gh_ecdf"}, {"groupby", "level"}}}}},
          {"marks", Json::array({{{"type", "line"}, {"from", {{"data", "gh_level"}}}, {"sort", {{"field", "datum.x"}}},
                                  {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "f"}, {"field", "f"}}}, {"interpolate", {{"value", "step-after"}}},
                                                          {"stroke", {{"scale", "color"}, {"field", "level"}}}, {"strokeWidth", {{"value", 2}}}}}}}}})}}});
    // The level whose median is highest, and by how much above the lowest.
    std::size_t hi = 0, lo = 0;
    for (std::size_t k = 0; k < g["box"].size(); ++k) {
      if (d(g["box"][k]["median"]) > d(g["box"][hi]["median"])) hi = k;
      if (d(g["box"][k]["median"]) < d(g["box"][lo]["median"])) lo = k;
    }
    const std::string finding = g["value"].get<std::string>() + ": median " + fmt(d(g["box"][hi]["median"]), 4) + " for " + g["levels"][hi].get<std::string>() +
                                " against " + fmt(d(g["box"][lo]["median"]), 4) + " for " + g["levels"][lo].get<std::string>() + " (" +
                                std::to_string(edges.size() - 1) + " common bins; lines: ECDF per level).";
    out.push_back({"group-hist-" + g["group"].get<std::string>() + "-" + g["value"].get<std::string>(), "Grouped distributions",
                   g["value"].get<std::string>() + " by " + g["group"].get<std::string>() + ": histograms and ECDFs", finding, s,
                   {{"bars", static_cast<long>(bars.size())}}});
  }
}

}  // namespace

void stats_charts(const Json& a, std::vector<Chart>& out) {
  grouped_histogram_charts(a, out);
  cost_energy_chart(a, out);
  interaction_charts(a, out);
  stability_charts(a, out);
  dependence_charts(a, out);
}

}  // namespace scalelab::report
