#include "report/charts.h"
#include "report/charts_stats.h"

#include "report/chart_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace scalelab::report {
namespace {

using util::base_spec;
using util::column;
using util::d;
using util::fmt;
using util::lower_better_name;
using util::tooltip_signal;

// A per-run mark's opacity: the runs outside a brush in the parallel coordinates dim (the
// brushed ones get a ring: a `points_hl` mark).
constexpr const char* kDimUnbrushed = util::kDimUnbrushed;

// The frame column of an association variable ("attn=flash" -> "attn").
std::string column_of(const Json& a, const std::string& var) {
  if (column(a, var)) return var;
  auto eq = var.find('=');
  return eq == std::string::npos ? var : var.substr(0, eq);
}

bool is_target(const Json& a, const std::string& var) {
  for (const auto& t : a["options"]["targets"])
    if (t == var) return true;
  return false;
}

bool is_feature(const Json& a, const std::string& var) {
  const std::string c = column_of(a, var);
  for (const auto& f : a["options"]["features"])
    if (f == c) return true;
  return false;
}

// A feature (a parameter, or a CSV column used as one) or a target.
bool of_interest(const Json& a, const std::string& var) {
  const std::string c = column_of(a, var);
  for (const auto& f : a["options"]["features"])
    if (f == c) return true;
  return is_target(a, c);
}

// #3: the correlation heatmap in clustered order, Pearson with a Spearman toggle.
void correlation_chart(const Json& a, std::vector<Chart>& out) {
  const Json& c = a["correlation"];
  const auto& names = c["variables"];
  const std::size_t k = names.size();
  if (k < 2) return;
  Json cells = Json::array();
  std::vector<std::size_t> order = c["clustered_order"].get<std::vector<std::size_t>>();
  double best = -1;
  std::string best_text;
  for (std::size_t ii = 0; ii < k; ++ii)
    for (std::size_t jj = 0; jj < k; ++jj) {
      std::size_t i = order[ii], j = order[jj];
      Json r = c["pearson_r"][i][j], rho = c["spearman_rho"][i][j];
      cells.push_back({{"a", names[i]}, {"b", names[j]}, {"pearson", r}, {"spearman", rho},
                       {"p", c["pearson_p"][i][j]}, {"n", c["n"][i][j]}});
      const bool relevant = of_interest(a, names[i]) && of_interest(a, names[j]) && column_of(a, names[i]) != column_of(a, names[j]);
      if (ii < jj && relevant && r.is_number() && std::fabs(r.get<double>()) > best) {
        best = std::fabs(r.get<double>());
        best_text = names[i].get<std::string>() + " and " + names[j].get<std::string>() + " (r = " + fmt(r.get<double>(), 3) + ")";
      }
    }
  const int cell = k > 30 ? 14 : (k > 16 ? 20 : 30);
  Json s = base_spec(static_cast<int>(k) * cell, static_cast<int>(k) * cell);
  s["signals"] = Json::array({{{"name", "method"}, {"value", "pearson"},
                               {"bind", {{"input", "radio"}, {"options", {"pearson", "spearman"}}, {"name", "coefficient "}}}}});
  s["data"] = Json::array({{{"name", "cell_rows"}, {"values", cells},
                            {"transform", Json::array({{{"type", "formula"}, {"as", "v"}, {"expr", "datum[method]"}}})}}});
  Json domain = Json::array();
  for (auto i : order) domain.push_back(names[i]);
  s["scales"] = Json::array({{{"name", "x"}, {"type", "band"}, {"domain", domain}, {"range", "width"}},
                             {{"name", "y"}, {"type", "band"}, {"domain", domain}, {"range", "height"}},
                             {{"name", "color"}, {"type", "linear"}, {"domain", {-1, 1}}, {"range", {{"scheme", "redblue"}}}, {"reverse", true}}});
  s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"labelAngle", -50}, {"labelAlign", "right"}, {"labelBaseline", "middle"}, {"labelOverlap", false}},
                           {{"orient", "left"}, {"scale", "y"}, {"labelOverlap", false}}});
  s["legends"] = Json::array({{{"fill", "color"}, {"title", "r"}, {"type", "gradient"}, {"gradientLength", 160}}});
  Json marks = Json::array();
  marks.push_back({{"type", "rect"}, {"name", "cells"}, {"from", {{"data", "cell_rows"}}},
                   {"encode", {{"enter", {{"x", {{"scale", "x"}, {"field", "a"}}}, {"width", {{"scale", "x"}, {"band", 1}}},
                                          {"y", {{"scale", "y"}, {"field", "b"}}}, {"height", {{"scale", "y"}, {"band", 1}}}}},
                               {"update", {{"fill", {{"signal", "isValid(datum.v) ? scale('color', datum.v) : '#eee'"}}},
                                           {"tooltip", tooltip_signal({{"pair", "datum.a + ' × ' + datum.b"}, {"r", "format(datum.pearson, '.3f')"},
                                                                        {"rho", "format(datum.spearman, '.3f')"}, {"p", "format(datum.p, '.3g')"}, {"n", "datum.n"}})}}}}}});
  if (k <= 14)
    marks.push_back({{"type", "text"}, {"name", "labels"}, {"from", {{"data", "cell_rows"}}},
                     {"encode", {{"enter", {{"x", {{"scale", "x"}, {"field", "a"}, {"band", 0.5}}}, {"y", {{"scale", "y"}, {"field", "b"}, {"band", 0.5}}},
                                            {"align", {{"value", "center"}}}, {"baseline", {{"value", "middle"}}}, {"fontSize", {{"value", 10}}}}},
                                 {"update", {{"text", {{"signal", "isValid(datum.v) ? format(datum.v, '.2f') : ''"}}},
                                             {"fill", {{"signal", "isValid(datum.v) && abs(datum.v) > 0.6 ? 'white' : 'black'"}}}}}}}});
  s["marks"] = marks;
  Chart ch{"corr-heatmap", "Correlations", "Correlation matrix (clustered order)",
           best >= 0 ? "Strongest correlation among parameters and targets: " + best_text + "." : "No parameter or target has a defined correlation (too few rows or constant columns).",
           s, {{"cells", static_cast<long>(k * k)}}};
  out.push_back(ch);
}

