#include "analysis/trees.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>

#include <xgboost/c_api.h>

#include "analysis/correlation.h"
#include "analysis/descriptive.h"

namespace scalelab::analysis {
namespace {

constexpr float kMissing = std::numeric_limits<float>::quiet_NaN();

void check(int rc, const char* what) {
  if (rc != 0) throw std::runtime_error(std::string("xgboost ") + what + ": " + XGBGetLastError());
}

struct DMat {
  DMatrixHandle h = nullptr;
  DMat(const std::vector<float>& x, std::size_t rows, std::size_t cols, const std::vector<float>& y, const std::vector<std::string>& names) {
    check(XGDMatrixCreateFromMat(x.data(), rows, cols, kMissing, &h), "DMatrix");
    if (!y.empty()) check(XGDMatrixSetFloatInfo(h, "label", y.data(), rows), "label");
    std::vector<const char*> c;
    for (const auto& n : names) c.push_back(n.c_str());
    check(XGDMatrixSetStrFeatureInfo(h, "feature_name", c.data(), c.size()), "feature names");
  }
  ~DMat() { if (h) XGDMatrixFree(h); }
  DMat(const DMat&) = delete;
  DMat& operator=(const DMat&) = delete;
};

struct Booster {
  BoosterHandle h = nullptr;
  Booster(const DMat& train, const std::vector<std::pair<std::string, std::string>>& params, int rounds, double base_score) {
    check(XGBoosterCreate(&train.h, 1, &h), "booster");
    for (const auto& [k, v] : params) check(XGBoosterSetParam(h, k.c_str(), v.c_str()), k.c_str());
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", base_score);
    check(XGBoosterSetParam(h, "base_score", buf), "base_score");
    for (int i = 0; i < rounds; ++i) check(XGBoosterUpdateOneIter(h, i, train.h), "update");
  }
  ~Booster() { if (h) XGBoosterFree(h); }
  Booster(const Booster&) = delete;
  Booster& operator=(const Booster&) = delete;
  std::vector<double> predict(const DMat& d) const {
    bst_ulong len = 0;
    const float* out = nullptr;
    check(XGBoosterPredict(h, d.h, 0, 0, 0, &len, &out), "predict");
    return std::vector<double>(out, out + len);
  }
  // TreeSHAP contributions (pred_contribs): rows x (features + 1, the last the bias).
  std::vector<double> contribs(const DMat& d) const {
    bst_ulong len = 0;
    const float* out = nullptr;
    check(XGBoosterPredict(h, d.h, 4, 0, 0, &len, &out), "predict contributions");
    return std::vector<double>(out, out + len);
  }
  // SHAP interaction values (pred_interactions): rows x (features + 1) x (features + 1).
  std::vector<double> interactions(const DMat& d) const {
    bst_ulong len = 0;
    const float* out = nullptr;
    check(XGBoosterPredict(h, d.h, 16, 0, 0, &len, &out), "predict interactions");
    return std::vector<double>(out, out + len);
  }
  // Scores per feature name (0 for unused features), scaled 100 x / max.
  std::vector<double> importance(const char* type, const std::vector<std::string>& names) const {
    Json cfg{{"importance_type", type}, {"feature_names", names}};
    bst_ulong nf = 0, dim = 0;
    const char** feats = nullptr;
    const bst_ulong* shape = nullptr;
    const float* scores = nullptr;
    check(XGBoosterFeatureScore(h, cfg.dump().c_str(), &nf, &feats, &dim, &shape, &scores), "feature score");
    std::map<std::string, double> by;
    for (bst_ulong i = 0; i < nf; ++i) by[feats[i]] = scores[i];
    std::vector<double> out;
    double mx = 0;
    for (const auto& n : names) {
      out.push_back(by.count(n) ? by[n] : 0.0);
      mx = std::max(mx, out.back());
    }
    if (mx > 0)
      for (auto& v : out) v = 100.0 * v / mx;
    return out;
  }
};

struct ModelSpec {
  const char* name;
  std::vector<std::pair<std::string, std::string>> params;
  int rounds;
};

std::vector<ModelSpec> model_specs() {
  const std::vector<std::pair<std::string, std::string>> common = {
      {"objective", "reg:squarederror"}, {"tree_method", "exact"}, {"seed", "0"}, {"nthread", "1"}, {"verbosity", "0"}};
  ModelSpec rf{"random_forest", common, 1};
  for (auto kv : std::vector<std::pair<std::string, std::string>>{{"num_parallel_tree", "64"}, {"subsample", "0.8"}, {"colsample_bynode", "0.8"},
                                                                  {"learning_rate", "1"}, {"max_depth", "6"}})
    rf.params.push_back(kv);
  ModelSpec gb{"gradient_boosting", common, 100};
  for (auto kv : std::vector<std::pair<std::string, std::string>>{{"learning_rate", "0.1"}, {"max_depth", "3"}}) gb.params.push_back(kv);
  return {rf, gb};
}

// Percentile (0..100) of values by linear interpolation (numpy's default).
double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return quantile_sorted(v, q / 100.0);
}

// The stability statistics of one importance over the resamples (rows: resamples x features).
ImportanceStability stability_of(const std::vector<std::vector<double>>& per, const std::vector<double>& full) {
  ImportanceStability s;
  const std::size_t b = per.size(), p = full.size();
  std::vector<std::vector<double>> ranks;
  for (const auto& v : per) {
    std::vector<double> neg(v.size());
    for (std::size_t k = 0; k < v.size(); ++k) neg[k] = -v[k];
    ranks.push_back(average_ranks(neg));
  }
  for (std::size_t k = 0; k < p; ++k) {
    std::vector<double> col, rk;
    for (std::size_t r = 0; r < b; ++r) { col.push_back(per[r][k]); rk.push_back(ranks[r][k]); }
    double m = 0;
    for (double x : col) m += x;
    m /= static_cast<double>(b);
    double ss = 0;
    for (double x : col) ss += (x - m) * (x - m);
    s.mean.push_back(m);
    s.sd.push_back(b > 1 ? std::sqrt(ss / static_cast<double>(b - 1)) : std::numeric_limits<double>::quiet_NaN());
    s.low.push_back(percentile(col, 2.5));
    s.high.push_back(percentile(col, 97.5));
    double mr = 0, top3 = 0;
    for (double x : rk) { mr += x; top3 += x <= 3 ? 1 : 0; }
    s.mean_rank.push_back(mr / static_cast<double>(b));
    s.rank_low.push_back(percentile(rk, 2.5));
    s.rank_high.push_back(percentile(rk, 97.5));
    s.top3_share.push_back(top3 / static_cast<double>(b));
  }
  auto argmax = [](const std::vector<double>& v) { return static_cast<std::size_t>(std::max_element(v.begin(), v.end()) - v.begin()); };
  auto varies = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()) > *std::min_element(v.begin(), v.end()); };
  double rho_sum = 0, top1 = 0;
  for (const auto& v : per) {
    if (varies(v) && varies(full)) {
      Correlation c = spearman(v, full);
      if (!std::isnan(c.r)) { rho_sum += c.r; ++s.spearman_n; }
    }
    top1 += argmax(v) == argmax(full) ? 1 : 0;
  }
  s.spearman_mean = s.spearman_n ? rho_sum / s.spearman_n : std::numeric_limits<double>::quiet_NaN();
  s.top1_share = top1 / static_cast<double>(b);
  return s;
}

