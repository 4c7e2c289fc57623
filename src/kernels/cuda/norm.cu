// RMSNorm and LayerNorm on CUDA, plain and fused with the residual add (kernels/norm.h,
// layernorm.h, fused.h). The CPU kernels (cpu/norm.cpp, cpu/layernorm.cpp, cpu/fused_norm.cpp)
// are the oracle; this file computes the same expressions in fp32:
//   - one block per row (grid-stride over rows), row_threads(H) threads; a thread touches the same
//     elements in every pass over its row, so in-place forms (h aliasing x or delta, dx aliasing
//     dy) read each element before the same thread writes it;
//   - statistics are block sums in a fixed order (deterministic for a given H);
//   - weight/bias gradients are column sums over rows (rowops.cuh: per-split partials in a
//     "workspace" block from ctx.alloc, then a second pass; no float atomics), launched BEFORE the
//     row kernel that writes dx, because dx may alias dy.
// Each tensor may have its own float dtype (In/Out handles); rstd and mean are fp32.
//
// What the fused forms compute, exactly as the CPU does:
//   rmsnorm_residual_forward: h = x + delta stored (rounded to h's dtype); rstd from Σ(x + delta)²
//     of the unrounded fp32 sums; y from the stored h (so rmsnorm_recompute rebuilds it bit for bit).
//   layernorm_residual_forward: h stored, then mean and variance of the stored (rounded) h, as
//     add_ followed by layernorm_forward would.
#include <algorithm>
#include <initializer_list>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rowops.cuh"
#include "kernels/kernel_common.h"

namespace scalelab::kernels::cuda {

namespace {

// --------------------------------------------------------------------------------------------
// RMSNorm
// --------------------------------------------------------------------------------------------

// y = w · (src · inv): the expression of the CPU's rmsnorm_forward and fused write_row.
__device__ __forceinline__ float rms_out(float src, float inv, float w) { return __fmul_rn(w, __fmul_rn(src, inv)); }

// Plain (kResidual false): src = x, rstd = 1 / sqrt(Σx² / H + eps).
// Residual: h = x + delta written first (h may alias x or delta); rstd = 1 / sqrt(Σh² · (1/H) + eps)
// with h the unrounded sums; y from h as stored.
template <bool kResidual>
__global__ void rms_forward_kernel(Out h, Out y, float* __restrict__ rstd, In x, In delta, In w, std::int64_t rows,
                                   std::int64_t H, float eps) {
  __shared__ float sh[32];
  const float Hf = static_cast<float>(H);
  const float inv_h = 1.0f / Hf;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * H;
    float ss = 0.0f;
    for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      float v;
      if constexpr (kResidual) {
        v = __fadd_rn(x[base + i], delta[base + i]);
        h.set(base + i, v);
      } else {
        v = x[base + i];
      }
      ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, sh);
    const float ms = kResidual ? __fmul_rn(ss, inv_h) : __fdiv_rn(ss, Hf);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
    if (threadIdx.x == 0) rstd[r] = inv;
    for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      // The residual re-reads h as stored (this thread wrote it above).
      const float src = kResidual ? h[base + i] : x[base + i];
      y.set(base + i, rms_out(src, inv, w[i]));
    }
  }
}

// y = w · (h · rstd[r]) from saved statistics (rmsnorm_recompute).
__global__ void rms_recompute_kernel(Out y, const float* __restrict__ rstd, In h, In w, std::int64_t rows,
                                     std::int64_t H) {
  const std::int64_t n = rows * H;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / H, i = e - r * H;
    y.set(e, rms_out(h[e], rstd[r], w[i]));
  }
}

