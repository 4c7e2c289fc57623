// DDP overlap on this machine with a synthetic backward: how much of the gradient all-reduce the
// bucketed, overlapped reducer hides, and what it costs the compute (weak-scaling efficiency).
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_ddp_overlap
//          [--params-m 25] [--layers 12] [--gemm 384] [--gemms-per-layer 8] [--steps 5]
//          [--bucket-mb 25] [--poll-sleep-us 20]
//
// "Backward" is `layers` blocks of single-threaded GEMMs (OpenBLAS, gemm x gemm); after each
// block the layer's slice of a flat gradient buffer (params-m million fp32) is marked ready, from
// the last layer to the first, as the trainer will. Each step is timed three ways on every rank:
//   compute   the GEMMs alone (no reducer)
//   overlap   with GradReducer: buckets go out during backward, finish() waits for the rest
//   serial    compute, then one all-reduce of the whole buffer (no overlap)
// Efficiency = compute time / overlapped step time (what a 2-rank weak-scaling run keeps of one
// rank's throughput when the per-rank work is the same). Medians over steps, slowest rank.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "distributed/ddp.h"
#include "distributed/mpi_communicator.h"

using namespace scalelab;

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  double params_m = 25, bucket_mb = 25;
  int layers = 12, gemm = 384, gemms_per_layer = 8, steps = 5, poll_sleep_us = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--params-m") params_m = std::stod(argv[i + 1]);
    if (a == "--layers") layers = std::stoi(argv[i + 1]);
    if (a == "--gemm") gemm = std::stoi(argv[i + 1]);
    if (a == "--gemms-per-layer") gemms_per_layer = std::stoi(argv[i + 1]);
    if (a == "--steps") steps = std::stoi(argv[i + 1]);
    if (a == "--bucket-mb") bucket_mb = std::stod(argv[i + 1]);
    if (a == "--poll-sleep-us") poll_sleep_us = std::stoi(argv[i + 1]);
  }
  if (!MpiCommunicator::available()) {
    std::printf("bench_ddp_overlap: this build has no MPI\n");
    return 0;
  }
  openblas_set_num_threads(1);
  CommOptions opt;
  opt.poll_sleep_us = poll_sleep_us;
  auto comm = MpiCommunicator::create(opt);
  const int rank = comm->rank(), n = comm->world_size();
  const std::int64_t numel = static_cast<std::int64_t>(params_m * 1e6);
  std::vector<float> grads(static_cast<std::size_t>(numel), 1.0f);
  const std::size_t g2 = static_cast<std::size_t>(gemm) * static_cast<std::size_t>(gemm);
  std::vector<float> a(g2, 0.01f), b(g2, 0.02f), c(g2, 0.0f);
  auto layer_compute = [&] {
    for (int k = 0; k < gemms_per_layer; ++k)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, gemm, gemm, gemm, 1.0f, a.data(), gemm, b.data(), gemm,
                  0.0f, c.data(), gemm);
  };
  DdpOptions dopt;
  dopt.bucket_mb = bucket_mb;
  GradReducer red(*comm, grads.data(), numel, dopt);

  std::vector<double> t_compute, t_overlap, t_serial, hidden, comm_s, exposed;
  for (int s = 0; s < steps + 1; ++s) {  // step 0 warms up
    comm->barrier();
    double t0 = now_s();
    for (int l = layers - 1; l >= 0; --l) layer_compute();
    const double tc = now_s() - t0;

    comm->barrier();
    t0 = now_s();
    red.begin_step(true);
    for (int l = layers - 1; l >= 0; --l) {
      layer_compute();
      red.mark_ready(numel * l / layers, numel * (l + 1) / layers);
    }
    red.finish();
    const double to = now_s() - t0;

    comm->barrier();
    t0 = now_s();
    for (int l = layers - 1; l >= 0; --l) layer_compute();
    comm->all_reduce(grads.data(), numel, CommDType::kF32, ReduceOp::kAvg);
    const double ts = now_s() - t0;
    if (s == 0) continue;
    double v[3] = {tc, to, ts};
    comm->all_reduce(v, 3, CommDType::kF64, ReduceOp::kMax);
    t_compute.push_back(v[0]);
    t_overlap.push_back(v[1]);
    t_serial.push_back(v[2]);
    hidden.push_back(red.last_step().hidden_fraction());
    comm_s.push_back(red.last_step().comm_s);
    exposed.push_back(red.last_step().exposed_s);
  }
  if (rank == 0) {
    std::printf("DDP overlap, %d ranks, %.0fM fp32 gradients (%.0f MiB), %zu buckets of %.0f MiB (first 1 MiB), "
                "%d layers x %d GEMMs %dx%d, poll sleep %d us\n",
                n, params_m, numel * 4 / 1048576.0, red.buckets().size(), bucket_mb, layers, gemms_per_layer, gemm, gemm,
                poll_sleep_us);
    std::printf("| compute s | overlapped step s | serial step s | comm s | exposed comm s | hidden %% | efficiency %% (compute / overlapped) | efficiency %% without overlap |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const double tc = median(t_compute), to = median(t_overlap), ts = median(t_serial);
    std::printf("| %.3f | %.3f | %.3f | %.3f | %.3f | %.1f | %.1f | %.1f |\n", tc, to, ts, median(comm_s), median(exposed),
                100 * median(hidden), 100 * tc / to, 100 * tc / ts);
  }
  comm.reset();
  return 0;
}
