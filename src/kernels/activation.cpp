// Front of the activation family (activation.h): validation, profiling, dispatch.
#include "kernels/activation.h"

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::kReLU;
  if (name == "gelu") return Activation::kGELU;
  throw InvalidInput("[activation] activation_function '" + name + "' is not supported — use relu or gelu");
}

void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kForward);
  const char* op = "swiglu_forward";
  const std::int64_t I = h.dim(-1), T = h.numel() / I;
  require_numel(gu, T * 2 * I, op, "gate/up");
  backend_for(device_of(op, {&h, &gu}), op).swiglu_forward(h, gu, ctx);
}

void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  const char* op = "swiglu_backward";
  const std::int64_t I = dh.dim(-1), T = dh.numel() / I;
  require_numel(gu, T * 2 * I, op, "gate/up");
  require_numel(dgu, T * 2 * I, op, "gate/up gradient");
  backend_for(device_of(op, {&dgu, &dh, &gu}), op).swiglu_backward(dgu, dh, gu, ctx);
}

void activation_forward(Tensor& y, const Tensor& x, Activation act, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kForward);
  const char* op = "activation_forward";
  require_numel(y, x.numel(), op, "output");
  backend_for(device_of(op, {&y, &x}), op).activation_forward(y, x, act, ctx);
}

void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Activation act, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  const char* op = "activation_backward";
  require_numel(dx, dy.numel(), op, "output");
  require_numel(x, dy.numel(), op, "input");
  backend_for(device_of(op, {&dx, &dy, &x}), op).activation_backward(dx, dy, x, act, ctx);
}

}  // namespace scalelab::kernels