// Plain (cpu/norm.cpp): mean = Σ (dy·w)·(x·inv) / H;  v = inv · (dy·w − x·inv·mean);
//   dx = v, or dx + v when accumulate.
// Residual (cpu/fused_norm.cpp): acc = Σ (dy·w)·h;  c = acc · (1/H) · inv³;
//   dh += inv · (dy·w) − h · c.
template <bool kResidual>
__global__ void rms_backward_kernel(Out dx, In dy, In x, const float* __restrict__ rstd, In w, std::int64_t rows,
                                    std::int64_t H, bool accumulate) {
  __shared__ float sh[32];
  const float Hf = static_cast<float>(H);
  const float inv_h = 1.0f / Hf;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * H;
    const float inv = rstd[r];
    float acc = 0.0f;
    for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const float gw = __fmul_rn(dy[base + i], w[i]);
      const float xv = x[base + i];
      acc = fmaf(gw, kResidual ? xv : __fmul_rn(xv, inv), acc);
    }
    acc = block_sum(acc, sh);
    if constexpr (kResidual) {
      const float c = __fmul_rn(__fmul_rn(acc, inv_h), __fmul_rn(__fmul_rn(inv, inv), inv));
      for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
        const float gw = __fmul_rn(dy[base + i], w[i]);
        const float v = __fsub_rn(__fmul_rn(inv, gw), __fmul_rn(x[base + i], c));
        dx.set(base + i, __fadd_rn(dx[base + i], v));
      }
    } else {
      const float mean = __fdiv_rn(acc, Hf);
      for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
        const float gw = __fmul_rn(dy[base + i], w[i]);
        const float xv = x[base + i];
        const float v = __fmul_rn(inv, __fsub_rn(gw, __fmul_rn(__fmul_rn(xv, inv), mean)));
        dx.set(base + i, accumulate ? __fadd_rn(dx[base + i], v) : v);
      }
    }
  }
}

// ---- Packed RMSNorm (every tensor of one dtype T, rows of whole 16-byte packs, aligned) --------
// One block per row, thread j owning packs j, j + blockDim, ... (at most kMaxRowPacks of them),
// which it loads once into registers and keeps for the row's second pass: the element-wise
// kernels above read x (and dy, w) twice and use 2-byte accesses. Same expressions per element;
// the fp32 sums run in another order (per-thread partial sums, then block_sum), as any launch
// geometry change would: the CPU comparison's tolerance covers it.
constexpr int kMaxRowPacks = 4;

template <class T>
__device__ __forceinline__ float round_via(float v) { return to_f32<T>(from_f32<T>(v)); }

template <class T, bool kResidual>
__global__ void rms_forward_packed(T* h, T* y, float* __restrict__ rstd, const T* x, const T* delta, const T* w,
                                   std::int64_t rows, int row_packs, float eps) {
  constexpr int kN = Pack<T>::kN;
  __shared__ float sh[32];
  const int H = row_packs * kN;
  const float Hf = static_cast<float>(H), inv_h = 1.0f / Hf;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * row_packs;
    float v[kMaxRowPacks][kN];
    float ss = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxRowPacks; ++q) {
      const int j = threadIdx.x + q * blockDim.x;
      if (j < row_packs) {
        const Pack<T> a = load_pack(x, base + j);
        if constexpr (kResidual) {
          const Pack<T> d = load_pack(delta, base + j);
          Pack<T> hs;
#pragma unroll
          for (int e = 0; e < kN; ++e) {
            const float sum = __fadd_rn(to_f32<T>(a.v[e]), to_f32<T>(d.v[e]));
            ss = fmaf(sum, sum, ss);
            hs.v[e] = from_f32<T>(sum);
            v[q][e] = to_f32<T>(hs.v[e]);  // y reads h as stored
          }
          store_pack(h, base + j, hs);
        } else {
#pragma unroll
          for (int e = 0; e < kN; ++e) {
            v[q][e] = to_f32<T>(a.v[e]);
            ss = fmaf(v[q][e], v[q][e], ss);
          }
        }
      }
    }
    ss = block_sum(ss, sh);
    const float ms = kResidual ? __fmul_rn(ss, inv_h) : __fdiv_rn(ss, Hf);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
    if (threadIdx.x == 0) rstd[r] = inv;
#pragma unroll
    for (int q = 0; q < kMaxRowPacks; ++q) {
      const int j = threadIdx.x + q * blockDim.x;
      if (j < row_packs) {
        const Pack<T> wp = load_pack(w, j);
        Pack<T> out;
#pragma unroll
        for (int e = 0; e < kN; ++e) out.v[e] = from_f32<T>(rms_out(v[q][e], inv, to_f32<T>(wp.v[e])));
        store_pack(y, base + j, out);
      }
    }
  }
}

