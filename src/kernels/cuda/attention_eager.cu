// Causal grouped-query attention on the GPU (kernels/attention.h is the contract, the CPU code in
// kernels/cpu/attention_{eager,flash}.cpp the oracle). Plain fp32 FMA tiles in shared memory; no
// cuBLAS. All four ops share the same tile machinery:
//
//   flash forward   one block per (row tile, query head, batch): K/V tiles up to the causal
//                   diagonal, online softmax in the log2 domain, out and lse (natural log) written.
//   eager forward   the same row tiles: a first pass finds each row's max and sum, a second pass
//                   writes the full probability rows (zeros above the diagonal) in the dtype of
//                   probs; a second kernel then multiplies the stored (rounded) probabilities by V,
//                   as the CPU does.
//   backward        "rows" kernel per (row tile, query head, batch): dQ = scale · dS K (and, eager,
//                   D = Σ_j P·dP first, written to the workspace); "cols" kernel per (key tile, kv
//                   head, batch): dK = scale · dS^T Q and dV = P^T dO summed over the query heads of
//                   the group. Flash recomputes P from lse; D = rowsum(dO ⊙ O) comes from a small
//                   kernel before. Every gradient element has one writer: no atomics, results are
//                   bit-identical from run to run.
//
// Workspace: forward none; backward one fp32 D per score row ([B, nh, S], "attention workspace").
// No S×S buffer exists for flash. Head dims up to 256 run on the tile of the next power of two
// (32, 64, 128, 256), zero-padded.
//
// Thread geometry (every kernel, 128 threads): warp w, lane = rg·8 + cg. A thread owns the rows
// w·(R/4) + rg + 4i of an R-row operand (i < R/16) and the columns cg + 8j of the other, so
// reductions over a row run across the 8 lanes sharing rg (shuffles xor 1, 2, 4). Shared-memory
// rows are padded (hd + 1 floats; score tiles + 8) so that these access patterns are free of bank
// conflicts.
//
// This file: the eager methods (attention_flash.cu has the flash ones).
//
// By default (SCALELAB_CUDA_EAGER=fma: the FMA-tile kernels above, the first version, to compare)
// the eager methods run on cuBLASLt instead of the FMA-tile kernels: the products are tensor-core GEMMs, strided-batched over the kv heads,
// as the reference's eager attention multiplies with cuBLAS. For each batch element b and each
// position g within a query-head group (heads h = j·G + g share kv head j):
//   forward   scores_j = scale · Q_h · K_jᵀ (fp32 [S, S] each, "attention workspace"); a row
//             kernel writes probs_h = softmax over keys 0..i of row i (zeros above the diagonal),
//             rounded to the probs dtype; out_h = probs_h · V_j (the stored, rounded probabilities,
//             as the CPU).
//   backward  dP_j = dO_h · V_jᵀ (fp32 workspace); a row kernel forms dS = P ⊙ (dP − Σ_k P·dP) in
//             the activations' dtype (workspace); dV_j (+)= P_hᵀ · dO_h, dQ_h = scale · dS · K_j,
//             dK_j (+)= scale · dSᵀ · Q_h, the group's heads adding into dK_j/dV_j in turn.
// Workspace per call (reused over b and g): forward nkv·S·S fp32; backward nkv·S·S fp32 and
// nkv·S·S in the activations' dtype — the rule the plan replays (attention.h,
// attention_eager_cuda_workspace_blocks). The full S×S products do twice the causal work, as the
// reference's do.
#include "kernels/attention.h"
#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/backend.h"

namespace scalelab::kernels::cuda {

using namespace attn;

namespace {

constexpr int kRowThreads = 256;

__device__ __forceinline__ float block_reduce(float v, float* sh, bool is_max) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  __syncthreads();  // a previous call's readers are done with sh
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  float r = sh[0];
  for (int k = 1; k < static_cast<int>(blockDim.x >> 5); ++k) r = is_max ? fmaxf(r, sh[k]) : r + sh[k];
  return r;
}

// One block per score row (j, i) of a (b, g) slice: probs row = softmax of scores[0..i], zeros after.
template <class T>
__global__ void __launch_bounds__(kRowThreads) eager_softmax_rows(T* probs, std::int64_t probs_head_stride,
                                                                  const float* __restrict__ scores, int S) {
  __shared__ float sh[32];
  const std::int64_t row = blockIdx.x;  // j·S + i
  const int j = static_cast<int>(row / S), i = static_cast<int>(row - static_cast<std::int64_t>(j) * S);
  const float* x = scores + row * S;
  T* p = probs + j * probs_head_stride + static_cast<std::int64_t>(i) * S;
  const int valid = i + 1;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < valid; c += blockDim.x) m = fmaxf(m, x[c]);
  m = block_reduce(m, sh, true);
  float sum = 0.0f;
  for (int c = threadIdx.x; c < valid; c += blockDim.x) sum += expf(x[c] - m);
  sum = block_reduce(sum, sh, false);
  const float inv = 1.0f / sum;
  for (int c = threadIdx.x; c < S; c += blockDim.x) p[c] = from_f32<T>(c < valid ? expf(x[c] - m) * inv : 0.0f);
}

