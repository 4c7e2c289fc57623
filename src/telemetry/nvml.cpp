#include "telemetry/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "telemetry/cuda_visible.h"
#include "telemetry/nvml_abi.h"

namespace scalelab {

namespace abi = nvml_abi;

std::vector<std::pair<std::string, double>> GpuReading::fields() const {
  std::vector<std::pair<std::string, double>> out;
  auto add = [&](const char* name, const std::optional<double>& v) {
    if (v) out.emplace_back(name, *v);
  };
  add("gpu_util_pct", gpu_util_pct);
  add("mem_util_pct", mem_util_pct);
  add("mem_total_bytes", mem_total_bytes);
  add("mem_used_bytes", mem_used_bytes);
  add("mem_reserved_bytes", mem_reserved_bytes);
  add("temperature_c", temperature_c);
  add("power_w", power_w);
  add("energy_j", energy_j);
  add("sm_clock_mhz", sm_clock_mhz);
  add("mem_clock_mhz", mem_clock_mhz);
  add("pcie_tx_kb_s", pcie_tx_kb_s);
  add("pcie_rx_kb_s", pcie_rx_kb_s);
  add("clocks_event_reasons", clocks_event_reasons);
  add("num_processes", num_processes);
  add("process_mem_used_bytes", process_mem_used_bytes);
  return out;
}

std::vector<std::string> clocks_event_reason_names(unsigned long long mask) {
  static const std::array<std::pair<unsigned long long, const char*>, 9> kNames = {{
      {abi::kClocksEventGpuIdle, "gpu_idle"},
      {abi::kClocksEventApplicationsClocksSetting, "applications_clocks_setting"},
      {abi::kClocksEventSwPowerCap, "sw_power_cap"},
      {abi::kClocksEventHwSlowdown, "hw_slowdown"},
      {abi::kClocksEventSyncBoost, "sync_boost"},
      {abi::kClocksEventSwThermalSlowdown, "sw_thermal_slowdown"},
      {abi::kClocksEventHwThermalSlowdown, "hw_thermal_slowdown"},
      {abi::kClocksEventHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
      {abi::kClocksEventDisplayClockSetting, "display_clock_setting"},
  }};
  std::vector<std::string> out;
  unsigned long long known = 0;
  for (const auto& [bit, name] : kNames) {
    known |= bit;
    if (mask & bit) out.emplace_back(name);
  }
  if (mask & ~known) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "other_0x%llx", mask & ~known);
    out.emplace_back(buf);
  }
  return out;
}

unsigned long long clocks_event_throttle_mask() {
  return ~(abi::kClocksEventGpuIdle | abi::kClocksEventApplicationsClocksSetting |
           abi::kClocksEventDisplayClockSetting);
}

namespace {

// The fields read per device; each can be switched off for the session on its own.
enum Field : int {
  kUtil,
  kMemory,
  kTemperature,
  kPower,
  kEnergy,
  kSmClock,
  kMemClock,
  kPcieTx,
  kPcieRx,
  kClocksEvent,
  kProcesses,
  kNumFields
};
constexpr std::array<const char*, kNumFields> kFieldMetric = {
    "gpu_util_pct", "mem_used_bytes", "temperature_c", "power_w",  "energy_j",
    "sm_clock_mhz", "mem_clock_mhz",  "pcie_tx_kb_s",  "pcie_rx_kb_s", "clocks_event_reasons",
    "num_processes"};

constexpr unsigned long long kValueNotAvailable = ~0ull;  // NVML_VALUE_NOT_AVAILABLE

struct DeviceState {
  GpuInfo info;
  abi::Device handle = nullptr;
  bool lost = false;
  bool mem_v1_only = false;
  std::array<std::string, kNumFields> disabled;   // non-empty: why the field is off
  std::array<bool, kNumFields> transient_noted{};  // a transient error was noted once
};

}  // namespace

struct NvmlSource::Impl {
  Options options;
  void* lib = nullptr;
  bool initialized = false;
  std::string library_name;

  abi::ShutdownFn shutdown = nullptr;
  abi::ErrorStringFn error_string = nullptr;
  abi::DeviceGetCountFn get_count = nullptr;
  abi::DeviceGetHandleByIndexFn get_handle = nullptr;
  abi::DeviceGetStringFn get_name = nullptr;
  abi::DeviceGetStringFn get_uuid = nullptr;
  abi::DeviceGetUtilizationRatesFn get_util = nullptr;
  abi::DeviceGetMemoryInfoFn get_mem = nullptr;
  abi::DeviceGetMemoryInfoV2Fn get_mem_v2 = nullptr;
  abi::DeviceGetTemperatureFn get_temp = nullptr;
  abi::DeviceGetPowerUsageFn get_power = nullptr;
  abi::DeviceGetTotalEnergyConsumptionFn get_energy = nullptr;
  abi::DeviceGetClockInfoFn get_clock = nullptr;
  abi::DeviceGetPcieThroughputFn get_pcie = nullptr;
  abi::DeviceGetClocksEventReasonsFn get_clocks_event = nullptr;
  abi::DeviceGetProcessesV1Fn get_procs_v1 = nullptr;
  abi::DeviceGetProcessesV2Fn get_procs_v2 = nullptr;