template <class T, bool kResidual>
__global__ void rms_backward_packed(T* dx, const T* dy, const T* x, const float* __restrict__ rstd, const T* w,
                                    std::int64_t rows, int row_packs, bool accumulate) {
  constexpr int kN = Pack<T>::kN;
  __shared__ float sh[32];
  const int H = row_packs * kN;
  const float Hf = static_cast<float>(H), inv_h = 1.0f / Hf;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * row_packs;
    const float inv = rstd[r];
    float gw[kMaxRowPacks][kN], xv[kMaxRowPacks][kN];
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxRowPacks; ++q) {
      const int j = threadIdx.x + q * blockDim.x;
      if (j < row_packs) {
        const Pack<T> d = load_pack(dy, base + j), a = load_pack(x, base + j), wp = load_pack(w, j);
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          gw[q][e] = __fmul_rn(to_f32<T>(d.v[e]), to_f32<T>(wp.v[e]));
          xv[q][e] = to_f32<T>(a.v[e]);
          acc = fmaf(gw[q][e], kResidual ? xv[q][e] : __fmul_rn(xv[q][e], inv), acc);
        }
      }
    }
    acc = block_sum(acc, sh);
    const float c = __fmul_rn(__fmul_rn(acc, inv_h), __fmul_rn(__fmul_rn(inv, inv), inv));  // residual
    const float mean = __fdiv_rn(acc, Hf);                                                   // plain
#pragma unroll
    for (int q = 0; q < kMaxRowPacks; ++q) {
      const int j = threadIdx.x + q * blockDim.x;
      if (j < row_packs) {
        Pack<T> old;
        if (kResidual || accumulate) old = load_pack(dx, base + j);  // after dy/x: dx may alias dy
        Pack<T> out;
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          float vv;
          if constexpr (kResidual) {
            vv = __fsub_rn(__fmul_rn(inv, gw[q][e]), __fmul_rn(xv[q][e], c));
            vv = __fadd_rn(to_f32<T>(old.v[e]), vv);
          } else {
            vv = __fmul_rn(inv, __fsub_rn(gw[q][e], __fmul_rn(__fmul_rn(xv[q][e], inv), mean)));
            if (accumulate) vv = __fadd_rn(to_f32<T>(old.v[e]), vv);
          }
          out.v[e] = from_f32<T>(vv);
        }
        store_pack(dx, base + j, out);
      }
    }
  }
}

template <class T>
__global__ void rms_recompute_packed(T* y, const float* __restrict__ rstd, const T* h, const T* w,
                                     std::uint32_t packs, std::uint32_t row_packs) {
  constexpr int kN = Pack<T>::kN;
  for (std::uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < packs; k += gridDim.x * blockDim.x) {
    const std::uint32_t r = k / row_packs, j = k - r * row_packs;
    const Pack<T> hp = load_pack(h, k), wp = load_pack(w, j);
    const float inv = rstd[r];
    Pack<T> out;
#pragma unroll
    for (int e = 0; e < kN; ++e) out.v[e] = from_f32<T>(rms_out(to_f32<T>(hp.v[e]), inv, to_f32<T>(wp.v[e])));
    store_pack(y, k, out);
  }
}

// The packed kernels apply: not v1, every tensor one dtype and 16-byte aligned, H whole packs, at
// most kMaxRowPacks packs per thread of a 1024-thread block. Returns the threads per row (0: no).
unsigned rms_packed_threads(std::int64_t H, std::initializer_list<const Tensor*> ts) {
  if (cuda_kernels_v1()) return 0;
  const DType dt = (*ts.begin())->dtype();
  const std::int64_t kn = 16 / static_cast<std::int64_t>(dtype_size(dt));
  if (H % kn != 0) return 0;
  for (const Tensor* t : ts) {
    if (t->dtype() != dt || !aligned_to(t->raw(), 16)) return 0;
  }
  const std::int64_t row_packs = H / kn;
  std::int64_t threads = (row_packs + kMaxRowPacks - 1) / kMaxRowPacks;  // fewest threads that fit
  threads = std::max<std::int64_t>(threads, std::min<std::int64_t>(row_packs, 128));  // but a few warps
  threads = (threads + 31) / 32 * 32;
  if (threads > 1024 || (row_packs + threads - 1) / threads > kMaxRowPacks) return 0;
  return static_cast<unsigned>(threads);
}

