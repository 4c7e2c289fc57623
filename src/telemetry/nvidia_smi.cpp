#include "telemetry/nvidia_smi.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "core/subprocess.h"
#include "telemetry/cuda_visible.h"
#include "telemetry/proc.h"

namespace scalelab {

const std::vector<NvidiaSmiField>& nvidia_smi_fields() {
  static const std::vector<NvidiaSmiField> kFields = {
      {"index", "", 1},
      {"uuid", "", 1},
      {"name", "", 1},
      {"utilization.gpu", "gpu_util_pct", 1},
      {"utilization.memory", "mem_util_pct", 1},
      {"memory.total", "mem_total_bytes", 1024.0 * 1024.0},  // MiB
      {"memory.used", "mem_used_bytes", 1024.0 * 1024.0},    // MiB
      {"temperature.gpu", "temperature_c", 1},
      {"power.draw", "power_w", 1},
      {"clocks.sm", "sm_clock_mhz", 1},
      {"clocks.mem", "mem_clock_mhz", 1},
  };
  return kFields;
}

std::string nvidia_smi_query_argument() {
  std::string q = "--query-gpu=";
  bool first = true;
  for (const auto& f : nvidia_smi_fields()) {
    if (!first) q += ",";
    q += f.query;
    first = false;
  }
  return q;
}

namespace {

std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == ',') {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(trim(cur));
  return out;
}

std::optional<double> parse_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0') return std::nullopt;
  return v;
}

}  // namespace

bool nvidia_smi_value_missing(const std::string& text) {
  const std::string t = trim(text);
  if (t.empty()) return true;
  if (t.front() == '[' && t.back() == ']') return true;  // [N/A], [Not Supported], [Unknown Error]
  return t == "N/A" || t == "Not Supported";
}

std::optional<NvidiaSmiRow> parse_nvidia_smi_line(const std::string& line) {
  const auto& fields = nvidia_smi_fields();
  const auto cols = split_commas(line);
  // GPU names do not contain commas; any other column count is not our data line.
  if (cols.size() != fields.size()) return std::nullopt;
  NvidiaSmiRow row;
  const auto index = parse_number(cols[0]);
  if (!index || *index < 0 || cols[1].rfind("GPU-", 0) != 0) return std::nullopt;
  row.index = static_cast<unsigned>(*index);
  row.uuid = cols[1];
  row.name = cols[2];
  for (std::size_t i = 3; i < fields.size(); ++i) {
    if (nvidia_smi_value_missing(cols[i])) continue;
    const auto v = parse_number(cols[i]);
    if (!v) return std::nullopt;  // neither a number nor a placeholder: not our line
    row.values.emplace_back(fields[i].metric, *v * fields[i].scale);
  }
  return row;
}

NvidiaSmiSource::NvidiaSmiSource(Options options) : options_(std::move(options)) {}

NvidiaSmiSource::~NvidiaSmiSource() { close(); }

std::string NvidiaSmiSource::open() {
  std::string name = options_.path;
  if (name.empty()) {
    const char* env = std::getenv("SCALELAB_NVIDIA_SMI");
    name = env && *env ? env : "nvidia-smi";
  }
  exe_ = find_executable(name);
  if (exe_.empty()) return name + " not found (or not executable)";

  // Probe: which GPUs, and does nvidia-smi work at all (it prints why not on stdout).
  SubprocessSpec probe_spec;
  probe_spec.argv = {exe_, "--query-gpu=index,uuid", "--format=csv,noheader,nounits"};
  probe_spec.own_process_group = false;  // a short query: Ctrl-C at the terminal may end it too
  probe_spec.timeout_s = 10;
  probe_spec.kill_grace_s = 0.2;
  SubprocessResult probe;
  try {
    probe = run_subprocess(probe_spec);
  } catch (const Error& e) {
    return e.what();
  }
  if (!probe.started) return exe_ + ": " + probe.start_error;
  if (probe.timed_out) return exe_ + " did not answer within 10 s";
  std::vector<GpuIdentity> ids;
  {
    std::istringstream in(probe.output);
    std::string line;
    while (std::getline(in, line)) {
      const auto cols = split_commas(line);
      const auto idx = cols.size() == 2 ? parse_number(cols[0]) : std::nullopt;
      if (idx && cols[1].rfind("GPU-", 0) == 0) ids.push_back({static_cast<unsigned>(*idx), cols[1]});
    }
  }
  if (!probe.exited() || probe.exit_code() != 0 || ids.empty()) {
    std::string first = trim(probe.output.substr(0, probe.output.find('\n')));
    if (first.empty()) first = "no output";
    return exe_ + " failed (" +
           (probe.exited() ? "exit status " + std::to_string(probe.exit_code()) : std::string("killed")) +
           "): " + first;
  }
  const auto visible = options_.cuda_visible_from_env ? cuda_visible_devices_from_env()
                                                      : options_.cuda_visible_devices;
  const VisibleMapping map = map_cuda_visible_devices(visible, ids);
  if (!map.note.empty()) note("nvidia-smi: " + map.note);
  for (std::size_t o = 0; o < map.ordinal_to_gpu.size(); ++o)
    device_by_index_[ids[map.ordinal_to_gpu[o]].index] = cuda_device_name(static_cast<int>(o));
  if (device_by_index_.empty()) return "no GPU is visible (CUDA_VISIBLE_DEVICES)";

  return "";
}

