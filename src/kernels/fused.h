#pragma once
// Fused kernels: the `--fused-kernels` rung (the CPU analogue of Liger-Kernel), for Llama and OPT.
// Each computes the same function as the unfused composition it replaces (fp32: within ~1e-5
// relative; the order of float sums differs) and saves memory or passes over memory:
//
//   residual add + norm    h = x + delta and y = norm(h) in one pass over each row, instead of an
//                          add kernel and a norm kernel (one fewer read and write of [T, H]).
//   SwiGLU / bias+ReLU     the MLP activation is not kept for backward: swiglu_backward_recompute
//                          rebuilds silu(gate)·up while it computes the gate/up gradient;
//                          bias_relu applies the fc1 bias and the ReLU in one in-place pass.
//   linear + cross-entropy the LM head and the loss, chunk by chunk over tokens: the full
//                          [tokens, vocab] logits never exist, forward or backward.
//
// Conventions as everywhere in kernels/: arguments are outputs, saved-for-backward, inputs,
// parameters, sizes, then the context. Parameter gradients accumulate (+=), activation gradients
// are assigned (=) unless a function says otherwise. Rows are the
// leading dimensions flattened; the last dimension is the feature dimension. Tensors may be fp32,
// bf16 or fp16 (compute in fp32; low-precision rows are staged through fp32 buffers).
//
// RoPE needs no fused form here: rope_forward/rope_backward (rope.h) already rotate in place.
// The plain LayerNorm that OPT's baseline uses is in layernorm.h.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "kernels/loss.h"

namespace scalelab::kernels {

// ---------------------------------------------------------------------------------------------
// Residual add fused into the norm (CPU: cpu/fused_norm.cpp and cpu/layernorm.cpp)
// ---------------------------------------------------------------------------------------------

// h = x + delta;  y = h · rstd · w,  rstd = 1 / sqrt(mean(h²) + eps)  (one pass per row).
// Saves h (the residual stream, which the next residual add needs anyway) and rstd[rows].
// h may alias x or delta (the in-place residual add), y may not alias h.
// Replaces: add_(delta, x) followed by rmsnorm_forward(y, rstd, delta, w, eps).
void rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta,
                              const Tensor& w, float eps, ExecContext& ctx);

// Backward of rmsnorm_residual_forward. On entry dh holds the gradient that reaches h through the
// residual path (the gradient of the block's output); on return it holds the whole gradient of h,
// dh += rmsnorm_backward(dy), which is the gradient of both x and delta (h = x + delta).
// dw += Σ_rows dy · h · rstd. One pass per row, vectorized; the same as
// rmsnorm_backward(dh, dw, dy, h, rstd, w, ctx, /*accumulate_dx=*/true).
void rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h, const Tensor& rstd,
                               const Tensor& w, ExecContext& ctx);

// Rebuilds the norm output y = h · rstd · w from the saved h and rstd, bit-identical to what
// rmsnorm_residual_forward wrote. Lets a caller drop y after forward and rebuild it in backward
// for the weight gradient of the projection that consumed it (one [T, H] per norm saved).
void rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext& ctx);

// OPT: h = x + delta;  y = (h − mean) · rstd · w + b, biased variance, as torch.nn.LayerNorm.
// w and b may be undefined tensors (layer_norm_elementwise_affine = false: w = 1, b = 0).
// Saves h, mean[rows] and rstd[rows]. h may alias x or delta; y may not alias h.
void layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                                const Tensor& delta, const Tensor& w, const Tensor& b, float eps, ExecContext& ctx);

// Backward of layernorm_residual_forward: dh += layernorm_backward(dy) (see
// rmsnorm_residual_backward for the meaning of dh on entry and return); dw, db accumulate and may
// be null or undefined when there is no affine weight / bias.
void layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx);

// Rebuilds y = (h − mean) · rstd · w + b from saved statistics, bit-identical to the forward.
void layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                         const Tensor& b, ExecContext& ctx);

// ---------------------------------------------------------------------------------------------
// MLP activations, fused and recomputed (CPU: cpu/fused_activation.cpp)
// ---------------------------------------------------------------------------------------------

