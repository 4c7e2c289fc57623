#include "telemetry/sampler.h"

#include <time.h>

#include "core/error.h"

namespace scalelab {
namespace {

double this_thread_cpu_s() {
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

Sampler::Sampler(std::chrono::milliseconds interval, std::function<void()> tick)
    : interval_(interval), tick_(std::move(tick)) {
  SCALELAB_CHECK_INPUT(interval_.count() > 0,
                       "[telemetry] sampling interval must be positive (got " +
                           std::to_string(interval_.count()) + " ms) — pass e.g. 200");
}

Sampler::~Sampler() { stop(); }

void Sampler::start() {
  SCALELAB_CHECK(!thread_.joinable(), "[telemetry] Sampler::start called twice — this is a bug");
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = false;
  }
  thread_ = std::thread(&Sampler::run, this);
}

void Sampler::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Sampler::run() {
  auto one_tick = [&]() -> bool {
    try {
      tick_();
    } catch (...) {
      error_ = std::current_exception();
      return false;
    }
    ++ticks_;
    thread_cpu_s_ = this_thread_cpu_s();
    return true;
  };
  if (!one_tick()) return;
  auto next = std::chrono::steady_clock::now() + interval_;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_until(lock, next, [&] { return stop_requested_; })) break;
    }
    if (!one_tick()) return;
    next += interval_;
    const auto now = std::chrono::steady_clock::now();
    while (next <= now) next += interval_;  // skip ticks missed while this one ran long
  }
  one_tick();  // the final reading, at stop()
}

}  // namespace scalelab
