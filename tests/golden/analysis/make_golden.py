#!/usr/bin/env python3
"""Goldens for scalelab's analysis (src/analysis/): a deterministic synthetic sweep with planted
structure, and the values the reference packages compute from it.

Writes, into the directory given (default: this script's):
  sweep.json     the sweep: trials (params, repeat, status, metrics, telemetry samples); the C++
                 tests insert it into a results database through lab::ResultsStore
  scaling_sweep.json  a second sweep over ranks 1..8 with power telemetry (#2 scaling curves)
  runs.csv       the same runs as one table (parameters and outcomes, repeats averaged)
  expected.json  the data table and every analysed number, from numpy / scipy / pandas /
                 statsmodels / scikit-learn (versions in requirements.txt, recorded in the file)

Planted structure: a memory gap between the two models (opt-small +2 GiB), the engine's reserved
bytes below NVML's used bytes by a fixed 256 MiB, noise on nvidia-smi's power, a loss model with
an lr x micro-batch interaction, throughput driven by attention, fused kernels and micro-batch,
a straggler GPU (device 1 at lower utilization), a constant parameter (max_steps), a trial whose
val_loss is missing, and an OOM trial that the analysis leaves out.

The frame rules (repeats averaged, telemetry over the steady window, typing, constant columns)
and the split / fold generator follow docs/analysis.md; they are re-implemented here from that
text so that the C++ and this script agree only if both follow it.
"""
import json
import math
import os
import sys

import numpy as np
import pandas as pd
import scipy
import scipy.stats as st
import sklearn
import xgboost as xgb
import statsmodels
import statsmodels.api as sm
import statsmodels.formula.api as smf
from sklearn.metrics import f1_score, roc_auc_score
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.outliers_influence import variance_inflation_factor

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
rng = np.random.RandomState(12)

# ---------------------------------------------------------------------------------------------
# The sweep.
MODELS = ["llama-small", "opt-small"]
MBS = [1, 2, 4, 8, 16]
SEQ = [128, 256, 512]
ATTN = ["eager", "flash", "sdpa"]
LR = [1e-4, 3e-4, 1e-3]

configs, seen = [], set()
while len(configs) < 30:
    c = {"model": MODELS[rng.randint(2)], "micro_batch_size": MBS[rng.randint(5)], "seq_len": SEQ[rng.randint(3)],
         "attn": ATTN[rng.randint(3)], "fused_kernels": bool(rng.randint(2)), "lr": LR[rng.randint(3)], "max_steps": 10}
    key = json.dumps(c, sort_keys=True)
    if key not in seen:
        seen.add(key)
        configs.append(c)


def metrics_for(c):
    opt = c["model"] == "opt-small"
    mem = 1.5 + 2.0 * opt + 0.004 * c["micro_batch_size"] * c["seq_len"] / 64 * (0.5 if c["attn"] == "flash" else 1.0)
    mem += rng.normal(0, 0.02)
    speed = {"eager": 1.0, "flash": 1.6, "sdpa": 1.3}[c["attn"]] * (1.2 if c["fused_kernels"] else 1.0)
    tps = 900.0 * c["micro_batch_size"] ** 0.45 * speed * (256.0 / c["seq_len"]) ** 0.3 * (0.8 if opt else 1.0)
    tps *= math.exp(rng.normal(0, 0.05))
    llr = math.log10(c["lr"] / 1e-4)
    lmb = math.log2(c["micro_batch_size"])
    val = 3.0 + 0.4 * llr - 0.05 * lmb + 0.08 * llr * lmb + 0.1 * opt + rng.normal(0, 0.02)
    step = c["micro_batch_size"] * c["seq_len"] / tps
    return {"tokens_per_s_per_device": round(tps, 6), "tokens_per_s": round(tps, 6), "max_reserved_gib": round(mem, 6),
            "step_time_s": round(step, 9), "val_loss": round(val, 6), "flops_per_token": 295698432.0}, mem, tps


def telemetry_for(mem_gib, tps):
    out = []
    for k in range(10):
        t = round(0.5 * k, 3)
        warm = 0.5 if k == 0 else 1.0  # the first sample is before the steady window
        for dev in ("0", "1"):
            used = mem_gib * 2**30 * warm + rng.normal(0, 2**20)
            util = (92.0 if dev == "0" else 61.0) * warm + rng.normal(0, 2.0)  # device 1: the straggler
            power = 120.0 + 0.05 * tps * warm + rng.normal(0, 1.0)
            out.append([t, "nvml", dev, "mem_used_bytes", round(used, 1)])
            out.append([t, "nvml", dev, "gpu_util_pct", round(util, 3)])
            out.append([t, "nvml", dev, "power_w", round(power, 3)])
            out.append([t, "nvidia-smi", dev, "power_w", round(power + rng.normal(0, 3.0), 3)])
            if dev == "0":
                out.append([t, "engine", dev, "mem_reserved_bytes", round(used - 2**28, 1)])
    return out


trials = []
for i, c in enumerate(configs):
    reps = 2 if i % 3 == 0 else 1
    for r in range(reps):
        m, mem, tps = metrics_for(c)
        if i == 7:
            m["val_loss"] = None  # a NaN metric: missing in the analysis
        trials.append({"params": c, "repeat": r, "status": "ok", "metrics": m, "telemetry": telemetry_for(mem, tps)})