// One block per row (j, i): ds = P ⊙ (dP − Σ_c P·dP) over keys 0..i, zeros after (P as stored).
template <class T>
__global__ void __launch_bounds__(kRowThreads) eager_dscores_rows(T* __restrict__ ds, const float* __restrict__ dp,
                                                                  const T* __restrict__ probs,
                                                                  std::int64_t probs_head_stride, int S) {
  __shared__ float sh[32];
  const std::int64_t row = blockIdx.x;
  const int j = static_cast<int>(row / S), i = static_cast<int>(row - static_cast<std::int64_t>(j) * S);
  const float* d = dp + row * S;
  const T* p = probs + j * probs_head_stride + static_cast<std::int64_t>(i) * S;
  T* o = ds + row * S;
  const int valid = i + 1;
  float dot = 0.0f;
  for (int c = threadIdx.x; c < valid; c += blockDim.x) dot += to_f32<T>(p[c]) * d[c];
  dot = block_reduce(dot, sh, false);
  for (int c = threadIdx.x; c < S; c += blockDim.x)
    o[c] = from_f32<T>(c < valid ? to_f32<T>(p[c]) * (d[c] - dot) : 0.0f);
}

void eager_forward_lt(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale,
                      ExecContext& ctx, const char* op) {
  const std::int64_t S = s.seq, hd = s.head_dim, W = s.qkv_width(), ldo = s.out_width();
  const std::int64_t nh = s.n_heads, nkv = s.n_kv_heads, G = nh / nkv;
  const std::int64_t k_off = nh * hd, v_off = k_off + nkv * hd;
  const DType dt = qkv.dtype();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt));
  Tensor scores = Tensor::empty({nkv * S * S}, DType::kF32, *ctx.alloc, "attention workspace");
  const char* base = static_cast<const char*>(qkv.raw());
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const char* qkv_b = base + b * S * W * es;
    for (std::int64_t g = 0; g < G; ++g) {
      // scores_j = scale · Q_h · K_jᵀ, h = j·G + g
      gemm_strided_batched(false, true, S, S, hd, scale, qkv_b + g * hd * es, dt, W, G * hd, qkv_b + k_off * es, W,
                           hd, 0.0f, scores.raw(), DType::kF32, S, S * S, nkv);
      void* pb = static_cast<char*>(probs.raw()) + (b * nh + g) * S * S * es;
      dispatch_float(dt, op, [&]<class T>() {
        eager_softmax_rows<T><<<static_cast<unsigned>(nkv * S), kRowThreads, 0, stream()>>>(
            static_cast<T*>(pb), G * S * S, scores.f32(), static_cast<int>(S));
      });
      check_launch(op);
      // out_h = P_h · V_j
      gemm_strided_batched(false, false, S, hd, S, 1.0f, pb, dt, S, G * S * S, qkv_b + v_off * es, W, hd, 0.0f,
                           static_cast<char*>(out.raw()) + (b * S * ldo + g * hd) * es, dt, ldo, G * hd, nkv);
    }
  }
}

