#include "distributed/zero.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"

namespace scalelab {
namespace {
double since(CommClock::time_point t) { return std::chrono::duration<double>(CommClock::now() - t).count(); }
}  // namespace

double sum_of_squares(const float* x, std::int64_t n) {
  if (n <= 0) return 0.0;
  const int threads = n >= (1 << 16) ? num_threads() : 1;
  std::vector<double> partial(static_cast<std::size_t>(threads), 0.0);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const std::int64_t b = n * t / threads, e = n * (t + 1) / threads;
    double s = 0;
    for (std::int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[static_cast<std::size_t>(t)] = s;
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

std::vector<std::int64_t> ZeroOptimizer::shard_counts(std::int64_t numel, int world_size) {
  return even_counts(numel, world_size, 16);
}

ZeroOptimizer::ZeroOptimizer(Communicator& comm, float* params, float* grads, std::int64_t numel, UpdateRange update,
                             float* recv, bool average)
    : comm_(comm), params_(params), grads_(grads), numel_(numel), update_(std::move(update)), average_(average) {
  SCALELAB_CHECK(numel >= 0 && (numel == 0 || (params && grads)), "[zero] ZeroOptimizer: no parameter/gradient buffer");
  SCALELAB_CHECK(static_cast<bool>(update_), "[zero] ZeroOptimizer: no update function");
  SCALELAB_CHECK(!comm.device_memory(),
                 "[zero] ZeRO-1 over device memory (NCCL) is not implemented yet — use --zero 0 with --device cuda");
  counts_ = shard_counts(numel, comm.world_size());
  shard_begin_ = segment_offset(counts_, comm.rank());
  shard_end_ = shard_begin_ + counts_[static_cast<std::size_t>(comm.rank())];
  if (comm.world_size() > 1) {
    if (recv == nullptr) {
      own_recv_.resize(static_cast<std::size_t>(shard_numel()));
      recv = own_recv_.data();
    }
    recv_ = recv;
  }
}

double ZeroOptimizer::reduce_gradients() {
  const auto t0 = CommClock::now();
  if (comm_.world_size() > 1) {
    comm_.reduce_scatter(grads_, recv_, counts_, CommDType::kF32, average_ ? ReduceOp::kAvg : ReduceOp::kSum);
    if (shard_numel() > 0)
      std::memcpy(grads_ + shard_begin_, recv_, static_cast<std::size_t>(shard_numel()) * sizeof(float));
  }
  const double sq = comm_.all_reduce_value(sum_of_squares(grads_ + shard_begin_, shard_numel()), ReduceOp::kSum);
  reduced_ = true;
  stats_.reduce_scatter_s += since(t0);
  return std::sqrt(sq);
}

void ZeroOptimizer::update_and_gather() {
  SCALELAB_CHECK(reduced_, "[zero] update_and_gather before reduce_gradients — reduce the gradients first");
  reduced_ = false;
  const auto t0 = CommClock::now();
  if (shard_end_ > shard_begin_) update_(shard_begin_, shard_end_);
  stats_.update_s += since(t0);
  const auto t1 = CommClock::now();
  if (comm_.world_size() > 1) comm_.all_gather(params_, counts_, CommDType::kF32);
  stats_.all_gather_s += since(t1);
  ++stats_.steps;
}

}  // namespace scalelab