  std::vector<DeviceState> devs;
  std::vector<GpuInfo> infos;
  std::vector<abi::ProcessInfoV2> proc_buf_v2;
  std::vector<abi::ProcessInfoV1> proc_buf_v1;
  mutable std::mutex mu;  // read() vs unavailable_fields() from another thread

  template <class F>
  F sym(const char* name) {
    return reinterpret_cast<F>(dlsym(lib, name));
  }

  std::string err(abi::Return rc) const {
    const char* s = error_string ? error_string(rc) : nullptr;
    std::string text = s ? s : "NVML error";
    return text + " (" + std::to_string(rc) + ")";
  }
};

NvmlSource::NvmlSource(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
}

NvmlSource::~NvmlSource() { close(); }

const std::vector<GpuInfo>& NvmlSource::devices() const { return impl_->infos; }

std::string NvmlSource::open() {
  auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.devs.clear();
  s.infos.clear();
  s.library_name = s.options.library;
  if (s.library_name.empty()) {
    const char* env = std::getenv("SCALELAB_NVML_LIBRARY");
    s.library_name = env && *env ? env : "libnvidia-ml.so.1";
  }
  dlerror();
  s.lib = dlopen(s.library_name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!s.lib) {
    const char* e = dlerror();
    return "cannot load " + s.library_name + " (" + (e ? e : "dlopen failed") +
           ") — no NVIDIA driver on this machine, or set SCALELAB_NVML_LIBRARY";
  }
  auto init = s.sym<abi::InitFn>("nvmlInit_v2");
  if (!init) init = s.sym<abi::InitFn>("nvmlInit");
  s.shutdown = s.sym<abi::ShutdownFn>("nvmlShutdown");
  s.error_string = s.sym<abi::ErrorStringFn>("nvmlErrorString");
  s.get_count = s.sym<abi::DeviceGetCountFn>("nvmlDeviceGetCount_v2");
  if (!s.get_count) s.get_count = s.sym<abi::DeviceGetCountFn>("nvmlDeviceGetCount");
  s.get_handle = s.sym<abi::DeviceGetHandleByIndexFn>("nvmlDeviceGetHandleByIndex_v2");
  if (!s.get_handle) s.get_handle = s.sym<abi::DeviceGetHandleByIndexFn>("nvmlDeviceGetHandleByIndex");
  for (auto [fn, name] : {std::pair<bool, const char*>{init != nullptr, "nvmlInit_v2"},
                          {s.shutdown != nullptr, "nvmlShutdown"},
                          {s.get_count != nullptr, "nvmlDeviceGetCount_v2"},
                          {s.get_handle != nullptr, "nvmlDeviceGetHandleByIndex_v2"}}) {
    if (!fn) {
      dlclose(s.lib);
      s.lib = nullptr;
      return s.library_name + " lacks " + name + " — the NVIDIA driver is too old or broken";
    }
  }
  const abi::Return rc = init();
  if (rc != abi::kSuccess) {
    std::string why = "nvmlInit_v2 failed: " + s.err(rc);
    dlclose(s.lib);
    s.lib = nullptr;
    return why;
  }
  s.initialized = true;

  s.get_name = s.sym<abi::DeviceGetStringFn>("nvmlDeviceGetName");
  s.get_uuid = s.sym<abi::DeviceGetStringFn>("nvmlDeviceGetUUID");
  s.get_util = s.sym<abi::DeviceGetUtilizationRatesFn>("nvmlDeviceGetUtilizationRates");
  s.get_mem = s.sym<abi::DeviceGetMemoryInfoFn>("nvmlDeviceGetMemoryInfo");
  s.get_mem_v2 = s.sym<abi::DeviceGetMemoryInfoV2Fn>("nvmlDeviceGetMemoryInfo_v2");
  s.get_temp = s.sym<abi::DeviceGetTemperatureFn>("nvmlDeviceGetTemperature");
  s.get_power = s.sym<abi::DeviceGetPowerUsageFn>("nvmlDeviceGetPowerUsage");
  s.get_energy = s.sym<abi::DeviceGetTotalEnergyConsumptionFn>("nvmlDeviceGetTotalEnergyConsumption");
  s.get_clock = s.sym<abi::DeviceGetClockInfoFn>("nvmlDeviceGetClockInfo");
  s.get_pcie = s.sym<abi::DeviceGetPcieThroughputFn>("nvmlDeviceGetPcieThroughput");
  s.get_clocks_event = s.sym<abi::DeviceGetClocksEventReasonsFn>("nvmlDeviceGetCurrentClocksEventReasons");
  if (!s.get_clocks_event)  // the name before NVML 12.2
    s.get_clocks_event =
        s.sym<abi::DeviceGetClocksEventReasonsFn>("nvmlDeviceGetCurrentClocksThrottleReasons");
  s.get_procs_v2 = s.sym<abi::DeviceGetProcessesV2Fn>("nvmlDeviceGetComputeRunningProcesses_v2");
  s.get_procs_v1 = s.sym<abi::DeviceGetProcessesV1Fn>("nvmlDeviceGetComputeRunningProcesses");

  unsigned count = 0;
  abi::Return crc = s.get_count(&count);
  if (crc != abi::kSuccess || count == 0) {
    std::string why = crc != abi::kSuccess ? "nvmlDeviceGetCount_v2 failed: " + s.err(crc)
                                           : std::string("NVML sees no GPU");
    s.shutdown();
    s.initialized = false;
    dlclose(s.lib);
    s.lib = nullptr;
    return why;
  }

  std::vector<DeviceState> all;
  std::vector<GpuIdentity> ids;
  for (unsigned i = 0; i < count; ++i) {
    DeviceState d;
    d.info.nvml_index = i;
    const abi::Return hrc = s.get_handle(i, &d.handle);
    if (hrc != abi::kSuccess) {
      note("nvml: device index " + std::to_string(i) + " skipped: nvmlDeviceGetHandleByIndex_v2: " +
           s.err(hrc));
      continue;
    }
    char buf[abi::kDeviceUuidBufferSize] = {};
    if (s.get_uuid && s.get_uuid(d.handle, buf, sizeof buf) == abi::kSuccess) d.info.uuid = buf;
    char name[abi::kDeviceNameBufferSize] = {};
    if (s.get_name && s.get_name(d.handle, name, sizeof name) == abi::kSuccess) d.info.name = name;
    ids.push_back({i, d.info.uuid});
    all.push_back(std::move(d));
  }
  const auto visible = s.options.cuda_visible_from_env ? cuda_visible_devices_from_env()
                                                       : s.options.cuda_visible_devices;
  const VisibleMapping map = map_cuda_visible_devices(visible, ids);
  if (!map.note.empty()) note("nvml: " + map.note);
  for (std::size_t o = 0; o < map.ordinal_to_gpu.size(); ++o) {
    DeviceState d = all[map.ordinal_to_gpu[o]];
    d.info.ordinal = static_cast<int>(o);
    d.info.device = cuda_device_name(static_cast<int>(o));
    if (!s.get_util) d.disabled[kUtil] = "missing symbol nvmlDeviceGetUtilizationRates";
    if (!s.get_mem && !s.get_mem_v2) d.disabled[kMemory] = "missing symbol nvmlDeviceGetMemoryInfo";
    if (!s.get_mem_v2) d.mem_v1_only = true;
    if (!s.get_temp) d.disabled[kTemperature] = "missing symbol nvmlDeviceGetTemperature";
    if (!s.get_power) d.disabled[kPower] = "missing symbol nvmlDeviceGetPowerUsage";
    if (!s.get_energy) d.disabled[kEnergy] = "missing symbol nvmlDeviceGetTotalEnergyConsumption";
    if (!s.get_clock) {
      d.disabled[kSmClock] = d.disabled[kMemClock] = "missing symbol nvmlDeviceGetClockInfo";
    }
    if (!s.get_pcie) {
      d.disabled[kPcieTx] = d.disabled[kPcieRx] = "missing symbol nvmlDeviceGetPcieThroughput";
    }
    if (!s.get_clocks_event)
      d.disabled[kClocksEvent] = "missing symbol nvmlDeviceGetCurrentClocksEventReasons";
    if (!s.get_procs_v2 && !s.get_procs_v1)
      d.disabled[kProcesses] = "missing symbol nvmlDeviceGetComputeRunningProcesses";
    s.infos.push_back(d.info);
    s.devs.push_back(std::move(d));
  }
  if (s.devs.empty()) {
    s.shutdown();
    s.initialized = false;
    dlclose(s.lib);
    s.lib = nullptr;
    return "no GPU is visible (CUDA_VISIBLE_DEVICES='" + visible.value_or("") + "', " +
           std::to_string(count) + " present)";
  }
  return "";
}