// #4: the top relationships that involve a parameter (pairs of telemetry or outcome columns often
// measure the same thing twice and would fill the chart); every pair is in pairs.csv.
void pairs_chart(const Json& a, std::vector<Chart>& out) {
  const auto& rows = a["pairs"]["rows"];
  if (rows.empty()) return;
  Json vals = Json::array();
  std::size_t significant = 0, relevant = 0;
  const Json* top = nullptr;
  for (const auto& r : rows)
    if (r["q"].is_number() && r["q"].get<double>() < 0.05) ++significant;
  for (const auto& r : rows) {
    const std::string x = r["a"], y = r["b"];
    const bool keep = is_feature(a, x) || is_feature(a, y);
    if (!keep) continue;
    ++relevant;
    if (vals.size() >= 20) continue;
    if (!top) top = &r;
    std::string sign = r["sign"] == 1 ? "positive" : (r["sign"] == -1 ? "negative" : "no sign");
    vals.push_back({{"pair", std::to_string(vals.size() + 1) + ". " + x + " × " + y},
                    {"effect", r["effect"]}, {"sign", sign}, {"kind", r["kind"]}, {"p", r["p"]}, {"q", r["q"]}});
  }
  if (vals.empty()) return;
  Json s = base_spec(380, static_cast<int>(vals.size()) * 20);
  s["config"]["axis"]["labelLimit"] = 340;
  s["data"] = Json::array({{{"name", "pairs"}, {"values", vals}}});
  Json domain = Json::array();
  for (const auto& v : vals) domain.push_back(v["pair"]);
  s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", domain}, {"range", "height"}, {"padding", 0.15}},
                             {{"name", "x"}, {"type", "linear"}, {"domain", {0, 1}}, {"range", "width"}},
                             {{"name", "color"}, {"type", "ordinal"}, {"domain", {"positive", "negative", "no sign"}},
                              {"range", {"#c0392b", "#2471a3", "#7f8c8d"}}}});
  s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "effect (|r|, |r_pb| or Cramér's V)"}, {"grid", true}}, {{"orient", "left"}, {"scale", "y"}}});
  s["legends"] = Json::array({{{"fill", "color"}, {"title", "direction"}}});
  s["marks"] = Json::array({{{"type", "rect"}, {"name", "bars"}, {"from", {{"data", "pairs"}}},
                             {"encode", {{"enter", {{"y", {{"scale", "y"}, {"field", "pair"}}}, {"height", {{"scale", "y"}, {"band", 1}}},
                                                    {"x", {{"scale", "x"}, {"value", 0}}}, {"x2", {{"scale", "x"}, {"field", "effect"}}},
                                                    {"fill", {{"scale", "color"}, {"field", "sign"}}},
                                                    {"tooltip", tooltip_signal({{"pair", "datum.pair"}, {"kind", "datum.kind"}, {"effect", "format(datum.effect, '.3f')"},
                                                                                 {"p", "format(datum.p, '.3g')"}, {"q (BH)", "format(datum.q, '.3g')"}})}}}}}}});
  std::string finding = std::to_string(rows.size()) + " pairs in all, " + std::to_string(significant) + " with q < 0.05; strongest involving a parameter: " +
                        (*top)["a"].get<std::string>() + " × " + (*top)["b"].get<std::string>() + " (effect " + fmt(d((*top)["effect"])) +
                        ", q = " + fmt(d((*top)["q"])) + ").";
  out.push_back({"pairs", "Top relationships",
                 "Top relationships of a parameter (" + std::to_string(vals.size()) + " of " + std::to_string(relevant) + ")", finding, s,
                 {{"bars", static_cast<long>(vals.size())}}});
}

constexpr int kFitPoints = 24;

// #8: each parameter against a target, a selector over the parameters, the fit line.
void fit_charts(const Json& a, std::vector<Chart>& out) {
  for (const auto& tf : a["fits"]) {
    const std::string target = tf["target"];
    const Json* y = column(a, target);
    if (!y || tf["fits"].empty()) continue;
    Json points = Json::array(), lines = Json::array();
    std::vector<std::string> params;
    Json titles = Json::object(), log_ok = Json::object();
    std::string first;
    long first_n = 0;
    for (const auto& f : tf["fits"]) {
      if (f.contains("error")) continue;
      const std::string xname = f["x"];
      // The x values: a numeric/binary column, or an indicator "col=level".
      std::vector<double> xs((*y)["values"].size(), NAN);
      auto eq = xname.find('=');
      const Json* xc = column(a, xname);
      if (!xc && eq != std::string::npos) xc = column(a, xname.substr(0, eq));
      if (!xc) continue;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const Json& v = (*xc)["values"][i];
        if (v.is_null()) continue;
        if ((*xc)["kind"] == "numeric") xs[i] = v.get<double>();
        else if ((*xc)["kind"] == "binary" && eq == std::string::npos) xs[i] = v == (*xc)["levels"][1] ? 1.0 : 0.0;
        else xs[i] = v == xname.substr(eq + 1) ? 1.0 : 0.0;
      }
      long n = 0;
      double lo = INFINITY, hi = -INFINITY;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const Json& yv = (*y)["values"][i];
        if (std::isnan(xs[i]) || !yv.is_number()) continue;
        lo = std::min(lo, xs[i]);
        hi = std::max(hi, xs[i]);
        ++n;
      }
      // A log2 axis where every value is positive (the toggle); the fit line is drawn through
      // kFitPoints points spaced evenly on that axis, so it is the same line on either axis.
      const bool loggable = lo > 0;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const Json& yv = (*y)["values"][i];
        if (std::isnan(xs[i]) || !yv.is_number()) continue;
        points.push_back({{"param", xname}, {"x", xs[i]}, {"lx", loggable ? std::log2(xs[i]) : xs[i]}, {"y", yv}, {"row", a["table"]["row_labels"][i]}});
      }
      const double sl = d(f["slope"]), ic = d(f["intercept"]);
      for (int k = 0; k < kFitPoints; ++k) {
        const double t = static_cast<double>(k) / (kFitPoints - 1);
        const double x = loggable ? std::exp2(std::log2(lo) + t * (std::log2(hi) - std::log2(lo))) : lo + t * (hi - lo);
        lines.push_back({{"param", xname}, {"x", x}, {"lx", loggable ? std::log2(x) : x}, {"y", ic + sl * x}});
      }
      log_ok[xname] = loggable;
      params.push_back(xname);
      std::string title = xname;
      if ((*xc)["kind"] == "binary" && eq == std::string::npos)
        title += " (0 = " + (*xc)["levels"][0].get<std::string>() + ", 1 = " + (*xc)["levels"][1].get<std::string>() + ")";
      else if (eq != std::string::npos)
        title += " (1 = yes, 0 = another level)";
      titles[xname] = title;
      if (first.empty()) { first = xname; first_n = n; }
    }
    if (params.empty()) continue;
    const auto& f0 = tf["fits"][0];
    // The log2 axis starts on for a parameter of powers of two (frame: log2_axis).
    const Json* fc = column(a, first);
    const bool first_log = fc && (*fc)["log2_axis"].get<bool>();
    Json s = base_spec(420, 260);
    s["signals"] = Json::array({{{"name", "param"}, {"value", first}, {"bind", {{"input", "select"}, {"options", params}, {"name", "parameter "}}}},
                                {{"name", "titles"}, {"value", titles}}, {{"name", "logok"}, {"value", log_ok}},
                                {{"name", "logx"}, {"value", first_log}, {"bind", {{"input", "checkbox"}, {"name", "log2 axis "}}}}});
    Json eqs = Json::array();
    for (const auto& f : tf["fits"])
      if (!f.contains("error"))
        eqs.push_back({{"param", f["x"]}, {"text", target + " = " + fmt(d(f["intercept"]), 4) + " + " + fmt(d(f["slope"]), 4) + " · " +
                                                       f["x"].get<std::string>() + "   r = " + fmt(d(f["r"])) + ", R² = " + fmt(d(f["r2"])) +
                                                       ", p = " + fmt(d(f["p"])) + ", slope 95% CI [" + fmt(d(f["slope_ci_low"])) + ", " +
                                                       fmt(d(f["slope_ci_high"])) + "]"}});
    const Json xv = {{"type", "formula"}, {"as", "xv"}, {"expr", "logx && logok[param] ? datum.lx : datum.x"}};
    s["data"] = Json::array({{{"name", "point_rows"}, {"values", points}, {"transform", Json::array({{{"type", "filter"}, {"expr", "datum.param === param"}}, xv})}},
                             {{"name", "line"}, {"values", lines}, {"transform", Json::array({{{"type", "filter"}, {"expr", "datum.param === param"}}, xv})}},
                             {{"name", "eq"}, {"values", eqs}, {"transform", Json::array({{{"type", "filter"}, {"expr", "datum.param === param"}}})}}});
    s["scales"] = Json::array({{{"name", "x"}, {"type", "linear"}, {"zero", false}, {"nice", true}, {"range", "width"},
                                {"domain", {{"fields", Json::array({{{"data", "point_rows"}, {"field", "xv"}}, {{"data", "line"}, {"field", "xv"}}})}}}},
                               {{"name", "y"}, {"type", "linear"}, {"zero", false}, {"nice", true}, {"range", "height"},
                                {"domain", {{"fields", Json::array({{{"data", "point_rows"}, {"field", "y"}}, {{"data", "line"}, {"field", "y"}}})}}}}});
    // On the log2 axis the positions are log2(x); ticks at whole exponents, labelled 2^k as
    // numbers (1, 2, 4, 8, ...), not as exponents.
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", {{"signal", "titles[param] + (logx && logok[param] ? ' (log2 axis)' : '')"}}},
                              {"tickMinStep", {{"signal", "logx && logok[param] ? 1 : 0"}}},
                              {"encode", {{"labels", {{"update", {{"text", {{"signal", "logx && logok[param] ? format(pow(2, datum.value), '~r') : datum.label"}}}}}}}}}},
                             {{"orient", "left"}, {"scale", "y"}, {"title", target}}});
    s["marks"] = Json::array({{{"type", "line"}, {"name", "fit"}, {"from", {{"data", "line"}}},
                               {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "xv"}}}, {"y", {{"scale", "y"}, {"field", "y"}}},
                                                       {"stroke", {{"value", "#c0392b"}}}, {"strokeWidth", {{"value", 2}}}}}}}},
                              {{"type", "symbol"}, {"name", "points"}, {"from", {{"data", "point_rows"}}},
                               {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "xv"}}}, {"y", {{"scale", "y"}, {"field", "y"}}}, {"size", {{"value", 50}}},
                                                       {"fill", {{"value", "#2471a3"}}}, {"fillOpacity", {{"value", 0.75}}}, {"opacity", {{"signal", kDimUnbrushed}}},
                                                       {"tooltip", tooltip_signal({{"run", "datum.row"}, {"x", "datum.x"}, {"y", "datum.y"}})}}}}}},
                              {{"type", "text"}, {"name", "equation"}, {"from", {{"data", "eq"}}},
                               {"encode", {{"update", {{"x", {{"value", 0}}}, {"y", {{"value", -8}}}, {"text", {{"field", "text"}}}, {"fontSize", {{"value", 11}}}, {"fill", {{"value", "#333"}}}}}}}}});
    std::string finding = "Best single predictor of " + target + ": " + f0["x"].get<std::string>() + " (r = " + fmt(d(f0["r"])) +
                          ", R² = " + fmt(d(f0["r2"])) + ", p = " + fmt(d(f0["p"])) + ").";
    // The runs brushed in the parallel coordinates: a ring around their points.
    s["data"].push_back(util::highlight_dataset("point_hl", "point_rows"));
    s["marks"].push_back({{"type", "symbol"}, {"name", "points_hl"}, {"from", {{"data", "point_hl"}}}, {"interactive", false},
                          {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "xv"}}}, {"y", {{"scale", "y"}, {"field", "y"}}}, {"size", {{"value", 150}}},
                                                  {"fill", {{"value", "transparent"}}}, {"stroke", {{"value", "#e67e22"}}}, {"strokeWidth", {{"value", 2.5}}}}}}}});
    Chart ch{"fit-" + target, "Parameters vs targets", target + " against each parameter", finding, s, {{"points", first_n}, {"fit", kFitPoints}}};
    util::link_rows(ch, "point_rows");
    out.push_back(std::move(ch));
  }
}

