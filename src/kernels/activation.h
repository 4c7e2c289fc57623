#pragma once
// Gated MLP activations (activation family).
//
// SwiGLU (Llama): gu[T, 2I] holds gate (columns [0, I)) and up (columns [I, 2I)) for each token,
// as one GEMM against the contiguous [gate_proj; up_proj] weight produces them.
//   swiglu_forward:  h[T, I] = silu(gate) · up,  silu(x) = x · sigmoid(x)
//   swiglu_backward: dgu[T, 2I] assigned from dh (no parameters).
//
// Pointwise activations (OPT's MLP, unfused): y = f(x) elementwise, with f as transformers'
// ACT2FN: "relu" max(x, 0); "gelu" the exact x·Φ(x) = x/2 · (1 + erf(x/√2)).
//   activation_forward:  y = f(x)                 (y may alias x)
//   activation_backward: dx = dy · f'(x)          (assigned from the saved input x; dx may alias
//                                                  dy; relu' is 1 where x > 0, else 0)
// The fused bias+ReLU form (no pre-activation kept) is in fused.h.
#include <string>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

enum class Activation { kReLU, kGELU };
// "relu" or "gelu"; anything else throws InvalidInput naming it.
Activation parse_activation(const std::string& name);

void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx);
void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx);

void activation_forward(Tensor& y, const Tensor& x, Activation act, ExecContext& ctx);
void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Activation act, ExecContext& ctx);

}  // namespace scalelab::kernels
