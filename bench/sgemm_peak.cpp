// Measures this machine's sgemm peak through the BLAS scalelab links (the denominator of the
// "effective GFLOP/s vs peak" figure). Prints the best GFLOP/s over a few square and
// transformer-shaped products at the given thread count.
//   build/bench/bench_sgemm_peak [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/parallel.h"
#include "kernels/matmul.h"

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  scalelab::set_num_threads(threads);
  struct Shape {
    int m, n, k;
  };
  const Shape shapes[] = {{2048, 2048, 2048}, {1024, 2048, 512}, {1024, 512, 2048}, {1024, 4096, 512}};
  double best = 0;
  for (const auto& s : shapes) {
    std::vector<float> a(static_cast<std::size_t>(s.m) * s.k, 0.001f), b(static_cast<std::size_t>(s.k) * s.n, 0.002f),
        c(static_cast<std::size_t>(s.m) * s.n);
    scalelab::kernels::gemm(false, true, s.m, s.n, s.k, 1, a.data(), s.k, b.data(), s.k, 0, c.data(), s.n);
    double best_shape = 0;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      scalelab::kernels::gemm(false, true, s.m, s.n, s.k, 1, a.data(), s.k, b.data(), s.k, 0, c.data(), s.n);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best_shape = std::max(best_shape, 2.0 * s.m * s.n * s.k / dt / 1e9);
    }
    std::printf("sgemm %5d x %5d x %5d: %7.1f GFLOP/s\n", s.m, s.n, s.k, best_shape);
    best = std::max(best, best_shape);
  }
  std::printf("sgemm peak (%d threads): %.1f GFLOP/s\n", scalelab::num_threads(), best);
  return 0;
}
