// Front of the dropout family (dropout.h): validation, profiling, dispatch; the host keep test.
#include "kernels/dropout.h"

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/dropout_mask.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

namespace {

void check(float p, const DropoutKey& key, const char* op) {
  if (!(p >= 0.0f && p < 1.0f)) {
    throw InvalidInput(std::string("[") + op + "] dropout probability must be in [0, 1), got " + std::to_string(p));
  }
  SCALELAB_CHECK(key.site >= 0 && key.site < 16, std::string("[") + op + "] dropout site must be in 0..15");
}

}  // namespace

bool dropout_keep(float p, const DropoutKey& key, std::int64_t i) {
  check(p, key, "dropout_keep");
  if (p == 0.0f) return true;
  return philox_block(key, i / 4)[static_cast<std::size_t>(i % 4)] >= keep_threshold(p);
}

void dropout_forward(Tensor& x, float p, const DropoutKey& key, ExecContext& ctx) {
  ProfileScope prof(ctx, "dropout", Phase::kForward);
  const char* op = "dropout_forward";
  check(p, key, op);
  backend_for(device_of(op, {&x}), op).dropout_forward(x, p, key, ctx);
}

void dropout_backward(Tensor& dx, const Tensor& dy, float p, const DropoutKey& key, ExecContext& ctx) {
  ProfileScope prof(ctx, "dropout", Phase::kBackward);
  const char* op = "dropout_backward";
  check(p, key, op);
  require_numel(dx, dy.numel(), op, "output");
  backend_for(device_of(op, {&dx, &dy}), op).dropout_backward(dx, dy, p, key, ctx);
}

}  // namespace scalelab::kernels
