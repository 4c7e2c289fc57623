#pragma once
// Flash attention through cuDNN's fused SDPA (its graph API, via the header-only cuDNN frontend),
// for bf16/fp16 tensors on the GPU. attention_flash.cu tries this first and falls back to
// scalelab's own FlashAttention-2 kernels (attention_kernels.cuh) when it returns false: fp32
// tensors (cuDNN's SDPA has no fp32 path), a build without cuDNN (SCALELAB_WITH_CUDNN off), a
// shape cuDNN refuses, or SCALELAB_CUDA_FLASH=own in the environment (to compare the two).
//
// The layouts are scalelab's, passed to cuDNN as strides: Q, K and V are read in place from the
// packed qkv rows (no copies), dQ/dK/dV are written in place into the packed dqkv rows, out is
// [B*S, nh*hd], and lse is cuDNN's softmax statistics [B, nh, S] fp32 (the natural-log
// log-sum-exp of the scaled scores, the same quantity as the CPU's lse). GQA is native (K/V heads
// are not repeated). cuDNN's workspace comes from ctx.alloc as "attention workspace" (so the
// CUDA run's peak includes it; the meta plan mirrors the CPU kernels' workspaces instead).
// Graphs are built once per shape and dtype and cached for the process.
//
// The backward is cuDNN's default (not its deterministic variant): dQ is accumulated with
// atomics, so its last bits can differ from run to run, as PyTorch's SDPA backward.
#include <string>

#include "core/context.h"
#include "core/tensor.h"
#include "kernels/attention.h"

namespace scalelab::kernels::cuda {

// True when the forward was computed by cuDNN.
bool cudnn_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s, float scale,
                         ExecContext& ctx);
// True when the backward was computed by cuDNN (dqkv assigned).
bool cudnn_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                          const AttentionShape& s, float scale, ExecContext& ctx);
// "cudnn <version>" when this build and this process can use cuDNN's SDPA, else why not.
std::string cudnn_flash_status();

}  // namespace scalelab::kernels::cuda
