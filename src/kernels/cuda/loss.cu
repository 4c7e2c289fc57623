// Cross-entropy on the GPU (loss family) and the chunked linear + cross-entropy (fused.h).
//
// Reductions are deterministic: a fixed number of blocks (kLossBlocks) strides over the rows,
// each block adds its rows' losses in order into its own double slot, and one final block adds the
// slots in a fixed tree. The per-row loss is lse − logit[target] formed in double from the fp32 lse,
// as the CPU does; the slot sums in double differ from the CPU's sequential double sum only by
// double rounding (~1e-16 relative). Counts are integer atomics (exact).
//
// Scratch: besides the buffers the CPU kernels allocate, each call takes one small block from
// ctx.alloc ("loss reduction": (kLossBlocks + 4) doubles = 8 KiB + 32 B) for the partial sums and
// counters, returned when the call ends. The host reads the results once per call (one
// synchronization): the sum, the count, and the number of invalid targets.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/device.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/fused.h"
#include "kernels/kernel_common.h"
#include "kernels/logprobs_impl.h"

namespace scalelab::kernels::cuda {

namespace {

constexpr int kLossBlocks = 1024;
constexpr int kMaxThreads = 1024;

// Threads per row block: enough that each thread reads a few dozen elements of a long row.
int row_threads(std::int64_t V) {
  if (V < 2048) return 128;
  if (V < 16384) return 256;
  if (V < 65536) return 512;
  return kMaxThreads;
}

unsigned row_blocks(std::int64_t rows, std::int64_t cap) { return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(rows, cap))); }

// Device scratch of one call: kLossBlocks partial sums, then the result and three counters.
struct LossScratch {
  double* partial = nullptr;       // [kLossBlocks]
  double* result = nullptr;        // [1]: Σ partial
  unsigned long long* counters = nullptr;  // [0] counted rows, [1] invalid targets, [2] first invalid row

  // The slots are one small device buffer of the process (8 KiB, cudaMalloc'ed once, outside the
  // caching allocator like the other fixed per-process scratch): every use reads its result back
  // before returning (a stream synchronization), so calls never overlap on it, and the count of
  // target tokens needs no allocator (count_target_tokens(targets) has no context to give one).
  explicit LossScratch(ExecContext&) {
    constexpr std::size_t slots = kLossBlocks + 4;
    static void* buffer = [] {
      void* p = nullptr;
      check(cudaMalloc(&p, slots * 8), "loss reduction");
      return p;
    }();
    partial = static_cast<double*>(buffer);
    result = partial + kLossBlocks;
    counters = reinterpret_cast<unsigned long long*>(result + 1);
    check(cudaMemsetAsync(partial, 0, static_cast<std::size_t>(kLossBlocks + 3) * 8, stream()), "loss reduction");
    check(cudaMemsetAsync(counters + 2, 0xff, 8, stream()), "loss reduction");  // first invalid row: none
  }

  struct Host {
    double sum;
    unsigned long long count, invalid, first_invalid;
  };
  // One copy of the result and the counters to the host (synchronizes the stream).
  Host read() const {
    Host h{};
    static_assert(sizeof(Host) == 32);
    check(cudaMemcpyAsync(&h, result, sizeof h, cudaMemcpyDeviceToHost, stream()), "loss (read result)");
    check(cudaStreamSynchronize(stream()), "loss (read result)");
    return h;
  }
};

// Counts targets != kIgnoreIndex and, when V > 0, those outside [0, V) (with the first such row).
__global__ void count_targets_kernel(const std::int32_t* __restrict__ tg, std::int64_t n, std::int64_t V,
                                     unsigned long long* counters) {
  __shared__ unsigned long long sh[32];
  unsigned long long counted = 0, invalid = 0, first = ~0ull;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t t = tg[i];
    if (t == kIgnoreIndex) continue;
    if (V > 0 && (t < 0 || t >= V)) {
      ++invalid;
      first = min(first, static_cast<unsigned long long>(i));
    } else {
      ++counted;
    }
  }
  counted = block_sum(counted, sh);
  invalid = block_sum(invalid, sh);
  if (threadIdx.x == 0) {
    if (counted) atomicAdd(&counters[0], counted);
    if (invalid) atomicAdd(&counters[1], invalid);
  }
  if (first != ~0ull) atomicMin(&counters[2], first);
}

// result = Σ partial[0, n) in a fixed order (one block).
__global__ void sum_partials_kernel(const double* __restrict__ partial, int n, double* result) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *result = s;
}