// SwiGLU backward that rebuilds the activation instead of reading a saved one. gu[T, 2I] is the
// packed [gate | up] buffer (activation.h); dh[T, I] is the gradient of silu(gate)·up. In one pass:
//   act[T, I]  = silu(gate) · up                           (the recomputed forward output)
//   dgu[T, 2I] = (dh · up · s · (1 + gate · (1 − s)),  dh · silu(gate)),  s = sigmoid(gate)
// act may alias dh (the recomputed activation overwrites its own gradient), and dgu may alias gu
// (the gate/up gradient overwrites gate/up): every element is read before it is written.
// The fused rung's MLP therefore keeps only gu for backward, not act. Its backward order is:
//   dact = dout · Wdown                       (gemm; needs no activation)
//   swiglu_backward_recompute(dgu, act, dact, gu)      (act written over dact)
//   dWdown += doutᵀ · act
// swiglu_down_backward_recompute does exactly that.
void swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu, ExecContext& ctx);

// The backward of out = down(swiglu(gu)) without a saved activation: dgu[T, 2I] assigned (may
// alias gu), dwdown[H, I] += doutᵀ · act. One [T, I] scratch from ctx.alloc ("mlp activation
// (recomputed)") holds dact, then the recomputed act.
void swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                    const Tensor& wdown, ExecContext& ctx);

// OPT's fc1 bias + ReLU in one pass: y = max(x + b, 0). b may be undefined (enable_bias = false:
// plain ReLU). y may alias x, so the fc1 GEMM output becomes the activation in place.
// Saved for backward: y only (the pre-activation is not kept; y > 0 exactly where x + b > 0, and
// fc2 needs y for its weight gradient anyway).
void bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext& ctx);

// dx = dy where y > 0, else 0 (assigned; dx may alias dy). db += Σ_rows dx (db may be null or
// undefined when there is no bias). This is the gradient of fc1's output and of its bias.
void bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext& ctx);

// ---------------------------------------------------------------------------------------------
// Linear + cross-entropy over chunks of tokens (CPU: cpu/fused_loss.cpp)
// ---------------------------------------------------------------------------------------------

// Label of the chunk scratch in the allocator.
constexpr const char* kFusedLossChunkLabel = "fused loss chunk";

// Default chunk: 512 tokens, halved (not below 256) while the chunk's fp32 logits exceed 64 MiB:
// V = 32768 (llama-small) 512 tokens, 64 MiB; V = 49152 (SmolLM2) 256, 48 MiB; V = 50272 (OPT)
// 256, 49 MiB; V = 128256 (Llama 3) 256, 125 MiB. A token count, not a byte target, because the
// cost of chunking is per token: each chunk's GEMMs re-pack all of w (and read and write all of
// dw), work that a chunk of c tokens amortizes over 2c FLOPs per weight; on the CPU below ~256
// tokens that overhead shows (bench_fused at llama-small's head: 64 tokens ~0.8x, 128 ~0.9x, 256
// 0.98x, 512-1024 at parity with the unfused head; at SmolLM2's, 512 tokens: 256 costs 5 % more
// than 512 and holds half the logits). The chunk is at the step's peak (it is live while every
// activation is), so the 64 MiB cap is worth those few per cent of the head: SmolLM2's full
// fine-tuning peaks 48 MiB lower. --fused-loss-chunk N overrides it. The workspace does not grow
// with the micro-batch, which is what removes the logits term from the memory plan.
std::int64_t fused_linear_cross_entropy_default_chunk(std::int64_t vocab);
// The default on `device`. On CUDA: 4096 tokens, halved (not below 128) while the chunk's fp32
// logits exceed 1 GiB (V = 128256: 2048 tokens, 0.98 GiB; V = 50272: 4096, 0.77 GiB). Each chunk's
// dW GEMM reads and writes all of dw (0.5 GiB in bf16 for Llama 3's head), so a 256-token chunk
// spends more time moving dw than multiplying (measured on an H200: llama-3.2-1b, micro-batch 16,
// the fused loss took ~64 ms per step at 256-token chunks); GPU memory is large enough to amortize
// it over 2048 tokens. The meta device follows ExecContext::options.planned_device.
std::int64_t fused_linear_cross_entropy_default_chunk(std::int64_t vocab, DeviceType device);