// RMSNorm forward over rows (h and delta: the residual form), packed when it applies.
template <bool kResidual>
void rms_forward_launch(Tensor* h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor* delta, const Tensor& w,
                        std::int64_t rows, std::int64_t H, float eps, const char* op) {
  const unsigned th = kResidual ? rms_packed_threads(H, {h, &y, &x, delta, &w}) : rms_packed_threads(H, {&y, &x, &w});
  if (th != 0) {
    dispatch_float(x.dtype(), op, [&]<class E>() {
      rms_forward_packed<E, kResidual><<<row_blocks(rows), th, 0, stream()>>>(
          kResidual ? static_cast<E*>(h->raw()) : nullptr, static_cast<E*>(y.raw()), rstd.f32(),
          static_cast<const E*>(x.raw()), kResidual ? static_cast<const E*>(delta->raw()) : nullptr,
          static_cast<const E*>(w.raw()), rows, static_cast<int>(H / Pack<E>::kN), eps);
    });
  } else {
    rms_forward_kernel<kResidual><<<row_blocks(rows), row_threads(H), 0, stream()>>>(
        kResidual ? out_of(h) : Out{}, out_of(y), rstd.f32(), in_of(x), kResidual ? in_of(delta) : In{}, in_of(w),
        rows, H, eps);
  }
  check_launch(op);
}

// RMSNorm backward over rows into dx (the residual form: dh, always accumulated), packed when it applies.
template <bool kResidual>
void rms_backward_launch(Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& w,
                         std::int64_t rows, std::int64_t H, bool accumulate, const char* op) {
  if (const unsigned th = rms_packed_threads(H, {&dx, &dy, &x, &w})) {
    dispatch_float(x.dtype(), op, [&]<class E>() {
      rms_backward_packed<E, kResidual><<<row_blocks(rows), th, 0, stream()>>>(
          static_cast<E*>(dx.raw()), static_cast<const E*>(dy.raw()), static_cast<const E*>(x.raw()), rstd.f32(),
          static_cast<const E*>(w.raw()), rows, static_cast<int>(H / Pack<E>::kN), accumulate);
    });
  } else {
    rms_backward_kernel<kResidual><<<row_blocks(rows), row_threads(H), 0, stream()>>>(
        out_of(dx), in_of(dy), in_of(x), rstd.f32(), in_of(w), rows, H, accumulate);
  }
  check_launch(op);
}

// dw column term: dy · (x · rstd).
struct RmsDwTerm {
  In dy, x;
  const float* rstd;
  std::int64_t H;
  __device__ float operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t e = r * H + c;
    return __fmul_rn(dy[e], __fmul_rn(x[e], rstd[r]));
  }
};

std::int64_t rms_rows(const Tensor& x, const Tensor& w, const char* op) {
  const std::int64_t H = w.numel();
  SCALELAB_CHECK(H > 0 && x.numel() % H == 0,
                 std::string("[") + op + "] input " + x.shape().str() + " does not end in the weight's " +
                     std::to_string(H));
  return x.numel() / H;
}

// --------------------------------------------------------------------------------------------
// LayerNorm
// --------------------------------------------------------------------------------------------

// y = (src − m) · inv [· w] [+ b]: shared by forward and recompute (bit-identical).
__device__ __forceinline__ float ln_out(float src, float m, float inv, const In& w, const In& b, std::int64_t i) {
  float v = __fmul_rn(__fsub_rn(src, m), inv);
  if (w.present()) v = __fmul_rn(v, w[i]);
  if (b.present()) v = __fadd_rn(v, b[i]);
  return v;
}