void finish_sum(const LossScratch& sc) {
  sum_partials_kernel<<<1, kMaxThreads, 0, stream()>>>(sc.partial, kLossBlocks, sc.result);
  check_launch("loss (sum)");
}

void launch_count(const Tensor& targets, std::int64_t n, std::int64_t V, const LossScratch& sc) {
  if (n == 0) return;
  count_targets_kernel<<<std::min<unsigned>(grid_for(n), 1024), 256, 0, stream()>>>(targets.data<std::int32_t>(),
                                                                                   n, V, sc.counters);
  check_launch("count_target_tokens");
}

[[noreturn]] void throw_invalid_target(const char* op, const Tensor& targets, unsigned long long row, std::int64_t V) {
  std::int32_t t = 0;
  check(cudaMemcpyAsync(&t, targets.data<std::int32_t>() + row, sizeof t, cudaMemcpyDeviceToHost, stream()), op);
  check(cudaStreamSynchronize(stream()), op);
  throw InvalidInput(std::string("[") + op + "] target " + std::to_string(t) + " at row " + std::to_string(row) +
                     " is outside the vocabulary of " + std::to_string(V) +
                     " — the data does not match the model's vocab_size");
}

// Per row: lse[r] = log Σ exp(logits[r, :]) (online, fp32); the block adds lse − logit[target]
// (double) of its counted rows to partial[blockIdx.x]. Targets were validated (or are counted
// invalid) by count_targets_kernel; an invalid one is skipped here.
template <class T>
__global__ void ce_forward_kernel(const T* __restrict__ logits, std::int64_t V, std::int64_t rows,
                                  const std::int32_t* __restrict__ tg, float* __restrict__ lse,
                                  double* __restrict__ partial) {
  __shared__ LseState sh[32];
  double acc = 0.0;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = logits + r * V;
    LseState st{-INFINITY, 0.0f};
    for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) st = lse_push(st, to_f32<T>(row[j]));
    st = block_lse(st, sh);
    const float l = st.m + logf(st.s);
    if (threadIdx.x == 0) {
      lse[r] = l;
      const std::int32_t t = tg[r];
      if (t != kIgnoreIndex && t >= 0 && t < V) acc += static_cast<double>(l) - static_cast<double>(to_f32<T>(row[t]));
    }
  }
  if (threadIdx.x == 0) partial[blockIdx.x] += acc;
}

// dlogits = (exp(logits − lse) · scale − onehot · scale), ignored rows 0. One block per row
// (grid-stride). Each element is read and then written by the same thread: dlogits may alias
// logits (hence no __restrict__ on them).
template <class TL, class TD>
__global__ void ce_backward_kernel(TD* dlogits, const TL* logits, std::int64_t V, std::int64_t rows,
                                   const float* __restrict__ lse, const std::int32_t* __restrict__ tg, float scale) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int32_t t = tg[r];
    const TL* in = logits + r * V;
    TD* out = dlogits + r * V;
    if (t == kIgnoreIndex) {
      for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) out[j] = from_f32<TD>(0.0f);
      continue;
    }
    const float l = lse[r];
    for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      // As the CPU: p = exp(x − lse); p·scale; minus scale at the target (no fused multiply-add).
      float d = __fmul_rn(expf(to_f32<TL>(in[j]) - l), scale);
      if (j == t) d = __fsub_rn(d, scale);
      out[j] = from_f32<TD>(d);
    }
  }
}

// logp[r] = logits[r, t] − lse[r], 0 for ignored rows (one thread per row).
template <class T>
__global__ void token_logprobs_forward_kernel(float* __restrict__ logp, const T* __restrict__ logits, std::int64_t V,
                                      std::int64_t rows, const float* __restrict__ lse,
                                      const std::int32_t* __restrict__ tg) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const std::int32_t t = tg[r];
  logp[r] = (t == kIgnoreIndex || t < 0 || t >= V) ? 0.0f : to_f32<T>(logits[r * V + t]) - lse[r];
}

// dlogits = weights[r] · (onehot − softmax): ce_backward_kernel with the scale −weights[r] per row.
template <class TL, class TD>
__global__ void token_logprobs_backward_kernel(TD* dlogits, const TL* logits, std::int64_t V, std::int64_t rows,
                                            const float* __restrict__ lse, const std::int32_t* __restrict__ tg,
                                            const float* __restrict__ weights) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int32_t t = tg[r];
    const TL* in = logits + r * V;
    TD* out = dlogits + r * V;
    if (t == kIgnoreIndex) {
      for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) out[j] = from_f32<TD>(0.0f);
      continue;
    }
    const float l = lse[r], scale = -weights[r];  // d logp / d logits = onehot − softmax
    for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      float d = __fmul_rn(expf(to_f32<TL>(in[j]) - l), scale);
      if (j == t) d = __fsub_rn(d, scale);
      out[j] = from_f32<TD>(d);
    }
  }
}