// #10: OLS standardized coefficients with their 95 % intervals.
void ols_charts(const Json& a, std::vector<Chart>& out) {
  for (const auto& o : a["ols"]) {
    if (o.contains("error") || !o.contains("terms")) continue;
    const std::string target = o["target"];
    Json vals = Json::array();
    std::string best;
    double best_abs = -1;
    for (const auto& t : o["terms"]) {
      if (t["name"] == "const" || !t["std_beta"].is_number()) continue;
      double coef = d(t["coef"]), sb = d(t["std_beta"]);
      double scale = coef != 0 ? sb / coef : 0;
      vals.push_back({{"term", t["name"]}, {"beta", sb}, {"lo", d(t["ci_low"]) * scale}, {"hi", d(t["ci_high"]) * scale}, {"p", t["p"]},
                      {"vif", t["vif"]}, {"sig", d(t["p"], 1) < 0.05 ? "p < 0.05" : "p ≥ 0.05"}});
      if (d(t["p"], 1) < 0.05 && std::fabs(sb) > best_abs) { best_abs = std::fabs(sb); best = t["name"].get<std::string>() + " (β = " + fmt(sb) + ", p = " + fmt(d(t["p"])) + ")"; }
    }
    if (vals.empty()) continue;
    Json s = base_spec(420, static_cast<int>(vals.size()) * 26 + 10);
    s["data"] = Json::array({{{"name", "terms"}, {"values", vals}}});
    s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", {{"data", "terms"}, {"field", "term"}}}, {"range", "height"}, {"padding", 0.3}},
                               {{"name", "x"}, {"type", "linear"}, {"nice", true}, {"zero", true}, {"range", "width"},
                                {"domain", {{"fields", Json::array({{{"data", "terms"}, {"field", "lo"}}, {{"data", "terms"}, {"field", "hi"}}})}}}},
                               {{"name", "color"}, {"type", "ordinal"}, {"domain", {"p < 0.05", "p ≥ 0.05"}}, {"range", {"#c0392b", "#95a5a6"}}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "standardized coefficient (95% CI)"}, {"grid", true}}, {{"orient", "left"}, {"scale", "y"}}});
    s["legends"] = Json::array({{{"fill", "color"}, {"title", "coefficient"}}});
    s["marks"] = Json::array({{{"type", "rule"}, {"name", "ci"}, {"from", {{"data", "terms"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "term"}, {"band", 0.5}}}, {"x", {{"scale", "x"}, {"field", "lo"}}},
                                                       {"x2", {{"scale", "x"}, {"field", "hi"}}}, {"stroke", {{"scale", "color"}, {"field", "sig"}}}, {"strokeWidth", {{"value", 2}}}}}}}},
                              {{"type", "symbol"}, {"name", "coef"}, {"from", {{"data", "terms"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "term"}, {"band", 0.5}}}, {"x", {{"scale", "x"}, {"field", "beta"}}},
                                                       {"fill", {{"scale", "color"}, {"field", "sig"}}}, {"size", {{"value", 70}}},
                                                       {"tooltip", tooltip_signal({{"term", "datum.term"}, {"beta", "format(datum.beta, '.3f')"}, {"p", "format(datum.p, '.3g')"}, {"VIF", "format(datum.vif, '.3g')"}})}}}}}}});
    std::string finding = "R² = " + fmt(d(o["r2"])) + " (adjusted " + fmt(d(o["adj_r2"])) + "), F p = " + fmt(d(o["f_p"])) + "; " +
                          (best.empty() ? "no coefficient with p < 0.05." : "largest significant effect: " + best + ".");
    if (o.contains("cv")) finding += " Cross-validated R² = " + fmt(d(o["cv"]["r2"])) + ".";
    out.push_back({"ols-" + target, "Regression", "OLS of " + target + " (n = " + std::to_string(o["n"].get<int>()) + ")", finding, s,
                   {{"coef", static_cast<long>(vals.size())}}});
  }
}