oom = dict(configs[0])
oom["micro_batch_size"] = 64
trials.append({"params": oom, "repeat": 0, "status": "oom", "metrics": {}, "telemetry": []})

with open(os.path.join(OUT, "sweep.json"), "w") as f:
    json.dump({"sweep": "golden", "trials": trials}, f, separators=(",", ":"))
    f.write("\n")

# ---------------------------------------------------------------------------------------------
# The frame (docs/analysis.md "The data table").
ok = [t for t in trials if t["status"] == "ok"]
groups, order = {}, []
for t in ok:
    key = json.dumps(t["params"], sort_keys=True)
    if key not in groups:
        groups[key] = []
        order.append(key)
    groups[key].append(t)


def tel_stats(t):
    series = {}
    for ts, src, dev, met, v in t["telemetry"]:
        series.setdefault(src + "." + met, []).append((ts, v))
    out = {}
    for key, pts in series.items():
        t0 = min(p[0] for p in pts)
        t1 = max(p[0] for p in pts)
        cut = t0 + 0.1 * (t1 - t0)
        v = np.array([p[1] for p in pts if len(pts) < 10 or p[0] >= cut])
        out["tel." + key + ".avg"] = float(np.mean(v))
        out["tel." + key + ".max"] = float(np.max(v))
        out["tel." + key + ".p95"] = float(np.percentile(v, 95))
    return out


param_keys, metric_keys, tel_keys = [], [], set()
rows = []
for key in order:
    g = groups[key]
    params = g[0]["params"]
    for k in sorted(params):
        if k not in param_keys:
            param_keys.append(k)
    mets, tels = {}, {}
    for t in g:
        for k in sorted(t["metrics"]):
            v = t["metrics"][k]
            if v is None:
                continue
            mets.setdefault(k, []).append(float(v))
            if k not in metric_keys:
                metric_keys.append(k)
        for k, v in tel_stats(t).items():
            tels.setdefault(k, []).append(v)
            tel_keys.add(k)
    rows.append((params, mets, tels, len(g)))
tel_keys = sorted(tel_keys)


def type_column(name, cells, role):
    present = [c for c in cells if c is not None]
    col = {"name": name, "role": role}
    if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in present):
        col["kind"] = "numeric"
        col["values"] = [float(c) if c is not None else float("nan") for c in cells]
        d = set(present)
        col["log2_axis"] = bool(d) and all(float(x).is_integer() and x >= 1 and (int(x) & (int(x) - 1)) == 0 for x in d) and len(d) >= 3
        return col
    text = [None if c is None else ("true" if c is True else "false" if c is False else str(c)) for c in cells]
    levels = sorted(set(x for x in text if x is not None))
    if all(isinstance(c, bool) for c in present):
        levels = ["false", "true"]
    col["kind"] = "binary" if (all(isinstance(c, bool) for c in present) or len(levels) == 2) else "categorical"
    col["levels"] = levels
    col["text"] = text
    col["log2_axis"] = False
    if col["kind"] == "binary":
        col["values"] = [float("nan") if x is None else (1.0 if x == levels[1] else 0.0) for x in text]
    return col


columns = []
for k in param_keys:
    columns.append(type_column(k, [r[0].get(k) for r in rows], "parameter"))
for k in metric_keys:
    columns.append(type_column(k, [float(np.mean(r[1][k])) if k in r[1] else None for r in rows], "outcome"))
for k in tel_keys:
    columns.append(type_column(k, [float(np.mean(r[2][k])) if k in r[2] else None for r in rows], "telemetry"))
dropped = []
kept = []
for c in columns:
    vals = c["text"] if c["kind"] != "numeric" else [v for v in c["values"] if not math.isnan(v)]
    d = set(v for v in vals if v is not None)
    (dropped if len(d) <= 1 else kept).append(c)
dropped = [c["name"] for c in dropped]
columns = kept
n = len(rows)
col = {c["name"]: c for c in columns}

# CSV of the runs (parameters and outcomes; the constant max_steps stays in, as a user's CSV would).
csv_cols = param_keys + metric_keys
with open(os.path.join(OUT, "runs.csv"), "w") as f:
    f.write(",".join(csv_cols) + "\n")
    for params, mets, _, _ in rows:
        cells = []
        for k in param_keys:
            v = params[k]
            cells.append("true" if v is True else "false" if v is False else repr(v) if isinstance(v, float) else str(v))
        for k in metric_keys:
            cells.append(repr(float(np.mean(mets[k]))) if k in mets else "")
        f.write(",".join(cells) + "\n")

# ---------------------------------------------------------------------------------------------
# Analyses.
def splitmix_shuffle(n, seed):
    M = (1 << 64) - 1
    state = seed

    def nxt():
        nonlocal state
        state = (state + 0x9E3779B97F4A7C15) & M
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)

    idx = list(range(n))
    for i in range(n, 1, -1):
        j = nxt() % i
        idx[i - 1], idx[j] = idx[j], idx[i - 1]
    return idx


