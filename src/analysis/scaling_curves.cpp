#include "analysis/scaling_curves.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "analysis/descriptive.h"

namespace scalelab::analysis {
namespace {

using lab::CellFormat;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }

std::string fmt(double v, int sig = 3) {
  if (!std::isfinite(v)) return "—";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", sig, v);
  return buf;
}

double value_at(const Frame& f, const char* name, std::size_t i) {
  const Column* c = f.find(name);
  return c && c->kind == ColumnKind::kNumeric ? c->values[i] : kNaN;
}

double median_of(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return quantile_sorted(v, 0.5);
}

}  // namespace

std::optional<double> trial_j_per_token(const std::vector<lab::TelemetrySample>& samples, double tokens_per_s, std::string* why) {
  auto fail = [&](const std::string& m) -> std::optional<double> {
    if (why) *why = m;
    return std::nullopt;
  };
  if (!(tokens_per_s > 0) || !std::isfinite(tokens_per_s)) return fail("no positive tokens/s");
  std::string source;
  for (const char* s : {"nvml", "nvidia-smi"})
    for (const auto& x : samples)
      if (source.empty() && x.source == s && x.metric == "power_w") source = s;
  if (source.empty()) return fail("no power samples (nvml or nvidia-smi power_w)");
  std::map<std::string, std::vector<std::pair<double, double>>> by_device;
  for (const auto& x : samples)
    if (x.source == source && x.metric == "power_w" && std::isfinite(x.value)) by_device[x.device].push_back({x.t_s, x.value});
  double total_w = 0;
  for (auto& [dev, pts] : by_device) {
    std::sort(pts.begin(), pts.end());
    const double t0 = pts.front().first, t1 = pts.back().first, cut = t0 + 0.1 * (t1 - t0);
    std::vector<std::pair<double, double>> steady;
    for (const auto& p : pts)
      if (pts.size() < 10 || p.first >= cut) steady.push_back(p);
    if (steady.size() < 2 || !(steady.back().first > steady.front().first))
      return fail("device " + dev + " has fewer than 2 steady power samples");
    double integral = 0;  // trapezoid rule, J
    for (std::size_t k = 0; k + 1 < steady.size(); ++k)
      integral += (steady[k + 1].first - steady[k].first) * (steady[k + 1].second + steady[k].second) / 2.0;
    total_w += integral / (steady.back().first - steady.front().first);
  }
  return total_w / tokens_per_s;
}