// mean = Σ src · (1/H), rstd = 1 / sqrt(Σ (src − mean)² · (1/H) + eps), src = x, or (residual)
// h = x + delta as stored in h's dtype.
template <bool kResidual>
__global__ void ln_forward_kernel(Out h, Out y, float* __restrict__ mean, float* __restrict__ rstd, In x, In delta,
                                  In w, In b, std::int64_t rows, std::int64_t H, float eps) {
  __shared__ float sh[32];
  const float inv_h = 1.0f / static_cast<float>(H);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * H;
    float s = 0.0f;
    for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      float v;
      if constexpr (kResidual) {
        const float sum = __fadd_rn(x[base + i], delta[base + i]);
        h.set(base + i, sum);
        v = h.rounded(sum);
      } else {
        v = x[base + i];
      }
      s = __fadd_rn(s, v);
    }
    s = block_sum(s, sh);
    const float m = __fmul_rn(s, inv_h);
    float ss = 0.0f;
    for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const float d = __fsub_rn(kResidual ? h[base + i] : x[base + i], m);
      ss = fmaf(d, d, ss);
    }
    ss = block_sum(ss, sh);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fmul_rn(ss, inv_h), eps)));
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = inv;
    }
    for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const float src = kResidual ? h[base + i] : x[base + i];
      y.set(base + i, ln_out(src, m, inv, w, b, i));
    }
  }
}

__global__ void ln_recompute_kernel(Out y, const float* __restrict__ mean, const float* __restrict__ rstd, In h, In w,
                                    In b, std::int64_t rows, std::int64_t H) {
  const std::int64_t n = rows * H;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / H, i = e - r * H;
    y.set(e, ln_out(h[e], mean[r], rstd[r], w, b, i));
  }
}

// dx (= or +=) inv · (g − a − xhat · c),  g = dy · w (dy without w),  xhat = (x − mean) · inv,
// a = Σg / H, c = Σ g·xhat / H (cpu/layernorm.cpp backward_impl).
__global__ void ln_backward_kernel(Out dx, In dy, In x, const float* __restrict__ mean,
                                   const float* __restrict__ rstd, In w, std::int64_t rows, std::int64_t H,
                                   bool accumulate) {
  __shared__ float2 sh[32];
  const float inv_h = 1.0f / static_cast<float>(H);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * H;
    const float m = mean[r], inv = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const float xh = __fmul_rn(__fsub_rn(x[base + i], m), inv);
      const float g = w.present() ? __fmul_rn(dy[base + i], w[i]) : dy[base + i];
      sg = __fadd_rn(sg, g);
      sgx = fmaf(g, xh, sgx);
    }
    const float2 t = block_sum2(sg, sgx, sh);
    const float a = __fmul_rn(t.x, inv_h), c = __fmul_rn(t.y, inv_h);
    for (std::int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const float xh = __fmul_rn(__fsub_rn(x[base + i], m), inv);
      const float g = w.present() ? __fmul_rn(dy[base + i], w[i]) : dy[base + i];
      const float v = __fmul_rn(inv, __fsub_rn(__fsub_rn(g, a), __fmul_rn(xh, c)));
      dx.set(base + i, accumulate ? __fadd_rn(dx[base + i], v) : v);
    }
  }
}

// dw column term: dy · (x − mean) · rstd.
struct LnDwTerm {
  In dy, x;
  const float* mean;
  const float* rstd;
  std::int64_t H;
  __device__ float operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t e = r * H + c;
    return __fmul_rn(dy[e], __fmul_rn(__fsub_rn(x[e], mean[r]), rstd[r]));
  }
};

// db column term: dy.
struct DyTerm {
  In dy;
  std::int64_t H;
  __device__ float operator()(std::int64_t r, std::int64_t c) const { return dy[r * H + c]; }
};

