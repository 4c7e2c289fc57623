#include "telemetry/host_source.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

namespace scalelab {

std::optional<unsigned long long> rapl_delta_uj(unsigned long long prev, unsigned long long cur,
                                                unsigned long long max_range) {
  if (cur >= prev) return cur - prev;
  if (max_range == 0 || prev > max_range) return std::nullopt;
  return (max_range - prev) + cur;  // wrapped once (an interval is far shorter than a wrap)
}

namespace {

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string first_line(const std::string& path) {
  auto t = read_small_file(path);
  if (!t) return "";
  std::string s = t->substr(0, t->find('\n'));
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

std::optional<unsigned long long> read_ull(const std::string& path, int* err = nullptr) {
  errno = 0;
  auto t = read_small_file(path);
  if (!t) {
    if (err) *err = errno;
    return std::nullopt;
  }
  char* end = nullptr;
  const unsigned long long v = std::strtoull(t->c_str(), &end, 10);
  if (end == t->c_str()) return std::nullopt;
  return v;
}

std::optional<double> read_double(const std::string& path) {
  auto t = read_small_file(path);
  if (!t) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t->c_str(), &end);
  if (end == t->c_str()) return std::nullopt;
  return v;
}

}  // namespace

HostSource::HostSource(Options options) : options_(std::move(options)) {}

std::vector<std::string> HostSource::rapl_devices() const {
  std::vector<std::string> out;
  for (const auto& z : rapl_) out.push_back(z.device);
  return out;
}

std::vector<std::string> HostSource::hwmon_devices() const {
  std::vector<std::string> out;
  for (const auto& s : sensors_) out.push_back(s.device);
  return out;
}

void HostSource::open_rapl() {
  const std::string base = options_.sys_root + "/class/powercap";
  const auto entries = list_dir(base);
  if (entries.empty()) {
    note("host: RAPL unavailable: " + base + " is absent or empty (no package energy readings)");
    return;
  }
  std::string unreadable;
  for (const auto& e : entries) {
    // Top-level zones only ("intel-rapl:0"); sub-zones ("intel-rapl:0:0") are parts of them.
    if (e.rfind("intel-rapl:", 0) != 0 || std::count(e.begin(), e.end(), ':') != 1) continue;
    RaplZone z;
    const std::string dir = base + "/" + e;
    std::string zone_name = first_line(dir + "/name");
    if (zone_name.empty()) zone_name = e;
    z.device = "rapl:" + zone_name;
    z.energy_path = dir + "/energy_uj";
    z.max_range_uj = read_ull(dir + "/max_energy_range_uj").value_or(0);
    int err = 0;
    const auto v = read_ull(z.energy_path, &err);
    if (!v) {
      unreadable = z.energy_path + (err ? std::string(" (") + std::strerror(err) + ")" : "");
      continue;
    }
    z.prev_uj = *v;
    z.prev_time = TelemetryClock::now();
    rapl_.push_back(std::move(z));
  }
  if (rapl_.empty()) {
    note("host: RAPL unavailable: " +
         (unreadable.empty() ? "no intel-rapl zone under " + base
                             : "cannot read " + unreadable + " — energy_uj is root-only on recent "
                                                             "kernels"));
  }
}

void HostSource::open_hwmon() {
  const std::string base = options_.sys_root + "/class/hwmon";
  const auto chips = list_dir(base);
  if (chips.empty()) {
    note("host: hwmon unavailable: " + base + " is absent or empty (no temperature readings)");
    return;
  }
  std::map<std::string, int> name_count;
  for (const auto& c : chips) ++name_count[first_line(base + "/" + c + "/name")];
  for (const auto& c : chips) {
    const std::string dir = base + "/" + c;
    std::string chip = first_line(dir + "/name");
    if (chip.empty()) chip = c;
    if (name_count[chip] > 1) chip += "@" + c;  // several chips of one driver (nvme, ...)
    for (const auto& f : list_dir(dir)) {
      // temp<N>_input, in millidegrees Celsius; temp<N>_label names it where the driver does.
      if (f.rfind("temp", 0) != 0 || f.size() < 11 || f.compare(f.size() - 6, 6, "_input") != 0)
        continue;
      const std::string stem = f.substr(0, f.size() - 6);
      std::string label = first_line(dir + "/" + stem + "_label");
      if (label.empty()) label = stem;
      if (sensors_.size() >= options_.max_hwmon_sensors) break;
      if (!read_double(dir + "/" + f)) continue;  // present but unreadable: skip
      sensors_.push_back({"hwmon:" + chip + "/" + label, dir + "/" + f, false});
    }
  }
  if (sensors_.empty()) note("host: hwmon has no readable temperature sensor under " + base);
}

std::string HostSource::open() {
  prev_cpu_ = read_system_cpu(options_.proc_root);
  prev_cpu_time_ = TelemetryClock::now();
  const auto mem = read_meminfo(options_.proc_root);
  if (!prev_cpu_ && !mem) return "cannot read " + options_.proc_root + "/stat or /meminfo";
  if (options_.rapl) open_rapl();
  if (options_.hwmon) open_hwmon();
  return "";
}

void HostSource::sample(double t_s, TimeSeries& out) {
  const auto now = TelemetryClock::now();
  if (auto cpu = read_system_cpu(options_.proc_root)) {
    // As for the process: a few clock ticks at least between two readings (see process_source).
    const double dt = std::chrono::duration<double>(now - prev_cpu_time_).count();
    if (!prev_cpu_ || dt >= 3.0 / static_cast<double>(clock_ticks_per_second())) {
      if (prev_cpu_) {
        if (auto pct = cpu_busy_pct(*prev_cpu_, *cpu)) out.append("host", "host", "cpu_util_pct", t_s, *pct);
      }
      prev_cpu_ = cpu;
      prev_cpu_time_ = now;
    }
  }
  if (auto mem = read_meminfo(options_.proc_root)) {
    out.append("host", "host", "mem_used_bytes", t_s, mem->total_bytes - mem->available_bytes);
    out.append("host", "host", "mem_total_bytes", t_s, mem->total_bytes);
  }
  for (auto& z : rapl_) {
    if (z.failed) continue;
    const auto v = read_ull(z.energy_path);
    if (!v) {
      z.failed = true;
      note("host: " + z.device + ": " + z.energy_path + " became unreadable; no further readings");
      continue;
    }
    const auto d = rapl_delta_uj(z.prev_uj, *v, z.max_range_uj);
    const double dt = std::chrono::duration<double>(now - z.prev_time).count();
    if (d) {
      z.energy_j += static_cast<double>(*d) * 1e-6;
      if (dt >= 0.01) out.append("host", z.device, "power_w", t_s, static_cast<double>(*d) * 1e-6 / dt);
    }
    z.prev_uj = *v;
    z.prev_time = now;
    out.append("host", z.device, "energy_j", t_s, z.energy_j);
  }
  for (auto& s : sensors_) {
    if (s.failed) continue;
    const auto v = read_double(s.input_path);
    if (!v) {
      s.failed = true;
      note("host: " + s.device + " became unreadable; no further readings");
      continue;
    }
    out.append("host", s.device, "temperature_c", t_s, *v / 1000.0);
  }
}

}  // namespace scalelab
