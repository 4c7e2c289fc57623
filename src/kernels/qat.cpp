// Front of the qat family (qat.h): validation, profiling, dispatch; the host int4 quantization.
#include "kernels/qat.h"

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/kernel_common.h"
#include "kernels/qat_math.h"

namespace scalelab::kernels {

namespace {

void check_float(const Tensor& t, const char* op, const char* name) {
  if (!is_float_type(t.dtype())) {
    throw RuntimeError(std::string("[") + op + "] " + name + " must be fp32, bf16 or fp16, got " +
                       std::string(dtype_name(t.dtype())));
  }
}

void check_group(const Tensor& w, std::int64_t group, const char* op) {
  SCALELAB_CHECK(w.rank() == 2, std::string("[") + op + "] the weight must be [out, in], got " + w.shape().str());
  if (group <= 1 || w.dim(1) % group != 0) {
    throw InvalidInput(std::string("[") + op + "] group size " + std::to_string(group) + " must be > 1 and divide " +
                       "the weight's " + std::to_string(w.dim(1)) + " columns — choose another --qat-group-size");
  }
}

}  // namespace

void fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext& ctx) {
  ProfileScope prof(ctx, "qat", Phase::kForward);
  const char* op = "fake_quant_per_token_forward";
  check_float(x, op, "x");
  check_float(y, op, "y");
  require_numel(y, x.numel(), op, "y");
  backend_for(device_of(op, {&y, &x}), op).fake_quant_per_token_forward(y, x, ctx);
}

void fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate, ExecContext& ctx) {
  ProfileScope prof(ctx, "qat", Phase::kBackward);
  const char* op = "fake_quant_per_token_backward";
  check_float(x, op, "x");
  check_float(dy, op, "dy");
  check_float(dx, op, "dx");
  require_numel(dy, x.numel(), op, "dy");
  require_numel(dx, x.numel(), op, "dx");
  backend_for(device_of(op, {&dx, &dy, &x}), op).fake_quant_per_token_backward(dx, dy, x, accumulate, ctx);
}

void fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext& ctx) {
  ProfileScope prof(ctx, "qat", Phase::kForward);
  const char* op = "fake_quant_group_forward";
  check_float(w, op, "w");
  check_float(wq, op, "wq");
  check_group(w, group, op);
  require_numel(wq, w.numel(), op, "wq");
  backend_for(device_of(op, {&wq, &w}), op).fake_quant_group_forward(wq, w, group, ctx);
}

void fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group, ExecContext& ctx) {
  ProfileScope prof(ctx, "qat", Phase::kBackward);
  const char* op = "fake_quant_group_backward";
  check_float(w, op, "w");
  check_float(g, op, "g");
  check_float(dw, op, "dw");
  check_group(w, group, op);
  require_numel(g, w.numel(), op, "g");
  require_numel(dw, w.numel(), op, "dw");
  backend_for(device_of(op, {&dw, &g, &w}), op).fake_quant_group_backward(dw, g, w, group, ctx);
}

void quantize_int4_grouped(std::int8_t* q, float* scales, const float* w, std::int64_t rows, std::int64_t cols,
                           std::int64_t group, DType t) {
  if (!is_float_type(t)) {
    throw InvalidInput(std::string("[quantize] the weights must be fp32, bf16 or fp16, got ") +
                       std::string(dtype_name(t)));
  }
  if (group <= 1 || cols % group != 0) {
    throw InvalidInput("[quantize] group size " + std::to_string(group) + " must be > 1 and divide the weight's " +
                       std::to_string(cols) + " columns");
  }
  const std::int64_t groups = cols / group;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const float* wg = w + r * cols + g * group;
      float lo = wg[0], hi = wg[0];
      for (std::int64_t i = 1; i < group; ++i) {
        lo = wg[i] < lo ? wg[i] : lo;
        hi = wg[i] > hi ? wg[i] : hi;
      }
      const qat::Affine a = qat::group_params(lo, hi, t);
      scales[r * groups + g] = a.scale;
      for (std::int64_t i = 0; i < group; ++i) {
        q[r * cols + g * group + i] = static_cast<std::int8_t>(qat::clamp_q(qat::unclamped(wg[i], a), a));
      }
    }
  }
}

}  // namespace scalelab::kernels