void add_scaling_curves(Analysis& a, const Frame& f, const ScalingCurveInputs& in) {
  const Column* speedup = f.find("speedup");
  const Column* ranks = f.find("ranks");
  if (!speedup || !ranks) return;
  const Column* eff = f.find("efficiency_pct");
  const Column* kf = f.find("karp_flatt");
  const Column* model = f.find("model");
  const std::set<std::string> axis_params = {"ranks", "model", "micro_batch_size", "seq_len"};
  Json problems = a.json.contains("problems") ? a.json["problems"] : Json::array();
  std::vector<std::string> not_computed;
  auto note = [&](const std::string& m) { problems.push_back(m); not_computed.push_back(m); };

  lab::Table rt, stt;
  rt.columns = {{"model", "model"}, {"devices", "devices", CellFormat::kInt}, {"micro_batch_size", "micro-batch", CellFormat::kSig4},
                {"seq_len", "seq len", CellFormat::kSig4}, {"global_batch", "global batch", CellFormat::kSig4}, {"other", "other parameters"},
                {"tokens_per_s", "tokens/s", CellFormat::kFixed1}, {"speedup", "speedup", CellFormat::kRatio},
                {"efficiency_pct", "efficiency %", CellFormat::kFixed1}, {"karp_flatt", "Karp–Flatt", CellFormat::kFixed4},
                {"cost_per_million_tokens", "cost / 1M tokens", CellFormat::kSig4}, {"j_per_token", "J/token", CellFormat::kSig4}};
  struct Row { std::string model; int devices; double eff, speedup, kf, cost, jpt; };
  std::vector<Row> rows;
  const Column* tps = f.find("tokens_per_s");
  for (std::size_t i = 0; i < f.rows(); ++i) {
    if (std::isnan(speedup->values[i]) || std::isnan(ranks->values[i])) continue;
    Row r;
    r.model = model && !model->text.empty() && !model->text[i].empty() ? model->text[i] : "all";
    r.devices = static_cast<int>(ranks->values[i]);
    r.speedup = speedup->values[i];
    r.eff = eff ? eff->values[i] : kNaN;
    r.kf = kf ? kf->values[i] : kNaN;
    const double t = tps ? tps->values[i] : kNaN;
    r.cost = in.price_per_gpu_hour && t > 0 ? *in.price_per_gpu_hour * ranks->values[i] / (3600.0 * t) * 1e6 : kNaN;
    r.jpt = i < in.j_per_token.size() ? in.j_per_token[i] : kNaN;
    const double mb = value_at(f, "micro_batch_size", i);
    double gas = value_at(f, "grad_accum_steps", i);
    if (std::isnan(gas)) gas = in.grad_accum_steps;
    std::string other;
    for (const auto& c : f.columns) {
      if (c.role != ColumnRole::kParameter || axis_params.count(c.name)) continue;
      std::string v = c.kind == ColumnKind::kNumeric ? fmt(c.values[i], 6) : c.text[i];
      other += (other.empty() ? "" : " ") + c.name + "=" + v;
    }
    const std::string series = std::to_string(r.devices) + (r.devices == 1 ? " device" : " devices") + (other.empty() ? "" : " " + other);
    rt.rows.push_back({{"row", f.row_labels[i]}, {"model", r.model}, {"devices", r.devices}, {"micro_batch_size", num(mb)},
                       {"seq_len", num(value_at(f, "seq_len", i))}, {"global_batch", num(mb * ranks->values[i] * gas)},
                       {"other", other}, {"series", series}, {"tokens_per_s", num(t)}, {"speedup", num(r.speedup)},
                       {"efficiency_pct", num(r.eff)}, {"karp_flatt", num(r.kf)}, {"cost_per_million_tokens", num(r.cost)},
                       {"j_per_token", num(r.jpt)}});
    rows.push_back(r);
  }
  if (rows.empty()) return;
  // Sorted for reading: facet, series, then the x axes.
  std::stable_sort(rt.rows.begin(), rt.rows.end(), [](const Json& x, const Json& y) {
    auto key = [](const Json& r) {
      auto d = [&](const char* k) { return r[k].is_null() ? -1.0 : r[k].get<double>(); };
      return std::make_tuple(r["model"].get<std::string>(), r["other"].get<std::string>(), d("devices"), d("micro_batch_size"), d("seq_len"));
    };
    return key(x) < key(y);
  });

  // Summary per model x device count.
  stt.columns = {{"model", "model"}, {"devices", "devices", CellFormat::kInt}, {"n", "configs", CellFormat::kInt},
                 {"efficiency_min", "eff. min %", CellFormat::kFixed1}, {"efficiency_q25", "q25", CellFormat::kFixed1},
                 {"efficiency_median", "median", CellFormat::kFixed1}, {"efficiency_q75", "q75", CellFormat::kFixed1},
                 {"efficiency_max", "max", CellFormat::kFixed1}, {"speedup_median", "speedup (median)", CellFormat::kRatio},
                 {"karp_flatt_median", "Karp–Flatt (median)", CellFormat::kFixed4},
                 {"cost_per_million_tokens_median", "cost / 1M tokens (median)", CellFormat::kSig4},
                 {"j_per_token_median", "J/token (median)", CellFormat::kSig4}};
  std::map<std::pair<std::string, int>, std::vector<const Row*>> groups;
  for (const auto& r : rows) groups[{r.model, r.devices}].push_back(&r);
  std::map<std::string, std::optional<int>> below80;  // per model: the first count whose median efficiency < 80 %
  for (const auto& [key, g] : groups) {
    std::vector<double> e, s, k, c, j;
    for (const Row* r : g) { e.push_back(r->eff); s.push_back(r->speedup); k.push_back(r->kf); c.push_back(r->cost); j.push_back(r->jpt); }
    std::vector<double> es;
    for (double x : e) if (!std::isnan(x)) es.push_back(x);
    std::sort(es.begin(), es.end());
    auto q = [&](double p) { return es.empty() ? kNaN : quantile_sorted(es, p); };
    stt.rows.push_back({{"model", key.first}, {"devices", key.second}, {"n", g.size()}, {"efficiency_min", num(q(0))},
                        {"efficiency_q25", num(q(0.25))}, {"efficiency_median", num(q(0.5))}, {"efficiency_q75", num(q(0.75))},
                        {"efficiency_max", num(q(1))}, {"speedup_median", num(median_of(s))}, {"karp_flatt_median", num(median_of(k))},
                        {"cost_per_million_tokens_median", num(median_of(c))}, {"j_per_token_median", num(median_of(j))}});
    if (!below80.count(key.first)) below80[key.first] = std::nullopt;
    if (!below80[key.first] && q(0.5) < 80) below80[key.first] = key.second;
  }

  // Which x axes vary, and what could not be computed.
  Json x_axes = Json::array();
  for (const char* x : {"micro_batch_size", "seq_len"}) {
    if (f.find(x)) x_axes.push_back(x);
    else note(std::string("scaling curves against ") + x + ": the sweep does not vary " + x + " (constant or absent)");
  }
  if (!in.price_per_gpu_hour)
    note("cost per token: no price — give --price-per-gpu-hour P (any currency per GPU-hour)");
  const bool any_energy = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !std::isnan(r.jpt); });
  for (const auto& e : in.energy_notes) note("energy per token: " + e);
  std::vector<std::string> findings;
  for (const auto& [m, n] : below80)
    findings.push_back(std::string(m == "all" ? "" : m + ": ") +
                       (n ? "median efficiency falls below 80 % from " + std::to_string(*n) + " devices on"
                          : "median efficiency stays at or above 80 % at every device count measured"));

  a.json["scaling_curves"] = {{"x_axes", x_axes}, {"facet", "model"}, {"series", "devices"},
                              {"price_per_gpu_hour", in.price_per_gpu_hour ? Json(*in.price_per_gpu_hour) : Json()},
                              {"price_source", in.price_source}, {"energy", any_energy}, {"rows", rt.rows}, {"summary", stt.rows},
                              {"findings", findings}};
  a.json["problems"] = problems;
  a.tables.push_back({"scaling_curves", rt});
  a.tables.push_back({"scaling_summary", stt});
  std::ostringstream md;
  md << "\n## Scaling curves: speedup and efficiency per model and device count\n\n";
  for (const auto& s : findings) md << "- " << s << "\n";
  for (const auto& s : not_computed) md << "- not computed: " << s << "\n";
  md << "\nPrice: " << (in.price_per_gpu_hour ? fmt(*in.price_per_gpu_hour, 6) + " per GPU-hour (" + in.price_source + ")" : std::string("none given"))
     << "; energy: " << (any_energy ? "telemetry power integrated over the steady window" : "no power telemetry") << ". "
     << "scaling_curves.csv has one row per configuration (x: micro_batch_size, seq_len; facet: model; series: devices).\n\n"
     << lab::render_markdown(stt);
  a.markdown += md.str();
}