def splitmix_draws(seed, count):
    """count raw splitmix64 outputs from state `seed` (docs/analysis.md)."""
    M = (1 << 64) - 1
    state = seed
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & M
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        out.append(z ^ (z >> 31))
    return out


def bootstrap_rows(n, b, seed=0):
    """Resample b (0-based) of n rows: n draws of the generator at state 1000003 (seed + 1) + b, row = draw mod n."""
    return [d % n for d in splitmix_draws(1000003 * (seed + 1) + b, n)]


def describe(v):
    v = np.asarray(v, dtype=float)
    x = v[~np.isnan(v)]
    s = pd.Series(x)
    out = {"n": int(len(x)), "missing": int(np.isnan(v).sum()), "mean": float(np.mean(x)), "std0": float(np.std(x, ddof=0)),
           "std1": float(np.std(x, ddof=1)), "min": float(np.min(x)), "q25": float(np.percentile(x, 25)),
           "median": float(np.median(x)), "q75": float(np.percentile(x, 75)), "max": float(np.max(x))}
    if np.std(x) > 0:
        out["skew_g1"] = float(st.skew(x, bias=True))
        out["kurt_g2"] = float(st.kurtosis(x, bias=True, fisher=True))
        out["skew_G1"] = float(s.skew())
        out["kurt_G2"] = float(s.kurt())
    return out


num_cols = [c for c in columns if c["kind"] != "categorical"]
split = [0] * n
idx = splitmix_shuffle(n, 0)
for k in range(int(math.floor(0.75 * n + 0.5))):
    split[idx[k]] = 1
descriptive = {}
for c in num_cols:
    v = np.array(c["values"])
    descriptive[c["name"]] = {"all": describe(v),
                              "train": describe(v[np.array(split) == 1]),
                              "test": describe(v[np.array(split) == 0])}

# Association variables.
assoc = []
for c in columns:
    if c["kind"] != "categorical":
        assoc.append((c["name"], c["name"], c["kind"], np.array(c["values"])))
    else:
        for lv in c["levels"]:
            assoc.append((c["name"] + "=" + lv, c["name"], "binary",
                          np.array([float("nan") if x is None else (1.0 if x == lv else 0.0) for x in c["text"]])))


def complete(a, b):
    m = ~np.isnan(a) & ~np.isnan(b)
    return a[m], b[m]


corr = {"variables": [a[0] for a in assoc], "pearson_r": [], "pearson_p": [], "spearman_rho": [], "spearman_p": []}
for _, _, _, a in assoc:
    rr, rp, sr, sp = [], [], [], []
    for _, _, _, b in assoc:
        x, y = complete(a, b)
        pr = st.pearsonr(x, y)
        sr_ = st.spearmanr(x, y)
        rr.append(float(pr.statistic)); rp.append(float(pr.pvalue))
        sr.append(float(sr_.statistic)); sp.append(float(sr_.pvalue))
    corr["pearson_r"].append(rr); corr["pearson_p"].append(rp)
    corr["spearman_rho"].append(sr); corr["spearman_p"].append(sp)

pairs = []
for i in range(len(assoc)):
    for j in range(i + 1, len(assoc)):
        na, ca, ka, a = assoc[i]
        nb, cb, kb, b = assoc[j]
        if ka != "numeric" and kb != "numeric":
            continue
        if ka != "numeric":
            na, ca, ka, a, nb, cb, kb, b = nb, cb, kb, b, na, ca, ka, a
        x, y = complete(a, b)
        r, p = st.pearsonr(x, y)
        row = {"a": na, "b": nb, "n": int(len(x)), "r": float(r), "p": float(p), "effect": abs(float(r))}
        if kb == "numeric":
            row["kind"] = "numeric-numeric"
            row["rho"] = float(st.spearmanr(x, y).statistic)
        else:
            row["kind"] = "numeric-binary"
            row["eta2"] = float(r) ** 2
            yi = y.astype(int)
            best = 0.0
            for t in np.unique(x):
                best = max(best, f1_score(yi, (x >= t).astype(int), zero_division=0), f1_score(yi, (x <= t).astype(int), zero_division=0))
            row["f1"] = float(best)
            row["auc"] = float(roc_auc_score(yi, x))
        pairs.append(row)
cats = [c for c in columns if c["kind"] != "numeric"]
for i in range(len(cats)):
    for j in range(i + 1, len(cats)):
        a, b = cats[i], cats[j]
        m = [k for k in range(n) if a["text"][k] is not None and b["text"][k] is not None]
        tab = pd.crosstab(pd.Series([a["text"][k] for k in m]), pd.Series([b["text"][k] for k in m]))
        chi2, p, dof, _ = st.chi2_contingency(tab.values, correction=False)
        v = math.sqrt(chi2 / (len(m) * (min(tab.shape) - 1)))
        pairs.append({"a": a["name"], "b": b["name"], "kind": "categorical-categorical", "n": len(m), "chi2": float(chi2),
                      "cramers_v": v, "p": float(p), "effect": min(1.0, v)})
q = multipletests([p["p"] for p in pairs], method="fdr_bh")[1]
for p, qq in zip(pairs, q):
    p["q"] = float(qq)

