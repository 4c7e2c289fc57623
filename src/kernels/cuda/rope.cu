// Rotary position embeddings on CUDA (kernels/rope.h); cpu/rope.cpp is the oracle.
//
// In place on columns [col, col + n_heads·head_dim) of rows of width ld; row r sits at position
// r % seq_len. Rotate-half pairing as Hugging Face Llama: in each head, element i pairs with
// i + head_dim/2, and
//   x1' = x1·cos − x2·(sign·sin),   x2' = x2·cos + x1·(sign·sin)
// with sign = +1 forward and −1 backward (the inverse rotation, applied to the gradient in place).
// One thread per pair reads both elements before writing either.
//
// The cos/sin table is host memory (RopeTable, built once per model). It is uploaded on first use
// and the device copy cached here, keyed by the table's address, its cos buffer's address and its
// size; a cached copy is reused only while the table's inv_freq and first/last entries still match
// (so a destroyed table whose address is reused by a different one is uploaded again).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rowops.cuh"
#include "kernels/kernel_common.h"

namespace scalelab::kernels::cuda {

namespace {

// The device copies of rope tables: [cos | sin], each [max_positions, half] fp32.
//
// This memory comes from cudaMalloc directly, outside the device allocator: it is a small
// constant table (max_positions x head_dim floats, 1 MiB for 4096 positions of 64 pairs) whose
// owner, the host RopeTable, lives outside any ExecContext, and it must stay valid for as long as
// the model runs, across every context and allocator the process creates. It is freed when the
// cache is full or an entry goes stale (after a stream synchronization, so no queued kernel still
// reads it).
struct DeviceTable {
  float* data = nullptr;  // cos at data, sin at data + count
  std::size_t count = 0;  // max_positions * half
  std::vector<float> inv_freq;
  float probe[4] = {0, 0, 0, 0};  // cos/sin first and last entries, to notice stale keys
};

using Key = std::tuple<const RopeTable*, const float*, std::size_t>;

std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<Key, DeviceTable>& cache() {
  static std::map<Key, DeviceTable> c;
  return c;
}

void probe_of(const RopeTable& t, float out[4]) {
  out[0] = t.cos.front();
  out[1] = t.cos.back();
  out[2] = t.sin.front();
  out[3] = t.sin.back();
}

bool matches(const DeviceTable& d, const RopeTable& t) {
  float p[4];
  probe_of(t, p);
  return d.count == t.cos.size() && d.inv_freq == t.inv_freq && std::memcmp(p, d.probe, sizeof p) == 0;
}

void release(DeviceTable& d, const char* op) {
  if (d.data == nullptr) return;
  check(cudaStreamSynchronize(stream()), op);
  check(cudaFree(d.data), op);
  d.data = nullptr;
}

// The device copy of `table` (uploaded on first use).
const float* device_table(const RopeTable& table, const char* op) {
  SCALELAB_CHECK(!table.cos.empty() && table.sin.size() == table.cos.size(),
                 std::string("[") + op + "] the rope table is empty or its cos and sin differ in size");
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& c = cache();
  const Key key{&table, table.cos.data(), table.cos.size()};
  auto it = c.find(key);
  if (it != c.end()) {
    if (matches(it->second, table)) return it->second.data;
    release(it->second, op);
    c.erase(it);
  }
  constexpr std::size_t kMaxTables = 16;  // a process holds one or two models; beyond that, start over
  if (c.size() >= kMaxTables) {
    for (auto& [k, d] : c) release(d, op);
    c.clear();
  }
  DeviceTable d;
  d.count = table.cos.size();
  d.inv_freq = table.inv_freq;
  probe_of(table, d.probe);
  const std::size_t bytes = d.count * sizeof(float);
  check(cudaMalloc(&d.data, 2 * bytes), op);
  check(cudaMemcpyAsync(d.data, table.cos.data(), bytes, cudaMemcpyHostToDevice, stream()), op);
  check(cudaMemcpyAsync(d.data + d.count, table.sin.data(), bytes, cudaMemcpyHostToDevice, stream()), op);
  check(cudaStreamSynchronize(stream()), op);
  const float* out = d.data;
  c.emplace(key, std::move(d));
  return out;
}

struct RopeRotate {
  Out x;
  const float* cos;
  const float* sin;
  std::int64_t col, ld, n_heads, head_dim, half, seq_len;
  float sign;
  __device__ void operator()(std::int64_t e) const {
    const std::int64_t per_row = n_heads * half;
    const std::int64_t r = e / per_row, rem = e - r * per_row;
    const std::int64_t h = rem / half, i = rem - h * half;
    const std::int64_t pos = r % seq_len;
    const std::int64_t a = r * ld + col + h * head_dim + i, b = a + half;
    const float x1 = x[a], x2 = x[b];
    const float c = cos[pos * half + i], si = __fmul_rn(sign, sin[pos * half + i]);
    x.set(a, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, si)));
    x.set(b, __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, si)));
  }
};

