// `scalelab monitor`: live telemetry lines, one per GPU per interval, with the fields of
// `nvidia-smi dmon` (power, temperature, SM and memory utilization, clocks, framebuffer used,
// PCIe rx/tx). Without a GPU it says so once and shows the host instead (CPU, memory, RAPL
// package power, the hottest hwmon sensor). Ctrl-C ends it; --csv writes the series at the end.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "cli/command.h"
#include "cli/lab_common.h"
#include "telemetry/session.h"

namespace scalelab::cli {
namespace {

struct MonitorOptions {
  int interval_ms = 1000;
  int count = 0;  // 0: until interrupted
  std::string csv;
};

// The current reading of one device: metric -> value, from the latest tick only.
using Reading = std::map<std::string, double>;

std::map<std::string, Reading> current_readings(const TelemetrySession& s, const std::string& source) {
  const auto latest = s.series().latest();
  double t = -1;
  for (const auto& [k, v] : latest) t = std::max(t, v.first);
  std::map<std::string, Reading> out;
  for (const auto& [k, v] : latest)
    if (k.source == source && v.first == t) out[k.device][k.metric] = v.second;
  return out;
}

std::string cell(const Reading& r, const char* metric, double scale, int width) {
  char buf[32];
  auto it = r.find(metric);
  if (it == r.end()) {
    std::snprintf(buf, sizeof buf, "%*s", width, "-");
  } else {
    std::snprintf(buf, sizeof buf, "%*.0f", width, it->second * scale);
  }
  return buf;
}

void print_gpu_header() {
  std::printf("# gpu    pwr  gtemp     sm    mem   mclk   pclk      fb  rxpci  txpci\n");
  std::printf("# Idx      W      C      %%      %%    MHz    MHz      MB   MB/s   MB/s\n");
}

void print_gpu_lines(const TelemetrySession& s) {
  for (const auto& [dev, r] : current_readings(s, "nvml")) {
    const std::string idx = dev.rfind("cuda:", 0) == 0 ? dev.substr(5) : dev;
    std::printf("%5s %s %s %s %s %s %s %s %s %s\n", idx.c_str(), cell(r, "power_w", 1, 6).c_str(),
                cell(r, "temperature_c", 1, 6).c_str(), cell(r, "gpu_util_pct", 1, 6).c_str(),
                cell(r, "mem_util_pct", 1, 6).c_str(), cell(r, "mem_clock_mhz", 1, 6).c_str(),
                cell(r, "sm_clock_mhz", 1, 6).c_str(),
                cell(r, "mem_used_bytes", 1.0 / (1024.0 * 1024.0), 7).c_str(),
                cell(r, "pcie_rx_kb_s", 1.0 / 1024.0, 6).c_str(),
                cell(r, "pcie_tx_kb_s", 1.0 / 1024.0, 6).c_str());
  }
}

void print_host_header() {
  std::printf("#   time   cpu   mem_used  mem_total   pkg_pwr  temp_max\n");
  std::printf("#      s     %%        GiB        GiB         W         C\n");
}

void print_host_line(const TelemetrySession& s) {
  const auto readings = current_readings(s, "host");
  std::optional<double> cpu, used, total, pkg_w, temp_max;
  for (const auto& [dev, r] : readings) {
    if (dev == "host") {
      if (auto it = r.find("cpu_util_pct"); it != r.end()) cpu = it->second;
      if (auto it = r.find("mem_used_bytes"); it != r.end()) used = it->second;
      if (auto it = r.find("mem_total_bytes"); it != r.end()) total = it->second;
    } else if (dev.rfind("rapl:package", 0) == 0) {
      if (auto it = r.find("power_w"); it != r.end()) pkg_w = pkg_w.value_or(0) + it->second;
    } else if (dev.rfind("hwmon:", 0) == 0) {
      if (auto it = r.find("temperature_c"); it != r.end())
        temp_max = std::max(temp_max.value_or(it->second), it->second);
    }
  }
  auto fmt = [](const std::optional<double>& v, double scale, int width, int prec) {
    char buf[32];
    if (!v) {
      std::snprintf(buf, sizeof buf, "%*s", width, "-");
    } else {
      std::snprintf(buf, sizeof buf, "%*.*f", width, prec, *v * scale);
    }
    return std::string(buf);
  };
  const double gib = 1.0 / (1024.0 * 1024.0 * 1024.0);
  std::printf("%8.1f %s %s %s %s %s\n", s.elapsed_s(), fmt(cpu, 1, 5, 1).c_str(),
              fmt(used, gib, 10, 2).c_str(), fmt(total, gib, 10, 2).c_str(),
              fmt(pkg_w, 1, 9, 1).c_str(), fmt(temp_max, 1, 9, 1).c_str());
}

int run_monitor(const MonitorOptions& o) {
  TelemetryOptions to;
  to.interval = std::chrono::milliseconds(o.interval_ms);
  to.nvidia_smi = false;  // one reading per line: NVML's (nvidia-smi dmon reads NVML too)
  to.process = false;
  to.report_unavailable = false;  // said once below, in the output itself
  TelemetrySession session(to);

  // Ctrl-C / SIGTERM end the loop between readings (the lab's handler: a second one kills).
  InterruptFlag interrupt;
  const std::atomic<bool>& interrupted = *interrupt.get();

  session.sample_now();
  const bool gpu = session.source_status()["nvml"] == "ok";
  if (gpu) {
    for (const auto& g : session.gpus())
      std::printf("# %s: %s (%s)\n", g.device.c_str(), g.name.c_str(), g.uuid.c_str());
    print_gpu_header();
  } else {
    std::printf("# no GPU: nvml %s; showing the host\n", session.source_status()["nvml"].c_str());
    print_host_header();
  }
  auto print = [&] {
    if (gpu) {
      print_gpu_lines(session);
    } else {
      print_host_line(session);
    }
    std::fflush(stdout);
  };
  print();
  auto next = std::chrono::steady_clock::now() + to.interval;
  for (int n = 1; (o.count == 0 || n < o.count) && !interrupted.load(); ++n) {
    // Sleeps in short slices so that Ctrl-C ends it promptly (the handler only sets a flag).
    while (!interrupted.load() && std::chrono::steady_clock::now() < next)
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          next - std::chrono::steady_clock::now(), std::chrono::milliseconds(50)));
    if (interrupted.load()) break;
    next += to.interval;
    session.sample_now();
    print();
  }
  session.stop();
  if (!o.csv.empty()) session.write_csv(o.csv);
  return 0;
}

}  // namespace

Subcommand add_monitor_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "monitor", "Live telemetry lines per GPU, like nvidia-smi dmon (the host when there is no GPU)");
  auto o = std::make_shared<MonitorOptions>();
  app->add_option("--interval", o->interval_ms, "Milliseconds between readings")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--count", o->count, "Stop after N readings (0: until Ctrl-C)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--csv", o->csv, "Write the time series to FILE at the end");
  return {app, [o] { return run_monitor(*o); }};
}

}  // namespace scalelab::cli