// #9: histogram with counts, and the ECDF, for each target and outcome column.
void distribution_charts(const Json& a, std::vector<Chart>& out) {
  std::set<std::string> targets;
  for (const auto& t : a["options"]["targets"]) targets.insert(t.get<std::string>());
  int shown = 0;
  for (const auto& dist : a["distributions"]) {
    const std::string col = dist["column"];
    const bool is_target = targets.count(col) > 0;
    if (!is_target && (dist["role"] != "outcome" || shown >= 6)) continue;
    ++shown;
    const auto& h = dist["histogram"];
    Json bins = Json::array();
    long total = 0;
    std::size_t mode = 0;
    for (std::size_t k = 0; k < h["counts"].size(); ++k) {
      long c = h["counts"][k].get<long>();
      total += c;
      if (c > h["counts"][mode].get<long>()) mode = k;
      bins.push_back({{"x0", h["edges"][k]}, {"x1", h["edges"][k + 1]}, {"count", c}});
    }
    Json steps = Json::array();
    for (std::size_t k = 0; k < dist["ecdf"]["x"].size(); ++k) steps.push_back({{"x", dist["ecdf"]["x"][k]}, {"f", dist["ecdf"]["f"][k]}});
    Json s = base_spec(420, 200);
    s["data"] = Json::array({{{"name", "bins"}, {"values", bins}}, {{"name", "ecdf_rows"}, {"values", steps}}});
    s["scales"] = Json::array({{{"name", "x"}, {"type", "linear"}, {"zero", false}, {"range", "width"}, {"domain", {{"fields", Json::array({{{"data", "bins"}, {"field", "x0"}}, {{"data", "bins"}, {"field", "x1"}}})}}}},
                               {{"name", "y"}, {"type", "linear"}, {"nice", true}, {"range", "height"}, {"domain", {0, h["counts"][mode].get<long>() + 1}}},
                               {{"name", "f"}, {"type", "linear"}, {"domain", {0, 1}}, {"range", "height"}}});
    Json xaxis = {{"orient", "bottom"}, {"scale", "x"}, {"title", col}};
    if (std::max(std::fabs(d(h["edges"][0])), std::fabs(d(h["edges"][h["edges"].size() - 1]))) >= 1e5) xaxis["format"] = "~s";
    s["axes"] = Json::array({xaxis, {{"orient", "left"}, {"scale", "y"}, {"title", "rows"}, {"tickMinStep", 1}},
                             {{"orient", "right"}, {"scale", "f"}, {"title", "ECDF"}, {"format", "%"}}});
    s["marks"] = Json::array({{{"type", "rect"}, {"name", "bars"}, {"from", {{"data", "bins"}}},
                               {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x0"}, {"offset", 1}}}, {"x2", {{"scale", "x"}, {"field", "x1"}}},
                                                       {"y", {{"scale", "y"}, {"field", "count"}}}, {"y2", {{"scale", "y"}, {"value", 0}}}, {"fill", {{"value", "#5dade2"}}},
                                                       {"tooltip", tooltip_signal({{"bin", "format(datum.x0, '.4g') + ' – ' + format(datum.x1, '.4g')"}, {"rows", "datum.count"}})}}}}}},
                              {{"type", "text"}, {"name", "counts"}, {"from", {{"data", "bins"}}},
                               {"encode", {{"update", {{"x", {{"signal", "(scale('x', datum.x0) + scale('x', datum.x1)) / 2"}}}, {"y", {{"scale", "y"}, {"field", "count"}, {"offset", -3}}},
                                                       {"text", {{"signal", "datum.count > 0 ? datum.count : ''"}}}, {"align", {{"value", "center"}}}, {"fontSize", {{"value", 10}}}}}}}},
                              {{"type", "line"}, {"name", "ecdf"}, {"from", {{"data", "ecdf_rows"}}},
                               {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "f"}, {"field", "f"}}}, {"interpolate", {{"value", "step-after"}}},
                                                       {"stroke", {{"value", "#c0392b"}}}, {"strokeWidth", {{"value", 2}}}, {"tooltip", tooltip_signal({{"x", "datum.x"}, {"F(x)", "format(datum.f, '.3f')"}})}}}}}}});
    const double lo = d(h["edges"][0]), hi = d(h["edges"][h["edges"].size() - 1]);
    std::string finding = col + ": " + std::to_string(total) + " rows from " + fmt(lo, 4) + " to " + fmt(hi, 4) + "; most in [" +
                          fmt(d(h["edges"][mode]), 4) + ", " + fmt(d(h["edges"][mode + 1]), 4) + ").";
    out.push_back({"dist-" + col, "Distributions", "Distribution of " + col, finding, s,
                   {{"bars", static_cast<long>(bins.size())}, {"ecdf", static_cast<long>(steps.size())}}});
  }
}

// #6: box plots of each target per level of each categorical parameter: the box the quartiles,
// Tukey's whiskers (the most extreme values within 1.5 IQR of the quartiles, with caps), the values
// beyond them as points (outliers), a tick at the median, a dot at the mean — all from the
// analysis' box numbers (analysis/distributions.h).
void group_charts(const Json& a, std::vector<Chart>& out) {
  for (const auto& g : a["groups"]) {
    if (g.contains("error")) continue;
    Json vals = Json::array(), outliers = Json::array();
    for (std::size_t k = 0; k < g["levels"].size(); ++k) {
      const auto& b = g["box"][k];
      // Without Tukey's numbers (an older analysis.json) the whiskers fall back to min–max.
      const Json wl = b.contains("whisker_low") && b["whisker_low"].is_number() ? b["whisker_low"] : b["min"];
      const Json wh = b.contains("whisker_high") && b["whisker_high"].is_number() ? b["whisker_high"] : b["max"];
      const long n_out = b.contains("outliers") ? static_cast<long>(b["outliers"].size()) : 0;
      vals.push_back({{"level", g["levels"][k]}, {"mean", g["means"][k]}, {"n", g["sizes"][k]}, {"min", b["min"]}, {"q25", b["q25"]},
                      {"median", b["median"]}, {"q75", b["q75"]}, {"max", b["max"]}, {"wl", wl}, {"wh", wh}, {"n_out", n_out}});
      if (b.contains("outliers"))
        for (const auto& v : b["outliers"]) outliers.push_back({{"level", g["levels"][k]}, {"v", v}});
    }
    Json s = base_spec(360, static_cast<int>(vals.size()) * 34 + 10);
    s["data"] = Json::array({{{"name", "groups"}, {"values", vals}}, {{"name", "box_out"}, {"values", outliers}}});
    s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", {{"data", "groups"}, {"field", "level"}}}, {"range", "height"}, {"padding", 0.3}},
                               {{"name", "x"}, {"type", "linear"}, {"nice", true}, {"zero", false}, {"range", "width"},
                                {"domain", {{"fields", Json::array({{{"data", "groups"}, {"field", "min"}}, {{"data", "groups"}, {"field", "max"}}})}}}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", g["value"]}, {"format", "~s"}}, {{"orient", "left"}, {"scale", "y"}, {"title", g["group"]}}});
    Json tip = tooltip_signal({{"level", "datum.level"}, {"rows", "datum.n"}, {"mean", "format(datum.mean, '.4g')"}, {"median", "format(datum.median, '.4g')"},
                               {"quartiles", "format(datum.q25, '.4g') + ' – ' + format(datum.q75, '.4g')"},
                               {"whiskers (1.5 IQR)", "format(datum.wl, '.4g') + ' – ' + format(datum.wh, '.4g')"}, {"outliers", "datum.n_out"},
                               {"range", "format(datum.min, '.4g') + ' – ' + format(datum.max, '.4g')"}});
    auto cap = [](const char* name, const char* field) {
      return Json{{"type", "rect"}, {"name", name}, {"from", {{"data", "groups"}}},
                  {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", field}, {"offset", -1}}}, {"width", {{"value", 2}}},
                                          {"y", {{"scale", "y"}, {"field", "level"}, {"band", 0.2}}}, {"y2", {{"scale", "y"}, {"field", "level"}, {"band", 0.8}}},
                                          {"fill", {{"value", "#555"}}}}}}}};
    };
    s["marks"] = Json::array({{{"type", "rule"}, {"name", "whiskers"}, {"from", {{"data", "groups"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "level"}, {"band", 0.5}}}, {"x", {{"scale", "x"}, {"field", "wl"}}},
                                                       {"x2", {{"scale", "x"}, {"field", "wh"}}}, {"stroke", {{"value", "#555"}}}}}}}},
                              cap("whisker_low", "wl"), cap("whisker_high", "wh"),
                              {{"type", "rect"}, {"name", "boxes"}, {"from", {{"data", "groups"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "level"}}}, {"height", {{"scale", "y"}, {"band", 1}}}, {"x", {{"scale", "x"}, {"field", "q25"}}},
                                                       {"x2", {{"scale", "x"}, {"field", "q75"}}}, {"fill", {{"value", "#48c9b0"}}}, {"stroke", {{"value", "#1e8449"}}}, {"tooltip", tip}}}}}},
                              {{"type", "rect"}, {"name", "medians"}, {"from", {{"data", "groups"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "level"}}}, {"height", {{"scale", "y"}, {"band", 1}}}, {"x", {{"scale", "x"}, {"field", "median"}}},
                                                       {"width", {{"value", 2}}}, {"fill", {{"value", "#1b2631"}}}}}}}},
                              {{"type", "symbol"}, {"name", "means"}, {"from", {{"data", "groups"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "level"}, {"band", 0.5}}}, {"x", {{"scale", "x"}, {"field", "mean"}}}, {"size", {{"value", 30}}},
                                                       {"fill", {{"value", "#c0392b"}}}, {"tooltip", tip}}}}}},
                              {{"type", "symbol"}, {"name", "outliers"}, {"from", {{"data", "box_out"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "level"}, {"band", 0.5}}}, {"x", {{"scale", "x"}, {"field", "v"}}}, {"size", {{"value", 28}}},
                                                       {"shape", {{"value", "circle"}}}, {"fill", {{"value", "transparent"}}}, {"stroke", {{"value", "#555"}}}, {"strokeWidth", {{"value", 1.2}}},
                                                       {"tooltip", tooltip_signal({{"level", "datum.level"}, {"outlier", "format(datum.v, '.4g')"}})}}}}}}});
    std::string finding = g["group"].get<std::string>() + " explains " + fmt(100 * d(g["eta2"]), 3) + " % of the variance of " + g["value"].get<std::string>() +
                          " (ANOVA F p = " + fmt(d(g["f_p"])) + ", Kruskal–Wallis p = " + fmt(d(g["kruskal_p"])) + "); whiskers: Tukey's 1.5 IQR, " +
                          std::to_string(outliers.size()) + " outlier(s) as circles; red dot: mean.";
    out.push_back({"group-" + g["group"].get<std::string>() + "-" + g["value"].get<std::string>(), "Groups",
                   g["value"].get<std::string>() + " by " + g["group"].get<std::string>(), finding, s,
                   {{"boxes", static_cast<long>(vals.size())}, {"whiskers", static_cast<long>(vals.size())}, {"whisker_low", static_cast<long>(vals.size())},
                    {"whisker_high", static_cast<long>(vals.size())}, {"outliers", static_cast<long>(outliers.size())}}});
  }
}