// Packed form (x of one 16-bit or fp32 dtype T, half a multiple of Pack<T>::kN, rows and the column
// offset aligned to packs): thread k rotates Pack<T>::kN consecutive pairs of one head, with 32-bit
// index arithmetic once per pack (RopeRotate divides 64-bit indices per pair). Same arithmetic.
template <class T>
__global__ void rope_packed_kernel(T* x, const float* __restrict__ cos, const float* __restrict__ sin,
                                   std::uint32_t packs, std::uint32_t head_packs, std::uint32_t row_packs,
                                   std::int64_t col, std::int64_t ld, std::int64_t head_dim, std::int64_t half,
                                   std::uint32_t seq_len, float sign) {
  constexpr int kN = Pack<T>::kN;
  for (std::uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < packs; k += gridDim.x * blockDim.x) {
    const std::uint32_t r = k / row_packs, rem = k - r * row_packs;
    const std::uint32_t h = rem / head_packs, i0 = (rem - h * head_packs) * kN;
    const std::uint32_t pos = r % seq_len;
    const std::int64_t a = static_cast<std::int64_t>(r) * ld + col + h * head_dim + i0;  // a multiple of kN
    const Pack<T> x1 = load_pack(x, a / kN), x2 = load_pack(x, (a + half) / kN);
    const float* cp = cos + static_cast<std::int64_t>(pos) * half + i0;
    const float* sp = sin + static_cast<std::int64_t>(pos) * half + i0;
    Pack<T> y1, y2;
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      const float v1 = to_f32<T>(x1.v[e]), v2 = to_f32<T>(x2.v[e]);
      const float c = cp[e], si = __fmul_rn(sign, sp[e]);
      y1.v[e] = from_f32<T>(__fsub_rn(__fmul_rn(v1, c), __fmul_rn(v2, si)));
      y2.v[e] = from_f32<T>(__fadd_rn(__fmul_rn(v2, c), __fmul_rn(v1, si)));
    }
    store_pack(x, a / kN, y1);
    store_pack(x, (a + half) / kN, y2);
  }
}

void rope_apply(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                std::int64_t seq_len, const RopeTable& table, float sign, const char* op) {
  const std::int64_t half = head_dim / 2;
  SCALELAB_CHECK(half == table.half, std::string("[") + op + "] head_dim does not match the rope table");
  SCALELAB_CHECK(seq_len > 0 && seq_len <= table.max_positions,
                 std::string("[") + op + "] sequence length " + std::to_string(seq_len) +
                     " exceeds the rope table's " + std::to_string(table.max_positions) + " positions");
  SCALELAB_CHECK(static_cast<std::int64_t>(table.cos.size()) >= table.max_positions * half,
                 std::string("[") + op + "] the rope table holds fewer entries than its positions say");
  SCALELAB_CHECK(ld > 0 && col >= 0 && n_heads >= 0 && col + n_heads * head_dim <= ld && x.numel() % ld == 0,
                 std::string("[") + op + "] columns [" + std::to_string(col) + ", " +
                     std::to_string(col + n_heads * head_dim) + ") do not fit rows of " + std::to_string(ld) +
                     " in " + x.shape().str());
  const std::int64_t rows = x.numel() / ld;
  const std::int64_t n = rows * n_heads * half;
  if (n == 0) return;
  const float* dev = device_table(table, op);
  const std::size_t count = table.cos.size();
  const std::int64_t kn = 16 / static_cast<std::int64_t>(dtype_size(x.dtype()));
  if (!cuda_kernels_v1() && half % kn == 0 && col % kn == 0 && ld % kn == 0 && aligned_to(x.raw(), 16) &&
      n / kn < (std::int64_t{1} << 31) && seq_len < (std::int64_t{1} << 31)) {
    const std::int64_t head_packs = half / kn, row_packs = n_heads * head_packs, packs = rows * row_packs;
    dispatch_float(x.dtype(), op, [&]<class E>() {
      rope_packed_kernel<E><<<pack_grid(packs), 256, 0, stream()>>>(static_cast<E*>(x.raw()), dev, dev + count,
                                          static_cast<std::uint32_t>(packs), static_cast<std::uint32_t>(head_packs),
                                          static_cast<std::uint32_t>(row_packs), col, ld, head_dim, half,
                                          static_cast<std::uint32_t>(seq_len), sign);
    });
    check_launch(op);
    return;
  }
  launch_map(RopeRotate{out_of(x), dev, dev + count, col, ld, n_heads, head_dim, half, seq_len, sign}, n, op);
}

}  // namespace

void CudaBackend::rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads,
                               std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) {
  rope_apply(x, col, ld, n_heads, head_dim, seq_len, table, 1.0f, "rope_forward");
}

void CudaBackend::rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t n_heads,
                                std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table,
                                ExecContext& ctx) {
  rope_apply(dx, col, ld, n_heads, head_dim, seq_len, table, -1.0f, "rope_backward");
}

}  // namespace scalelab::kernels::cuda
