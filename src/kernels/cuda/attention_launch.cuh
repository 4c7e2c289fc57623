#pragma once
// Host-side helpers shared by attention_eager.cu and attention_flash.cu: shape checks, the
// head-dim dispatch, shared-memory opt-in and the backward launch (kernels in attention_kernels.cuh).
#include <string>

#include "kernels/attention.h"
#include "kernels/cuda/common.cuh"
// common.cuh first: the kernels use its to_f32/from_f32.
#include "kernels/cuda/attention_kernels.cuh"

namespace scalelab::kernels::cuda::attn {

// ---------------------------------------------------------------------------------------------
// Host side

inline Geo make_geo(const AttentionShape& s, float scale, const char* op) {
  if (s.batch <= 0 || s.seq <= 0 || s.head_dim <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 ||
      s.n_heads % s.n_kv_heads != 0)
    throw RuntimeError(std::string("[") + op + "] bad attention shape (n_kv_heads must divide n_heads, sizes > 0)");
  if (s.head_dim > 256)
    throw RuntimeError(std::string("[") + op + "] head_dim " + std::to_string(s.head_dim) +
                       " is larger than the CUDA kernels support (256)");
  if (s.batch > 65535 || s.n_heads > 65535 || s.seq > (1LL << 30) || s.qkv_width() > (1LL << 30))
    throw RuntimeError(std::string("[") + op + "] attention shape too large for the CUDA launch grid");
  Geo g;
  g.S = static_cast<int>(s.seq);
  g.nh = static_cast<int>(s.n_heads);
  g.nkv = static_cast<int>(s.n_kv_heads);
  g.group = g.nh / g.nkv;
  g.hd = static_cast<int>(s.head_dim);
  g.ld = s.qkv_width();
  g.ldo = s.out_width();
  g.k_off = g.nh * g.hd;
  g.v_off = g.k_off + g.nkv * g.hd;
  g.scale = scale;
  g.c2 = scale * kLog2e;
  return g;
}

inline void require_cuda_float(const Tensor& t, DType dt, const char* op, const char* name) {
  if (t.device() != DeviceType::kCUDA)
    throw RuntimeError(std::string("[") + op + "] " + name + " is not on the CUDA device");
  if (t.dtype() != dt)
    throw RuntimeError(std::string("[") + op + "] " + name + " must be " + std::string(dtype_name(dt)) +
                       " (the dtype of qkv), got " + std::string(dtype_name(t.dtype())));
}

// Calls f.template operator()<HD>() with the tile head dim for hd (≤ 256, checked by make_geo).
template <class F>
void dispatch_hd(int hd, F&& f) {
  if (hd <= 32) f.template operator()<32>();
  else if (hd <= 64) f.template operator()<64>();
  else if (hd <= 128) f.template operator()<128>();
  else f.template operator()<256>();
}

// Opts the kernel into `bytes` of dynamic shared memory (above the 48 KiB default) once.
template <class K>
void prepare(K kernel, std::size_t bytes, const char* op) {
  const auto optin = static_cast<std::size_t>(device_props().sharedMemPerBlockOptin);
  if (bytes > optin)
    throw RuntimeError(std::string("[") + op + "] needs " + std::to_string(bytes) + " bytes of shared memory per block, the GPU allows " +
                       std::to_string(optin) + " — use a smaller head_dim");
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), op);
}

inline unsigned tiles(int n, int t) { return static_cast<unsigned>((n + t - 1) / t); }

inline Tensor d_workspace(const AttentionShape& s, ExecContext& ctx) {
  return Tensor::empty({s.batch * s.n_heads * s.seq}, DType::kF32, *ctx.alloc, "attention workspace");
}

template <class T, bool EAGER>
void launch_backward(T* dqkv, float* D, const T* dout, const T* probs, const float* lse, const T* qkv, const Geo& g,
                     std::int64_t batch, const char* op) {
  dispatch_hd(g.hd, [&]<int HD>() {
    using C = Cfg<HD>;
    static const bool ready = (prepare(bwd_rows_kernel<T, HD, EAGER>, rows_smem<HD>(), op),
                               prepare(bwd_cols_kernel<T, HD, EAGER>, cols_smem<HD>(), op), true);
    (void)ready;
    const dim3 rows_grid(tiles(g.S, C::BR), g.nh, static_cast<unsigned>(batch));
    bwd_rows_kernel<T, HD, EAGER><<<rows_grid, kThreads, rows_smem<HD>(), stream()>>>(dqkv, D, dout, probs, lse, qkv, g);
    check_launch(op);
    const dim3 cols_grid(tiles(g.S, C::BK), g.nkv, static_cast<unsigned>(batch));
    bwd_cols_kernel<T, HD, EAGER><<<cols_grid, kThreads, cols_smem<HD>(), stream()>>>(dqkv, D, dout, probs, lse, qkv, g);
    check_launch(op);
  });
}

}  // namespace scalelab::kernels::cuda::attn