// #2: speedup against devices with the ideal line (a line per configuration), parallel
// efficiency with the 80 % mark, and the Karp–Flatt serial fraction.
void scaling_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("scaling")) return;
  Json pts = Json::array();
  double max_ranks = 1;
  double below80 = -1;
  std::set<std::string> configs;
  for (const auto& r : a["scaling"]["rows"]) {
    if (!r["speedup"].is_number() || !r["ranks"].is_number()) continue;
    pts.push_back(r);
    configs.insert(r["config"].get<std::string>());
    max_ranks = std::max(max_ranks, d(r["ranks"]));
    if (d(r["efficiency_pct"]) < 80 && (below80 < 0 || d(r["ranks"]) < below80)) below80 = d(r["ranks"]);
  }
  if (pts.empty()) return;
  auto line_chart = [&](const std::string& id, const std::string& field, const std::string& title, const std::string& ytitle, bool ideal,
                        double rule, const std::string& finding) {
    Json s = base_spec(360, 220);
    Json data = Json::array({{{"name", "sc_rows"}, {"values", pts}, {"transform", Json::array({{{"type", "filter"}, {"expr", "isValid(datum." + field + ")"}}})}}});
    if (ideal) data.push_back({{"name", "ideal_rows"}, {"values", Json::array({{{"x", 1}, {"y", 1}}, {{"x", max_ranks}, {"y", max_ranks}}})}});
    s["data"] = data;
    Json yfields = Json::array({{{"data", "sc_rows"}, {"field", field}}});
    if (ideal) yfields.push_back({{"data", "ideal_rows"}, {"field", "y"}});
    s["scales"] = Json::array({{{"name", "x"}, {"type", "log"}, {"base", 2}, {"range", "width"}, {"domain", {1, max_ranks}}},
                               {{"name", "y"}, {"type", "linear"}, {"zero", true}, {"nice", true}, {"range", "height"}, {"domain", {{"fields", yfields}}}},
                               {{"name", "color"}, {"type", "ordinal"}, {"domain", {{"data", "sc_rows"}, {"field", "config"}}}, {"range", "category"}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "devices (ranks, log2 axis)"}}, {{"orient", "left"}, {"scale", "y"}, {"title", ytitle}}});
    if (configs.size() > 1) s["legends"] = Json::array({{{"stroke", "color"}, {"title", "configuration"}, {"orient", "bottom"}, {"direction", "vertical"}, {"labelLimit", 480}}});
    Json marks = Json::array();
    if (ideal)
      marks.push_back({{"type", "line"}, {"name", "ideal"}, {"from", {{"data", "ideal_rows"}}},
                       {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "y"}}}, {"stroke", {{"value", "#999"}}}, {"strokeDash", {{"value", {5, 4}}}}}}}}});
    if (rule > 0)
      marks.push_back({{"type", "rule"}, {"name", "mark80"},
                       {"encode", {{"update", {{"x", {{"value", 0}}}, {"x2", {{"signal", "width"}}}, {"y", {{"scale", "y"}, {"value", rule}}}, {"stroke", {{"value", "#e67e22"}}}, {"strokeDash", {{"value", {4, 3}}}}}}}}});
    Json line = {{"type", "line"}, {"name", "series"}, {"from", {{"data", "sc_facet"}}},
                 {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "ranks"}}}, {"y", {{"scale", "y"}, {"field", field}}}, {"stroke", {{"scale", "color"}, {"field", "config"}}}, {"strokeWidth", {{"value", 2}}},
                                         {"strokeOpacity", {{"signal", "hl ? 0.35 : 1"}}}}}}}};
    Json sym = {{"type", "symbol"}, {"name", "points"}, {"from", {{"data", "sc_facet"}}},
                {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "ranks"}}}, {"y", {{"scale", "y"}, {"field", field}}}, {"fill", {{"scale", "color"}, {"field", "config"}}}, {"size", {{"value", 50}}},
                                        {"opacity", {{"signal", kDimUnbrushed}}},
                                        {"tooltip", tooltip_signal({{"configuration", "datum.config"}, {"devices", "datum.ranks"}, {"speedup", "format(datum.speedup, '.3f')"},
                                                                    {"efficiency", "format(datum.efficiency_pct, '.1f') + ' %'"}, {"Karp–Flatt", "format(datum.karp_flatt, '.3f')"}})}}}}}};
    marks.push_back({{"type", "group"}, {"from", {{"facet", {{"name", "sc_facet"}, {"data", "sc_rows"}, {"groupby", "config"}}}}},
                     {"marks", Json::array({{{"type", "line"}, {"name", "series"}, {"from", {{"data", "sc_facet"}}}, {"sort", {{"field", "datum.ranks"}}}, {"encode", line["encode"]}}, sym})}});
    // The runs brushed in the parallel coordinates: a ring around their points (the others dim).
    s["data"].push_back(util::highlight_dataset("sc_hl", "sc_rows"));
    marks.push_back({{"type", "symbol"}, {"name", "points_hl"}, {"from", {{"data", "sc_hl"}}}, {"interactive", false},
                     {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "ranks"}}}, {"y", {{"scale", "y"}, {"field", field}}}, {"size", {{"value", 160}}},
                                             {"fill", {{"value", "transparent"}}}, {"stroke", {{"value", "#e67e22"}}}, {"strokeWidth", {{"value", 2.5}}}}}}}});
    s["marks"] = marks;
    long n = 0;
    for (const auto& p : pts) n += p[field].is_number();
    std::map<std::string, long> expect{{"points", n}};
    if (ideal) expect["ideal"] = 2;
    Chart ch{id, "Scaling", title, finding, s, expect};
    util::link_rows(ch, "sc_rows");
    out.push_back(std::move(ch));
  };
  const std::string eff_finding = below80 > 0 ? "Efficiency falls below 80 % from " + fmt(below80) + " devices on (dashed: 80 %)."
                                              : "Efficiency stays at or above 80 % up to " + fmt(max_ranks) + " devices (dashed: 80 %).";
  line_chart("scaling-speedup", "speedup", "Speedup against devices", "speedup", true, 0,
             "Speedup at " + fmt(max_ranks) + " devices against the ideal (dashed); " + std::to_string(configs.size()) + " configuration(s).");
  line_chart("scaling-efficiency", "efficiency_pct", "Parallel efficiency", "efficiency (%)", false, 80, eff_finding);
  line_chart("scaling-karp-flatt", "karp_flatt", "Karp–Flatt serial fraction", "serial fraction e", false, 0,
             "A constant e means a fixed serial part; a growing e means overhead that grows with the device count.");
}

