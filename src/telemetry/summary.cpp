#include "telemetry/summary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "telemetry/nvml.h"

namespace scalelab {

using nlohmann::json;

std::optional<double> pearson_r(const std::vector<double>& x, const std::vector<double>& y) {
  const std::size_t n = std::min(x.size(), y.size());
  if (n < 3) return std::nullopt;
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double dx = x[i] - mx, dy = y[i] - my;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  // A side that does not vary has no correlation to speak of (r is 0/0). "Does not vary" is
  // relative to its mean: rounding in the mean leaves a constant series a tiny spread.
  const double scale_x = std::max(1.0, mx * mx) * 1e-24 * static_cast<double>(n);
  const double scale_y = std::max(1.0, my * my) * 1e-24 * static_cast<double>(n);
  if (sxx <= scale_x || syy <= scale_y) return std::nullopt;
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

std::vector<std::pair<double, double>> align_nearest(const SeriesPoints& a, const SeriesPoints& b,
                                                     double tolerance_s) {
  struct Candidate {
    double dist;
    std::size_t ia, ib;
  };
  std::vector<Candidate> cands;
  for (std::size_t i = 0; i < a.t_s.size(); ++i) {
    const double t = a.t_s[i];
    auto it = std::lower_bound(b.t_s.begin(), b.t_s.end(), t);
    std::size_t best = b.t_s.size();
    double best_d = std::numeric_limits<double>::infinity();
    for (auto j : {it - b.t_s.begin(), it - b.t_s.begin() - 1}) {
      if (j < 0 || static_cast<std::size_t>(j) >= b.t_s.size()) continue;
      const double d = std::abs(b.t_s[static_cast<std::size_t>(j)] - t);
      if (d < best_d) {
        best_d = d;
        best = static_cast<std::size_t>(j);
      }
    }
    if (best < b.t_s.size() && best_d <= tolerance_s) cands.push_back({best_d, i, best});
  }
  std::sort(cands.begin(), cands.end(), [](const Candidate& x, const Candidate& y) {
    return std::tie(x.dist, x.ia) < std::tie(y.dist, y.ia);
  });
  std::vector<bool> used_b(b.t_s.size(), false);
  std::vector<std::pair<std::size_t, std::size_t>> kept;
  for (const auto& c : cands) {
    if (used_b[c.ib]) continue;
    used_b[c.ib] = true;
    kept.emplace_back(c.ia, c.ib);
  }
  std::sort(kept.begin(), kept.end());
  std::vector<std::pair<double, double>> out;
  out.reserve(kept.size());
  for (const auto& [ia, ib] : kept) out.emplace_back(a.value[ia], b.value[ib]);
  return out;
}

double integrate_trapezoid(const SeriesPoints& p) {
  double sum = 0;
  for (std::size_t i = 1; i < p.t_s.size(); ++i)
    sum += 0.5 * (p.value[i] + p.value[i - 1]) * (p.t_s[i] - p.t_s[i - 1]);
  return sum;
}

std::vector<AgreementRow> compute_agreement(const std::map<SeriesKey, SeriesPoints>& series,
                                            double tolerance_s) {
  struct Pair {
    const char* quantity;
    const char* source_a;
    const char* metric_a;
    const char* source_b;
    const char* metric_b;
  };
  static const Pair kPairs[] = {
      {"mem_used_bytes", "nvml", "mem_used_bytes", "nvidia-smi", "mem_used_bytes"},
      {"mem_used_bytes", "nvml", "mem_used_bytes", "engine", "reserved_bytes"},
      {"mem_used_bytes", "nvidia-smi", "mem_used_bytes", "engine", "reserved_bytes"},
      {"power_w", "nvml", "power_w", "nvidia-smi", "power_w"},
      {"gpu_util_pct", "nvml", "gpu_util_pct", "nvidia-smi", "gpu_util_pct"},
      {"mem_util_pct", "nvml", "mem_util_pct", "nvidia-smi", "mem_util_pct"},
      {"temperature_c", "nvml", "temperature_c", "nvidia-smi", "temperature_c"},
  };
  std::vector<std::string> devices;
  for (const auto& [k, _] : series)
    if (std::find(devices.begin(), devices.end(), k.device) == devices.end())
      devices.push_back(k.device);
  std::vector<AgreementRow> rows;
  for (const auto& dev : devices) {
    for (const auto& p : kPairs) {
      auto a = series.find({p.source_a, dev, p.metric_a});
      auto b = series.find({p.source_b, dev, p.metric_b});
      if (a == series.end() || b == series.end()) continue;
      const auto pairs = align_nearest(a->second, b->second, tolerance_s);
      if (pairs.empty()) continue;
      AgreementRow r;
      r.device = dev;
      r.quantity = p.quantity;
      r.source_a = p.source_a;
      r.metric_a = p.metric_a;
      r.source_b = p.source_b;
      r.metric_b = p.metric_b;
      r.n = pairs.size();
      std::vector<double> xa, xb;
      double sd = 0, sad = 0;
      for (const auto& [va, vb] : pairs) {
        xa.push_back(va);
        xb.push_back(vb);
        r.mean_a += va;
        r.mean_b += vb;
        sd += vb - va;
        sad += std::abs(vb - va);
      }
      const double n = static_cast<double>(r.n);
      r.mean_a /= n;
      r.mean_b /= n;
      r.mean_diff = sd / n;
      r.mean_abs_diff = sad / n;
      r.pearson_r = pearson_r(xa, xb);
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

json agreement_to_json(const std::vector<AgreementRow>& rows) {
  json out = json::array();
  for (const auto& r : rows) {
    out.push_back({{"device", r.device},
                   {"quantity", r.quantity},
                   {"a", {{"source", r.source_a}, {"metric", r.metric_a}, {"mean", r.mean_a}}},
                   {"b", {{"source", r.source_b}, {"metric", r.metric_b}, {"mean", r.mean_b}}},
                   {"n", r.n},
                   {"pearson_r", r.pearson_r ? json(*r.pearson_r) : json(nullptr)},
                   {"mean_diff", r.mean_diff},
                   {"mean_abs_diff", r.mean_abs_diff}});
  }
  return out;
}

namespace {

bool is_counter(const std::string& metric) {
  return metric.size() >= 8 && metric.compare(metric.size() - 8, 8, "energy_j") == 0;
}

double span(const SeriesPoints& p) { return p.t_s.empty() ? 0.0 : p.t_s.back() - p.t_s.front(); }

json metric_stats(const std::string& metric, const SeriesPoints& p) {
  json j;
  j["n"] = p.value.size();
  if (p.value.empty()) return j;
  if (is_counter(metric)) {
    j["delta"] = p.value.back() - p.value.front();
    return j;
  }
  if (metric == "clocks_event_reasons") {
    unsigned long long any = 0;
    std::size_t throttled = 0;
    for (double v : p.value) {
      const auto mask = static_cast<unsigned long long>(v);
      any |= mask;
      if (mask & clocks_event_throttle_mask()) ++throttled;
    }
    j["any_mask"] = any;
    j["reasons"] = clocks_event_reason_names(any);
    j["throttled_fraction"] = static_cast<double>(throttled) / static_cast<double>(p.value.size());
    return j;
  }
  double sum = 0, mx = -std::numeric_limits<double>::infinity();
  for (double v : p.value) {
    sum += v;
    mx = std::max(mx, v);
  }
  j["avg"] = sum / static_cast<double>(p.value.size());
  j["max"] = mx;
  return j;
}

struct Energy {
  double joules = 0;
  double seconds = 0;
  std::string method;
};

// A device's energy: its own counter if it has one, else its integrated power; NVML before
// nvidia-smi. nullopt when there is neither (or a single reading).
std::optional<Energy> device_energy(const std::map<SeriesKey, SeriesPoints>& series,
                                    const std::string& device) {
  for (const char* source : {"nvml", "host"}) {
    auto it = series.find({source, device, "energy_j"});
    if (it != series.end() && it->second.value.size() >= 2 && span(it->second) > 0) {
      return Energy{it->second.value.back() - it->second.value.front(), span(it->second),
                    std::string(source) + (std::string(source) == "host" ? " rapl counter"
                                                                          : " energy counter")};
    }
  }
  for (const char* source : {"nvml", "nvidia-smi"}) {
    auto it = series.find({source, device, "power_w"});
    if (it != series.end() && it->second.value.size() >= 2 && span(it->second) > 0)
      return Energy{integrate_trapezoid(it->second), span(it->second),
                    std::string(source) + " integrated power"};
  }
  return std::nullopt;
}

json energy_json(const Energy& e, const std::optional<double>& tokens) {
  json j;
  j["energy_j"] = e.joules;
  j["energy_method"] = e.method;
  j["energy_span_s"] = e.seconds;
  j["avg_power_w"] = e.seconds > 0 ? json(e.joules / e.seconds) : json(nullptr);
  j["j_per_token"] = tokens && *tokens > 0 ? json(e.joules / *tokens) : json(nullptr);
  return j;
}

}  // namespace

json summarize(const std::map<SeriesKey, SeriesPoints>& series, const SummaryOptions& opt) {
  json out;
  double t_first = std::numeric_limits<double>::infinity(), t_last = -t_first;
  for (const auto& [k, p] : series) {
    if (p.t_s.empty()) continue;
    t_first = std::min(t_first, p.t_s.front());
    t_last = std::max(t_last, p.t_s.back());
  }
  out["duration_s"] = t_last >= t_first ? t_last - t_first : 0.0;
  out["tokens"] = opt.tokens ? json(*opt.tokens) : json(nullptr);

  json devices = json::object();
  json process = json::object();
  json host = json::object();
  json rapl = json::object();
  json temps = json::object();
  for (const auto& [k, p] : series) {
    const json stats = metric_stats(k.metric, p);
    if (k.source == "process") {
      process[k.metric] = stats;
    } else if (k.source == "host") {
      if (k.device == "host") {
        host[k.metric] = stats;
      } else if (k.device.rfind("rapl:", 0) == 0) {
        rapl[k.device][k.metric] = stats;
      } else {
        temps[k.device][k.metric] = stats;
      }
    } else {
      devices[k.device]["metrics"][k.source][k.metric] = stats;
    }
  }

  // Energy per GPU (and per RAPL zone), then the run's total: the GPUs' when there are any,
  // else the CPU packages'.
  double gpu_j = 0, gpu_s = 0;
  bool any_gpu_energy = false;
  for (auto& [dev, j] : devices.items()) {
    if (auto e = device_energy(series, dev)) {
      j.update(energy_json(*e, opt.tokens));
      gpu_j += e->joules;
      gpu_s = std::max(gpu_s, e->seconds);
      any_gpu_energy = true;
    }
  }
  double cpu_j = 0, cpu_s = 0;
  bool any_cpu_energy = false;
  for (auto& [dev, j] : rapl.items()) {
    if (auto e = device_energy(series, dev)) {
      j.update(energy_json(*e, opt.tokens));
      if (dev.rfind("rapl:package", 0) == 0) {
        cpu_j += e->joules;
        cpu_s = std::max(cpu_s, e->seconds);
        any_cpu_energy = true;
      }
    }
  }
  if (!rapl.empty()) host["rapl"] = rapl;
  if (!temps.empty()) host["temperatures"] = temps;

  out["devices"] = devices;
  out["process"] = process;
  out["host"] = host;
  if (any_gpu_energy || any_cpu_energy) {
    const double j = any_gpu_energy ? gpu_j : cpu_j;
    const double s = any_gpu_energy ? gpu_s : cpu_s;
    out["energy_j"] = j;
    out["energy_scope"] = any_gpu_energy ? "gpu" : "cpu_package";
    out["avg_power_w"] = s > 0 ? json(j / s) : json(nullptr);
    out["j_per_token"] = opt.tokens && *opt.tokens > 0 ? json(j / *opt.tokens) : json(nullptr);
  } else {
    out["energy_j"] = nullptr;
    out["energy_scope"] = nullptr;
    out["avg_power_w"] = nullptr;
    out["j_per_token"] = nullptr;
  }
  out["agreement"] = agreement_to_json(compute_agreement(series, opt.align_tolerance_s));
  return out;
}

}  // namespace scalelab
