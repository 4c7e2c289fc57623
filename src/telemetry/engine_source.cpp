#include "telemetry/engine_source.h"

#include <cstdio>
#include <exception>

namespace scalelab {

EngineSource::EngineSource(std::vector<EngineProbe> probes)
    : probes_(std::move(probes)), failed_(probes_.size(), false) {}

std::string EngineSource::open() {
  if (probes_.empty()) return "no engine probe given";
  for (const auto& p : probes_)
    if (!p.stats) return "engine probe for " + p.device + " has no callback";
  return "";
}

void EngineSource::sample(double t_s, TimeSeries& out) {
  for (std::size_t i = 0; i < probes_.size(); ++i) {
    if (failed_[i]) continue;
    const auto& p = probes_[i];
    MemoryStats s;
    try {
      s = p.stats();
    } catch (const std::exception& e) {
      failed_[i] = true;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f", t_s);
      note("engine: " + p.device + ": reading the allocator failed at t=" + buf + " s (" + e.what() +
           "); no further engine readings for it");
      continue;
    } catch (...) {
      failed_[i] = true;
      note("engine: " + p.device + ": reading the allocator failed (unknown exception)");
      continue;
    }
    out.append("engine", p.device, "allocated_bytes", t_s, static_cast<double>(s.allocated));
    out.append("engine", p.device, "reserved_bytes", t_s, static_cast<double>(s.reserved));
    out.append("engine", p.device, "peak_allocated_bytes", t_s, static_cast<double>(s.peak_allocated));
    out.append("engine", p.device, "peak_reserved_bytes", t_s, static_cast<double>(s.peak_reserved));
    out.append("engine", p.device, "capacity_bytes", t_s, static_cast<double>(s.capacity));
  }
}

}  // namespace scalelab
