// What `--trace` costs a training step: the same run without and with the timeline, in
// alternating rounds (drift in the machine's load hits both alike), with a second arm without it
// as a control for the noise; then the tracer's own cost per event, measured in isolation.
// Prints the median step times side by side.
//
//   build/bench/bench_trace_overhead [--model llama-tiny] [--seq-len 64] [--micro-batch-size 4]
//                                    [--steps 8] [--rounds 3] [--threads 0]
//
// Goal: overhead <= 3 % of the step time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/trace.h"
#include "train/trainer.h"

using namespace scalelab;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  TrainOptions o;
  o.model = "llama-tiny";
  o.seq_len = 64;
  o.micro_batch_size = 4;
  o.max_steps = 8;
  o.quiet = true;
  o.bench_warmup_steps = 2;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--model") o.model = argv[i + 1];
    else if (k == "--seq-len") o.seq_len = std::atoll(argv[i + 1]);
    else if (k == "--micro-batch-size") o.micro_batch_size = std::atoll(argv[i + 1]);
    else if (k == "--steps") o.max_steps = std::atoll(argv[i + 1]);
    else if (k == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (k == "--threads") o.threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const std::string trace = (std::filesystem::temp_directory_path() / "bench_trace_overhead.json").string();
  std::vector<double> plain, traced, control;
  std::size_t events = 0;
  for (int r = 0; r < rounds; ++r) {
    TrainOptions p = o;
    plain.push_back(run_training(p).step_time_s);
    TrainOptions t = o;
    t.trace = trace;
    traced.push_back(run_training(t).step_time_s);
    control.push_back(run_training(p).step_time_s);
  }
  {
    // Events per step, from the last traced run's file.
    std::ifstream in(trace);
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& e : j["traceEvents"])
      if (e["ph"] != "M") ++events;
  }
  // The tracer's cost per event in isolation (a complete event from a scope's two clock reads).
  Tracer tr({});
  const int n = 200000;
  const auto s = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    const auto a = Tracer::Clock::now();
    tr.complete("matmul", "op", a, Tracer::Clock::now(), "forward");
  }
  const double per_event_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - s).count() / n;
  std::printf("workload: %s, seq %lld x micro-batch %lld, %lld steps (%lld warm-up) per run, %d rounds\n", o.model.c_str(),
              static_cast<long long>(o.seq_len), static_cast<long long>(o.micro_batch_size),
              static_cast<long long>(o.max_steps), static_cast<long long>(o.bench_warmup_steps), rounds);
  const double mp = median(plain), mt = median(traced), mc = median(control);
  std::printf("%-26s %12s %12s %12s\n", "step time (median of runs)", "without", "--trace", "control");
  std::printf("%-26s %10.2f ms %10.2f ms %10.2f ms\n", "", 1e3 * mp, 1e3 * mt, 1e3 * mc);
  std::printf("overhead of --trace: %+.2f%% (control, a second arm without it: %+.2f%%, the noise here)\n",
              100.0 * (mt - mp) / mp, 100.0 * (mc - mp) / mp);
  const double per_step = static_cast<double>(events) / static_cast<double>(o.max_steps);
  std::printf("tracer cost in isolation: %.0f ns per event x %.0f events per step = %.3f ms, %.2f%% of the step\n",
              per_event_ns, per_step, per_event_ns * per_step * 1e-6, 100.0 * per_event_ns * per_step * 1e-9 / mp);
  std::filesystem::remove(trace);
  return 0;
}
