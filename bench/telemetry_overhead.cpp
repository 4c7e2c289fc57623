// What sampling costs a CPU-bound run: a fixed sgemm loop (OpenBLAS) timed without telemetry and
// with a TelemetrySession sampling every source at the given interval, in alternating rounds
// (so drift in the machine's load hits both alike), with a second arm without telemetry as a
// control for the noise. Prints the median round times, the
// throughput overhead, and the sampler's own CPU time (the cost that does not depend on noise).
//
//   build/bench/bench_telemetry_overhead [--rounds N] [--round-seconds S] [--interval MS] [--n SIZE]
//
// Goal: overhead < 1% at 200 ms.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "telemetry/session.h"

using namespace scalelab;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Workload {
  int n;
  std::vector<float> a, b, c;
  explicit Workload(int size) : n(size), a(size * size), b(size * size), c(size * size) {
    for (int i = 0; i < n * n; ++i) {
      a[i] = static_cast<float>((i * 7) % 13) / 13.0f;
      b[i] = static_cast<float>((i * 5) % 11) / 11.0f;
    }
  }
  void run(int iterations) {
    for (int i = 0; i < iterations; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                  n, 0.0f, c.data(), n);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, interval_ms = 200, size = 512;
  double round_seconds = 1.5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (k == "--round-seconds") round_seconds = std::atof(argv[i + 1]);
    else if (k == "--interval") interval_ms = std::atoi(argv[i + 1]);
    else if (k == "--n") size = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  Workload w(size);
  // Calibrate: iterations for one round of about round_seconds.
  w.run(3);
  const double t0 = now_s();
  int probe = 0;
  while (now_s() - t0 < 0.3) {
    w.run(1);
    ++probe;
  }
  const int iterations = std::max(1, static_cast<int>(probe * round_seconds / (now_s() - t0)));
  std::printf("workload: %d x sgemm %dx%d per round (%.1f GFLOP), %d threads, %d rounds, "
              "sampling every %d ms\n",
              iterations, size, size, 2.0 * size * size * size * iterations * 1e-9, num_threads(),
              rounds, interval_ms);

  std::vector<double> plain, control, sampled;
  double sampling_cpu = 0, sampled_wall = 0;
  std::size_t readings = 0;
  std::map<std::string, std::string> status;
  for (int r = 0; r < rounds; ++r) {
    {
      const double s = now_s();
      w.run(iterations);
      plain.push_back(now_s() - s);
    }
    {
      TelemetryOptions o;
      o.interval = std::chrono::milliseconds(interval_ms);
      o.report_unavailable = r == 0;
      TelemetrySession session(o);
      const double s = now_s();
      session.start();
      w.run(iterations);
      session.stop();
      const double dt = now_s() - s;
      sampled.push_back(dt);
      sampled_wall += dt;
      sampling_cpu += session.sampling_cpu_s();
      readings += session.readings();
      status = session.source_status();
    }
    {
      // A second run without telemetry: how much two identical arms differ here (the noise).
      const double s = now_s();
      w.run(iterations);
      control.push_back(now_s() - s);
    }
  }
  std::printf("sources:");
  for (const auto& [k, v] : status) std::printf(" %s=%s", k.c_str(), v.substr(0, v.find(':')).c_str());
  std::printf("\n");
  const double mp = median(plain), ms = median(sampled);
  std::printf("round time, median: without %.4f s, with %.4f s (min %.4f / %.4f)\n", mp, ms,
              *std::min_element(plain.begin(), plain.end()),
              *std::min_element(sampled.begin(), sampled.end()));
  const double mc = median(control);
  std::printf("throughput overhead: %+.2f%% (control: a second arm without telemetry differs by "
              "%+.2f%%, the noise of this machine)\n",
              100.0 * (ms - mp) / mp, 100.0 * (mc - mp) / mp);
  std::printf("sampler CPU: %.3f ms per reading, %.3f%% of one core, %.4f%% of the %d cores in use\n",
              1000.0 * sampling_cpu / static_cast<double>(readings), 100.0 * sampling_cpu / sampled_wall,
              100.0 * sampling_cpu / (sampled_wall * num_threads()), num_threads());
  return 0;
}