// One chunk of the fused loss, in place over the fp32 logits L[rows, V]:
//   loss:  partial[blockIdx.x] += lse − L[r, target] over counted rows;
//   kGrad: G[r, :] = (softmax(L[r, :]) − onehot) · scale, ignored rows 0, written as TG into row r
//          of L itself with a leading dimension of ldg TG elements (V for fp32, 2V for 16-bit types,
//          so that a 16-bit row lies in the first half of its own fp32 row).
// A 16-bit row is written tile by tile (blockDim elements), each tile read into registers before
// any thread writes: writing G[j] clobbers bytes of L[j / 2], which belongs to this tile or an
// earlier one, so nothing is overwritten before it is read.
template <class TG, bool kGrad>
__global__ void fused_chunk_kernel(float* L, std::int64_t V, std::int64_t rows, const std::int32_t* __restrict__ tg,
                                   float scale, std::int64_t ldg, double* __restrict__ partial) {
  __shared__ LseState sh[32];
  double acc = 0.0;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* row = L + r * V;
    TG* grow = reinterpret_cast<TG*>(L) + r * ldg;
    const std::int32_t t = tg[r];
    if (t == kIgnoreIndex || t < 0 || t >= V) {  // invalid targets were rejected before the chunk loop
      if (kGrad)  // writes only (the row is not read): no tile order needed
        for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) grow[j] = from_f32<TG>(0.0f);
      continue;  // uniform across the block (t is the same for every thread)
    }
    float target_logit = 0.0f;
    if (threadIdx.x == 0) target_logit = row[t];  // read before any thread rewrites the row
    LseState st{-INFINITY, 0.0f};
    for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) st = lse_push(st, row[j]);
    st = block_lse(st, sh);  // synchronizes: every read of the lse pass is done after this
    const float l = st.m + logf(st.s);
    if (threadIdx.x == 0) acc += static_cast<double>(l) - static_cast<double>(target_logit);
    if (kGrad) {
      if constexpr (sizeof(TG) == sizeof(float)) {
        for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
          float d = __fmul_rn(expf(row[j] - l), scale);
          if (j == t) d = __fsub_rn(d, scale);
          grow[j] = from_f32<TG>(d);
        }
      } else {
        for (std::int64_t base = 0; base < V; base += blockDim.x) {
          const std::int64_t j = base + threadIdx.x;
          float d = 0.0f;
          if (j < V) {
            d = __fmul_rn(expf(row[j] - l), scale);
            if (j == t) d = __fsub_rn(d, scale);
          }
          __syncthreads();  // the whole tile is read
          if (j < V) grow[j] = from_f32<TG>(d);
          __syncthreads();  // written before the next tile is read
        }
      }
    }
    __syncthreads();  // the row is finished before the block moves on (shared scratch, row reuse)
  }
  if (threadIdx.x == 0) partial[blockIdx.x] += acc;
}