// Mean |phi_jk| over the rows, and the additivity of the interactions against the contributions.
void shap_interactions(TreeModelResult& r, const std::vector<double>& inter, const std::vector<double>& contrib, std::size_t n, std::size_t p) {
  const std::size_t q = p + 1;
  r.interaction_mean_abs.assign(p, std::vector<double>(p, 0.0));
  double max_err = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < q; ++j) {
      double sum = 0;
      for (std::size_t k = 0; k < q; ++k) {
        const double v = inter[(i * q + j) * q + k];
        sum += v;
        if (j < p && k < p) r.interaction_mean_abs[j][k] += std::fabs(v);
      }
      max_err = std::max(max_err, std::fabs(sum - contrib[i * q + j]));
    }
  for (auto& row : r.interaction_mean_abs)
    for (auto& v : row) v /= static_cast<double>(n);
  r.interaction_additivity_error = max_err;
}

Json stability_to_json(const ImportanceStability& s) {
  auto nums = [](const std::vector<double>& v) {
    Json a = Json::array();
    for (double x : v) a.push_back(std::isfinite(x) ? Json(x) : Json());
    return a;
  };
  return {{"mean", nums(s.mean)}, {"sd", nums(s.sd)}, {"low", nums(s.low)}, {"high", nums(s.high)},
          {"mean_rank", nums(s.mean_rank)}, {"rank_low", nums(s.rank_low)}, {"rank_high", nums(s.rank_high)},
          {"top3_share", nums(s.top3_share)}, {"spearman_mean", std::isfinite(s.spearman_mean) ? Json(s.spearman_mean) : Json()},
          {"spearman_n", s.spearman_n}, {"top1_share", s.top1_share}};
}

}  // namespace