void eager_backward_lt(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                       const AttentionShape& s, float scale, ExecContext& ctx, const char* op) {
  const std::int64_t S = s.seq, hd = s.head_dim, W = s.qkv_width(), ldo = s.out_width();
  const std::int64_t nh = s.n_heads, nkv = s.n_kv_heads, G = nh / nkv;
  const std::int64_t k_off = nh * hd, v_off = k_off + nkv * hd;
  const DType dt = qkv.dtype();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt));
  Tensor dp = Tensor::empty({nkv * S * S}, DType::kF32, *ctx.alloc, "attention workspace");
  Tensor ds = Tensor::empty({nkv * S * S}, dt, *ctx.alloc, "attention workspace");
  const char* q_base = static_cast<const char*>(qkv.raw());
  const char* do_base = static_cast<const char*>(dout.raw());
  char* dq_base = static_cast<char*>(dqkv.raw());
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const char* qkv_b = q_base + b * S * W * es;
    const char* do_b = do_base + b * S * ldo * es;
    char* dqkv_b = dq_base + b * S * W * es;
    for (std::int64_t g = 0; g < G; ++g) {
      const char* pb = static_cast<const char*>(probs.raw()) + (b * nh + g) * S * S * es;
      const float acc = g > 0 ? 1.0f : 0.0f;  // the group's later heads add into dK_j, dV_j
      // dP_j = dO_h · V_jᵀ
      gemm_strided_batched(false, true, S, S, hd, 1.0f, do_b + g * hd * es, dt, ldo, G * hd, qkv_b + v_off * es, W, hd,
                           0.0f, dp.raw(), DType::kF32, S, S * S, nkv);
      dispatch_float(dt, op, [&]<class T>() {
        eager_dscores_rows<T><<<static_cast<unsigned>(nkv * S), kRowThreads, 0, stream()>>>(
            static_cast<T*>(ds.raw()), dp.f32(), reinterpret_cast<const T*>(pb), G * S * S, static_cast<int>(S));
      });
      check_launch(op);
      // dV_j (+)= P_hᵀ · dO_h
      gemm_strided_batched(true, false, S, hd, S, 1.0f, pb, dt, S, G * S * S, do_b + g * hd * es, ldo, G * hd, acc,
                           dqkv_b + v_off * es, dt, W, hd, nkv);
      // dQ_h = scale · dS · K_j
      gemm_strided_batched(false, false, S, hd, S, scale, ds.raw(), dt, S, S * S, qkv_b + k_off * es, W, hd, 0.0f,
                           dqkv_b + g * hd * es, dt, W, G * hd, nkv);
      // dK_j (+)= scale · dSᵀ · Q_h
      gemm_strided_batched(true, false, S, hd, S, scale, ds.raw(), dt, S, S * S, qkv_b + g * hd * es, W, G * hd, acc,
                           dqkv_b + k_off * es, dt, W, hd, nkv);
    }
  }
}

}  // namespace

void CudaBackend::attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s,
                                          float scale, ExecContext& ctx) {
  const char* op = "attention_eager_forward";
  const Geo g = make_geo(s, scale, op);
  require_cuda_float(qkv, qkv.dtype(), op, "qkv");
  require_cuda_float(out, qkv.dtype(), op, "output");
  require_cuda_float(probs, qkv.dtype(), op, "probs");
  if (cuda_eager_uses_cublaslt()) return eager_forward_lt(out, probs, qkv, s, scale, ctx, op);
  dispatch_float(qkv.dtype(), op, [&]<class T>() {
    dispatch_hd(g.hd, [&]<int HD>() {
      using C = Cfg<HD>;
      static const bool ready = (prepare(eager_probs_kernel<T, HD>, fwd_smem<HD>(), op),
                                 prepare(eager_pv_kernel<T, HD>, pv_smem<HD>(), op), true);
      (void)ready;
      const dim3 grid(tiles(g.S, C::BR), g.nh, static_cast<unsigned>(s.batch));
      eager_probs_kernel<T, HD><<<grid, kThreads, fwd_smem<HD>(), stream()>>>(static_cast<T*>(probs.raw()),
                                                                             static_cast<const T*>(qkv.raw()), g);
      check_launch(op);
      eager_pv_kernel<T, HD><<<grid, kThreads, pv_smem<HD>(), stream()>>>(
          static_cast<T*>(out.raw()), static_cast<const T*>(probs.raw()), static_cast<const T*>(qkv.raw()), g);
      check_launch(op);
    });
  });
}

void CudaBackend::attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                                           const AttentionShape& s, float scale, ExecContext& ctx) {
  const char* op = "attention_eager_backward";
  const Geo g = make_geo(s, scale, op);
  require_cuda_float(qkv, qkv.dtype(), op, "qkv");
  require_cuda_float(dout, qkv.dtype(), op, "output gradient");
  require_cuda_float(probs, qkv.dtype(), op, "probs");
  require_cuda_float(dqkv, qkv.dtype(), op, "qkv gradient");
  if (cuda_eager_uses_cublaslt()) return eager_backward_lt(dqkv, dout, probs, qkv, s, scale, ctx, op);
  Tensor D = d_workspace(s, ctx);  // D = Σ_j P·dP per row, written by the rows kernel
  dispatch_float(qkv.dtype(), op, [&]<class T>() {
    launch_backward<T, true>(static_cast<T*>(dqkv.raw()), D.f32(), static_cast<const T*>(dout.raw()),
                             static_cast<const T*>(probs.raw()), nullptr, static_cast<const T*>(qkv.raw()), g,
                             s.batch, op);
  });
}


}  // namespace scalelab::kernels::cuda