// The same for a 16-bit gradient (TG bf16/fp16) with V a multiple of 8, in packs: each thread
// reads 8 fp32 logits at a time (two 16-byte loads) and writes 8 gradient values (one 16-byte
// store). The row is processed in tiles of 8·blockDim elements with one barrier between a tile's
// reads and its writes: the writes of tile k cover bytes [2·base_k, 2·base_{k+1}) of the row, i.e.
// fp32 elements of tiles <= k, all read before the barrier, and never reach the bytes tile k + 1
// reads (from 4·base_{k+1} on), so the element-wise kernel's second barrier per tile is not
// needed. Same arithmetic per element (fused_chunk_kernel above stays for fp32 gradients, V not a
// multiple of 8, and SCALELAB_CUDA_KERNELS=v1).
template <class TG, bool kGrad>
__global__ void fused_chunk_packed_kernel(float* L, std::int64_t V, std::int64_t rows,
                                          const std::int32_t* __restrict__ tg, float scale, std::int64_t ldg,
                                          double* __restrict__ partial) {
  static_assert(sizeof(TG) == 2, "16-bit gradients only");
  __shared__ LseState sh[32];
  double acc = 0.0;
  const std::int64_t packs = V / 8;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* row = L + r * V;
    TG* grow = reinterpret_cast<TG*>(L) + r * ldg;
    const std::int32_t t = tg[r];
    if (t == kIgnoreIndex || t < 0 || t >= V) {
      if (kGrad) {  // writes only (the row is not read): no tile order needed
        Pack<TG> z;
#pragma unroll
        for (int e = 0; e < 8; ++e) z.v[e] = from_f32<TG>(0.0f);
        for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) store_pack(grow, p, z);
      }
      continue;
    }
    float target_logit = 0.0f;
    if (threadIdx.x == 0) target_logit = row[t];
    LseState st{-INFINITY, 0.0f};
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (std::int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const float4 a = row4[2 * p], b = row4[2 * p + 1];
      st = lse_push(st, a.x);
      st = lse_push(st, a.y);
      st = lse_push(st, a.z);
      st = lse_push(st, a.w);
      st = lse_push(st, b.x);
      st = lse_push(st, b.y);
      st = lse_push(st, b.z);
      st = lse_push(st, b.w);
    }
    st = block_lse(st, sh);  // synchronizes: every read of the lse pass is done after this
    const float l = st.m + logf(st.s);
    if (threadIdx.x == 0) acc += static_cast<double>(l) - static_cast<double>(target_logit);
    if (kGrad) {
      const std::int64_t tile = 8 * static_cast<std::int64_t>(blockDim.x);
      for (std::int64_t base = 0; base < V; base += tile) {
        const std::int64_t p = base / 8 + threadIdx.x;
        Pack<TG> out;
        if (p < packs) {
          const float4 a = row4[2 * p], b = row4[2 * p + 1];
          const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            float d = __fmul_rn(expf(x[e] - l), scale);
            if (8 * p + e == t) d = __fsub_rn(d, scale);
            out.v[e] = from_f32<TG>(d);
          }
        }
        __syncthreads();  // the whole tile is read
        if (p < packs) store_pack(grow, p, out);
      }
    }
    __syncthreads();  // the row is finished before the block moves on (shared scratch)
  }
  if (threadIdx.x == 0) partial[blockIdx.x] += acc;
}

struct FusedDims {
  std::int64_t T, H, V, chunk;
};

FusedDims fused_dims(const Tensor& x, const Tensor& w, const Tensor& targets, std::int64_t chunk_tokens,
                     const char* op) {
  SCALELAB_CHECK(is_float_type(x.dtype()) && is_float_type(w.dtype()),
                 std::string("[") + op + "] input and weight must be fp32, bf16 or fp16");
  require_dtype(targets, DType::kI32, op, "targets");
  SCALELAB_CHECK(w.rank() == 2, std::string("[") + op + "] weight must be 2-D [vocab, hidden], got " + w.shape().str());
  const std::int64_t V = w.dim(0), H = w.dim(1);
  SCALELAB_CHECK(x.rank() >= 1 && x.dim(-1) == H && H > 0,
                 std::string("[") + op + "] input " + x.shape().str() + " does not end in the hidden size " +
                     std::to_string(H));
  const std::int64_t T = x.numel() / H;
  require_numel(targets, T, op, "targets");
  return {T, H, V, fused_linear_cross_entropy_chunk(T, chunk_tokens, V)};
}

}  // namespace

LossSum CudaBackend::cross_entropy_forward(Tensor& lse, const Tensor& logits, const Tensor& targets,
                                           ExecContext& ctx) {
  const char* op = "cross_entropy_forward";
  require_dtype(targets, DType::kI32, op, "targets");
  require_dtype(lse, DType::kF32, op, "lse");
  const std::int64_t V = logits.dim(-1), rows = V > 0 ? logits.numel() / V : 0;
  require_numel(targets, rows, op, "targets");
  require_numel(lse, rows, op, "lse");
  if (rows == 0) return {};
  LossScratch sc(ctx);
  launch_count(targets, rows, V, sc);
  dispatch_float(logits.dtype(), op, [&]<class T>() {
    ce_forward_kernel<T><<<row_blocks(rows, kLossBlocks), row_threads(V), 0, stream()>>>(
        static_cast<const T*>(logits.raw()), V, rows, targets.data<std::int32_t>(), lse.f32(), sc.partial);
  });
  check_launch(op);
  finish_sum(sc);
  const auto h = sc.read();
  if (h.invalid) throw_invalid_target("cross_entropy", targets, h.first_invalid, V);
  return {h.sum, static_cast<std::int64_t>(h.count)};
}

