// The flash attention methods of CudaBackend: cuDNN's fused SDPA for bf16/fp16 where this build and
// the machine have it (attention_cudnn.h), else scalelab's own FlashAttention-2 style kernels (the
// design is described at the top of attention_eager.cu and the kernels are in attention_kernels.cuh).
// Measured on an H200 (bench/gpu/results): cuDNN's backward is far faster than the own kernels,
// which use no tensor cores.
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/backend.h"

namespace scalelab::kernels::cuda {

using namespace attn;

void CudaBackend::attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s,
                                          float scale, ExecContext& ctx) {
  const char* op = "attention_flash_forward";
  const Geo g = make_geo(s, scale, op);
  require_cuda_float(qkv, qkv.dtype(), op, "qkv");
  require_cuda_float(out, qkv.dtype(), op, "output");
  require_cuda_float(lse, DType::kF32, op, "lse");
  if (cudnn_flash_forward(out, lse, qkv, s, scale, ctx)) return;
  dispatch_float(qkv.dtype(), op, [&]<class T>() {
    dispatch_hd(g.hd, [&]<int HD>() {
      using C = Cfg<HD>;
      static const bool ready = (prepare(flash_fwd_kernel<T, HD>, fwd_smem<HD>(), op), true);
      (void)ready;
      const dim3 grid(tiles(g.S, C::BR), g.nh, static_cast<unsigned>(s.batch));
      flash_fwd_kernel<T, HD><<<grid, kThreads, fwd_smem<HD>(), stream()>>>(
          static_cast<T*>(out.raw()), lse.f32(), static_cast<const T*>(qkv.raw()), g);
      check_launch(op);
    });
  });
}

void CudaBackend::attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                                           const Tensor& qkv, const AttentionShape& s, float scale,
                                           ExecContext& ctx) {
  const char* op = "attention_flash_backward";
  const Geo g = make_geo(s, scale, op);
  require_cuda_float(qkv, qkv.dtype(), op, "qkv");
  require_cuda_float(out, qkv.dtype(), op, "output");
  require_cuda_float(dout, qkv.dtype(), op, "output gradient");
  require_cuda_float(dqkv, qkv.dtype(), op, "qkv gradient");
  require_cuda_float(lse, DType::kF32, op, "lse");
  if (cudnn_flash_backward(dqkv, dout, out, lse, qkv, s, scale, ctx)) return;
  Tensor D = d_workspace(s, ctx);  // D = rowsum(dO ⊙ O)
  dispatch_float(qkv.dtype(), op, [&]<class T>() {
    const std::int64_t n = s.batch * s.seq * s.n_heads;
    flash_rowdot_kernel<T><<<grid_for(n, kThreads / 32), kThreads, 0, stream()>>>(
        D.f32(), static_cast<const T*>(dout.raw()), static_cast<const T*>(out.raw()), g, n);
    check_launch(op);
    launch_backward<T, false>(static_cast<T*>(dqkv.raw()), D.f32(), static_cast<const T*>(dout.raw()), nullptr,
                              lse.f32(), static_cast<const T*>(qkv.raw()), g, s.batch, op);
  });
}


}  // namespace scalelab::kernels::cuda