// #11: xgboost importances per target and model, with the cross-validated R² in the finding.
void importance_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("trees")) return;
  for (const auto& r : a["trees"]) {
    if (r.contains("error")) continue;
    Json vals = Json::array();
    std::size_t top = 0;
    double shap_max = 0;
    for (const auto& v : r["shap_mean_abs"]) shap_max = std::max(shap_max, v.get<double>());
    for (std::size_t k = 0; k < r["features"].size(); ++k) {
      const double shap = r["shap_mean_abs"][k].get<double>();
      vals.push_back({{"feature", r["features"][k]}, {"gain", r["gain"][k]}, {"weight", r["weight"][k]}, {"cover", r["cover"][k]},
                      {"shap", shap_max > 0 ? 100 * shap / shap_max : 0.0}, {"shap_raw", shap},
                      {"perm", r["permutation_mean"][k]}, {"perm_sd", r["permutation_sd"][k]}});
      if (d(r["gain"][k]) > d(r["gain"][top])) top = k;
    }
    Json s = base_spec(360, static_cast<int>(vals.size()) * 22 + 10);
    s["signals"] = Json::array({{{"name", "kind"}, {"value", "gain"}, {"bind", {{"input", "radio"}, {"options", {"gain", "weight", "cover", "shap"}}, {"name", "importance "}}}}});
    s["data"] = Json::array({{{"name", "imp_rows"}, {"values", vals}, {"transform", Json::array({{{"type", "formula"}, {"as", "v"}, {"expr", "datum[kind]"}}})}}});
    s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", {{"data", "imp_rows"}, {"field", "feature"}, {"sort", {{"field", "gain"}, {"op", "max"}, {"order", "descending"}}}}},
                                {"range", "height"}, {"padding", 0.2}},
                               {{"name", "x"}, {"type", "linear"}, {"domain", {0, 100}}, {"range", "width"}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", {{"signal", "kind + ' importance (100 = the largest)'"}}}, {"grid", true}},
                             {{"orient", "left"}, {"scale", "y"}}});
    const bool bad = r["unreliable"].get<bool>();
    s["marks"] = Json::array({{{"type", "rect"}, {"name", "bars"}, {"from", {{"data", "imp_rows"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "feature"}}}, {"height", {{"scale", "y"}, {"band", 1}}}, {"x", {{"scale", "x"}, {"value", 0}}},
                                                       {"x2", {{"scale", "x"}, {"field", "v"}}}, {"fill", {{"value", bad ? "#bdc3c7" : "#8e44ad"}}},
                                                       {"tooltip", tooltip_signal({{"feature", "datum.feature"}, {"gain", "format(datum.gain, '.1f')"}, {"weight", "format(datum.weight, '.1f')"},
                                                                                   {"cover", "format(datum.cover, '.1f')"}, {"mean |SHAP|", "format(datum.shap_raw, '.4g')"}, {"permutation ΔMSE", "format(datum.perm, '.3g') + ' ± ' + format(datum.perm_sd, '.3g')"}})}}}}}}});
    const std::string model = r["model"] == "random_forest" ? "random forest" : "gradient boosting";
    std::string finding = (bad ? "SURROGATE UNRELIABLE — " : std::string()) + "cross-validated R² = " + fmt(d(r["cv_r2"])) + ", RMSE = " + fmt(d(r["cv_rmse"])) +
                          " (" + std::to_string(r["folds"].get<int>()) + " folds); top: " + r["features"][top].get<std::string>() +
                          " (permutation ΔMSE " + fmt(d(r["permutation_mean"][top])) + " ± " + fmt(d(r["permutation_sd"][top])) + ").";
    out.push_back({"trees-" + r["model"].get<std::string>() + "-" + r["target"].get<std::string>(), "Importances (xgboost)",
                   model + ": " + r["target"].get<std::string>(), finding, s, {{"bars", static_cast<long>(vals.size())}}});
  }
}

