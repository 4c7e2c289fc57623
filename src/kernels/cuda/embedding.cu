// Embedding lookup and its gradient on CUDA (kernels/embedding.h); cpu/embedding.cpp is the oracle.
//
// embedding_forward     y[t, :] = table[ids[t], :] (a 16-byte copy per thread when the dtypes
//                       match and rows are aligned, otherwise converted element by element).
// embedding_backward    deterministic and bit-identical to the CPU for every dtype: the positions
//                       are sorted by id with a stable radix sort (CUB; values = positions, so
//                       equal ids keep position order), then one block per distinct id sums its
//                       rows of dy in fp32 in position order and adds the sum to the table row once
//                       (a bf16/fp16 table rounds once, as on the CPU). No float atomics. Rows of
//                       skip_id get nothing. Workspace from ctx.alloc ("workspace"): sorted ids,
//                       positions in and out (3 x n int32, each rounded up to 256 bytes) and CUB's
//                       temporary storage, in one block freed on return. The cost of a very
//                       frequent id is one block walking all its rows (fine for real token
//                       distributions; padding rows are skipped before the walk).
// position_embedding_*  OPT's learned positions: y[t, :] += table[t % seq + offset, :]; backward
//                       sums each position's rows over the batch in batch order, one add per
//                       element (deterministic).
//
// Ids: the CPU throws InvalidInput for an id outside [0, rows). Here both embedding kernels first
// scan the ids on the device for the first bad one and read that result back (one 8-byte copy and
// a stream synchronization per call: the ids come from the host batch, so this is the point where
// bad data must stop the run with the CPU's message). The gather and the scatter also guard their
// indices, so nothing is read or written out of bounds whatever the ids.
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <mutex>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rowops.cuh"
#include "kernels/kernel_common.h"

