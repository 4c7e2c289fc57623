#pragma once
// Gated MLP activations (activation family).
//
// SwiGLU (Llama): gu[T, 2I] holds gate (columns [0, I)) and up (columns [I, 2I)) for each token,
// as one GEMM against the contiguous [gate_proj; up_proj] weight produces them.
//   swiglu_forward:  h[T, I] = silu(gate) · up,  silu(x) = x · sigmoid(x)
//   swiglu_backward: dgu[T, 2I] assigned from dh (no parameters).
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx);
void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx);

}  // namespace scalelab::kernels