void CudaBackend::cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                         const Tensor& targets, float grad_scale, ExecContext& ctx) {
  const char* op = "cross_entropy_backward";
  const std::int64_t V = logits.dim(-1), rows = V > 0 ? logits.numel() / V : 0;
  require_numel(dlogits, rows * V, op, "logits gradient");
  require_numel(lse, rows, op, "lse");
  require_numel(targets, rows, op, "targets");
  if (rows == 0) return;
  dispatch_float(logits.dtype(), op, [&]<class TL>() {
    dispatch_float(dlogits.dtype(), op, [&]<class TD>() {
      ce_backward_kernel<TL, TD><<<row_blocks(rows, 65535), row_threads(V), 0, stream()>>>(
          static_cast<TD*>(dlogits.raw()), static_cast<const TL*>(logits.raw()), V, rows, lse.f32(),
          targets.data<std::int32_t>(), grad_scale);
    });
  });
  check_launch(op);
}

void token_logprobs_forward(Tensor& logp, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                 ExecContext&) {
  const char* op = "token_logprobs_forward";
  const std::int64_t V = logits.dim(-1), rows = V > 0 ? logits.numel() / V : 0;
  if (rows == 0) return;
  dispatch_float(logits.dtype(), op, [&]<class T>() {
    const int threads = 256;
    const auto blocks = static_cast<unsigned>((rows + threads - 1) / threads);
    token_logprobs_forward_kernel<T><<<blocks, threads, 0, stream()>>>(logp.f32(), static_cast<const T*>(logits.raw()), V,
                                                                rows, lse.f32(), targets.data<std::int32_t>());
  });
  check_launch(op);
}

void token_logprobs_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                                  const Tensor& targets, const Tensor& weights, ExecContext&) {
  const char* op = "token_logprobs_backward";
  const std::int64_t V = logits.dim(-1), rows = V > 0 ? logits.numel() / V : 0;
  if (rows == 0) return;
  dispatch_float(logits.dtype(), op, [&]<class TL>() {
    dispatch_float(dlogits.dtype(), op, [&]<class TD>() {
      token_logprobs_backward_kernel<TL, TD><<<row_blocks(rows, 65535), row_threads(V), 0, stream()>>>(
          static_cast<TD*>(dlogits.raw()), static_cast<const TL*>(logits.raw()), V, rows, lse.f32(),
          targets.data<std::int32_t>(), weights.f32());
    });
  });
  check_launch(op);
}

std::int64_t CudaBackend::count_target_tokens(const Tensor& targets, ExecContext& ctx) {
  require_dtype(targets, DType::kI32, "count_target_tokens", "targets");
  if (targets.numel() == 0) return 0;
  LossScratch sc(ctx);
  launch_count(targets, targets.numel(), 0, sc);
  return static_cast<std::int64_t>(sc.read().count);
}

