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
#include "kernels/cuda/attention_launch.cuh"
#include "kernels/cuda/backend.h"

namespace scalelab::kernels::cuda {

using namespace attn;

void CudaBackend::attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s,
                                          float scale, ExecContext& ctx) {
  (void)ctx;
  const char* op = "attention_eager_forward";
  const Geo g = make_geo(s, scale, op);
  require_cuda_float(qkv, qkv.dtype(), op, "qkv");
  require_cuda_float(out, qkv.dtype(), op, "output");
  require_cuda_float(probs, qkv.dtype(), op, "probs");
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
  Tensor D = d_workspace(s, ctx);  // D = Σ_j P·dP per row, written by the rows kernel
  dispatch_float(qkv.dtype(), op, [&]<class T>() {
    launch_backward<T, true>(static_cast<T*>(dqkv.raw()), D.f32(), static_cast<const T*>(dout.raw()),
                             static_cast<const T*>(probs.raw()), nullptr, static_cast<const T*>(qkv.raw()), g,
                             s.batch, op);
  });
}


}  // namespace scalelab::kernels::cuda
