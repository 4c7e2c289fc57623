#include "distributed/single_communicator.h"

#include <cstring>

#include "core/error.h"

namespace scalelab {

std::unique_ptr<CommWork> SingleCommunicator::all_reduce_async(void*, std::int64_t count,
                                                               CommDType dtype, ReduceOp op) {
  SCALELAB_CHECK(count >= 0, "[dist] all_reduce: negative count " + std::to_string(count));
  check_reduce("all_reduce", dtype, op);
  return std::make_unique<CompletedWork>();
}

std::unique_ptr<CommWork> SingleCommunicator::broadcast_async(void*, std::int64_t count, CommDType,
                                                              int root) {
  SCALELAB_CHECK(count >= 0, "[dist] broadcast: negative count " + std::to_string(count));
  SCALELAB_CHECK(root == 0, "[dist] broadcast: root " + std::to_string(root) +
                                " outside a world of 1 rank");
  return std::make_unique<CompletedWork>();
}

std::unique_ptr<CommWork> SingleCommunicator::all_gather_async(void*, std::span<const std::int64_t> counts,
                                                               CommDType) {
  check_counts("all_gather", counts, 1);
  return std::make_unique<CompletedWork>();
}

std::unique_ptr<CommWork> SingleCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                                   std::span<const std::int64_t> counts,
                                                                   CommDType dtype, ReduceOp op) {
  check_counts("reduce_scatter", counts, 1);
  check_reduce("reduce_scatter", dtype, op);
  if (counts[0] > 0 && send != recv)
    std::memmove(recv, send, static_cast<std::size_t>(counts[0]) * comm_dtype_size(dtype));
  return std::make_unique<CompletedWork>();
}

std::unique_ptr<CommWork> SingleCommunicator::barrier_async() { return std::make_unique<CompletedWork>(); }

}  // namespace scalelab
