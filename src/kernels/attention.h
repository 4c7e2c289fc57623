#pragma once
// Causal self-attention with grouped-query heads (attention family).
//
// Inputs are packed per token, as one QKV GEMM produces them: row t of qkv[B*S, (nh + 2*nkv)*hd]
// holds nh query heads, then nkv key heads, then nkv value heads. Query head h reads key/value
// head h / (nh / nkv); repeated K/V are never materialized.
//
// Eager attention (the baseline, as Hugging Face's "eager"): materializes the probabilities
//   P[b, h] = softmax(scale · Q K^T + causal mask)   (saved [B, nh, S, S] for backward)
//   out[b, s, h*hd:(h+1)*hd] = P V
// attention_backward assigns dqkv (all three parts) from dout; nothing accumulates.
// Tensors may be fp32, bf16 or fp16; scores, softmax and products are computed in fp32 and the
// probabilities are stored (and reused in backward) in the dtype of `probs`.
//
// Flash attention (the same function, FlashAttention-2's algorithm on the CPU): query rows are
// processed in tiles of Br rows against key tiles of Bc columns with an online softmax (running
// row max and sum), so no S×S buffer exists in forward or backward; tiles entirely above the
// causal diagonal are skipped. Only the log-sum-exp of each score row is saved for backward:
//   lse[b, h, i] = log Σ_{j<=i} exp(scale · q_i · k_j)          (fp32, [B, nh, S])
// The backward recomputes P = exp(scale · Q K^T − lse) tile by tile, with D = rowsum(dO ⊙ O) and
// dS = P ⊙ (dP − D); it assigns dqkv like the eager backward (nothing accumulates).
// Scratch: one score tile per thread in forward, two in backward (plus stacked Q/O/dO/dQ rows),
// allocated from ctx.alloc as "attention workspace"; attention_flash_workspace_bytes says exactly
// how many bytes. Work is split statically (forward: a task per (batch, kv head, row tile), dealt
// round-robin; backward: a task per (batch, kv head), which owns that head's dK/dV and its group's
// dQ), so results are bit-identical from run to run at a given thread count.
#include <vector>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

struct AttentionShape {
  std::int64_t batch = 0, seq = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  std::int64_t qkv_width() const { return (n_heads + 2 * n_kv_heads) * head_dim; }
  std::int64_t out_width() const { return n_heads * head_dim; }
};

void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale,
                             ExecContext& ctx);
void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                              const AttentionShape& s, float scale, ExecContext& ctx);

// Bytes of per-thread scratch the eager kernels allocate (for the memory plan), for tensors of
// dtype `act` (fp32 needs only the backward's dP block; low precision stages Q/K/V in fp32).
std::size_t attention_eager_workspace_bytes(const AttentionShape& s, int threads);
std::size_t attention_eager_workspace_bytes(const AttentionShape& s, int threads, DType act);
std::size_t attention_eager_forward_workspace_bytes(const AttentionShape& s, int threads, DType act);
std::size_t attention_eager_backward_workspace_bytes(const AttentionShape& s, int threads, DType act);
// The same with each tensor's dtype: exactly the one "attention workspace" request of the kernel
// (the forward makes none when it needs 0 bytes: fp32 qkv, probs and output).
std::size_t attention_eager_forward_workspace_bytes(const AttentionShape& s, int threads, DType qkv, DType probs,
                                                    DType out);
std::size_t attention_eager_backward_workspace_bytes(const AttentionShape& s, int threads, DType qkv, DType dout,
                                                     DType probs, DType dqkv);
// The CUDA backend's eager workspace (cuda/attention_eager.cu, its cuBLASLt path), in allocation
// order: forward {nkv·S·S fp32 scores}; backward {nkv·S·S fp32 dP, nkv·S·S dS in `act`}. The meta
// backend plans with these when ExecContext::options.planned_device is CUDA.
std::vector<std::size_t> attention_eager_cuda_workspace_blocks(const AttentionShape& s, bool backward, DType act);
// Whether the CUDA backend's eager attention takes its cuBLASLt path: the default (checked on an
// H200, 2026-11-27: 1.6-1.7x the FMA-tile kernels' step); SCALELAB_CUDA_EAGER=fma keeps the first
// FMA-tile kernels, to compare. Any other value throws InvalidInput. The plan follows the switch.
bool cuda_eager_uses_cublaslt();

// out[B*S, nh*hd] (assigned) and lse[B, nh, S] (assigned, saved for backward) from qkv.
void attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s, float scale,
                             ExecContext& ctx);
// dqkv[B*S, (nh+2*nkv)*hd] assigned from dout, using the forward's out and lse.
void attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                              const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx);

// Tile sizes of the flash kernels. A row tile stacks the G = nh / nkv query heads of one kv group
// over Br = max(1, kFlashRowTile / G) positions (so the GEMMs see G·Br ≈ kFlashRowTile rows and
// each K/V tile serves the whole group); a column tile holds Bc = kFlashColTile keys. Both are
// clamped to S. Chosen on this CPU (bench/attention.cpp): 128 stacked rows keep OpenBLAS near its
// peak while Br = 32 positions (llama GQA, G = 4) wastes only ~Br/S of the work on the causal
// diagonal; 256 keys keep each thread's backward scratch (~350 KiB at hd = 64) inside L2.
inline constexpr std::int64_t kFlashRowTile = 128;
inline constexpr std::int64_t kFlashColTile = 256;

// Bytes the flash kernel of `phase` (Phase::kForward or Phase::kBackward) requests from the
// allocator in its single "attention workspace" allocation, before the allocator's rounding, when
// run with `threads` threads. With G = nh / nkv, Br and Bc as above, M = G·Br, and pad16(n) = n
// rounded up to a multiple of 16 floats (each thread's part starts on a cache line):
//   forward:  threads · pad16(M·Bc + 2·M·hd + 2·M) · 4   (score tile, stacked Q and O, row max, row sum)
//   backward: threads · pad16(2·M·Bc + 3·M·hd + 2·M) · 4 (P and dS tiles, stacked Q, dO, dQ, D, lse)
// Nothing else is allocated by the flash kernels; lse [B, nh, S] is the caller's tensor.
// With low-precision tensors (act != fp32) each thread also stages K and V of one kv head in fp32
// (2·S·hd floats), and in backward accumulates dK, dV in fp32 (2·S·hd more), padded to 16 floats.
std::size_t attention_flash_workspace_bytes(const AttentionShape& s, int threads, Phase phase,
                                            DType act = DType::kF32);

}  // namespace scalelab::kernels