// #7: Bland–Altman plots of the telemetry sources that measure the same quantity.
void agreement_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("agreement")) return;
  for (const auto& p : a["agreement"]) {
    Json pts = Json::array();
    const auto& st = p["per_sample"];
    double lo = d(st["lower"], d(st["bias"])), hi = d(st["upper"], d(st["bias"]));
    for (const auto& xy : p["points"]) {
      const double x = xy[0].get<double>(), y = xy[1].get<double>();
      pts.push_back({{"mean", 0.5 * (x + y)}, {"diff", y - x}});
      lo = std::min(lo, y - x);
      hi = std::max(hi, y - x);
    }
    // A spread that is rounding next to the bias (a fixed offset) gets a readable window of
    // ±5 % of the bias around it.
    const double mid = 0.5 * (lo + hi), span = hi - lo;
    const double pad = span < 1e-6 * std::max({std::fabs(lo), std::fabs(hi), 1.0}) ? 0.05 * std::max(std::fabs(mid), 1.0) : 0.08 * span;
    lo -= pad;
    hi += pad;
    Json lines = Json::array({{{"y", st["bias"]}, {"label", "bias"}}, {{"y", st["lower"]}, {"label", "−1.96 sd"}}, {{"y", st["upper"]}, {"label", "+1.96 sd"}}});
    Json s = base_spec(380, 220);
    s["data"] = Json::array({{{"name", "ba_rows"}, {"values", pts}}, {{"name", "ba_lines"}, {"values", lines}, {"transform", Json::array({{{"type", "filter"}, {"expr", "isValid(datum.y)"}}})}}});
    s["scales"] = Json::array({{{"name", "x"}, {"type", "linear"}, {"zero", false}, {"nice", true}, {"range", "width"}, {"domain", {{"data", "ba_rows"}, {"field", "mean"}}}},
                               {{"name", "y"}, {"type", "linear"}, {"zero", false}, {"range", "height"}, {"domain", {lo, hi}}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "mean of the two sources"}, {"format", "~s"}},
                             {{"orient", "left"}, {"scale", "y"}, {"title", "difference (b − a)"}, {"format", "~s"}, {"tickCount", 5}}});
    s["marks"] = Json::array({{{"type", "rule"}, {"name", "limits"}, {"from", {{"data", "ba_lines"}}},
                               {"encode", {{"update", {{"x", {{"value", 0}}}, {"x2", {{"signal", "width"}}}, {"y", {{"scale", "y"}, {"field", "y"}}},
                                                       {"stroke", {{"value", "#c0392b"}}}, {"strokeDash", {{"signal", "datum.label === 'bias' ? [] : [4, 3]"}}}}}}}},
                              {{"type", "symbol"}, {"name", "points"}, {"from", {{"data", "ba_rows"}}},
                               {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "mean"}}}, {"y", {{"scale", "y"}, {"field", "diff"}}}, {"size", {{"value", 16}}},
                                                       {"fill", {{"value", "#2471a3"}}}, {"fillOpacity", {{"value", 0.5}}},
                                                       {"tooltip", tooltip_signal({{"mean", "format(datum.mean, '.4~s')"}, {"difference", "format(datum.diff, '.4~s')"}})}}}}}}});
    std::string finding = p["b"].get<std::string>() + " − " + p["a"].get<std::string>() + ": bias " + fmt(d(st["bias"]), 4) + ", limits [" +
                          fmt(d(st["lower"]), 4) + ", " + fmt(d(st["upper"]), 4) + "], Lin's CCC " + fmt(d(st["ccc"]), 4) + ", r = " + fmt(d(st["r"]), 4) +
                          " over " + std::to_string(st["n"].get<long>()) + " aligned samples.";
    out.push_back({"agree-" + p["a"].get<std::string>() + "-" + p["b"].get<std::string>(), "Agreement of telemetry sources",
                   p["quantity"].get<std::string>() + ": " + p["b"].get<std::string>() + " vs " + p["a"].get<std::string>(), finding, s,
                   {{"points", static_cast<long>(pts.size())}, {"limits", 3}}});
  }
}

// #12: the sweep against a baseline sweep: a ratio per configuration and target, its interval,
// the verdict.
void baseline_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("baseline") || a["baseline"]["rows"].empty()) return;
  std::map<std::string, Json> by_target;
  for (const auto& r : a["baseline"]["rows"]) {
    Json& v = by_target[r["target"].get<std::string>()];
    if (v.is_null()) v = Json::array();
    if (v.size() < 40) v.push_back(r);
  }
  for (const auto& [target, rows] : by_target) {
    int worse = 0;
    double lo = 1, hi = 1;
    for (const auto& r : rows) {
      worse += r["verdict"] == "regression";
      for (const char* k : {"ratio", "ratio_low", "ratio_high"})
        if (r[k].is_number()) { lo = std::min(lo, r[k].get<double>()); hi = std::max(hi, r[k].get<double>()); }
    }
    Json s = base_spec(360, static_cast<int>(rows.size()) * 18 + 10);
    s["config"]["axis"]["labelLimit"] = 300;
    s["data"] = Json::array({{{"name", "bl_rows"}, {"values", rows}}});
    s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", {{"data", "bl_rows"}, {"field", "config"}}}, {"range", "height"}, {"padding", 0.2}},
                               {{"name", "x"}, {"type", "linear"}, {"zero", false}, {"nice", true}, {"range", "width"}, {"domain", {lo, hi}}},
                               {{"name", "color"}, {"type", "ordinal"}, {"domain", {"regression", "no change", "improvement"}}, {"range", {"#c0392b", "#95a5a6", "#27ae60"}}}});
    s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "current / baseline (95% interval from repeats)"}, {"grid", true}},
                             {{"orient", "left"}, {"scale", "y"}}});
    s["legends"] = Json::array({{{"fill", "color"}, {"title", "verdict"}}});
    s["marks"] = Json::array({{{"type", "rule"}, {"name", "one"}, {"encode", {{"update", {{"x", {{"scale", "x"}, {"value", 1}}}, {"y", {{"value", 0}}}, {"y2", {{"signal", "height"}}}, {"stroke", {{"value", "#333"}}}}}}}},
                              {{"type", "rule"}, {"name", "interval"}, {"from", {{"data", "bl_rows"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "config"}, {"band", 0.5}}}, {"x", {{"scale", "x"}, {"signal", "isValid(datum.ratio_low) ? datum.ratio_low : datum.ratio"}}},
                                                       {"x2", {{"scale", "x"}, {"signal", "isValid(datum.ratio_high) ? datum.ratio_high : datum.ratio"}}}, {"stroke", {{"scale", "color"}, {"field", "verdict"}}}, {"strokeWidth", {{"value", 2}}}}}}}},
                              {{"type", "symbol"}, {"name", "ratios"}, {"from", {{"data", "bl_rows"}}},
                               {"encode", {{"update", {{"y", {{"scale", "y"}, {"field", "config"}, {"band", 0.5}}}, {"x", {{"scale", "x"}, {"field", "ratio"}}}, {"fill", {{"scale", "color"}, {"field", "verdict"}}}, {"size", {{"value", 60}}},
                                                       {"tooltip", tooltip_signal({{"configuration", "datum.config"}, {"ratio", "format(datum.ratio, '.3f')"}, {"baseline", "format(datum.baseline_mean, '.4g')"},
                                                                                   {"current", "format(datum.current_mean, '.4g')"}, {"verdict", "datum.verdict"}})}}}}}}});
    std::string finding = std::to_string(worse) + " of " + std::to_string(rows.size()) + " configurations regress on " + target + " against " +
                          a["baseline"]["sweep"].get<std::string>() + (lower_better_name(target) ? " (lower is better)." : " (higher is better).");
    out.push_back({"baseline-" + target, "Against the baseline", target + ": current / baseline", finding, s, {{"ratios", static_cast<long>(rows.size())}}});
  }
}