void NvidiaSmiSource::begin(TelemetryClock::time_point t0, TimeSeries& out) {
  if (thread_.joinable() || exe_.empty() || device_by_index_.empty()) return;
  const long ms = std::max<long>(1, static_cast<long>(options_.interval.count()));
  SubprocessSpec spec;
  spec.argv = {exe_, nvidia_smi_query_argument(), "--format=csv,noheader,nounits", "-lms", std::to_string(ms)};
  spec.own_process_group = false;  // in the host's group, as a helper of the observed run
  spec.die_with_parent = false;    // outlives this call: read by the reader thread, ended by close()
  Subprocess p;
  try {
    p = Subprocess::start(spec);
  } catch (const Error& e) {
    note(std::string("nvidia-smi: cannot start the stream: ") + e.what() + "; no readings from it");
    ended_ = true;
    return;
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    p.terminate(std::chrono::milliseconds(500));
    note("nvidia-smi: eventfd failed; no readings from it");
    ended_ = true;
    return;
  }
  child_ = std::move(p);
  pid_ = child_.pid();
  stopping_ = false;
  ended_ = false;
  thread_ = std::thread(&NvidiaSmiSource::reader, this, t0, &out);
}

void NvidiaSmiSource::reader(TelemetryClock::time_point t0, TimeSeries* out) {
  std::string pending;
  bool noted_bad_line = false;
  char buf[8192];
  for (;;) {
    pollfd fds[2] = {{child_.output_fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int pr = ::poll(fds, 2, -1);
    if (pr < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents) break;  // close() asked us to stop
    const ssize_t n = ::read(child_.output_fd(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: nvidia-smi exited
    const double t_s = std::chrono::duration<double>(TelemetryClock::now() - t0).count();
    pending.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      const std::string line = trim(pending.substr(0, nl));
      pending.erase(0, nl + 1);
      if (line.empty()) continue;
      const auto row = parse_nvidia_smi_line(line);
      if (!row) {
        if (!noted_bad_line) {
          noted_bad_line = true;
          note("nvidia-smi: unexpected output (ignored; noted once): " + line);
        }
        continue;
      }
      const auto dev = device_by_index_.find(row->index);
      if (dev == device_by_index_.end()) continue;  // a GPU the observed process does not see
      for (const auto& [metric, value] : row->values)
        out->append("nvidia-smi", dev->second, metric, t_s, value);
      ++lines_parsed_;
    }
  }
  if (!stopping_.load()) {
    // The stream ended by itself: record why, and reap the child here (close() then has nothing
    // left to do). A zombie's /proc entry still has its CPU times.
    if (auto st = read_pid_stat(pid_)) {
      child_cpu_s_ = static_cast<double>(st->utime + st->stime) / clock_ticks_per_second();
    }
    const auto status = child_.wait_for(std::chrono::milliseconds(1000));
    const double t_s = std::chrono::duration<double>(TelemetryClock::now() - t0).count();
    char tbuf[32];
    std::snprintf(tbuf, sizeof tbuf, "%.2f", t_s);
    std::string how = "still running";
    if (status && status->exited) how = "exit status " + std::to_string(status->code);
    if (status && !status->exited) how = "signal " + std::to_string(status->signal);
    if (status) pid_ = -1;
    note("nvidia-smi: stream ended at t=" + std::string(tbuf) + " s (" + how +
         "); no further readings from it");
  }
  ended_ = true;
}

void NvidiaSmiSource::close() {
  if (thread_.joinable()) {
    stopping_ = true;
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  if (child_.valid() && !child_.reaped()) {
    if (auto st = read_pid_stat(child_.pid())) {
      child_cpu_s_ = static_cast<double>(st->utime + st->stime) / clock_ticks_per_second();
    }
    child_.terminate(std::chrono::milliseconds(1000));
  }
  pid_ = -1;
  child_ = Subprocess();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

}  // namespace scalelab
