// All-reduce bus bandwidth over MPI on this machine, for gradient-bucket sizes 1..256 MiB.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_allreduce_busbw
//          [--min-mb 1] [--max-mb 256] [--max-iters 20] [--poll-sleep-us 20]
//
// As nccl-tests define it: algbw = bytes / time, busbw = algbw * 2(n-1)/n (the bandwidth each
// link needs for a ring all-reduce, comparable across rank counts). Time per size is the median
// over iterations of the slowest rank. Three ways to run the same fp32 sum all-reduce:
//   comm      MpiCommunicator::all_reduce as DDP issues it: MPI_Iallreduce on the communication
//             thread, polled with the default policy (spin 50 us, then sleep --poll-sleep-us,
//             default CommOptions' 20 us, between tests)
//   comm-spin the same, polling without sleeping (poll_sleep_us = 0)
//   blocking  MPI_Allreduce from the calling thread (OpenMPI's tuned collective): the reference
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "distributed/mpi_communicator.h"

#if SCALELAB_HAVE_MPI
#include <mpi.h>
#endif

using namespace scalelab;

int main(int argc, char** argv) {
#if !SCALELAB_HAVE_MPI
  std::printf("bench_allreduce_busbw: this build has no MPI (SCALELAB_WITH_MPI=OFF)\n");
  return 0;
#else
  double min_mb = 1, max_mb = 256;
  int max_iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--min-mb")) min_mb = std::stod(argv[i + 1]);
    if (!std::strcmp(argv[i], "--max-mb")) max_mb = std::stod(argv[i + 1]);
    if (!std::strcmp(argv[i], "--max-iters")) max_iters = std::stoi(argv[i + 1]);
  }
  CommOptions polled;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--poll-sleep-us")) polled.poll_sleep_us = std::stoi(argv[i + 1]);
  CommOptions spin;
  spin.poll_sleep_us = 0;
  auto comm = MpiCommunicator::create(polled);
  auto comm_spin = MpiCommunicator::create(spin);
  const int n = comm->world_size(), rank = comm->rank();
  if (n < 2 && rank == 0) std::printf("note: 1 rank; run under mpirun -np 2 for a meaningful figure\n");

  struct Variant {
    const char* name;
    std::function<void(float*, std::int64_t)> run;
  };
  std::vector<Variant> variants = {
      {"comm", [&](float* p, std::int64_t c) { comm->all_reduce(p, c, CommDType::kF32, ReduceOp::kSum); }},
      {"comm-spin", [&](float* p, std::int64_t c) { comm_spin->all_reduce(p, c, CommDType::kF32, ReduceOp::kSum); }},
      {"blocking", [&](float* p, std::int64_t c) {
         MPI_Allreduce(MPI_IN_PLACE, p, static_cast<int>(c), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
       }},
  };

  if (rank == 0) {
    std::printf("all-reduce (fp32 sum) over MPI, %d ranks, busbw = algbw * 2(n-1)/n; GB = 1e9 bytes; comm polls "
                "with %d us sleeps\n", n, polled.poll_sleep_us);
    std::printf("| size MiB | iters |");
    for (const auto& v : variants) std::printf(" %s ms | %s busbw GB/s |", v.name, v.name);
    std::printf("\n|---:|---:|");
    for (std::size_t i = 0; i < variants.size(); ++i) std::printf("---:|---:|");
    std::printf("\n");
  }
  for (double mb = min_mb; mb <= max_mb + 1e-9; mb *= 2) {
    const std::int64_t count = static_cast<std::int64_t>(mb * 1024 * 1024 / sizeof(float));
    std::vector<float> buf(static_cast<std::size_t>(count), 1.0f);
    const int iters = std::max(3, std::min(max_iters, static_cast<int>(512 / mb)));
    if (rank == 0) std::printf("| %g | %d |", mb, iters);
    for (const auto& v : variants) {
      v.run(buf.data(), count);  // warm-up (pages, connections)
      std::vector<double> times;
      for (int it = 0; it < iters; ++it) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = std::chrono::steady_clock::now();
        v.run(buf.data(), count);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        times.push_back(s);
      }
      std::sort(times.begin(), times.end());
      const double t = times[times.size() / 2];
      const double algbw = static_cast<double>(count) * sizeof(float) / t / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      if (rank == 0) std::printf(" %.2f | %.2f |", t * 1e3, busbw);
    }
    if (rank == 0) {
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  comm_spin.reset();
  comm.reset();
  return 0;
#endif
}