namespace scalelab::kernels::cuda {

namespace {

constexpr unsigned long long kNoBadId = ~0ull;

// first = min over bad positions t of (t << 32 | id): the first position whose id is out of range.
__global__ void find_bad_id_kernel(const std::int32_t* __restrict__ ids, std::int64_t n, std::int64_t rows,
                                   unsigned long long* first) {
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t id = ids[t];
    if (id < 0 || id >= rows) {
      atomicMin(first, (static_cast<unsigned long long>(t) << 32) | static_cast<std::uint32_t>(id));
    }
  }
}

// Throws InvalidInput, with the CPU's message, when an id is outside [0, rows). Synchronizes.
void check_ids(const Tensor& ids, std::int64_t rows, const char* op) {
  const std::int64_t n = ids.numel();
  if (n == 0) return;
  // An 8-byte result slot for the whole process, from cudaMalloc directly rather than the
  // allocator: it is allocated once and never freed (the size of the memory plan's rounding
  // error), and it must outlive any ExecContext. The mutex serializes use of the slot.
  static std::mutex mu;
  static unsigned long long* slot = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (slot == nullptr) check(cudaMalloc(&slot, sizeof(unsigned long long)), op);
  check(cudaMemsetAsync(slot, 0xFF, sizeof(unsigned long long), stream()), op);
  find_bad_id_kernel<<<grid_for(n), 256, 0, stream()>>>(ids.data<std::int32_t>(), n, rows, slot);
  check_launch(op);
  unsigned long long first = kNoBadId;
  check(cudaMemcpyAsync(&first, slot, sizeof first, cudaMemcpyDeviceToHost, stream()), op);
  check(cudaStreamSynchronize(stream()), op);
  if (first == kNoBadId) return;
  const auto t = static_cast<std::int64_t>(first >> 32);
  const auto id = static_cast<std::int32_t>(static_cast<std::uint32_t>(first & 0xFFFFFFFFull));
  throw InvalidInput(std::string("[") + op + "] token id " + std::to_string(id) + " at position " +
                     std::to_string(t) + " is outside the table of " + std::to_string(rows) +
                     " rows — the data does not match the model's vocab_size");
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

struct Gather {
  Out y;
  In table;
  const std::int32_t* ids;
  std::int64_t width, rows;
  __device__ void operator()(std::int64_t e) const {
    const std::int64_t t = e / width, c = e - t * width;
    const std::int64_t id = ids[t];
    if (id < 0 || id >= rows) return;  // refused on the host before the launch
    y.set(e, table[id * width + c]);
  }
};

// Same dtype, rows a whole number of 16-byte units, both bases aligned: units of 16 bytes.
__global__ void gather16_kernel(uint4* __restrict__ y, const uint4* __restrict__ table,
                                const std::int32_t* __restrict__ ids, std::int64_t n, std::int64_t units,
                                std::int64_t rows) {
  const std::int64_t total = n * units;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / units, u = e - t * units;
    const std::int64_t id = ids[t];
    if (id < 0 || id >= rows) continue;
    y[e] = table[id * units + u];
  }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

__global__ void iota_kernel(std::int32_t* __restrict__ v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    v[i] = static_cast<std::int32_t>(i);
  }
}

// Block k (grid-stride) owns the group of equal sorted ids starting at k, if one starts there.
__global__ void scatter_groups_kernel(Out dtable, In dy, const std::uint32_t* __restrict__ keys,
                                      const std::int32_t* __restrict__ pos, std::int64_t n, std::int64_t width,
                                      std::int64_t rows, std::int64_t skip_id) {
  for (std::int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const std::uint32_t id = keys[k];
    if (k > 0 && keys[k - 1] == id) continue;  // not the first of its group
    if (static_cast<std::int64_t>(id) == skip_id || static_cast<std::int64_t>(id) >= rows) continue;
    for (std::int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      float acc = 0.0f;
      for (std::int64_t j = k; j < n && keys[j] == id; ++j) {
        acc = __fadd_rn(acc, dy[static_cast<std::int64_t>(pos[j]) * width + c]);
      }
      const std::int64_t e = static_cast<std::int64_t>(id) * width + c;
      dtable.set(e, __fadd_rn(dtable[e], acc));
    }
  }
}

std::size_t round256(std::size_t b) { return (b + 255) / 256 * 256; }

// Bits that hold every id below `rows` (at least 1).
int key_bits(std::int64_t rows) {
  int bits = 1;
  while (bits < 32 && (std::int64_t{1} << bits) < rows) ++bits;
  return bits;
}

// Position embeddings: y[t, c] += table[(t % seq + offset), c].
struct PositionAdd {
  Out y;
  In table;
  std::int64_t width, seq, offset;
  __device__ void operator()(std::int64_t e) const {
    const std::int64_t t = e / width, c = e - t * width;
    const std::int64_t row = t % seq + offset;
    y.set(e, __fadd_rn(y[e], table[row * width + c]));
  }
};

// dtable[p + offset, c] += Σ_b dy[b·seq + p, c], summed in batch order.
struct PositionGrad {
  Out dtable;
  In dy;
  std::int64_t width, seq, offset, batch;
  __device__ void operator()(std::int64_t e) const {
    const std::int64_t p = e / width, c = e - p * width;
    float acc = 0.0f;
    for (std::int64_t b = 0; b < batch; ++b) acc = __fadd_rn(acc, dy[(b * seq + p) * width + c]);
    const std::int64_t d = (p + offset) * width + c;
    dtable.set(d, __fadd_rn(dtable[d], acc));
  }
};

void check_positions(std::int64_t n, std::int64_t seq, std::int64_t offset, std::int64_t rows, const char* op) {
  SCALELAB_CHECK(seq > 0 && offset >= 0 && n % seq == 0 && seq + offset <= rows,
                 std::string("[") + op + "] " + std::to_string(n) + " tokens of sequence length " +
                     std::to_string(seq) + " do not fit the table of " + std::to_string(rows) + " rows");
}

}  // namespace

void CudaBackend::embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx) {
  const char* op = "embedding_forward";
  require_dtype(ids, DType::kI32, op, "ids");
  SCALELAB_CHECK(table.rank() == 2, std::string("[") + op + "] table must be 2-D, got " + table.shape().str());
  const std::int64_t rows = table.dim(0), width = table.dim(1), n = ids.numel();
  require_numel(y, n * width, op, "output");
  if (n == 0 || width == 0) return;
  check_ids(ids, rows, op);
  const std::size_t row_bytes = static_cast<std::size_t>(width) * dtype_size(table.dtype());
  const bool fast = y.dtype() == table.dtype() && row_bytes % 16 == 0 &&
                    (reinterpret_cast<std::uintptr_t>(y.raw()) & 15u) == 0 &&
                    (reinterpret_cast<std::uintptr_t>(table.raw()) & 15u) == 0;
  if (fast) {
    const std::int64_t units = static_cast<std::int64_t>(row_bytes / 16);
    gather16_kernel<<<grid_for(n * units), 256, 0, stream()>>>(static_cast<uint4*>(y.raw()),
                                                               static_cast<const uint4*>(table.raw()),
                                                               ids.data<std::int32_t>(), n, units, rows);
    check_launch(op);
    return;
  }
  launch_map(Gather{out_of(y), in_of(table), ids.data<std::int32_t>(), width, rows}, n * width, op);
}

