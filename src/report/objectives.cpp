// #12 importances per objective: with several targets, each parameter's importance for each of
// them side by side (report/chart_util.h objective_importance_chart).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "report/chart_util.h"

namespace scalelab::report::util {

// #12: importances per objective — with several targets, each parameter's importance for each
// of them side by side on one scale (100 = the most important feature of that objective's model):
// mean |SHAP| or gain (toggle), gradient boosting or random forest (toggle), from analysis.json's
// tree results. Drawn next to the Pareto front.
void objective_importance_chart(const Json& a, std::vector<Chart>& out) {
  if (!a.contains("trees")) return;
  std::vector<std::string> models, targets, features;
  auto add_unique = [](std::vector<std::string>& v, const std::string& x) {
    if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
  };
  Json rows = Json::array();
  std::map<std::string, std::set<std::string>> targets_of;  // model -> targets with importances
  std::map<std::string, bool> unreliable_of;  // model -> a target's surrogate is unreliable
  for (const auto& r : a["trees"]) {
    if (r.contains("error") || !r.contains("gain")) continue;
    const std::string m = r["model"], t = r["target"];
    double shap_max = 0;
    const bool has_shap = r.contains("shap_mean_abs") && r["shap_mean_abs"].size() == r["features"].size();
    if (has_shap)
      for (const auto& v : r["shap_mean_abs"]) shap_max = std::max(shap_max, d(v, 0));
    for (std::size_t k = 0; k < r["features"].size(); ++k) {
      const std::string f = r["features"][k];
      const double shap = has_shap ? d(r["shap_mean_abs"][k], 0) : NAN;
      rows.push_back({{"model", m}, {"target", t}, {"feature", f}, {"gain", r["gain"][k]},
                      {"shap", has_shap && shap_max > 0 ? Json(100 * shap / shap_max) : Json()}, {"shap_raw", has_shap ? Json(shap) : Json()},
                      {"cv_r2", r["cv_r2"]}, {"unreliable", r["unreliable"]}});
      add_unique(features, f);
    }
    add_unique(models, m);
    add_unique(targets, t);
    targets_of[m].insert(t);
    unreliable_of[m] = unreliable_of[m] || r["unreliable"].get<bool>();
  }
  // The models that explain at least two objectives (gradient boosting first).
  std::vector<std::string> usable;
  for (const char* m : {"gradient_boosting", "random_forest"})
    if (targets_of[m].size() >= 2) usable.push_back(m);
  if (usable.empty()) return;
  const std::string model0 = usable.front();
  bool shap_everywhere = true;
  long n_bars = 0;
  for (const auto& r : rows)
    if (r["model"] == model0) {
      ++n_bars;
      shap_everywhere = shap_everywhere && r["shap"].is_number();
    }
  const std::string kind0 = shap_everywhere ? "shap" : "gain";
  // The finding: each objective's top feature (the default model and importance).
  std::string finding;
  std::map<std::string, std::pair<std::string, double>> top;  // target -> (feature, importance)
  for (const auto& r : rows) {
    if (r["model"] != model0 || !r[kind0].is_number()) continue;
    auto& tp = top[r["target"].get<std::string>()];
    if (tp.first.empty() || d(r[kind0]) > tp.second) tp = {r["feature"].get<std::string>(), d(r[kind0])};
  }
  for (const auto& t : targets)
    if (top.count(t)) finding += (finding.empty() ? "" : ", ") + top[t].first + " drives " + t;
  if (finding.empty()) return;
  finding = std::string(kind0 == "shap" ? "By mean |SHAP|" : "By gain") + " (" + (model0 == "random_forest" ? "random forest" : "gradient boosting") +
            "; 100 = each objective's top feature): " + finding + ".";
  if (unreliable_of[model0]) finding += " Grey bars: a surrogate with cross-validated R² < 0.5 (unreliable).";
  // Features in the order of their largest importance over the objectives.
  std::map<std::string, double> best;
  for (const auto& r : rows)
    if (r["model"] == model0) best[r["feature"].get<std::string>()] = std::max(best[r["feature"].get<std::string>()], d(r[kind0], 0));
  std::stable_sort(features.begin(), features.end(), [&](const std::string& x, const std::string& y) { return best[x] > best[y]; });
  const int band = static_cast<int>(targets.size()) * 11 + 8;
  Json s = base_spec(380, static_cast<int>(features.size()) * band + 10);
  Json model_labels = Json::array();
  for (const auto& m : usable) model_labels.push_back(m == "random_forest" ? "random forest" : "gradient boosting");
  Json kinds = shap_everywhere ? Json::array({"shap", "gain"}) : Json::array({"gain"});
  s["signals"] = Json::array({{{"name", "imp_kind"}, {"value", kind0}, {"bind", {{"input", "radio"}, {"options", kinds}, {"labels", shap_everywhere ? Json::array({"mean |SHAP|", "gain"}) : Json::array({"gain"})}, {"name", "importance "}}}},
                              {{"name", "imp_model"}, {"value", model0}, {"bind", {{"input", "radio"}, {"options", usable}, {"labels", model_labels}, {"name", "model "}}}}});
  s["data"] = Json::array({{{"name", "obj_rows"}, {"values", rows},
                            {"transform", Json::array({{{"type", "filter"}, {"expr", "datum.model === imp_model"}},
                                                       {{"type", "formula"}, {"as", "v"}, {"expr", "isValid(datum[imp_kind]) ? datum[imp_kind] : 0"}}})}}});
  s["scales"] = Json::array({{{"name", "y"}, {"type", "band"}, {"domain", features}, {"range", "height"}, {"paddingInner", 0.25}, {"paddingOuter", 0.1}},
                             {{"name", "inner"}, {"type", "band"}, {"domain", targets}, {"range", {{"signal", "[0, bandwidth('y')]"}}}, {"padding", 0.08}},
                             {{"name", "x"}, {"type", "linear"}, {"domain", {0, 100}}, {"range", "width"}},
                             {{"name", "color"}, {"type", "ordinal"}, {"domain", targets}, {"range", {"#8e44ad", "#16a085", "#d35400", "#2471a3", "#c0392b"}}}});
  s["axes"] = Json::array({{{"orient", "bottom"}, {"scale", "x"}, {"title", {{"signal", "(imp_kind === 'shap' ? 'mean |SHAP|' : 'gain') + ' (100 = the top feature of each objective)'"}}}, {"grid", true}},
                           {{"orient", "left"}, {"scale", "y"}, {"labelOverlap", false}}});
  s["legends"] = Json::array({{{"fill", "color"}, {"title", "objective"}, {"orient", "bottom"}, {"direction", "vertical"}}});
  s["marks"] = Json::array({{{"type", "rect"}, {"name", "bars"}, {"from", {{"data", "obj_rows"}}},
                             {"encode", {{"update", {{"y", {{"signal", "scale('y', datum.feature) + scale('inner', datum.target)"}}}, {"height", {{"signal", "bandwidth('inner')"}}},
                                                     {"x", {{"scale", "x"}, {"value", 0}}}, {"x2", {{"scale", "x"}, {"field", "v"}}},
                                                     {"fill", {{"signal", "datum.unreliable ? '#bdc3c7' : scale('color', datum.target)"}}},
                                                     {"tooltip", tooltip_signal({{"feature", "datum.feature"}, {"objective", "datum.target"}, {"gain", "format(datum.gain, '.1f')"},
                                                                                 {"mean |SHAP| (% of top)", "isValid(datum.shap) ? format(datum.shap, '.1f') : '—'"},
                                                                                 {"mean |SHAP|", "isValid(datum.shap_raw) ? format(datum.shap_raw, '.4g') : '—'"},
                                                                                 {"CV R² of the model", "format(datum.cv_r2, '.3f')"}})}}}}}}});
  out.push_back({"importance-objectives", "Trade-offs", "What drives each objective: importances side by side", finding, s, {{"bars", n_bars}}});
}

}  // namespace scalelab::report::util