void NvmlSource::close() {
  auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.initialized && s.shutdown) s.shutdown();
  s.initialized = false;
  if (s.lib) dlclose(s.lib);
  s.lib = nullptr;
  // devs stays: unavailable_fields() is asked after the session stopped (handles are not used).
}

std::vector<GpuReading> NvmlSource::read(double t_s) {
  auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<GpuReading> out;
  if (!s.initialized) return out;
  std::vector<int> pids;
  if (s.options.followed_pids) pids = s.options.followed_pids();
  const std::set<unsigned> followed(pids.begin(), pids.end());

  char tbuf[32];
  std::snprintf(tbuf, sizeof tbuf, "%.2f", t_s);
  for (auto& d : s.devs) {
    if (d.lost) continue;
    GpuReading r;
    r.device = d.info.device;
    // Calls fn() for field f unless it is off; classifies the answer. True when a value came back.
    auto ok = [&](Field f, const char* fn_name, abi::Return rc) -> bool {
      if (rc == abi::kSuccess) return true;
      if (rc == abi::kErrorGpuIsLost || rc == abi::kErrorGpuNotFound) {
        d.lost = true;
        note("nvml: " + d.info.device + " (" + d.info.uuid + ") lost at t=" + tbuf + " s (" +
             fn_name + ": " + s.err(rc) + "); no further readings from it");
        return false;
      }
      if (rc == abi::kErrorNotSupported || rc == abi::kErrorNoPermission ||
          rc == abi::kErrorFunctionNotFound || rc == abi::kErrorInvalidArgument) {
        d.disabled[f] = std::string(fn_name) + ": " + s.err(rc);
        return false;
      }
      if (!d.transient_noted[f]) {
        d.transient_noted[f] = true;
        note("nvml: " + d.info.device + " " + kFieldMetric[f] + ": " + fn_name + " failed at t=" +
             tbuf + " s: " + s.err(rc) + " (that reading skipped; noted once)");
      }
      return false;
    };
    auto on = [&](Field f) { return !d.lost && d.disabled[f].empty(); };

    if (on(kUtil)) {
      abi::Utilization u{};
      if (ok(kUtil, "nvmlDeviceGetUtilizationRates", s.get_util(d.handle, &u))) {
        r.gpu_util_pct = u.gpu;
        r.mem_util_pct = u.memory;
      }
    }
    if (on(kMemory)) {
      bool done = false;
      if (!d.mem_v1_only) {
        abi::MemoryV2 m{};
        m.version = abi::kMemoryV2Version;
        const abi::Return rc = s.get_mem_v2(d.handle, &m);
        if (rc == abi::kErrorArgumentVersionMismatch || rc == abi::kErrorNotSupported ||
            rc == abi::kErrorFunctionNotFound) {
          d.mem_v1_only = true;
          note("nvml: " + d.info.device + ": nvmlDeviceGetMemoryInfo_v2 answered " + s.err(rc) +
               "; using nvmlDeviceGetMemoryInfo (v1: used includes driver-reserved memory)");
          if (!s.get_mem) d.disabled[kMemory] = "nvmlDeviceGetMemoryInfo_v2: " + s.err(rc);
        } else if (ok(kMemory, "nvmlDeviceGetMemoryInfo_v2", rc)) {
          r.mem_total_bytes = static_cast<double>(m.total);
          r.mem_used_bytes = static_cast<double>(m.used);
          r.mem_reserved_bytes = static_cast<double>(m.reserved);
          done = true;
        } else {
          done = true;  // classified by ok(): lost, disabled or skipped
        }
      }
      if (!done && d.mem_v1_only && on(kMemory)) {
        abi::Memory m{};
        if (ok(kMemory, "nvmlDeviceGetMemoryInfo", s.get_mem(d.handle, &m))) {
          r.mem_total_bytes = static_cast<double>(m.total);
          r.mem_used_bytes = static_cast<double>(m.used);
        }
      }
    }
    if (on(kTemperature)) {
      unsigned t = 0;
      if (ok(kTemperature, "nvmlDeviceGetTemperature", s.get_temp(d.handle, abi::kTemperatureGpu, &t)))
        r.temperature_c = t;
    }
    if (on(kPower)) {
      unsigned mw = 0;
      if (ok(kPower, "nvmlDeviceGetPowerUsage", s.get_power(d.handle, &mw))) r.power_w = mw / 1000.0;
    }
    if (on(kEnergy)) {
      unsigned long long mj = 0;
      if (ok(kEnergy, "nvmlDeviceGetTotalEnergyConsumption", s.get_energy(d.handle, &mj)))
        r.energy_j = static_cast<double>(mj) / 1000.0;
    }
    if (on(kSmClock)) {
      unsigned mhz = 0;
      if (ok(kSmClock, "nvmlDeviceGetClockInfo(SM)", s.get_clock(d.handle, abi::kClockSm, &mhz)))
        r.sm_clock_mhz = mhz;
    }
    if (on(kMemClock)) {
      unsigned mhz = 0;
      if (ok(kMemClock, "nvmlDeviceGetClockInfo(MEM)", s.get_clock(d.handle, abi::kClockMem, &mhz)))
        r.mem_clock_mhz = mhz;
    }
    if (on(kPcieTx)) {
      unsigned kb = 0;
      if (ok(kPcieTx, "nvmlDeviceGetPcieThroughput(TX)",
             s.get_pcie(d.handle, abi::kPcieUtilTxBytes, &kb)))
        r.pcie_tx_kb_s = kb;
    }
    if (on(kPcieRx)) {
      unsigned kb = 0;
      if (ok(kPcieRx, "nvmlDeviceGetPcieThroughput(RX)",
             s.get_pcie(d.handle, abi::kPcieUtilRxBytes, &kb)))
        r.pcie_rx_kb_s = kb;
    }
    if (on(kClocksEvent)) {
      unsigned long long mask = 0;
      if (ok(kClocksEvent, "nvmlDeviceGetCurrentClocksEventReasons",
             s.get_clocks_event(d.handle, &mask)))
        r.clocks_event_reasons = static_cast<double>(mask);
    }
    if (on(kProcesses)) {
      // Asks with room for 64 processes; on INSUFFICIENT_SIZE NVML says how many there are.
      unsigned n = 0;
      abi::Return rc = abi::kErrorUnknown;
      std::vector<std::pair<unsigned, unsigned long long>> procs;
      for (int attempt = 0; attempt < 3; ++attempt) {
        if (s.get_procs_v2) {
          if (s.proc_buf_v2.size() < 64) s.proc_buf_v2.resize(64);
          n = static_cast<unsigned>(s.proc_buf_v2.size());
          rc = s.get_procs_v2(d.handle, &n, s.proc_buf_v2.data());
          if (rc == abi::kErrorInsufficientSize) {
            s.proc_buf_v2.resize(n + 16);
            continue;
          }
          if (rc == abi::kSuccess)
            for (unsigned i = 0; i < n; ++i)
              procs.emplace_back(s.proc_buf_v2[i].pid, s.proc_buf_v2[i].used_gpu_memory);
        } else {
          if (s.proc_buf_v1.size() < 64) s.proc_buf_v1.resize(64);
          n = static_cast<unsigned>(s.proc_buf_v1.size());
          rc = s.get_procs_v1(d.handle, &n, s.proc_buf_v1.data());
          if (rc == abi::kErrorInsufficientSize) {
            s.proc_buf_v1.resize(n + 16);
            continue;
          }
          if (rc == abi::kSuccess)
            for (unsigned i = 0; i < n; ++i)
              procs.emplace_back(s.proc_buf_v1[i].pid, s.proc_buf_v1[i].used_gpu_memory);
        }
        break;
      }
      if (ok(kProcesses, "nvmlDeviceGetComputeRunningProcesses", rc)) {
        r.num_processes = static_cast<double>(procs.size());
        if (!followed.empty()) {
          double used = 0;
          for (const auto& [pid, bytes] : procs)
            if (followed.count(pid) && bytes != kValueNotAvailable) used += static_cast<double>(bytes);
          r.process_mem_used_bytes = used;
        }
      }
    }
    if (d.lost) continue;  // lost during this reading: what it gave before is dropped too
    out.push_back(std::move(r));
  }
  return out;
}

void NvmlSource::sample(double t_s, TimeSeries& out) {
  for (const auto& r : read(t_s))
    for (const auto& [metric, value] : r.fields()) out.append("nvml", r.device, metric, t_s, value);
}

std::map<std::string, std::map<std::string, std::string>> NvmlSource::unavailable_fields() const {
  const auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const auto& d : s.devs) {
    auto& m = out[d.info.device];
    for (int f = 0; f < kNumFields; ++f) {
      if (d.disabled[f].empty()) continue;
      m[kFieldMetric[f]] = d.disabled[f];
      if (f == kUtil) m["mem_util_pct"] = d.disabled[f];
    }
    if (d.lost) m["*"] = "device lost";
  }
  return out;
}

}  // namespace scalelab
