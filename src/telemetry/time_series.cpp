#include "telemetry/time_series.h"

#include <algorithm>

namespace scalelab {

TimeSeries::TimeSeries(const std::vector<Sample>& samples) {
  for (const auto& s : samples) append(s.source, s.device, s.metric, s.t_s, s.value);
}

std::uint32_t TimeSeries::id_locked(const std::string& source, const std::string& device,
                                    const std::string& metric) {
  SeriesKey key{source, device, metric};
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(keys_.size());
  keys_.push_back(key);
  ids_.emplace(std::move(key), id);
  return id;
}

void TimeSeries::append(const std::string& source, const std::string& device,
                        const std::string& metric, double t_s, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  points_.push_back({t_s, id_locked(source, device, metric), value});
}

std::vector<Sample> TimeSeries::samples() const {
  std::vector<Point> points;
  std::vector<SeriesKey> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    points = points_;
    keys = keys_;
  }
  std::stable_sort(points.begin(), points.end(), [&](const Point& a, const Point& b) {
    if (a.t_s != b.t_s) return a.t_s < b.t_s;
    return keys[a.series] < keys[b.series];
  });
  std::vector<Sample> out;
  out.reserve(points.size());
  for (const auto& p : points) {
    const auto& k = keys[p.series];
    out.push_back({p.t_s, k.source, k.device, k.metric, p.value});
  }
  return out;
}

std::map<SeriesKey, SeriesPoints> TimeSeries::series() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SeriesPoints> by_id(keys_.size());
  for (const auto& p : points_) {
    by_id[p.series].t_s.push_back(p.t_s);
    by_id[p.series].value.push_back(p.value);
  }
  std::map<SeriesKey, SeriesPoints> out;
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    auto& sp = by_id[i];
    // Appends from two threads can interleave slightly out of order: sort each series by time.
    if (!std::is_sorted(sp.t_s.begin(), sp.t_s.end())) {
      std::vector<std::size_t> order(sp.t_s.size());
      for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return sp.t_s[a] < sp.t_s[b]; });
      SeriesPoints sorted;
      for (auto j : order) {
        sorted.t_s.push_back(sp.t_s[j]);
        sorted.value.push_back(sp.value[j]);
      }
      sp = std::move(sorted);
    }
    out.emplace(keys_[i], std::move(sp));
  }
  return out;
}

std::map<SeriesKey, std::pair<double, double>> TimeSeries::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<SeriesKey, std::pair<double, double>> out;
  for (const auto& p : points_) {
    auto [it, inserted] = out.try_emplace(keys_[p.series], p.t_s, p.value);
    if (!inserted && p.t_s >= it->second.first) it->second = {p.t_s, p.value};
  }
  return out;
}

std::size_t TimeSeries::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return points_.size();
}

void TimeSeries::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  points_.clear();
  keys_.clear();
  ids_.clear();
}

}  // namespace scalelab