void CudaBackend::embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx,
                                     std::int64_t skip_id) {
  const char* op = "embedding_backward";
  require_dtype(ids, DType::kI32, op, "ids");
  SCALELAB_CHECK(dtable.rank() == 2, std::string("[") + op + "] table gradient must be 2-D, got " +
                                         dtable.shape().str());
  const std::int64_t rows = dtable.dim(0), width = dtable.dim(1), n = ids.numel();
  require_numel(dy, n * width, op, "output gradient");
  if (n == 0 || width == 0) return;
  SCALELAB_CHECK(n <= 0x7fffffffLL, std::string("[") + op + "] more than 2^31 token ids in one call");
  check_ids(ids, rows, op);
  const int num_items = static_cast<int>(n);
  const int end_bit = key_bits(rows);
  // Valid ids are non-negative, so their int32 bits sort as unsigned keys.
  const auto* keys_in = reinterpret_cast<const std::uint32_t*>(ids.data<std::int32_t>());
  std::size_t temp_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, static_cast<std::uint32_t*>(nullptr),
                                        static_cast<const std::int32_t*>(nullptr),
                                        static_cast<std::int32_t*>(nullptr), num_items, 0, end_bit, stream()),
        op);
  const std::size_t arr = round256(static_cast<std::size_t>(n) * sizeof(std::int32_t));
  const std::size_t total = 3 * arr + round256(temp_bytes);
  Tensor block = Tensor::empty({static_cast<std::int64_t>(total / 4)}, DType::kI32, *ctx.alloc, "workspace");
  char* base = static_cast<char*>(block.raw());
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base);
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + arr);
  auto* pos_out = reinterpret_cast<std::int32_t*>(base + 2 * arr);
  void* temp = base + 3 * arr;
  iota_kernel<<<grid_for(n), 256, 0, stream()>>>(pos_in, n);
  check_launch(op);
  check(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, pos_in, pos_out, num_items, 0, end_bit,
                                        stream()),
        op);
  check_launch(op);
  const unsigned threads = static_cast<unsigned>(std::clamp<std::int64_t>((width + 31) / 32 * 32, 32, 256));
  scatter_groups_kernel<<<row_blocks(n), threads, 0, stream()>>>(out_of(dtable), in_of(dy), keys_out, pos_out, n,
                                                                  width, rows, skip_id);
  check_launch(op);
}

void CudaBackend::position_embedding_add_forward(Tensor& y, const Tensor& table, std::int64_t seq, std::int64_t offset,
                                                 ExecContext& ctx) {
  const char* op = "position_embedding_add_forward";
  SCALELAB_CHECK(table.rank() == 2, std::string("[") + op + "] table must be 2-D, got " + table.shape().str());
  const std::int64_t width = table.dim(1);
  SCALELAB_CHECK(width > 0, std::string("[") + op + "] empty table rows");
  const std::int64_t n = y.numel() / width;
  check_positions(n, seq, offset, table.dim(0), op);
  launch_map(PositionAdd{out_of(y), in_of(table), width, seq, offset}, n * width, op);
}

void CudaBackend::position_embedding_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq, std::int64_t offset,
                                              ExecContext& ctx) {
  const char* op = "position_embedding_backward";
  SCALELAB_CHECK(dtable.rank() == 2, std::string("[") + op + "] table gradient must be 2-D, got " +
                                         dtable.shape().str());
  const std::int64_t width = dtable.dim(1);
  SCALELAB_CHECK(width > 0, std::string("[") + op + "] empty table rows");
  const std::int64_t n = dy.numel() / width;
  check_positions(n, seq, offset, dtable.dim(0), op);
  launch_map(PositionGrad{out_of(dtable), in_of(dy), width, seq, offset, n / seq}, seq * width, op);
}

}  // namespace scalelab::kernels::cuda