# Regression design: numeric, binary, k-1 indicators (first level dropped).
targets = ["val_loss", "tokens_per_s_per_device"]
features = [c["name"] for c in columns if c["role"] == "parameter"]
design = []
for name in features:
    c = col[name]
    if c["kind"] != "categorical":
        design.append((name, np.array(c["values"])))
    else:
        for lv in c["levels"][1:]:
            design.append((name + "=" + lv, np.array([float("nan") if x is None else (1.0 if x == lv else 0.0) for x in c["text"]])))


def fit_ols(y, rows_mask=None):
    X = np.column_stack([d[1] for d in design])
    m = ~np.isnan(y) & ~np.isnan(X).any(axis=1)
    if rows_mask is not None:
        m &= rows_mask
    Xc = sm.add_constant(X[m], has_constant="add")
    return sm.OLS(y[m], Xc).fit(), Xc, m


ols_out = {}
for tname in targets:
    y = np.array(col[tname]["values"])
    res, Xc, m = fit_ols(y)
    names = ["const"] + [d[0] for d in design]
    ci = res.conf_int(0.05)
    terms = []
    sdy = np.std(y[m], ddof=1)
    for k, name in enumerate(names):
        t = {"name": name, "coef": float(res.params[k]), "se": float(res.bse[k]), "t": float(res.tvalues[k]), "p": float(res.pvalues[k]),
             "ci_low": float(ci[k, 0]), "ci_high": float(ci[k, 1])}
        if k > 0:
            t["vif"] = float(variance_inflation_factor(Xc, k))
            t["std_beta"] = float(res.params[k] * np.std(Xc[:, k], ddof=1) / sdy)
        terms.append(t)
    # Cross-validated R^2, 5 folds from the same generator: fold of the row at position q is q % 5.
    pos = splitmix_shuffle(n, 0)
    fold = np.zeros(n, dtype=int)
    for qpos, row in enumerate(pos):
        fold[row] = qpos % 5
    pred = np.full(n, np.nan)
    X = np.column_stack([d[1] for d in design])
    for k in range(5):
        rk, _, _ = fit_ols(y, fold != k)
        sel = (fold == k) & ~np.isnan(X).any(axis=1)
        pred[sel] = rk.predict(sm.add_constant(X[sel], has_constant="add"))
    mm = ~np.isnan(pred) & ~np.isnan(y)
    ss = np.sum((y[mm] - pred[mm]) ** 2)
    sst = np.sum((y[mm] - np.mean(y[mm])) ** 2)
    ols_out[tname] = {"n": int(m.sum()), "p": len(names), "df_resid": float(res.df_resid), "r2": float(res.rsquared),
                      "adj_r2": float(res.rsquared_adj), "f": float(res.fvalue), "f_p": float(res.f_pvalue), "terms": terms,
                      "cv": {"folds": 5, "r2": float(1 - ss / sst), "rmse": float(np.sqrt(ss / mm.sum()))}}

fits = {}
for tname in targets:
    y = np.array(col[tname]["values"])
    out = []
    for name, x in design:
        xx, yy = complete(x, y)
        lr = st.linregress(xx, yy)
        tq = st.t.ppf(0.975, len(xx) - 2)
        out.append({"x": name, "n": int(len(xx)), "slope": float(lr.slope), "intercept": float(lr.intercept), "r": float(lr.rvalue),
                    "r2": float(lr.rvalue ** 2), "p": float(lr.pvalue), "slope_se": float(lr.stderr),
                    "intercept_se": float(lr.intercept_stderr), "slope_ci_low": float(lr.slope - tq * lr.stderr),
                    "slope_ci_high": float(lr.slope + tq * lr.stderr)})
    fits[tname] = out

dists = {}
for c in columns:
    if c["kind"] != "numeric":
        continue
    v = np.array(c["values"])
    v = v[~np.isnan(v)]
    counts, edges = np.histogram(v, bins=20)
    xs = np.unique(v)
    f = [float(np.sum(v <= x) / len(v)) for x in xs]
    dists[c["name"]] = {"edges": [float(e) for e in edges], "counts": [int(k) for k in counts], "ecdf_x": [float(x) for x in xs], "ecdf_f": f}

def grouped_histogram(df):
    """#6: 20 bins over all the values (numpy.histogram), each level counted on those common edges;
    the exact ECDF per level; Tukey's whiskers (the most extreme values within 1.5 IQR of the
    quartiles, numpy's linear quartiles) and the values outside them."""
    _, edges = np.histogram(df.y.values, bins=20)
    out = {"edges": [float(e) for e in edges], "levels": []}
    for lv in sorted(df.g.unique()):
        v = df.y[df.g == lv].values
        counts, _ = np.histogram(v, bins=edges)
        xs = np.unique(v)
        q1, q3 = np.percentile(v, 25), np.percentile(v, 75)
        lo, hi = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
        inside = v[(v >= lo) & (v <= hi)]
        out["levels"].append({"level": lv, "counts": [int(k) for k in counts], "ecdf_x": [float(x) for x in xs],
                              "ecdf_f": [float(np.sum(v <= x) / len(v)) for x in xs],
                              "whisker_low": float(np.min(inside)), "whisker_high": float(np.max(inside)),
                              "outliers": [float(x) for x in sorted(v[(v < lo) | (v > hi)])]})
    return out


