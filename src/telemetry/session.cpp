#include "telemetry/session.h"

#include <time.h>

#include <cstdio>

#include "core/error.h"
#include "telemetry/csv_writer.h"
#include "telemetry/host_source.h"
#include "telemetry/nvidia_smi.h"
#include "telemetry/process_source.h"
#include "telemetry/summary.h"

namespace scalelab {

using nlohmann::json;

namespace {

double thread_cpu_now() {
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

TelemetrySession::TelemetrySession(TelemetryOptions options) : options_(std::move(options)) {
  SCALELAB_CHECK_INPUT(options_.interval.count() > 0,
                       "[telemetry] --telemetry-interval must be positive (got " +
                           std::to_string(options_.interval.count()) + " ms) — pass e.g. 200");
}

TelemetrySession::~TelemetrySession() { stop(); }

void TelemetrySession::open_sources() {
  if (opened_) return;
  opened_ = true;

  // Reading order within a tick: the process tree first (NVML's per-process memory uses it).
  std::vector<std::unique_ptr<TelemetrySource>> candidates;
  std::map<std::string, bool> enabled;
  if (options_.process) {
    ProcessSource::Options po;
    po.root_pid = options_.root_pid;
    po.follow_children = options_.follow_children;
    po.proc_root = options_.proc_root;
    po.exclude = [this] {
      const pid_t p = smi_ ? smi_->child_pid() : -1;
      return p > 0 ? std::vector<int>{static_cast<int>(p)} : std::vector<int>{};
    };
    auto p = std::make_unique<ProcessSource>(po);
    process_ = p.get();
    candidates.push_back(std::move(p));
  } else {
    status_["process"] = "disabled";
  }
  if (options_.host) {
    HostSource::Options ho;
    ho.proc_root = options_.proc_root;
    ho.sys_root = options_.sys_root;
    candidates.push_back(std::make_unique<HostSource>(ho));
  } else {
    status_["host"] = "disabled";
  }
  if (!options_.engine.empty()) {
    candidates.push_back(std::make_unique<EngineSource>(options_.engine));
  } else {
    status_["engine"] = "disabled";
  }
  if (options_.nvml) {
    NvmlSource::Options no;
    no.library = options_.nvml_library;
    no.cuda_visible_from_env = options_.cuda_visible_from_env;
    no.cuda_visible_devices = options_.cuda_visible_devices;
    // process_ is settled (kept or dropped) before the first reading, as it opens first.
    no.followed_pids = [this] { return process_ ? process_->pids() : std::vector<int>{}; };
    auto n = std::make_unique<NvmlSource>(no);
    nvml_ = n.get();
    candidates.push_back(std::move(n));
  } else {
    status_["nvml"] = "disabled";
  }
  if (options_.nvidia_smi) {
    NvidiaSmiSource::Options so;
    so.path = options_.nvidia_smi_path;
    so.interval = options_.interval;
    so.cuda_visible_from_env = options_.cuda_visible_from_env;
    so.cuda_visible_devices = options_.cuda_visible_devices;
    auto s = std::make_unique<NvidiaSmiSource>(so);
    smi_ = s.get();
    candidates.push_back(std::move(s));
  } else {
    status_["nvidia-smi"] = "disabled";
  }

  for (auto& src : candidates) {
    std::string why;
    try {
      why = src->open();
    } catch (const std::exception& e) {
      why = e.what();
    }
    const std::string name = src->name();
    {
      // Notes from open() (a device skipped, RAPL absent) come before the verdict.
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& n : src->take_notes()) notes_.push_back(std::move(n));
    }
    if (why.empty()) {
      status_[name] = "ok";
      sources_.push_back(std::move(src));
      continue;
    }
    status_[name] = "unavailable: " + why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      notes_.push_back(name + " unavailable: " + why);
    }
    if (options_.report_unavailable)
      std::fprintf(stderr, "%s: %s unavailable: %s\n", options_.report_prefix.c_str(), name.c_str(),
                   why.c_str());
    if (src.get() == nvml_) nvml_ = nullptr;
    if (src.get() == smi_) smi_ = nullptr;
    if (src.get() == process_) process_ = nullptr;
    src->close();
  }
  // t = 0 is when every source is ready (probing nvidia-smi can take a while).
  t0_ = TelemetryClock::now();
  start_unix_s_ =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& src : sources_) src->begin(t0_, series_);
}