// The rows the kernel processes per chunk: chunk_tokens (when <= 0, the default on `device`)
// capped at tokens.
std::int64_t fused_linear_cross_entropy_chunk(std::int64_t tokens, std::int64_t chunk_tokens, std::int64_t vocab,
                                              DeviceType device = DeviceType::kCPU);

// Bytes the kernel allocates through ctx.alloc (the allocator-rounded [chunk, vocab] fp32 logits
// of one chunk, label kFusedLossChunkLabel); pass the effective chunk
// (fused_linear_cross_entropy_chunk) for the exact figure. Besides it the kernel uses host
// scratch as the other CPU kernels do for per-thread reductions, outside the device allocator:
// threads × chunk × H floats of input-gradient partials and a few floats per token.
std::size_t fused_linear_cross_entropy_workspace_bytes(std::int64_t chunk_tokens, std::int64_t vocab);

// Every block the kernel allocates, in order, for the memory plan: the [chunk, vocab] fp32 logits,
// and with low-precision tensors an fp32 [chunk, hidden] copy of the chunk's input rows; the GEMMs
// of the low-precision path add gemm_ex's transient panels (matmul.h) for each product.
std::vector<std::size_t> fused_linear_cross_entropy_workspace_blocks(std::int64_t tokens, std::int64_t chunk_tokens,
                                                                     std::int64_t hidden, std::int64_t vocab,
                                                                     DType x_type, DType w_type, DType dx_type,
                                                                     DType dw_type, bool backward);

// Number of targets that count toward the loss (not kIgnoreIndex), counted on the targets' device
// (a device result comes back to the host: a synchronization). The one-argument form passes the
// backend a context without allocator or profiler: a backend's count must not need workspace.
std::int64_t count_target_tokens(const Tensor& targets);
std::int64_t count_target_tokens(const Tensor& targets, ExecContext& ctx);

// logits = x · wᵀ (x[T, H], w[V, H], no bias) and the cross-entropy against targets[T] (int32,
// kIgnoreIndex rows ignored), with the gradients, one chunk of tokens at a time:
//   per chunk c:  L = x_c · wᵀ;  per row lse, loss;  L ← (softmax(L) − onehot) · grad_scale_per_token
//                 (in place; ignored rows 0);  dx_c = L · w (assigned);  dw += Lᵀ · x_c.
// Returns Σ loss over counted rows and their count, like cross_entropy_forward.
//
// The mean: Hugging Face divides the summed loss by the number of target tokens of the micro-batch,
// which the gradient needs before the first chunk is done. The caller therefore passes
// grad_scale_per_token = grad_scale / count_target_tokens(targets) (counting is one pass over T
// integers); with that, loss.sum / loss.count, dx and dw equal the unfused
// linear_forward + cross_entropy_forward + cross_entropy_backward + linear_backward.
// dw may be the embedding gradient (tied head): it accumulates. dw undefined (a frozen head, e.g.
// under LoRA): no weight gradient, its GEMM skipped (pass DType::kF32 as dw_type to
// fused_linear_cross_entropy_workspace_blocks then). Throws InvalidInput for a target
// outside [0, V) before touching any output. A chunk whose rows are all ignored costs nothing
// but zeroing its dx rows.
//
// Threads split the vocabulary (each owns rows of w and dw and runs single-threaded BLAS on them,
// which the OpenMP build of OpenBLAS does inside a parallel region); results are deterministic at
// a given thread count. The profiler books the whole call as ("loss", backward).
LossSum fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& targets,
                                   float grad_scale_per_token, std::int64_t chunk_tokens, ExecContext& ctx);

// Forward only (evaluation): the loss sum and count, same chunking and scratch, no gradients.
LossSum fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                           std::int64_t chunk_tokens, ExecContext& ctx);

}  // namespace scalelab::kernels