groups_out = []
for name in features:
    c = col[name]
    if c["kind"] == "numeric":
        continue
    for tname in targets:
        y = np.array(col[tname]["values"])
        m = [k for k in range(n) if c["text"][k] is not None and not math.isnan(y[k])]
        df = pd.DataFrame({"g": [c["text"][k] for k in m], "y": y[m]})
        a = sm.stats.anova_lm(smf.ols("y ~ C(g)", data=df).fit(), typ=1)
        ssb = float(a["sum_sq"].iloc[0])
        sst = float(a["sum_sq"].sum())
        kw = st.kruskal(*[df.y[df.g == lv].values for lv in sorted(df.g.unique())])
        groups_out.append({"group": name, "value": tname, "n": len(m), "k": int(df.g.nunique()), "eta2": ssb / sst,
                           "f": float(a["F"].iloc[0]), "f_p": float(a["PR(>F)"].iloc[0]), "kruskal_h": float(kw.statistic),
                           "kruskal_p": float(kw.pvalue),
                           "box": [{"min": float(np.min(v)), "q25": float(np.percentile(v, 25)), "median": float(np.median(v)),
                                    "q75": float(np.percentile(v, 75)), "max": float(np.max(v))}
                                   for v in [df.y[df.g == lv].values for lv in sorted(df.g.unique())]],
                           "grouped": grouped_histogram(df)})


def shap_details(bst, dall, contrib, shap_mean_abs, Xd):
    """#12: the SHAP interaction values (pred_interactions, rows x (p+1) x (p+1)): mean |phi_jk| per
    pair of features (the diagonal is the main effect), the largest additivity error
    |sum_k phi_jk - contribution_j| over rows and j (each row of the interactions sums to its
    contribution); dependence data for the top features by mean |contribution| (at most 5, those
    above 0, ties in feature order): each row's (value, contribution) and the feature it interacts
    with most (largest mean |phi_jk|, k != j, the first on ties)."""
    inter = bst.predict(dall, pred_interactions=True).astype(np.float64)
    p = len(shap_mean_abs)
    matrix = [[float(np.mean(np.abs(inter[:, j, k]))) for k in range(p)] for j in range(p)]
    add = float(np.max(np.abs(inter.sum(axis=2) - contrib)))
    assert add < 1e-3, add
    order = sorted([k for k in range(p) if shap_mean_abs[k] > 0], key=lambda k: (-shap_mean_abs[k], k))[:5]
    dep = []
    for j in order:
        others = [k for k in range(p) if k != j]
        color = max(others, key=lambda k: (matrix[j][k], -k)) if others else None
        dep.append({"feature": j, "x": [None if math.isnan(v) else float(v) for v in Xd[:, j]], "shap": [float(v) for v in contrib[:, j]],
                    "color_by": color})
    return {"interaction_mean_abs": matrix, "interaction_additivity_max_abs_error": add, "dependence": dep}


BOOTSTRAP = 20  # resamples for the stability goldens (the CLI's default is larger; the math is the same)

# Tree models (#11) with xgboost, the parameters of src/analysis/trees.h.
COMMON = {"objective": "reg:squarederror", "tree_method": "exact", "seed": "0", "nthread": "1", "verbosity": "0"}
MODELS = [("random_forest", dict(COMMON, num_parallel_tree="64", subsample="0.8", colsample_bynode="0.8", learning_rate="1", max_depth="6"), 1),
          ("gradient_boosting", dict(COMMON, learning_rate="0.1", max_depth="3"), 100)]