std::string xgboost_version() {
  int a = 0, b = 0, c = 0;
  XGBoostVersion(&a, &b, &c);
  return std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c);
}

std::vector<TreeModelResult> tree_importances(const std::string& target, const std::vector<double>& y_all,
                                              const std::vector<Variable>& design, const TreeOptions& options) {
  const int folds = options.folds;
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < y_all.size(); ++i)
    if (!std::isnan(y_all[i])) rows.push_back(i);
  const std::size_t n = rows.size(), p = design.size();
  std::vector<std::string> names;
  for (const auto& v : design) names.push_back(v.name);
  auto matrix = [&](const std::vector<std::size_t>& sel) {
    std::vector<float> x(sel.size() * p);
    for (std::size_t r = 0; r < sel.size(); ++r)
      for (std::size_t c = 0; c < p; ++c) {
        double v = design[c].values[rows[sel[r]]];
        x[r * p + c] = std::isnan(v) ? kMissing : static_cast<float>(v);
      }
    return x;
  };
  auto mean_of = [&](const std::vector<std::size_t>& sel) {
    double m = 0;
    for (auto i : sel) m += y_all[rows[i]];
    return m / static_cast<double>(sel.size());
  };
  auto labels = [&](const std::vector<std::size_t>& sel) {
    std::vector<float> out;
    for (auto s : sel) out.push_back(static_cast<float>(y_all[rows[s]]));
    return out;
  };
  std::vector<TreeModelResult> out;
  for (const auto& spec : model_specs()) {
    TreeModelResult r;
    r.model = spec.name;
    r.target = target;
    r.n = n;
    r.folds = folds;
    r.features = names;
    if (p == 0 || n < static_cast<std::size_t>(std::max(folds, 4))) {
      r.error = "needs at least " + std::to_string(std::max(folds, 4)) + " rows with the target and one feature";
      out.push_back(r);
      continue;
    }
    try {
      std::vector<std::size_t> all(n);
      for (std::size_t i = 0; i < n; ++i) all[i] = i;
      {
        DMat d(matrix(all), n, p, labels(all), names);
        Booster b(d, spec.params, spec.rounds, mean_of(all));
        r.gain = b.importance("gain", names);
        r.weight = b.importance("weight", names);
        r.cover = b.importance("cover", names);
        // TreeSHAP: mean |contribution| per feature, and additivity (contributions + bias sum to
        // the prediction) as a check of the library's output.
        auto c = b.contribs(d);
        auto pr = b.predict(d);
        r.shap_mean_abs.assign(p, 0.0);
        double max_err = 0;
        for (std::size_t i = 0; i < n; ++i) {
          double sum = 0;
          for (std::size_t k = 0; k <= p; ++k) {
            const double v = c[i * (p + 1) + k];
            sum += v;
            if (k < p) r.shap_mean_abs[k] += std::fabs(v) / static_cast<double>(n);
          }
          max_err = std::max(max_err, std::fabs(sum - pr[i]));
        }
        r.shap_additivity_error = max_err;
        shap_interactions(r, b.interactions(d), c, n, p);
        // Dependence data: the top features by mean |contribution|.
        std::vector<std::size_t> order;
        for (std::size_t k = 0; k < p; ++k) if (r.shap_mean_abs[k] > 0) order.push_back(k);
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b2) { return r.shap_mean_abs[a] > r.shap_mean_abs[b2]; });
        if (order.size() > static_cast<std::size_t>(std::max(options.dependence_top, 0))) order.resize(static_cast<std::size_t>(std::max(options.dependence_top, 0)));
        for (std::size_t j : order) {
          ShapDependence dep;
          dep.feature = j;
          for (std::size_t i = 0; i < n; ++i) {
            dep.x.push_back(design[j].values[rows[i]]);
            dep.shap.push_back(c[i * (p + 1) + j]);
          }
          for (std::size_t k = 0; k < p; ++k)
            if (k != j && (!dep.color_by || r.interaction_mean_abs[j][k] > r.interaction_mean_abs[j][*dep.color_by])) dep.color_by = k;
          if (dep.color_by)
            for (std::size_t i = 0; i < n; ++i) dep.color_x.push_back(design[*dep.color_by].values[rows[i]]);
          r.dependence.push_back(std::move(dep));
        }
      }
      // Stability over bootstrap resamples.
      if (options.bootstrap > 0) {
        auto importances_of = [&](const Booster& b, const DMat& d_all) {
          std::map<std::string, std::vector<double>> imp;
          for (const char* kind : {"gain", "weight", "cover"}) imp[kind] = b.importance(kind, names);
          auto c = b.contribs(d_all);
          std::vector<double> m(p, 0.0);
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t k = 0; k < p; ++k) m[k] += std::fabs(c[i * (p + 1) + k]);
          for (auto& v : m) v /= static_cast<double>(n);
          imp["shap_mean_abs"] = m;
          return imp;
        };
        DMat d_all(matrix(all), n, p, labels(all), names);
        std::map<std::string, std::vector<double>> full;
        {
          Booster b(d_all, spec.params, spec.rounds, mean_of(all));
          full = importances_of(b, d_all);
        }
        std::map<std::string, std::vector<std::vector<double>>> per;
        for (int rs = 0; rs < options.bootstrap; ++rs) {
          auto sel = bootstrap_rows(n, static_cast<std::size_t>(rs), options.seed);
          DMat d(matrix(sel), n, p, labels(sel), names);
          Booster b(d, spec.params, spec.rounds, mean_of(sel));
          for (auto& [kind, v] : importances_of(b, d_all)) per[kind].push_back(std::move(v));
        }
        r.resamples = options.bootstrap;
        for (const auto& [kind, v] : per) r.stability[kind] = stability_of(v, full[kind]);
      }
      auto pos = shuffled_indices(n, 0);
      std::vector<int> fold(n);
      for (std::size_t q = 0; q < n; ++q) fold[pos[q]] = static_cast<int>(q % static_cast<std::size_t>(folds));
      std::vector<double> pred(n, 0);
      std::vector<std::vector<double>> perm(p);
      for (int k = 0; k < folds; ++k) {
        std::vector<std::size_t> tr, te;
        for (std::size_t i = 0; i < n; ++i) (fold[i] == k ? te : tr).push_back(i);
        DMat dtr(matrix(tr), tr.size(), p, labels(tr), names);
        Booster b(dtr, spec.params, spec.rounds, mean_of(tr));
        std::vector<float> xte = matrix(te);
        DMat dte(xte, te.size(), p, {}, names);
        auto pk = b.predict(dte);
        double base = 0;
        for (std::size_t i = 0; i < te.size(); ++i) {
          pred[te[i]] = pk[i];
          double e = y_all[rows[te[i]]] - pk[i];
          base += e * e;
        }
        base /= static_cast<double>(te.size());
        for (std::size_t c = 0; c < p; ++c) {
          std::vector<float> xp = xte;
          auto perm_idx = shuffled_indices(te.size(), 1 + c);
          for (std::size_t i = 0; i < te.size(); ++i) xp[i * p + c] = xte[perm_idx[i] * p + c];
          DMat dp(xp, te.size(), p, {}, names);
          auto pp = b.predict(dp);
          double mse = 0;
          for (std::size_t i = 0; i < te.size(); ++i) {
            double e = y_all[rows[te[i]]] - pp[i];
            mse += e * e;
          }
          perm[c].push_back(mse / static_cast<double>(te.size()) - base);
        }
      }
      double mean = 0, ss = 0, st = 0;
      for (std::size_t i = 0; i < n; ++i) mean += y_all[rows[i]];
      mean /= static_cast<double>(n);
      for (std::size_t i = 0; i < n; ++i) {
        double yv = y_all[rows[i]];
        ss += (yv - pred[i]) * (yv - pred[i]);
        st += (yv - mean) * (yv - mean);
      }
      r.cv_r2 = st > 0 ? 1 - ss / st : std::numeric_limits<double>::quiet_NaN();
      r.cv_rmse = std::sqrt(ss / static_cast<double>(n));
      r.unreliable = !(r.cv_r2 >= 0.5);
      for (std::size_t c = 0; c < p; ++c) {
        double m = 0;
        for (double v : perm[c]) m += v;
        m /= static_cast<double>(perm[c].size());
        double s = 0;
        for (double v : perm[c]) s += (v - m) * (v - m);
        r.perm_mean.push_back(m);
        r.perm_sd.push_back(perm[c].size() > 1 ? std::sqrt(s / static_cast<double>(perm[c].size() - 1)) : 0.0);
      }
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    out.push_back(r);
  }
  return out;
}