void ln_forward(Tensor* h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor* delta,
                const Tensor& w, const Tensor& b, float eps, const char* op) {
  const std::int64_t H = x.dim(-1);
  SCALELAB_CHECK(H > 0, std::string("[") + op + "] empty rows");
  const std::int64_t rows = x.numel() / H;
  require_numel(y, rows * H, op, "output");
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  require_dtype(mean, DType::kF32, op, "mean");
  require_dtype(rstd, DType::kF32, op, "rstd");
  if (w.defined()) require_numel(w, H, op, "weight");
  if (b.defined()) require_numel(b, H, op, "bias");
  if (delta != nullptr) {
    require_numel(*delta, rows * H, op, "residual delta");
    require_numel(*h, rows * H, op, "residual output");
  }
  if (rows == 0) return;
  const unsigned threads = row_threads(H);
  if (delta != nullptr) {
    ln_forward_kernel<true><<<row_blocks(rows), threads, 0, stream()>>>(
        out_of(*h), out_of(y), mean.f32(), rstd.f32(), in_of(x), in_of(*delta), in_of(w), in_of(b), rows, H, eps);
  } else {
    ln_forward_kernel<false><<<row_blocks(rows), threads, 0, stream()>>>(
        Out{}, out_of(y), mean.f32(), rstd.f32(), in_of(x), In{}, in_of(w), in_of(b), rows, H, eps);
  }
  check_launch(op);
}

void ln_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                 const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool accumulate, const char* op) {
  const std::int64_t H = x.dim(-1);
  SCALELAB_CHECK(H > 0, std::string("[") + op + "] empty rows");
  const std::int64_t rows = x.numel() / H;
  require_numel(dx, rows * H, op, "input gradient");
  require_numel(dy, rows * H, op, "output gradient");
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  if (w.defined()) require_numel(w, H, op, "weight");
  Out dwo = out_of(dw), dbo = out_of(db);
  if (dwo.present()) require_numel(*dw, H, op, "weight gradient");
  if (dbo.present()) require_numel(*db, H, op, "bias gradient");
  if (rows == 0) return;
  // Parameter gradients first: they read dy, which dx may overwrite.
  if (dwo.present()) column_sum_into(dwo, LnDwTerm{in_of(dy), in_of(x), mean.f32(), rstd.f32(), H}, rows, H, ctx, op);
  if (dbo.present()) column_sum_into(dbo, DyTerm{in_of(dy), H}, rows, H, ctx, op);
  ln_backward_kernel<<<row_blocks(rows), row_threads(H), 0, stream()>>>(
      out_of(dx), in_of(dy), in_of(x), mean.f32(), rstd.f32(), in_of(w), rows, H, accumulate);
  check_launch(op);
}

}  // namespace

// --------------------------------------------------------------------------------------------
// RMSNorm methods
// --------------------------------------------------------------------------------------------

void CudaBackend::rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps,
                                  ExecContext& ctx) {
  const char* op = "rmsnorm_forward";
  const std::int64_t rows = rms_rows(x, w, op), H = w.numel();
  require_numel(y, rows * H, op, "output");
  require_numel(rstd, rows, op, "rstd");
  require_dtype(rstd, DType::kF32, op, "rstd");
  if (rows == 0) return;
  rms_forward_launch<false>(nullptr, y, rstd, x, nullptr, w, rows, H, eps, op);
}

void CudaBackend::rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                                   const Tensor& w, ExecContext& ctx, bool accumulate_dx) {
  const char* op = "rmsnorm_backward";
  const std::int64_t rows = rms_rows(x, w, op), H = w.numel();
  require_numel(dx, rows * H, op, "input gradient");
  require_numel(dy, rows * H, op, "output gradient");
  if (dw.defined()) require_numel(dw, H, op, "weight gradient");
  require_numel(rstd, rows, op, "rstd");
  if (rows == 0) return;
  if (dw.defined()) column_sum_into(out_of(dw), RmsDwTerm{in_of(dy), in_of(x), rstd.f32(), H}, rows, H, ctx, op);
  rms_backward_launch<false>(dx, dy, x, rstd, w, rows, H, accumulate_dx, op);
}

void CudaBackend::rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta,
                                           const Tensor& w, float eps, ExecContext& ctx) {
  const char* op = "rmsnorm_residual_forward";
  const std::int64_t rows = rms_rows(x, w, op), H = w.numel();
  require_numel(y, rows * H, op, "output");
  require_numel(delta, rows * H, op, "residual delta");
  require_numel(h, rows * H, op, "residual output");
  require_numel(rstd, rows, op, "rstd");
  require_dtype(rstd, DType::kF32, op, "rstd");
  if (rows == 0) return;
  rms_forward_launch<true>(&h, y, rstd, x, &delta, w, rows, H, eps, op);
}

