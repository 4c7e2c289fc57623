#include "analysis/analyze.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "analysis/correlation.h"
#include "analysis/descriptive.h"
#include "analysis/distributions.h"
#include "analysis/pairs.h"
#include "analysis/regression.h"
#include "analysis/tree_tables.h"
#include "analysis/trees.h"
#include "core/error.h"

namespace scalelab::analysis {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }

std::string column_list(const Frame& f) {
  std::string s;
  for (const auto& c : f.columns) s += (s.empty() ? "" : ", ") + c.name;
  return s.empty() ? "none" : s;
}

bool is_dropped(const Frame& f, const std::string& name) {
  return std::find(f.dropped_constant.begin(), f.dropped_constant.end(), sanitize_name(name)) != f.dropped_constant.end();
}

bool is_missing(const Frame& f, const std::string& name) {
  return std::find(f.dropped_missing.begin(), f.dropped_missing.end(), sanitize_name(name)) != f.dropped_missing.end();
}

std::vector<std::string> default_targets(const Frame& f) {
  for (const char* k : {"val_loss", "tokens_per_s_per_device", "final_loss", "tokens_per_s", "step_time_s"})
    if (const Column* c = f.find(k); c && c->kind == ColumnKind::kNumeric) return {c->name};
  for (const auto& c : f.columns)
    if (c.role == ColumnRole::kOutcome && c.kind == ColumnKind::kNumeric) return {c.name};
  return {};
}

std::vector<double> masked(const std::vector<double>& v, const std::vector<int>& keep, int want) {
  std::vector<double> out(v.size(), kNaN);
  for (std::size_t i = 0; i < v.size(); ++i)
    if (keep[i] == want) out[i] = v[i];
  return out;
}

// OLS predictions for rows from a fitted model's terms (by design variable name).
std::vector<double> ols_predict(const OlsResult& fit, const std::vector<Variable>& design, std::size_t rows) {
  std::vector<double> out(rows, kNaN);
  for (std::size_t i = 0; i < rows; ++i) {
    double s = 0;
    bool ok = true;
    for (const auto& t : fit.terms) {
      if (t.name == "const") { s += t.coef; continue; }
      auto it = std::find_if(design.begin(), design.end(), [&](const Variable& v) { return v.name == t.name; });
      if (it == design.end() || std::isnan(it->values[i])) { ok = false; break; }
      s += t.coef * it->values[i];
    }
    if (ok) out[i] = s;
  }
  return out;
}

std::string fmt(double v, int sig = 4) {
  if (std::isnan(v)) return "—";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", sig, v);
  return buf;
}

// The row's varying parameters other than ranks, "micro_batch_size=2 model=x" (the series of a
// scaling chart).
std::string config_label(const Frame& f, std::size_t i) {
  std::string out;
  for (const auto& c : f.columns) {
    if (c.role != ColumnRole::kParameter || c.name == "ranks") continue;
    std::string v = c.kind == ColumnKind::kNumeric ? (std::isnan(c.values[i]) ? "" : fmt(c.values[i], 6)) : c.text[i];
    out += (out.empty() ? "" : " ") + c.name + "=" + v;
  }
  return out.empty() ? "all" : out;
}