trees_out = []
names = [d[0] for d in design]
for tname in targets:
    yfull = np.array(col[tname]["values"])
    rows_t = [i for i in range(n) if not math.isnan(yfull[i])]
    X_design = np.column_stack([d[1] for d in design])[rows_t]  # float64, the values as reported
    X = X_design.astype(np.float32)
    y = yfull[rows_t]
    nt = len(rows_t)

    def seq_mean(v):
        acc = 0.0
        for x in v:
            acc += float(x)
        return acc / len(v)

    def train(sel, params, rounds):
        p = dict(params, base_score="%.17g" % seq_mean(y[sel]))
        d = xgb.DMatrix(X[sel], label=y[sel], feature_names=names, missing=np.nan)
        return xgb.train(p, d, num_boost_round=rounds)

    def importances_of(bst):
        out = {}
        for kind in ("gain", "weight", "cover"):
            sc = bst.get_score(importance_type=kind)
            v = [float(sc.get(nm, 0.0)) for nm in names]
            mx = max(v)
            out[kind] = [100.0 * x / mx for x in v] if mx > 0 else v
        c = bst.predict(xgb.DMatrix(X, feature_names=names, missing=np.nan), pred_contribs=True).astype(np.float64)
        out["shap_mean_abs"] = [float(np.mean(np.abs(c[:, k]))) for k in range(len(names))]
        return out

    def importance_stability(params, rounds):
        """#12: B bootstrap resamples of the rows (bootstrap_rows), the model refitted on each; per
        importance the mean, sd (ddof 1) and the 2.5 / 97.5 percentiles (numpy linear) per feature;
        ranks (1 = most important, ties averaged: scipy rankdata of -x) with their mean, percentiles
        and the share of resamples in the top 3; Spearman's rho between each resample's importances and
        the all-rows model's (mean over the resamples where it is defined) and the share of resamples
        whose top feature (first maximum) is the all-rows model's."""
        full = importances_of(train(list(range(nt)), params, rounds))
        per = [importances_of(train(bootstrap_rows(nt, b), params, rounds)) for b in range(BOOTSTRAP)]
        out = {"resamples": BOOTSTRAP}
        for kind in ("gain", "weight", "cover", "shap_mean_abs"):
            V = np.array([r[kind] for r in per])
            R = np.array([st.rankdata(-v, method="average") for v in V])
            rhos = []
            for v in V:
                if np.ptp(v) > 0 and np.ptp(full[kind]) > 0:
                    rhos.append(float(st.spearmanr(v, full[kind]).statistic))
            top = int(np.argmax(full[kind]))
            out[kind] = {"mean": [float(x) for x in V.mean(axis=0)], "sd": [float(x) for x in V.std(axis=0, ddof=1)],
                         "low": [float(np.percentile(V[:, k], 2.5)) for k in range(len(names))],
                         "high": [float(np.percentile(V[:, k], 97.5)) for k in range(len(names))],
                         "mean_rank": [float(x) for x in R.mean(axis=0)],
                         "rank_low": [float(np.percentile(R[:, k], 2.5)) for k in range(len(names))],
                         "rank_high": [float(np.percentile(R[:, k], 97.5)) for k in range(len(names))],
                         "top3_share": [float(np.mean(R[:, k] <= 3)) for k in range(len(names))],
                         "spearman_mean": float(np.mean(rhos)) if rhos else None, "spearman_n": len(rhos),
                         "top1_share": float(np.mean([int(np.argmax(v)) == top for v in V]))}
        return out

    for mname, params, rounds in MODELS:
        allr = list(range(nt))
        b = train(allr, params, rounds)
        imp = {}
        for kind in ("gain", "weight", "cover"):
            sc = b.get_score(importance_type=kind)
            v = [float(sc.get(nm, 0.0)) for nm in names]
            mx = max(v)
            imp[kind] = [100.0 * x / mx for x in v] if mx > 0 else v
        dall = xgb.DMatrix(X, feature_names=names, missing=np.nan)
        contrib = b.predict(dall, pred_contribs=True).astype(np.float64)
        shap_mean_abs = [float(np.mean(np.abs(contrib[:, k]))) for k in range(len(names))]
        shap_extra = shap_details(b, dall, contrib, shap_mean_abs, X_design)
        stability = importance_stability(params, rounds)
        pos = splitmix_shuffle(nt, 0)
        fold = [0] * nt
        for qpos, row in enumerate(pos):
            fold[row] = qpos % 5
        pred = np.zeros(nt)
        perm = [[] for _ in names]
        for k in range(5):
            tr = [i for i in range(nt) if fold[i] != k]
            te = [i for i in range(nt) if fold[i] == k]
            bk = train(tr, params, rounds)
            xte = X[te]
            pk = bk.predict(xgb.DMatrix(xte, feature_names=names, missing=np.nan)).astype(np.float64)
            pred[te] = pk
            base = float(np.mean((y[te] - pk) ** 2))
            for c in range(len(names)):
                pidx = splitmix_shuffle(len(te), 1 + c)
                xp = xte.copy()
                xp[:, c] = xte[pidx, c]
                pp = bk.predict(xgb.DMatrix(xp, feature_names=names, missing=np.nan)).astype(np.float64)
                perm[c].append(float(np.mean((y[te] - pp) ** 2)) - base)
        ss = float(np.sum((y - pred) ** 2))
        st_ = float(np.sum((y - np.mean(y)) ** 2))
        trees_out.append({"model": mname, "target": tname, "n": nt, "cv_r2": 1 - ss / st_, "cv_rmse": math.sqrt(ss / nt),
                          "gain": imp["gain"], "weight": imp["weight"], "cover": imp["cover"],
                          "permutation_mean": [float(np.mean(v)) for v in perm],
                          "permutation_sd": [float(np.std(v, ddof=1)) for v in perm], "shap_mean_abs": shap_mean_abs,
                          **shap_extra, "stability": stability})

# Pareto front (#12) of tokens/s (up) against validation loss (down).
xs = np.array(col["tokens_per_s_per_device"]["values"])
ys = np.array(col["val_loss"]["values"])
pareto = []
for i in range(n):
    if math.isnan(xs[i]) or math.isnan(ys[i]):
        continue
    dom = any(k != i and not math.isnan(xs[k]) and not math.isnan(ys[k]) and xs[k] >= xs[i] and ys[k] <= ys[i] and (xs[k] > xs[i] or ys[k] < ys[i])
              for k in range(n))
    pareto.append(not dom)