namespace {

// The chunk loop of both fused entry points (dx, dw null: forward only).
//
// Device memory taken from ctx.alloc, in order (the sizes of the CPU kernel's blocks, so the
// memory plan's fused_linear_cross_entropy_workspace_blocks holds for this kernel too):
//   1. "fused loss chunk" [chunk, V] fp32: a chunk's logits, then in place their gradient (fp32
//      when w is fp32, else rounded to w's dtype, as cuBLASLt multiplies operands of one type);
//   2. "fused loss chunk" [chunk, H] fp32, only when a tensor is low-precision (the CPU's
//      condition): holds the chunk's input rows converted to w's dtype when x's dtype differs;
//   3. "loss reduction" (8 KiB, see the top of the file).
// The GEMMs go through gemm_ex, which takes scratch ("matmul workspace") only for dtype
// combinations the engine does not use (dx or dw in a type the product cannot write, e.g. fp16
// dx with bf16 weights); the CPU's fp32 conversion panels have no counterpart here.
LossSum fused_chunks(CudaBackend& be, Tensor* dx, Tensor* dw, const Tensor& x, const Tensor& w,
                     const Tensor& targets, float scale, const FusedDims& d, ExecContext& ctx, const char* op) {
  const std::int64_t T = d.T, H = d.H, V = d.V;
  const bool backward = dx != nullptr;
  LossScratch sc(ctx);
  // Validate every target before touching an output (as the CPU), and count them.
  launch_count(targets, T, V, sc);
  const auto counted = sc.read();
  if (counted.invalid) throw_invalid_target(op, targets, counted.first_invalid, V);

  const DType xt = x.dtype(), wt = w.dtype();
  const bool lowp = xt != DType::kF32 || wt != DType::kF32 ||
                    (backward && (dx->dtype() != DType::kF32 || (dw->defined() && dw->dtype() != DType::kF32)));
  Tensor L = Tensor::empty({d.chunk, V}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  Tensor xc;
  if (lowp) xc = Tensor::empty({d.chunk, H}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  const bool convert_x = xt != wt;  // implies lowp
  const std::int64_t ldg = wt == DType::kF32 ? V : 2 * V;  // the gradient's leading dimension (TG elements)
  const std::int32_t* tg = targets.data<std::int32_t>();

  for (std::int64_t r0 = 0; r0 < T; r0 += d.chunk) {
    const std::int64_t c = std::min(d.chunk, T - r0);
    const void* xp = static_cast<const char*>(x.raw()) + static_cast<std::size_t>(r0 * H) * dtype_size(xt);
    if (convert_x) {
      // Dense rows in w's dtype (c·H·2 or 4 bytes <= the block's c·H·4 bytes); the stream-ordered
      // conversion of the CUDA runtime (round to nearest even).
      device_runtime(DeviceType::kCUDA).convert(xp, xt, xc.raw(), wt, static_cast<std::size_t>(c * H));
      xp = xc.raw();
    }
    // L[c, V] = x_c · wᵀ
    be.gemm_ex(false, true, c, V, H, 1.0f, xp, wt, H, w.raw(), wt, H, 0.0f, L.raw(), DType::kF32, V, ctx);
    dispatch_float(wt, op, [&]<class TG>() {
      if constexpr (sizeof(TG) == 2) {
        if (backward && V % 8 == 0 && !cuda_kernels_v1()) {
          fused_chunk_packed_kernel<TG, true><<<row_blocks(c, kLossBlocks), row_threads(V), 0, stream()>>>(
              L.f32(), V, c, tg + r0, scale, ldg, sc.partial);
          return;
        }
      }
      if (backward) {
        fused_chunk_kernel<TG, true><<<row_blocks(c, kLossBlocks), row_threads(V), 0, stream()>>>(
            L.f32(), V, c, tg + r0, scale, ldg, sc.partial);
      } else {
        fused_chunk_kernel<TG, false><<<row_blocks(c, kLossBlocks), row_threads(V), 0, stream()>>>(
            L.f32(), V, c, tg + r0, scale, ldg, sc.partial);
      }
    });
    check_launch(op);
    if (!backward) continue;
    // dx_c = G · w (assigned); dw += Gᵀ · x_c
    void* dxp = static_cast<char*>(dx->raw()) + static_cast<std::size_t>(r0 * H) * dtype_size(dx->dtype());
    be.gemm_ex(false, false, c, H, V, 1.0f, L.raw(), wt, ldg, w.raw(), wt, H, 0.0f, dxp, dx->dtype(), H, ctx);
    if (dw->defined()) {  // undefined: a frozen head (LoRA), no weight gradient
      be.gemm_ex(true, false, V, H, c, 1.0f, L.raw(), wt, ldg, xp, wt, H, 1.0f, dw->raw(), dw->dtype(), H, ctx);
    }
  }
  finish_sum(sc);
  const auto h = sc.read();
  return {h.sum, static_cast<std::int64_t>(counted.count)};
}

}  // namespace

LossSum CudaBackend::fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w,
                                                const Tensor& targets, float grad_scale_per_token,
                                                std::int64_t chunk_tokens, ExecContext& ctx) {
  const char* op = "fused_linear_cross_entropy";
  const FusedDims d = fused_dims(x, w, targets, chunk_tokens, op);
  require_numel(dx, d.T * d.H, op, "input gradient");
  if (dw.defined()) require_numel(dw, d.V * d.H, op, "weight gradient");
  if (d.T == 0) return {};
  return fused_chunks(*this, &dx, &dw, x, w, targets, grad_scale_per_token, d, ctx, op);
}

LossSum CudaBackend::fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                                        std::int64_t chunk_tokens, ExecContext& ctx) {
  const char* op = "fused_linear_cross_entropy_forward";
  const FusedDims d = fused_dims(x, w, targets, chunk_tokens, op);
  if (d.T == 0) return {};
  return fused_chunks(*this, nullptr, nullptr, x, w, targets, 0.0f, d, ctx, op);
}

}  // namespace scalelab::kernels::cuda