// #12: the Pareto front of two targets with opposite directions.
void pareto_chart(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("pareto") || a["pareto"]["rows"].empty()) return;
  const auto& p = a["pareto"];
  Json front = Json::array();
  for (const auto& r : p["rows"])
    if (r["front"].get<bool>()) front.push_back(r);
  std::sort(front.begin(), front.end(), [](const Json& l, const Json& r) { return l["x"].get<double>() < r["x"].get<double>(); });
  Json s = base_spec(420, 260);
  s["data"] = Json::array({{{"name", "pa_rows"}, {"values", p["rows"]}}, {{"name", "pa_front"}, {"values", front}}});
  s["scales"] = Json::array({{{"name", "x"}, {"type", "linear"}, {"zero", false}, {"nice", true}, {"range", "width"}, {"domain", {{"data", "pa_rows"}, {"field", "x"}}}},
                             {{"name", "y"}, {"type", "linear"}, {"zero", false}, {"nice", true}, {"range", "height"}, {"domain", {{"data", "pa_rows"}, {"field", "y"}}}},
                             {{"name", "color"}, {"type", "ordinal"}, {"domain", {"on the front", "dominated"}}, {"range", {"#c0392b", "#aab7b8"}}}});
  s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", p["x"].get<std::string>() + " (higher is better)"}, {"format", "~s"}},
                           {{"orient", "left"}, {"scale", "y"}, {"title", p["y"].get<std::string>() + " (lower is better)"}}});
  s["legends"] = Json::array({{{"fill", "color"}, {"title", "configuration"}}});
  s["marks"] = Json::array({{{"type", "line"}, {"name", "front"}, {"from", {{"data", "pa_front"}}},
                             {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "y"}}}, {"interpolate", {{"value", "step-before"}}},
                                                     {"stroke", {{"value", "#c0392b"}}}, {"strokeDash", {{"value", {4, 3}}}}}}}}},
                            {{"type", "symbol"}, {"name", "points"}, {"from", {{"data", "pa_rows"}}},
                             {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "y"}}}, {"size", {{"value", 55}}},
                                                     {"fill", {{"scale", "color"}, {"signal", "datum.front ? 'on the front' : 'dominated'"}}}, {"opacity", {{"signal", kDimUnbrushed}}},
                                                     {"tooltip", tooltip_signal({{"run", "datum.row"}, {"configuration", "datum.config"}, {"x", "format(datum.x, '.4~s')"}, {"y", "format(datum.y, '.4g')"}})}}}}}}});
  std::string finding = std::to_string(p["on_front"].get<long>()) + " of " + std::to_string(p["rows"].size()) + " configurations are Pareto-optimal for " +
                        p["x"].get<std::string>() + " against " + p["y"].get<std::string>() + "; every other one is beaten on both by one of them.";
  s["data"].push_back(util::highlight_dataset("pa_hl", "pa_rows"));
  s["marks"].push_back({{"type", "symbol"}, {"name", "points_hl"}, {"from", {{"data", "pa_hl"}}}, {"interactive", false},
                        {"encode", {{"update", {{"x", {{"scale", "x"}, {"field", "x"}}}, {"y", {{"scale", "y"}, {"field", "y"}}}, {"size", {{"value", 160}}},
                                                {"fill", {{"value", "transparent"}}}, {"stroke", {{"value", "#e67e22"}}}, {"strokeWidth", {{"value", 2.5}}}}}}}});
  Chart ch{"pareto", "Trade-offs", "Pareto front: " + p["x"].get<std::string>() + " vs " + p["y"].get<std::string>(), finding, s,
           {{"points", static_cast<long>(p["rows"].size())}, {"front", static_cast<long>(front.size())}}};
  util::link_rows(ch, "pa_rows");
  out.push_back(std::move(ch));
}

}  // namespace

// The profiling card: each profiled trial's time split by op family (or GPU kernel), as stacked
// bars (from analysis.json's "profile" section: `results --view profile`'s table).
void profile_charts(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("profile")) return;
  const Json& ops = a["profile"]["ops"];
  std::vector<std::string> fams, params;
  std::map<std::string, std::string> title_of;
  for (const auto& c : ops["columns"]) {
    const std::string k = c["key"];
    if (k.rfind("pct_", 0) == 0) {
      fams.push_back(k);
      std::string t = c["title"];
      if (t.size() > 2 && t.compare(t.size() - 2, 2, " %") == 0) t.resize(t.size() - 2);
      title_of[k] = t;
    } else if (k != "trial_id" && k != "status" && k != "step_time_s" && k != "op_time_fraction") {
      params.push_back(k);
    }
  }
  if (fams.empty()) return;
  Json vals = Json::array(), domain = Json::array();
  std::map<std::string, std::vector<double>> by_family;
  for (const auto& r : ops["rows"]) {
    std::string label = "trial " + std::to_string(r.value("trial_id", 0));
    std::string ps;
    for (const auto& p : params) {
      if (!r.contains(p) || r[p].is_null()) continue;
      ps += (ps.empty() ? "" : ", ") + p + "=" + (r[p].is_string() ? r[p].get<std::string>() : r[p].dump());
    }
    if (!ps.empty()) label += " (" + ps + ")";
    domain.push_back(label);
    for (const auto& f : fams) {
      if (!r.contains(f) || !r[f].is_number()) continue;
      vals.push_back({{"trial", label}, {"family", title_of[f]}, {"pct", r[f]}});
      by_family[title_of[f]].push_back(r[f].get<double>());
    }
  }
  if (vals.empty()) return;
  // The finding: the family with the largest mean share, and the one that changes most between trials.
  std::string top, spread;
  double top_mean = -1, spread_range = -1, lo = 0, hi = 0;
  for (const auto& [f, v] : by_family) {
    double m = 0, mn = v[0], mx = v[0];
    for (double x : v) {
      m += x;
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
    m /= static_cast<double>(v.size());
    if (m > top_mean) top_mean = m, top = f;
    if (mx - mn > spread_range) spread_range = mx - mn, spread = f, lo = mn, hi = mx;
  }
  std::string finding = top + " takes " + fmt(top_mean) + " % of the profiled time on average";
  finding += domain.size() > 1 ? "; the largest change between trials: " + spread + " from " + fmt(lo) + " to " + fmt(hi) + " %."
                               : " (one profiled trial).";
  Json s = base_spec(520, static_cast<int>(domain.size()) * 26 + 10);
  s["config"]["axis"]["labelLimit"] = 300;
  s["data"] = Json::array({{{"name", "ops"},
                            {"values", vals},
                            {"transform", Json::array({{{"type", "stack"}, {"groupby", {"trial"}}, {"field", "pct"},
                                                        {"sort", {{"field", "family"}}}, {"as", {"x0", "x1"}}}})}}});
  s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", domain}, {"range", "height"}, {"padding", 0.2}},
                             {{"name", "x"}, {"type", "linear"}, {"domain", {{"data", "ops"}, {"field", "x1"}}}, {"range", "width"}, {"nice", true}, {"zero", true}},
                             {{"name", "color"}, {"type", "ordinal"}, {"domain", {{"data", "ops"}, {"field", "family"}, {"sort", true}}}, {"range", {{"scheme", "tableau20"}}}}});
  s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", "share of the profiled time (%)"}, {"grid", true}},
                           {{"orient", "left"}, {"scale", "y"}}});
  s["legends"] = Json::array({{{"fill", "color"}, {"title", "op family / kernel"}, {"orient", "right"}}});
  s["marks"] = Json::array({{{"type", "rect"}, {"name", "segments"}, {"from", {{"data", "ops"}}},
                             {"encode", {{"enter", {{"y", {{"scale", "y"}, {"field", "trial"}}}, {"height", {{"scale", "y"}, {"band", 1}}},
                                                    {"x", {{"scale", "x"}, {"field", "x0"}}}, {"x2", {{"scale", "x"}, {"field", "x1"}}},
                                                    {"fill", {{"scale", "color"}, {"field", "family"}}},
                                                    {"tooltip", tooltip_signal({{"trial", "datum.trial"}, {"family", "datum.family"},
                                                                                 {"share %", "format(datum.pct, '.1f')"}})}}}}}}});
  out.push_back({"profile-ops", "Profiles", "Where the time goes, per profiled trial", finding, s,
                 {{"segments", static_cast<long>(vals.size())}}});
}

std::vector<Chart> build_charts(const Json& a) {
  std::vector<Chart> out;
  baseline_charts(a, out);
  util::parcoords_chart(a, out);
  scaling_charts(a, out);
  util::scaling_facet_charts(a, out);
  util::telemetry_charts(a, out);
  util::memory_parts_chart(a, out);
  profile_charts(a, out);
  agreement_charts(a, out);
  correlation_chart(a, out);
  pairs_chart(a, out);
  ols_charts(a, out);
  importance_charts(a, out);
  pareto_chart(a, out);
  util::objective_importance_chart(a, out);
  fit_charts(a, out);
  group_charts(a, out);
  distribution_charts(a, out);
  stats_charts(a, out);  // #2 cost/energy per device count, #12 SHAP interactions / dependence / stability (charts_stats.cpp)
  return out;
}

}  // namespace scalelab::report