# Telemetry per trial x device (#1): the imbalance over nvml.gpu_util_pct, steady window as above.
imbalance = []
for t in ok:
    util = {}
    for ts, src, dev, met, v in t["telemetry"]:
        if src == "nvml" and met == "gpu_util_pct":
            util.setdefault(dev, []).append((ts, v))
    devs = sorted(util)
    means, idles = [], []
    for dev in devs:
        pts = util[dev]
        t0 = min(p[0] for p in pts)
        t1 = max(p[0] for p in pts)
        v = np.array([p[1] for p in pts if len(pts) < 10 or p[0] >= t0 + 0.1 * (t1 - t0)])
        means.append(float(np.mean(v)))
        idles.append(float(np.mean(v < 5.0)))
    med = float(np.median(means))
    for dev, m, idle in zip(devs, means, idles):
        imbalance.append({"device": dev, "mean_util_pct": m, "idle_fraction": idle, "ratio_to_median": m / med,
                          "idle": idle >= 0.25, "straggler": len(devs) >= 2 and m < 0.8 * med})


# Agreement of sources (#7): samples of a and b share their timestamps here, so pairs are equal times.
def agree(a, b):
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    d = b - a
    lr = st.linregress(a, b)
    ccc = 2 * np.mean((a - a.mean()) * (b - b.mean())) / (np.var(a) + np.var(b) + (a.mean() - b.mean()) ** 2)
    sd = float(np.std(d, ddof=1))
    return {"n": int(len(a)), "slope": float(lr.slope), "intercept": float(lr.intercept), "r": float(lr.rvalue),
            "r2": float(lr.rvalue ** 2), "bias": float(d.mean()), "sd": sd, "lower": float(d.mean() - 1.96 * sd),
            "upper": float(d.mean() + 1.96 * sd), "ccc": float(ccc)}


agreement = []
for qty, sa, ma, sb, mb in [("memory used", "nvml", "mem_used_bytes", "nvidia-smi", "mem_used_bytes"),
                            ("memory used", "nvml", "mem_used_bytes", "engine", "mem_reserved_bytes"),
                            ("power", "nvml", "power_w", "nvidia-smi", "power_w"),
                            ("GPU utilization", "nvml", "gpu_util_pct", "nvidia-smi", "gpu_util_pct"),
                            ("temperature", "nvml", "temperature_c", "nvidia-smi", "temperature_c")]:
    A, B, TA, TB = [], [], [], []
    for t in ok:
        ser = {}
        for ts, src, dev, met, v in t["telemetry"]:
            ser.setdefault((src, dev, met), {})[ts] = v
        for dev in sorted({k[1] for k in ser}):
            if (sa, dev, ma) not in ser or (sb, dev, mb) not in ser:
                continue
            pa, pb = ser[(sa, dev, ma)], ser[(sb, dev, mb)]
            times = sorted(set(pa) & set(pb))
            A += [pa[x] for x in times]
            B += [pb[x] for x in times]
            TA.append(float(np.mean([pa[x] for x in times])))
            TB.append(float(np.mean([pb[x] for x in times])))
    if A:
        agreement.append({"quantity": qty, "a": sa + "." + ma, "b": sb + "." + mb, "per_sample": agree(A, B), "per_trial": agree(TA, TB)})


# ---------------------------------------------------------------------------------------------
# #2 scaling curves: a second sweep, "golden-scaling": two models x micro-batch x sequence length at
# 1, 2, 4, 8 ranks, efficiency that falls with the rank count and less so for larger micro-batches
# (communication amortized), NVML power per device over time (first sample before the steady
# window, uneven sample times so that the integral is not a plain mean) and nvidia-smi's too (the
# analysis prefers NVML). Written to scaling_sweep.json; the expected values to "scaling_curves".
PRICE = 2.5  # per GPU-hour, as the test passes --price-per-gpu-hour
srng = np.random.RandomState(7)
s_trials, s_configs = [], []
for model in ["llama-small", "opt-small"]:
    for mb in [1, 2, 4]:
        for seq in [128, 256]:
            for ranks in [1, 2, 4, 8]:
                s_configs.append({"model": model, "micro_batch_size": mb, "seq_len": seq, "ranks": ranks})
for i, c in enumerate(s_configs):
    for r in range(2 if i % 5 == 0 else 1):
        n_dev = c["ranks"]
        base = 1000.0 * c["micro_batch_size"] ** 0.6 * (256.0 / c["seq_len"]) ** 0.2 * (0.85 if c["model"] == "opt-small" else 1.0)
        eff = 1.0 / (1.0 + (0.06 / c["micro_batch_size"] ** 0.5) * (n_dev - 1))
        total = base * n_dev * eff * math.exp(srng.normal(0, 0.01))
        tel = []
        for k in range(10):
            t = round(0.5 * k + (0.13 if k % 3 == 1 else 0.0), 3)
            warm = 0.5 if k == 0 else 1.0
            for d in range(n_dev):
                pw = (150.0 + 0.02 * total / n_dev) * warm + srng.normal(0, 2.0)
                tel.append([t, "nvml", str(d), "power_w", round(pw, 3)])
                tel.append([t, "nvidia-smi", str(d), "power_w", round(pw + 5.0, 3)])
        s_trials.append({"params": c, "repeat": r, "status": "ok",
                         "metrics": {"tokens_per_s": round(total, 6), "tokens_per_s_per_device": round(total / n_dev, 6)},
                         "telemetry": tel})