Json tree_result_to_json(const TreeModelResult& r) {
  Json j{{"model", r.model}, {"target", r.target}, {"n", r.n}, {"folds", r.folds}, {"features", r.features}};
  if (!r.error.empty()) { j["error"] = r.error; return j; }
  j.update({{"cv_r2", r.cv_r2}, {"cv_rmse", r.cv_rmse}, {"unreliable", r.unreliable}, {"gain", r.gain}, {"weight", r.weight},
            {"cover", r.cover}, {"permutation_mean", r.perm_mean}, {"permutation_sd", r.perm_sd},
            {"shap_mean_abs", r.shap_mean_abs}, {"shap_additivity_max_abs_error", r.shap_additivity_error},
            {"interaction_mean_abs", r.interaction_mean_abs}, {"interaction_additivity_max_abs_error", r.interaction_additivity_error}});
  Json dep = Json::array();
  for (const auto& d : r.dependence) {
    Json x = Json::array();
    for (double v : d.x) x.push_back(std::isnan(v) ? Json() : Json(v));
    Json cx = Json::array();
    for (double v : d.color_x) cx.push_back(std::isnan(v) ? Json() : Json(v));
    dep.push_back({{"feature", d.feature}, {"name", r.features[d.feature]}, {"x", x}, {"shap", d.shap},
                   {"color_by", d.color_by ? Json(*d.color_by) : Json()}, {"color_by_name", d.color_by ? Json(r.features[*d.color_by]) : Json()},
                   {"color_x", cx}});
  }
  j["dependence"] = dep;
  if (r.resamples > 0) {
    Json st{{"resamples", r.resamples}};
    for (const auto& [kind, s] : r.stability) st[kind] = stability_to_json(s);
    j["stability"] = st;
  }
  return j;
}

}  // namespace scalelab::analysis