void add_scaling_curves(Analysis& a, const Frame& frame, const lab::ResultsStore& store, const std::string& sweep_name,
                        std::optional<double> price) {
  if (!frame.find("speedup") || frame.row_trials.size() != frame.rows()) return;
  ScalingCurveInputs in;
  in.price_per_gpu_hour = price;
  if (price) in.price_source = "--price-per-gpu-hour";
  auto sweep = store.find_sweep(sweep_name);
  if (!sweep) return;
  if (!price && sweep->spec.is_object() && sweep->spec.contains("price_per_device_hour") && sweep->spec["price_per_device_hour"].is_number()) {
    in.price_per_gpu_hour = sweep->spec["price_per_device_hour"].get<double>();
    in.price_source = "the scale study's --price-per-device-hour";
  }
  std::map<std::int64_t, double> tokens;
  bool gas_seen = false;
  for (const auto& t : store.trials(sweep->sweep_id)) {
    if (t.metrics.is_object() && t.metrics.contains("tokens_per_s") && t.metrics["tokens_per_s"].is_number())
      tokens[t.trial_id] = t.metrics["tokens_per_s"].get<double>();
    // A grad_accum_steps that is constant over the sweep is not a column of the table.
    auto params = t.params();
    if (!gas_seen && t.status == lab::TrialStatus::kOk && params.count("grad_accum_steps") && params.at("grad_accum_steps").is_number()) {
      in.grad_accum_steps = params.at("grad_accum_steps").get<double>();
      gas_seen = true;
    }
  }
  std::map<std::int64_t, std::vector<lab::TelemetrySample>> samples;
  for (auto& s : store.telemetry_samples(0, sweep->sweep_id)) samples[s.trial_id].push_back(std::move(s));
  std::size_t missing = 0;
  std::string first_reason;
  for (std::size_t i = 0; i < frame.rows(); ++i) {
    double sum = 0;
    int cnt = 0;
    for (auto id : frame.row_trials[i]) {
      std::string why;
      auto it = tokens.find(id);
      auto j = trial_j_per_token(samples[id], it == tokens.end() ? kNaN : it->second, &why);
      if (j) { sum += *j; ++cnt; }
      else if (first_reason.empty()) first_reason = "trial " + std::to_string(id) + ": " + why;
    }
    // A row's figure is the mean over its trials; a row where any trial lacks one has none, so
    // that no row mixes measured and unmeasured repeats.
    const bool all = cnt == static_cast<int>(frame.row_trials[i].size()) && cnt > 0;
    in.j_per_token.push_back(all ? sum / cnt : kNaN);
    missing += all ? 0 : 1;
  }
  if (missing)
    in.energy_notes.push_back(std::to_string(missing) + " of " + std::to_string(frame.rows()) + " rows have no figure (" + first_reason + ")");
  add_scaling_curves(a, frame, in);
}

}  // namespace scalelab::analysis