void TelemetrySession::collect_notes() {
  std::vector<std::string> fresh;
  for (auto& s : sources_)
    for (auto& n : s->take_notes()) fresh.push_back(std::move(n));
  if (fresh.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& n : fresh) notes_.push_back(std::move(n));
}

void TelemetrySession::tick() {
  std::lock_guard<std::mutex> lock(tick_mu_);
  const double t_s = std::chrono::duration<double>(TelemetryClock::now() - t0_).count();
  for (auto& s : sources_) s->sample(t_s, series_);
  collect_notes();
  std::lock_guard<std::mutex> l2(mu_);
  ++readings_;
}

void TelemetrySession::start() {
  SCALELAB_CHECK(!sampler_ && !closed_,
                 "[telemetry] TelemetrySession::start called twice or after stop — this is a bug");
  open_sources();
  sampler_ = std::make_unique<Sampler>(options_.interval, [this] { tick(); });
  sampler_->start();
}

void TelemetrySession::sample_now() {
  SCALELAB_CHECK(!closed_, "[telemetry] sample_now after stop — this is a bug");
  const double c0 = thread_cpu_now();
  open_sources();
  tick();
  std::lock_guard<std::mutex> lock(mu_);
  manual_cpu_s_ += thread_cpu_now() - c0;
}

void TelemetrySession::stop() {
  if (closed_) return;
  if (sampler_) sampler_->stop();  // takes the final reading
  if (!opened_) {
    closed_ = true;
    return;
  }
  for (auto& s : sources_) s->close();
  collect_notes();
  closed_ = true;
}

bool TelemetrySession::running() const { return sampler_ && sampler_->running(); }

std::vector<Sample> TelemetrySession::samples() const { return series_.samples(); }

void TelemetrySession::write_csv(const std::string& path) const {
  write_telemetry_csv(series_.samples(), path);
}

std::map<std::string, std::string> TelemetrySession::source_status() const { return status_; }

std::vector<std::string> TelemetrySession::notes() const {
  const_cast<TelemetrySession*>(this)->collect_notes();
  std::lock_guard<std::mutex> lock(mu_);
  return notes_;
}

std::vector<GpuInfo> TelemetrySession::gpus() const {
  return nvml_ ? nvml_->devices() : std::vector<GpuInfo>{};
}

std::size_t TelemetrySession::readings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return readings_;
}

double TelemetrySession::elapsed_s() const {
  if (!opened_) return 0;
  return std::chrono::duration<double>(TelemetryClock::now() - t0_).count();
}

double TelemetrySession::sampling_cpu_s() const {
  double s = sampler_ ? sampler_->thread_cpu_s() : 0.0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s += manual_cpu_s_;
  }
  if (smi_) s += smi_->child_cpu_s();
  return s;
}

json TelemetrySession::summary(std::optional<double> tokens) const {
  SummaryOptions so;
  so.tokens = tokens;
  so.align_tolerance_s = 0.5 * std::chrono::duration<double>(options_.interval).count();
  json j = summarize(series_.series(), so);
  j["interval_ms"] = options_.interval.count();
  j["start_unix_s"] = start_unix_s_;
  j["readings"] = readings();
  j["root_pid"] = process_ ? json(process_->root_pid()) : json(nullptr);
  j["sources"] = status_;
  j["notes"] = notes();
  // Which GPU each device is, and the fields it does not give.
  for (const auto& g : gpus()) {
    auto& d = j["devices"][g.device];
    d["name"] = g.name;
    d["uuid"] = g.uuid;
    d["nvml_index"] = g.nvml_index;
  }
  if (nvml_) {
    for (const auto& [dev, fields] : nvml_->unavailable_fields())
      if (!fields.empty()) j["devices"][dev]["nvml_unavailable_fields"] = fields;
  }
  const double cpu = sampling_cpu_s();
  const std::size_t n = readings();
  j["sampling"] = {{"cpu_s", cpu},
                   {"cpu_ms_per_reading", n ? json(1000.0 * cpu / static_cast<double>(n)) : json(nullptr)},
                   {"nvidia_smi_cpu_s", smi_ ? json(smi_->child_cpu_s()) : json(nullptr)}};
  return j;
}

}  // namespace scalelab