void write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InvalidInput("[analyze] cannot write '" + tmp + "' — check that the output directory (-o) is writable");
    out << text;
    if (!out) throw RuntimeError("[analyze] writing '" + tmp + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw RuntimeError("[analyze] cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

}  // namespace

Analysis analyze(const Frame& frame, const AnalyzeOptions& opt) {
  Analysis out;
  Json problems = Json::array();
  const std::size_t n = frame.rows();

  // Targets.
  std::vector<std::string> targets;
  for (const auto& t : opt.targets) {
    const Column* c = frame.find(t);
    if (!c) {
      if (is_missing(frame, t)) {
        problems.push_back("target '" + t + "' has no value in any of the " + std::to_string(n) +
                           " rows (every cell is missing: NaN, null or empty) — nothing to model; check the metric's name and the runs");
        continue;
      }
      if (is_dropped(frame, t)) {
        problems.push_back("target '" + t + "' is constant over the " + std::to_string(n) +
                           " rows — no model or fit for it (it explains nothing and nothing explains it)");
        continue;
      }
      throw InvalidInput("[analyze] --target '" + t + "' is not a column of " + frame.source + " — columns: " + column_list(frame));
    }
    if (c->kind != ColumnKind::kNumeric)
      throw InvalidInput("[analyze] --target '" + t + "' is " + kind_name(c->kind) + ", not numeric — pick a numeric outcome");
    targets.push_back(c->name);
  }
  if (opt.targets.empty()) {
    targets = default_targets(frame);
    if (targets.empty()) problems.push_back("no numeric outcome to use as a target — give --target NAME");
  }
  // Features.
  std::vector<std::string> features;
  if (opt.features.empty()) {
    bool from_csv = std::all_of(frame.columns.begin(), frame.columns.end(), [](const Column& c) { return c.role == ColumnRole::kOther; });
    for (const auto& c : frame.columns) {
      if (std::find(targets.begin(), targets.end(), c.name) != targets.end()) continue;
      if (c.role == ColumnRole::kParameter || (from_csv && c.role == ColumnRole::kOther)) features.push_back(c.name);
    }
  } else {
    for (const auto& f : opt.features) {
      const Column* c = frame.find(f);
      if (!c) {
        if (is_missing(frame, f)) { problems.push_back("feature '" + f + "' has no value in any row — left out"); continue; }
        if (is_dropped(frame, f)) { problems.push_back("feature '" + f + "' is constant — left out"); continue; }
        throw InvalidInput("[analyze] --features: '" + f + "' is not a column of " + frame.source + " — columns: " + column_list(frame));
      }
      features.push_back(c->name);
    }
  }
  if (opt.split && !(*opt.split > 0 && *opt.split < 1))
    throw InvalidInput("[analyze] --split " + fmt(*opt.split) + " is not a fraction in (0, 1) — e.g. --split 0.75");
  if (opt.cv && (*opt.cv < 2 || static_cast<std::size_t>(*opt.cv) > n))
    throw InvalidInput("[analyze] --cv " + std::to_string(*opt.cv) + ": needs 2 to " + std::to_string(n) + " folds (one per row at most)");
  if (n < 3) problems.push_back("only " + std::to_string(n) + " row(s): correlations, fits and regression need at least 3 rows (rows are configurations; repeats are averaged)");
  for (const auto& d : frame.dropped_constant) (void)d;

  Json j;
  j["version"] = 1;
  j["source"] = frame.source;
  j["options"] = {{"targets", targets}, {"features", features}, {"split", opt.split ? Json(*opt.split) : Json()},
                  {"seed", opt.seed}, {"cv", opt.cv ? Json(*opt.cv) : Json()}, {"bins", opt.bins}};
  j["table"] = frame.to_json();

  // #5 descriptive.
  std::vector<int> split;
  if (opt.split) split = split_rows(n, *opt.split, opt.seed);
  Json desc = Json::array();
  lab::Table dt;
  dt.columns = {{"column", "column"}, {"subset", "subset"}, {"n", "n", lab::CellFormat::kInt}, {"missing", "missing", lab::CellFormat::kInt},
                {"mean", "mean", lab::CellFormat::kSig4}, {"std0", "std (ddof=0)", lab::CellFormat::kSig4},
                {"std1", "std (ddof=1)", lab::CellFormat::kSig4}, {"min", "min", lab::CellFormat::kSig4},
                {"median", "median", lab::CellFormat::kSig4}, {"max", "max", lab::CellFormat::kSig4},
                {"skew_g1", "skew g1", lab::CellFormat::kSig4}, {"kurt_g2", "kurt g2", lab::CellFormat::kSig4},
                {"skew_G1", "skew G1", lab::CellFormat::kSig4}, {"kurt_G2", "kurt G2", lab::CellFormat::kSig4},
                {"q25", "q25", lab::CellFormat::kSig4}, {"q75", "q75", lab::CellFormat::kSig4}};
  for (const auto& c : frame.columns) {
    if (c.kind == ColumnKind::kCategorical) continue;
    Json e{{"column", c.name}, {"role", role_name(c.role)}, {"kind", kind_name(c.kind)}, {"all", describe_to_json(describe(c.values))}};
    if (opt.split) {
      std::vector<double> train, test;
      for (std::size_t i = 0; i < n; ++i) (split[i] ? train : test).push_back(c.values[i]);
      e["train"] = describe_to_json(describe(train));
      e["test"] = describe_to_json(describe(test));
    }
    for (const char* sub : {"all", "train", "test"}) {
      if (!e.contains(sub)) continue;
      Json row = e[sub];
      row["column"] = c.name;
      row["subset"] = sub;
      dt.rows.push_back(row);
    }
    desc.push_back(e);
  }
  j["descriptive"] = desc;
  out.tables.push_back({"descriptive", dt});

  // #3 correlation.
  auto vars = association_variables(frame);
  CorrelationMatrix cm = correlation_matrix(vars);
  j["correlation"] = correlation_to_json(cm);
  {
    lab::Table t;
    t.columns = {{"a", "a"}, {"b", "b"}, {"n", "n", lab::CellFormat::kInt}, {"pearson_r", "Pearson r", lab::CellFormat::kFixed4},
                 {"pearson_p", "p", lab::CellFormat::kSig4}, {"spearman_rho", "Spearman rho", lab::CellFormat::kFixed4},
                 {"spearman_p", "p (rho)", lab::CellFormat::kSig4}};
    for (std::size_t a = 0; a < vars.size(); ++a)
      for (std::size_t b = a + 1; b < vars.size(); ++b)
        t.rows.push_back({{"a", cm.names[a]}, {"b", cm.names[b]}, {"n", cm.pearson[a][b].n}, {"pearson_r", num(cm.pearson[a][b].r)},
                          {"pearson_p", num(cm.pearson[a][b].p)}, {"spearman_rho", num(cm.spearman[a][b].r)},
                          {"spearman_p", num(cm.spearman[a][b].p)}});
    out.tables.push_back({"correlation", t});
  }

  // #4 pairs.
  auto pairs = ranked_pairs(frame, vars);
  Json pj = Json::array();
  lab::Table pt;
  pt.columns = {{"a", "a"}, {"b", "b"}, {"kind", "kind"}, {"effect", "effect", lab::CellFormat::kFixed3}, {"sign", "sign", lab::CellFormat::kInt},
                {"r", "r", lab::CellFormat::kFixed3}, {"rho", "rho", lab::CellFormat::kFixed3}, {"eta2", "eta²", lab::CellFormat::kFixed3},
                {"f1", "F1", lab::CellFormat::kFixed3}, {"auc", "AUC", lab::CellFormat::kFixed3}, {"cramers_v", "Cramér's V", lab::CellFormat::kFixed3},
                {"p", "p", lab::CellFormat::kSig4}, {"q", "q (BH)", lab::CellFormat::kSig4}, {"n", "n", lab::CellFormat::kInt}};
  for (const auto& p : pairs) {
    pj.push_back(pair_to_json(p));
    pt.rows.push_back(pair_to_json(p));
  }
  j["pairs"] = {{"count", pairs.size()}, {"rows", pj}};
  out.tables.push_back({"pairs", pt});

  // #10 OLS and #8 fits, per target.
  auto design = design_variables(frame, features);
  Json olsj = Json::array(), fitsj = Json::array();
  lab::Table ot, ft;
  ot.columns = {{"target", "target"}, {"name", "term"}, {"coef", "coef", lab::CellFormat::kSig4}, {"se", "SE", lab::CellFormat::kSig4},
                {"t", "t", lab::CellFormat::kSig4}, {"p", "p", lab::CellFormat::kSig4}, {"ci_low", "CI low", lab::CellFormat::kSig4},
                {"ci_high", "CI high", lab::CellFormat::kSig4}, {"vif", "VIF", lab::CellFormat::kSig4}, {"std_beta", "std beta", lab::CellFormat::kSig4},
                {"normalised_weight", "norm. weight", lab::CellFormat::kFixed3}};
  ft.columns = {{"y", "target"}, {"x", "parameter"}, {"n", "n", lab::CellFormat::kInt}, {"r", "r", lab::CellFormat::kFixed3},
                {"r2", "R²", lab::CellFormat::kFixed3}, {"slope", "slope", lab::CellFormat::kSig4}, {"intercept", "intercept", lab::CellFormat::kSig4},
                {"slope_ci_low", "slope CI low", lab::CellFormat::kSig4}, {"slope_ci_high", "slope CI high", lab::CellFormat::kSig4},
                {"p", "p", lab::CellFormat::kSig4}};
  for (const auto& tname : targets) {
    const Column* y = frame.find(tname);
    std::vector<Variable> d;
    for (const auto& v : design)
      if (v.column != tname) d.push_back(v);
    OlsResult r = ols(tname, y->values, d);
    Json oj = ols_to_json(r);
    if (!r.error.empty()) problems.push_back("OLS for " + tname + ": " + r.error);
    if (opt.cv && r.error.empty()) {
      auto idx = shuffled_indices(n, opt.seed);
      std::vector<double> pred(n, kNaN);
      bool ok = true;
      for (int k = 0; k < *opt.cv && ok; ++k) {
        std::vector<int> fold(n, 0);
        for (std::size_t q = 0; q < n; ++q) fold[idx[q]] = static_cast<int>(q % static_cast<std::size_t>(*opt.cv)) == k ? 1 : 0;
        OlsResult fk = ols(tname, masked(y->values, fold, 0), d);
        if (!fk.error.empty()) { ok = false; break; }
        auto pk = ols_predict(fk, d, n);
        for (std::size_t q = 0; q < n; ++q) if (fold[q]) pred[q] = pk[q];
      }
      if (ok) {
        double ss = 0, st = 0, mean = 0, cnt = 0;
        for (std::size_t q = 0; q < n; ++q) if (!std::isnan(pred[q]) && !std::isnan(y->values[q])) { mean += y->values[q]; cnt += 1; }
        mean /= cnt;
        for (std::size_t q = 0; q < n; ++q)
          if (!std::isnan(pred[q]) && !std::isnan(y->values[q])) {
            ss += (y->values[q] - pred[q]) * (y->values[q] - pred[q]);
            st += (y->values[q] - mean) * (y->values[q] - mean);
          }
        oj["cv"] = {{"folds", *opt.cv}, {"r2", num(st > 0 ? 1 - ss / st : kNaN)}, {"rmse", num(std::sqrt(ss / cnt))}};
      } else {
        problems.push_back("cross-validated R² for " + tname + ": a fold had too few rows for the model");
      }
    }
    olsj.push_back(oj);
    for (const auto& t : r.terms) {
      Json row = oj["terms"][&t - &r.terms[0]];
      row["target"] = tname;
      ot.rows.push_back(row);
    }
    std::vector<LinFit> fits;
    for (const auto& v : d) fits.push_back(linregress(v.name, v.values, tname, y->values));
    std::stable_sort(fits.begin(), fits.end(), [](const LinFit& a, const LinFit& b) {
      double ra = std::isnan(a.r) ? -1 : std::fabs(a.r), rb = std::isnan(b.r) ? -1 : std::fabs(b.r);
      return ra > rb;
    });
    Json fl = Json::array();
    for (const auto& f : fits) {
      fl.push_back(linfit_to_json(f));
      ft.rows.push_back(linfit_to_json(f));
    }
    fitsj.push_back({{"target", tname}, {"fits", fl}});
  }
  j["ols"] = olsj;
  j["fits"] = fitsj;

  // #11 tree-model importances (xgboost), per target.
  Json treej = Json::array();
  lab::Table tt;
  tt.columns = {{"target", "target"}, {"model", "model"}, {"feature", "feature"}, {"gain", "gain", lab::CellFormat::kFixed1},
                {"weight", "weight", lab::CellFormat::kFixed1}, {"cover", "cover", lab::CellFormat::kFixed1},
                {"permutation_mean", "perm. ΔMSE", lab::CellFormat::kSig4}, {"permutation_sd", "± sd", lab::CellFormat::kSig4},
                {"cv_r2", "CV R²", lab::CellFormat::kFixed3}, {"cv_rmse", "CV RMSE", lab::CellFormat::kSig4}};
  std::vector<TreeModelResult> tree_results;
  if (opt.trees) {
    TreeOptions topt;
    topt.folds = opt.cv ? *opt.cv : 5;
    topt.bootstrap = opt.bootstrap;
    topt.seed = opt.seed;
    for (const auto& tname : targets) {
      std::vector<Variable> d;
      for (const auto& v : design)
        if (v.column != tname) d.push_back(v);
      for (const auto& r : tree_importances(tname, frame.find(tname)->values, d, topt)) {
        tree_results.push_back(r);
        treej.push_back(tree_result_to_json(r));
        if (!r.error.empty()) {
          problems.push_back(r.model + " importances for " + tname + ": " + r.error);
          continue;
        }
        for (std::size_t k = 0; k < r.features.size(); ++k)
          tt.rows.push_back({{"target", tname}, {"model", r.model}, {"feature", r.features[k]}, {"gain", r.gain[k]}, {"weight", r.weight[k]},
                             {"cover", r.cover[k]}, {"permutation_mean", r.perm_mean[k]}, {"permutation_sd", r.perm_sd[k]},
                             {"cv_r2", num(r.cv_r2)}, {"cv_rmse", r.cv_rmse}});
      }
    }
  }
  j["trees"] = treej;
  j["xgboost_version"] = xgboost_version();
  out.tables.push_back({"importances", tt});
  for (auto& t : tree_detail_tables(tree_results)) out.tables.push_back(std::move(t));
  out.tables.push_back({"ols", ot});
  out.tables.push_back({"fits", ft});

  // #9 distributions.
  Json dj = Json::array();
  for (const auto& c : frame.columns) {
    if (c.kind != ColumnKind::kNumeric) continue;
    Histogram h = histogram(c.values, opt.bins);
    Ecdf e = ecdf(c.values);
    dj.push_back({{"column", c.name}, {"role", role_name(c.role)}, {"log2_axis", c.log2_axis},
                  {"histogram", {{"edges", h.edges}, {"counts", h.counts}}}, {"ecdf", {{"x", e.x}, {"f", e.f}}}});
  }
  j["distributions"] = dj;

  // #6 groups: each binary/categorical feature against each target.
  Json gj = Json::array();
  lab::Table gt;
  gt.columns = {{"group", "group"}, {"value", "target"}, {"k", "groups", lab::CellFormat::kInt}, {"n", "n", lab::CellFormat::kInt},
                {"eta2", "eta²", lab::CellFormat::kFixed3}, {"f", "F", lab::CellFormat::kSig4}, {"f_p", "p (F)", lab::CellFormat::kSig4},
                {"kruskal_h", "Kruskal H", lab::CellFormat::kSig4}, {"kruskal_p", "p (H)", lab::CellFormat::kSig4}};
  lab::Table bt, ht;  // box plots and grouped histograms, one row per level (per bin)
  bt.columns = {{"group", "group"}, {"value", "target"}, {"level", "level"}, {"n", "n", lab::CellFormat::kInt},
                {"min", "min", lab::CellFormat::kSig4}, {"q25", "q25", lab::CellFormat::kSig4}, {"median", "median", lab::CellFormat::kSig4},
                {"q75", "q75", lab::CellFormat::kSig4}, {"max", "max", lab::CellFormat::kSig4},
                {"whisker_low", "whisker low", lab::CellFormat::kSig4}, {"whisker_high", "whisker high", lab::CellFormat::kSig4},
                {"outliers", "outliers", lab::CellFormat::kInt}, {"mean", "mean", lab::CellFormat::kSig4}};
  ht.columns = {{"group", "group"}, {"value", "target"}, {"level", "level"}, {"bin", "bin", lab::CellFormat::kInt},
                {"low", "low", lab::CellFormat::kSig4}, {"high", "high", lab::CellFormat::kSig4}, {"count", "count", lab::CellFormat::kInt}};
  for (const auto& f : features) {
    const Column* g = frame.find(f);
    if (!g || g->kind == ColumnKind::kNumeric) continue;
    for (const auto& tname : targets) {
      GroupTest t = group_test(g->name, g->text, tname, frame.find(tname)->values, opt.bins);
      gj.push_back(group_test_to_json(t));
      gt.rows.push_back(group_test_to_json(t));
      for (std::size_t k = 0; k < t.levels.size(); ++k) {
        const auto& b = t.box[k];
        bt.rows.push_back({{"group", t.group}, {"value", t.value}, {"level", t.levels[k]}, {"n", t.sizes[k]}, {"min", b[0]}, {"q25", b[1]},
                           {"median", b[2]}, {"q75", b[3]}, {"max", b[4]}, {"whisker_low", t.whiskers[k][0]},
                           {"whisker_high", t.whiskers[k][1]}, {"outliers", t.outliers[k].size()}, {"mean", num(t.means[k])}});
        if (k < t.counts.size())
          for (std::size_t e = 0; e + 1 < t.edges.size(); ++e)
            ht.rows.push_back({{"group", t.group}, {"value", t.value}, {"level", t.levels[k]}, {"bin", e}, {"low", t.edges[e]},
                               {"high", t.edges[e + 1]}, {"count", t.counts[k][e]}});
      }
    }
  }
  j["groups"] = gj;
  out.tables.push_back({"groups", gt});
  out.tables.push_back({"group_boxes", bt});
  out.tables.push_back({"group_histograms", ht});

  // #12 Pareto front of two targets with opposite directions (e.g. tokens/s up, validation loss
  // down): a row is on the front when no other row is at least as good on both and better on one.
  {
    std::string up, down;
    for (const auto& tname : targets) {
      const bool lower = tname.find("loss") != std::string::npos || tname.find("time") != std::string::npos ||
                         tname.find("bytes") != std::string::npos || tname.find("gib") != std::string::npos || tname.find("memory") != std::string::npos;
      if (lower && down.empty()) down = tname;
      if (!lower && up.empty()) up = tname;
    }
    if (!up.empty() && !down.empty()) {
      const Column* x = frame.find(up);
      const Column* y = frame.find(down);
      Json rows = Json::array();
      std::size_t on_front = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (std::isnan(x->values[i]) || std::isnan(y->values[i])) continue;
        bool dominated = false;
        for (std::size_t k = 0; k < n && !dominated; ++k) {
          if (k == i || std::isnan(x->values[k]) || std::isnan(y->values[k])) continue;
          dominated = x->values[k] >= x->values[i] && y->values[k] <= y->values[i] &&
                      (x->values[k] > x->values[i] || y->values[k] < y->values[i]);
        }
        on_front += !dominated;
        rows.push_back({{"row", frame.row_labels[i]}, {"config", config_label(frame, i)}, {"x", x->values[i]}, {"y", y->values[i]}, {"front", !dominated}});
      }
      j["pareto"] = {{"x", up}, {"y", down}, {"x_higher_is_better", true}, {"y_lower_is_better", true}, {"on_front", on_front}, {"rows", rows}};
    }
  }

  // #2 scaling columns, when present.
  if (const Column* s = frame.find("speedup")) {
    const Column* ranks = frame.find("ranks");
    const Column* eff = frame.find("efficiency_pct");
    const Column* kf = frame.find("karp_flatt");
    const Column* tpd = frame.find("tokens_per_s_per_device");
    Json rows = Json::array();
    for (std::size_t i = 0; i < n; ++i)
      rows.push_back({{"row", frame.row_labels[i]}, {"ranks", ranks ? num(ranks->values[i]) : Json()},
                      {"config", config_label(frame, i)},
                      {"speedup", num(s->values[i])}, {"efficiency_pct", eff ? num(eff->values[i]) : Json()},
                      {"karp_flatt", kf ? num(kf->values[i]) : Json()}, {"tokens_per_s_per_device", tpd ? num(tpd->values[i]) : Json()}});
    j["scaling"] = {{"rows", rows}};
  }

  // The data table itself.
  {
    lab::Table t;
    t.columns.push_back({"row", "row"});
    t.columns.push_back({"repeats", "repeats", lab::CellFormat::kInt});
    for (const auto& c : frame.columns) t.columns.push_back({c.name, c.name, c.kind == ColumnKind::kNumeric ? lab::CellFormat::kSig4 : lab::CellFormat::kText});
    for (std::size_t i = 0; i < n; ++i) {
      Json row{{"row", frame.row_labels[i]}, {"repeats", frame.repeats[i]}};
      for (const auto& c : frame.columns)
        row[c.name] = c.kind == ColumnKind::kNumeric ? num(c.values[i]) : (c.text[i].empty() ? Json() : Json(c.text[i]));
      t.rows.push_back(row);
    }
    out.tables.insert(out.tables.begin(), {"table", t});
  }
  j["problems"] = problems;
  out.json = j;

  // Markdown.
  std::ostringstream md;
  md << "# Analysis of " << frame.source << "\n\n";
  md << n << " rows (configurations; repeats averaged), " << frame.columns.size() << " columns";
  if (!frame.dropped_constant.empty()) {
    md << "; constant columns dropped: ";
    for (std::size_t k = 0; k < frame.dropped_constant.size(); ++k) md << (k ? ", " : "") << frame.dropped_constant[k];
    if (!frame.dropped_missing.empty()) {
      md << " (no value at all: ";
      for (std::size_t k = 0; k < frame.dropped_missing.size(); ++k) md << (k ? ", " : "") << frame.dropped_missing[k];
      md << ")";
    }
  }
  md << ".\n";
  for (const auto& note : frame.notes) md << "\n" << note << ".\n";
  md << "\nTargets: " << (targets.empty() ? std::string("none") : "");
  for (std::size_t k = 0; k < targets.size(); ++k) md << (k ? ", " : "") << targets[k];
  md << ". Features: ";
  for (std::size_t k = 0; k < features.size(); ++k) md << (k ? ", " : "") << features[k];
  md << (features.empty() ? "none" : "") << ".\n";
  if (!problems.empty()) {
    md << "\n## Not computed\n\n";
    for (const auto& p : problems) md << "- " << p.get<std::string>() << "\n";
  }
  md << "\n## Descriptive statistics\n\n" << lab::render_markdown(dt);
  {
    lab::Table top = pt;
    if (top.rows.size() > 15) top.rows.resize(15);
    md << "\n## Top relationships (" << pairs.size() << " pairs in all; pairs.csv has every one)\n\n" << lab::render_markdown(top);
  }
  for (const auto& oj : olsj) {
    md << "\n## OLS: " << oj["target"].get<std::string>() << "\n\n";
    if (oj.contains("error")) { md << "Not computed: " << oj["error"].get<std::string>() << "\n"; continue; }
    md << "n = " << oj["n"] << ", R² = " << fmt(oj["r2"].is_null() ? kNaN : oj["r2"].get<double>())
       << ", adjusted R² = " << fmt(oj["adj_r2"].is_null() ? kNaN : oj["adj_r2"].get<double>())
       << ", F = " << fmt(oj["f"].is_null() ? kNaN : oj["f"].get<double>()) << " (p = " << fmt(oj["f_p"].is_null() ? kNaN : oj["f_p"].get<double>()) << ")";
    if (oj.contains("cv")) md << ", cross-validated R² (" << oj["cv"]["folds"] << " folds) = " << fmt(oj["cv"]["r2"].is_null() ? kNaN : oj["cv"]["r2"].get<double>());
    md << "\n";
    if (!oj["aliased"].empty()) {
      md << "Aliased (left out): ";
      for (std::size_t k = 0; k < oj["aliased"].size(); ++k) md << (k ? ", " : "") << oj["aliased"][k].get<std::string>();
      md << "\n";
    }
    lab::Table t = ot;
    t.rows.clear();
    for (const auto& r : ot.rows) if (r["target"] == oj["target"]) t.rows.push_back(r);
    md << "\n" << lab::render_markdown(t);
  }
  if (!ft.rows.empty()) md << "\n## Each parameter against each target (ordered by |r|)\n\n" << lab::render_markdown(ft);
  if (!gt.rows.empty()) md << "\n## Groups (ANOVA and Kruskal–Wallis)\n\n" << lab::render_markdown(gt);
  if (!bt.rows.empty())
    md << "\n## Box plots per level (linear quartiles; whiskers: Tukey's 1.5 IQR; group_histograms.csv has the " << opt.bins
       << "-bin histograms on common edges)\n\n" << lab::render_markdown(bt);
  for (const auto& r : treej) {
    if (r.contains("error")) continue;
    md << "\n## Importances: " << r["model"].get<std::string>() << " for " << r["target"].get<std::string>() << " (xgboost "
       << j["xgboost_version"].get<std::string>() << ")\n\n"
       << "Cross-validated R² = " << fmt(r["cv_r2"].is_null() ? kNaN : r["cv_r2"].get<double>()) << ", RMSE = " << fmt(r["cv_rmse"].get<double>())
       << " (" << r["folds"] << " folds)";
    if (r["unreliable"].get<bool>()) md << " — **surrogate unreliable**: the model does not predict the target (CV R² < 0.5), so its importances say little";
    md << ".\n\n";
    lab::Table t = tt;
    t.rows.clear();
    for (const auto& row : tt.rows)
      if (row["model"] == r["model"] && row["target"] == r["target"]) t.rows.push_back(row);
    std::stable_sort(t.rows.begin(), t.rows.end(), [](const Json& a, const Json& b) { return a["gain"].get<double>() > b["gain"].get<double>(); });
    md << lab::render_markdown(t);
  }
  md << tree_detail_markdown(tree_results);
  out.markdown = md.str();
  return out;
}

std::vector<std::string> write_analysis(const Analysis& a, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InvalidInput("[analyze] cannot create the output directory '" + dir + "': " + ec.message() + " — pick another -o");
  std::vector<std::string> paths;
  const std::string jp = (std::filesystem::path(dir) / "analysis.json").string();
  write_atomic(jp, a.json.dump(1) + "\n");
  paths.push_back(jp);
  for (const auto& [stem, t] : a.tables) {
    const std::string p = (std::filesystem::path(dir) / (stem + ".csv")).string();
    write_atomic(p, lab::render_csv(t));
    paths.push_back(p);
  }
  return paths;
}

}  // namespace scalelab::analysis
