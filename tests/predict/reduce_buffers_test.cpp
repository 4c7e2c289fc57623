// The global-memory buffers PyTorch's CUDA reduction takes from the caching allocator for a sum
// over the rows of a [rows, cols] tensor (a bias's gradient, a norm weight's): the staging buffer
// sizes the H200 traces show, and the formula's regimes (Reduce.cuh's setReduceConfig).
#include <gtest/gtest.h>

#include "predict/schedule_internal.h"

namespace scalelab::predict {
namespace {
using namespace detail;

TEST(RowSumBuffers, TheStagingTheH200TracesShow) {
  // OPT-1.3B, micro-batch 4 x 1024 rows: fc2's bias (2048) 64 MiB, fc1's (8192) 132 MiB
  EXPECT_EQ(row_sum_buffers(4096, 2048).staging, u64{64} << 20);
  EXPECT_EQ(row_sum_buffers(4096, 8192).staging, u64{132} << 20);
  // Qwen2.5-0.5B, micro-batch 8: q_proj's bias (896) 56 MiB, k/v's (128) 8 MiB
  EXPECT_EQ(row_sum_buffers(8192, 896).staging, 58720256u);
  EXPECT_EQ(row_sum_buffers(8192, 128).staging, u64{8} << 20);
  // Llama's RMSNorm weight (2048) at micro-batch 6: 8 bytes per element of g*h, 64-byte semaphores
  const ReduceBuffers n = row_sum_buffers(6144, 2048);
  EXPECT_EQ(n.staging, 6144u * 2048 * 8);
  EXPECT_EQ(n.semaphores, 64u);
}

TEST(RowSumBuffers, TheBlocksPerOutputAreCappedByTheGridTarget) {
  // 16384 rows: 4096 values per thread would ask 256 blocks per output column; the grid target
  // (132 SMs x 16 blocks of 128 threads, over 16 columns of blocks) caps it at 132
  EXPECT_EQ(row_sum_buffers(16384, 2048).staging, 4u * 2048 * 132 * 32 * 4);
  // and a GPU with fewer SMs gets fewer
  EXPECT_EQ(row_sum_buffers(16384, 2048, 114).staging, 4u * 2048 * 114 * 32 * 4);
}

TEST(RowSumBuffers, FewRowsReduceInOneBlockWithoutStaging) {
  // under 256 values per thread after the warps split the rows: no global reduction
  EXPECT_EQ(row_sum_buffers(1000, 2048).staging, 0u);
  EXPECT_EQ(row_sum_buffers(0, 2048).staging, 0u);
  // at the threshold (1024 rows over 4 warps: 256 values per thread) the rows are split over blocks
  EXPECT_GT(row_sum_buffers(1024, 2048).staging, 0u);
}

}  // namespace
}  // namespace scalelab::predict
