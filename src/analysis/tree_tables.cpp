#include "analysis/tree_tables.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace scalelab::analysis {
namespace {

using lab::CellFormat;

Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }

std::string fmt(double v, int sig = 3) {
  if (!std::isfinite(v)) return "—";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", sig, v);
  return buf;
}

}  // namespace

std::vector<std::pair<std::string, lab::Table>> tree_detail_tables(const std::vector<TreeModelResult>& results) {
  lab::Table inter, dep, stab;
  inter.columns = {{"target", "target"}, {"model", "model"}, {"a", "feature a"}, {"b", "feature b"},
                   {"mean_abs", "mean |SHAP interaction|", CellFormat::kSig4}};
  dep.columns = {{"target", "target"}, {"model", "model"}, {"feature", "feature"}, {"row", "row", CellFormat::kInt},
                 {"x", "value", CellFormat::kSig4}, {"shap", "SHAP", CellFormat::kSig4}, {"color_by", "interacts most with"}};
  stab.columns = {{"target", "target"}, {"model", "model"}, {"importance", "importance"}, {"feature", "feature"},
                  {"mean", "mean", CellFormat::kSig4}, {"sd", "sd", CellFormat::kSig4}, {"low", "2.5 %", CellFormat::kSig4},
                  {"high", "97.5 %", CellFormat::kSig4}, {"mean_rank", "mean rank", CellFormat::kFixed2},
                  {"rank_low", "rank 2.5 %", CellFormat::kFixed1}, {"rank_high", "rank 97.5 %", CellFormat::kFixed1},
                  {"top3_share", "top-3 share", CellFormat::kFixed2}, {"resamples", "resamples", CellFormat::kInt}};
  for (const auto& r : results) {
    if (!r.error.empty()) continue;
    const std::size_t p = r.features.size();
    for (std::size_t a = 0; a < r.interaction_mean_abs.size(); ++a)
      for (std::size_t b = a; b < p; ++b)
        inter.rows.push_back({{"target", r.target}, {"model", r.model}, {"a", r.features[a]}, {"b", r.features[b]},
                              {"mean_abs", r.interaction_mean_abs[a][b]}});
    for (const auto& d : r.dependence)
      for (std::size_t i = 0; i < d.x.size(); ++i)
        dep.rows.push_back({{"target", r.target}, {"model", r.model}, {"feature", r.features[d.feature]}, {"row", i}, {"x", num(d.x[i])},
                            {"shap", d.shap[i]}, {"color_by", d.color_by ? Json(r.features[*d.color_by]) : Json()}});
    for (const auto& [kind, s] : r.stability)
      for (std::size_t k = 0; k < p; ++k)
        stab.rows.push_back({{"target", r.target}, {"model", r.model}, {"importance", kind}, {"feature", r.features[k]},
                             {"mean", num(s.mean[k])}, {"sd", num(s.sd[k])}, {"low", num(s.low[k])}, {"high", num(s.high[k])},
                             {"mean_rank", num(s.mean_rank[k])}, {"rank_low", num(s.rank_low[k])}, {"rank_high", num(s.rank_high[k])},
                             {"top3_share", num(s.top3_share[k])}, {"resamples", r.resamples}});
  }
  return {{"shap_interactions", inter}, {"shap_dependence", dep}, {"importance_stability", stab}};
}

std::string tree_detail_markdown(const std::vector<TreeModelResult>& results) {
  std::ostringstream md;
  for (const auto& r : results) {
    if (!r.error.empty()) continue;
    const std::size_t p = r.features.size();
    // The strongest off-diagonal interactions (phi_jk + phi_kj = 2 phi_jk: the pair's share).
    std::vector<std::pair<double, std::pair<std::size_t, std::size_t>>> pairs;
    for (std::size_t a = 0; a < r.interaction_mean_abs.size(); ++a)
      for (std::size_t b = a + 1; b < p; ++b) pairs.push_back({r.interaction_mean_abs[a][b], {a, b}});
    std::stable_sort(pairs.begin(), pairs.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    md << "\n## SHAP interactions and stability: " << r.model << " for " << r.target << "\n\n";
    if (!pairs.empty()) {
      md << "Strongest interactions (mean |SHAP interaction value|, each half of the pair's share; additivity error "
         << fmt(r.interaction_additivity_error) << "): ";
      for (std::size_t k = 0; k < std::min<std::size_t>(3, pairs.size()); ++k)
        md << (k ? "; " : "") << r.features[pairs[k].second.first] << " × " << r.features[pairs[k].second.second] << " "
           << fmt(pairs[k].first);
      md << ".\n";
    }
    if (r.stability.empty()) continue;
    lab::Table t;
    t.columns = {{"feature", "feature"}, {"gain", "gain mean [95 %]"}, {"gain_rank", "gain mean rank"}, {"gain_top3", "gain top-3", CellFormat::kFixed2},
                 {"shap", "mean abs SHAP [95 %]"}, {"shap_rank", "SHAP mean rank"}, {"shap_top3", "SHAP top-3", CellFormat::kFixed2}};
    const auto& g = r.stability.at("gain");
    const auto& s = r.stability.at("shap_mean_abs");
    std::vector<std::size_t> order(p);
    for (std::size_t k = 0; k < p; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return s.mean_rank[a] < s.mean_rank[b]; });
    for (std::size_t k : order)
      t.rows.push_back({{"feature", r.features[k]}, {"gain", fmt(g.mean[k]) + " [" + fmt(g.low[k]) + ", " + fmt(g.high[k]) + "]"},
                        {"gain_rank", fmt(g.mean_rank[k])}, {"gain_top3", g.top3_share[k]},
                        {"shap", fmt(s.mean[k]) + " [" + fmt(s.low[k]) + ", " + fmt(s.high[k]) + "]"},
                        {"shap_rank", fmt(s.mean_rank[k])}, {"shap_top3", s.top3_share[k]}});
    md << "\nStability over " << r.resamples << " bootstrap resamples: Spearman ρ with the all-rows ranking " << fmt(g.spearman_mean)
       << " (gain), " << fmt(s.spearman_mean) << " (SHAP); the top feature is the same in " << fmt(100 * g.top1_share) << " % (gain), "
       << fmt(100 * s.top1_share) << " % (SHAP) of the resamples.\n\n"
       << lab::render_markdown(t);
  }
  return md.str();
}

}  // namespace scalelab::analysis