void CudaBackend::rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h,
                                            const Tensor& rstd, const Tensor& w, ExecContext& ctx) {
  const char* op = "rmsnorm_residual_backward";
  const std::int64_t rows = rms_rows(h, w, op), H = w.numel();
  require_numel(dh, rows * H, op, "residual gradient");
  require_numel(dy, rows * H, op, "output gradient");
  if (dw.defined()) require_numel(dw, H, op, "weight gradient");
  require_numel(rstd, rows, op, "rstd");
  if (rows == 0) return;
  if (dw.defined()) column_sum_into(out_of(dw), RmsDwTerm{in_of(dy), in_of(h), rstd.f32(), H}, rows, H, ctx, op);
  rms_backward_launch<true>(dh, dy, h, rstd, w, rows, H, true, op);
}

void CudaBackend::rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w,
                                    ExecContext& ctx) {
  const char* op = "rmsnorm_recompute";
  const std::int64_t rows = rms_rows(h, w, op), H = w.numel();
  require_numel(y, rows * H, op, "output");
  require_numel(rstd, rows, op, "rstd");
  if (rows == 0) return;
  if (rms_packed_threads(H, {&y, &h, &w}) != 0 && (rows * H) / (16 / static_cast<std::int64_t>(dtype_size(h.dtype()))) < (std::int64_t{1} << 31)) {
    dispatch_float(h.dtype(), op, [&]<class E>() {
      const auto row_packs = static_cast<std::uint32_t>(H / Pack<E>::kN);
      const auto packs = static_cast<std::uint32_t>(rows * row_packs);
      rms_recompute_packed<E><<<pack_grid(packs), 256, 0, stream()>>>(
          static_cast<E*>(y.raw()), rstd.f32(), static_cast<const E*>(h.raw()), static_cast<const E*>(w.raw()), packs,
          row_packs);
    });
    check_launch(op);
    return;
  }
  rms_recompute_kernel<<<grid_for(rows * H), 256, 0, stream()>>>(out_of(y), rstd.f32(), in_of(h), in_of(w), rows,
                                                                   H);
  check_launch(op);
}

// --------------------------------------------------------------------------------------------
// LayerNorm methods
// --------------------------------------------------------------------------------------------

void CudaBackend::layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                                    const Tensor& b, float eps, ExecContext& ctx) {
  ln_forward(nullptr, y, mean, rstd, x, nullptr, w, b, eps, "layernorm_forward");
}

void CudaBackend::layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx,
                                     bool accumulate_dx) {
  ln_backward(dx, dw, db, dy, x, mean, rstd, w, ctx, accumulate_dx, "layernorm_backward");
}

void CudaBackend::layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                                             const Tensor& delta, const Tensor& w, const Tensor& b, float eps,
                                             ExecContext& ctx) {
  ln_forward(&h, y, mean, rstd, x, &delta, w, b, eps, "layernorm_residual_forward");
}

void CudaBackend::layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h,
                                              const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                              ExecContext& ctx) {
  ln_backward(dh, dw, db, dy, h, mean, rstd, w, ctx, /*accumulate=*/true, "layernorm_residual_backward");
}

void CudaBackend::layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& w, const Tensor& b, ExecContext& ctx) {
  const char* op = "layernorm_recompute";
  const std::int64_t H = h.dim(-1);
  SCALELAB_CHECK(H > 0, std::string("[") + op + "] empty rows");
  const std::int64_t rows = h.numel() / H;
  require_numel(y, rows * H, op, "output");
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  if (w.defined()) require_numel(w, H, op, "weight");
  if (b.defined()) require_numel(b, H, op, "bias");
  if (rows == 0) return;
  ln_recompute_kernel<<<grid_for(rows * H), 256, 0, stream()>>>(out_of(y), mean.f32(), rstd.f32(), in_of(h),
                                                                  in_of(w), in_of(b), rows, H);
  check_launch(op);
}

}  // namespace scalelab::kernels::cuda
