#pragma once
// Multi-threading for CPU kernels: OpenMP underneath (OpenBLAS is linked in its OpenMP build, so
// GEMMs and our loops share one pool of threads). Work is split statically, so results are the
// same bit for bit from run to run at the same thread count.
#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace scalelab {

// Sets the threads used by our kernels and by BLAS. n <= 0 means all cores.
void set_num_threads(int n);
int num_threads();

// Below this many elements of work a loop runs on one thread: starting and joining a parallel
// region costs microseconds, and idle OpenMP threads spin, which on a loaded machine steals the
// core the working thread needs.
inline constexpr std::int64_t kParallelMinElements = std::int64_t{1} << 16;

// The grain (in rows) of a loop over rows of `row_elements` elements each.
inline std::int64_t row_grain(std::int64_t row_elements) {
  return std::max<std::int64_t>(1, kParallelMinElements / std::max<std::int64_t>(1, row_elements));
}

// Calls fn(begin, end) on disjoint chunks covering [0, n), in parallel when n >= grain.
template <class F>
void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
  if (n <= 0) return;
  const int nt = omp_get_max_threads();
  if (nt <= 1 || n < grain || n < 2) {
    fn(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t k = omp_get_num_threads();
    const std::int64_t begin = n * t / k;
    const std::int64_t end = n * (t + 1) / k;
    if (begin < end) fn(begin, end);
  }
}

}  // namespace scalelab