with open(os.path.join(OUT, "scaling_sweep.json"), "w") as f:
    json.dump({"sweep": "golden-scaling", "trials": s_trials}, f, separators=(",", ":"))
    f.write("\n")


def j_per_token(trial):
    """Energy per token of one trial: per device, the trapezoid integral of NVML power over the
    steady samples (t >= t0 + 0.1 (t1 - t0) of that device's series) divided by their time span is
    its mean power; the devices' mean powers summed, divided by the trial's total tokens/s."""
    series = {}
    for ts, src, dev, met, v in trial["telemetry"]:
        if src == "nvml" and met == "power_w":
            series.setdefault(dev, []).append((ts, v))
    total_w = 0.0
    for dev, pts in series.items():
        pts.sort()
        t0, t1 = pts[0][0], pts[-1][0]
        sp = [p for p in pts if len(pts) < 10 or p[0] >= t0 + 0.1 * (t1 - t0)]
        tt = np.array([p[0] for p in sp])
        vv = np.array([p[1] for p in sp])
        total_w += float(np.trapz(vv, tt)) / float(tt[-1] - tt[0])
    return total_w / trial["metrics"]["tokens_per_s"]


s_rows = {}
for t in s_trials:
    key = json.dumps(t["params"], sort_keys=True)
    e = s_rows.setdefault(key, {"params": t["params"], "tps": [], "jpt": []})
    e["tps"].append(t["metrics"]["tokens_per_s"])
    e["jpt"].append(j_per_token(t))
curve_rows = []
for key, e in s_rows.items():
    c = e["params"]
    T = float(np.mean(e["tps"]))
    b = [x for x in s_rows.values() if all(x["params"][k] == c[k] for k in c if k != "ranks")]
    bmin = min(b, key=lambda x: x["params"]["ranks"])
    S = T / float(np.mean(bmin["tps"]))
    pr = c["ranks"] / bmin["params"]["ranks"]
    curve_rows.append({"model": c["model"], "micro_batch_size": c["micro_batch_size"], "seq_len": c["seq_len"], "devices": c["ranks"],
                       "tokens_per_s": T, "speedup": S, "efficiency_pct": 100.0 * S / pr,
                       "karp_flatt": (1 / S - 1 / pr) / (1 - 1 / pr) if pr > 1 else None,
                       "cost_per_million_tokens": PRICE * c["ranks"] / (3600.0 * T) * 1e6,
                       "j_per_token": float(np.mean(e["jpt"]))})
summary = []
for model in ["llama-small", "opt-small"]:
    for n_dev in [1, 2, 4, 8]:
        rr = [r for r in curve_rows if r["model"] == model and r["devices"] == n_dev]
        eff = np.array([r["efficiency_pct"] for r in rr])
        kf = [r["karp_flatt"] for r in rr if r["karp_flatt"] is not None]
        summary.append({"model": model, "devices": n_dev, "n": len(rr),
                        "efficiency_min": float(np.min(eff)), "efficiency_q25": float(np.percentile(eff, 25)),
                        "efficiency_median": float(np.median(eff)), "efficiency_q75": float(np.percentile(eff, 75)),
                        "efficiency_max": float(np.max(eff)),
                        "speedup_median": float(np.median([r["speedup"] for r in rr])),
                        "karp_flatt_median": float(np.median(kf)) if kf else None,
                        "cost_per_million_tokens_median": float(np.median([r["cost_per_million_tokens"] for r in rr])),
                        "j_per_token_median": float(np.median([r["j_per_token"] for r in rr]))})
scaling_curves = {"price_per_gpu_hour": PRICE, "rows": curve_rows, "summary": summary}


def clean(o):
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else o
    if isinstance(o, dict):
        return {k: clean(v) for k, v in o.items()}
    if isinstance(o, list):
        return [clean(v) for v in o]
    return o


frame = {"rows": n, "dropped_constant": dropped, "repeats": [r[3] for r in rows],
         "columns": [{"name": c["name"], "kind": c["kind"], "role": c["role"], "log2_axis": c["log2_axis"],
                      "levels": c.get("levels", []),
                      "values": c["values"] if c["kind"] == "numeric" else c["text"]} for c in columns]}
expected = {"versions": {"numpy": np.__version__, "pandas": pd.__version__, "scipy": scipy.__version__,
                         "statsmodels": statsmodels.__version__, "scikit-learn": sklearn.__version__,
                         "xgboost": xgb.__version__},
            "targets": targets, "features": features, "split_train": split,
            "frame": frame, "descriptive": descriptive, "correlation": corr, "pairs": pairs, "ols": ols_out, "fits": fits,
            "distributions": dists, "groups": groups_out, "imbalance": imbalance, "trees": trees_out, "agreement": agreement, "pareto_front": pareto,
            "scaling_curves": scaling_curves}
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(clean(expected), f, indent=None, separators=(",", ":"))
    f.write("\n")
print(f"analysis goldens: {n} rows, {len(columns)} columns ({len(dropped)} constant dropped), {len(pairs)} pairs -> {OUT}")
