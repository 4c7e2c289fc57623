#pragma once
// A thread that calls a function at a fixed interval until stopped.
//
// The first tick runs as soon as the thread starts, then one every `interval` on a fixed grid
// (a late tick does not shift the following ones; ticks missed while one ran long are skipped),
// and one final tick when stop() is called, so a session's series always cover its whole span.
// stop() wakes the thread through a condition variable (no sleeping it out) and joins it; the
// tick function is never running after stop() returns. The tick function must not throw (the
// sources never do); if it does, the exception is kept and the thread ends.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace scalelab {

class Sampler {
 public:
  Sampler(std::chrono::milliseconds interval, std::function<void()> tick);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  void start();  // at most once
  void stop();   // idempotent; safe without start()

  bool running() const { return thread_.joinable(); }
  std::size_t ticks() const { return ticks_.load(); }
  // CPU time the sampler thread itself used, in seconds (what sampling costs the process).
  double thread_cpu_s() const { return thread_cpu_s_.load(); }
  // The exception a tick threw, if any (the thread ended there).
  std::exception_ptr error() const { return error_; }

 private:
  void run();

  std::chrono::milliseconds interval_;
  std::function<void()> tick_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_requested_ = false;
  std::atomic<std::size_t> ticks_{0};
  std::atomic<double> thread_cpu_s_{0};
  std::exception_ptr error_;
};

}  // namespace scalelab
