// The backend registry: which object runs an op on a device, and which ops each implements.
#include "kernels/backend.h"

#include <algorithm>

#include "kernels/cpu/backend.h"
#include "kernels/meta/backend.h"

namespace scalelab::kernels {

const std::vector<std::string>& all_ops() {
  // The methods of Backend (kernels/backend.h), in declaration order: keep the two in step.
  static const std::vector<std::string> ops = {
      // matmul
      "linear_forward", "linear_backward", "gemm_ex",
      // norm / layernorm
      "rmsnorm_forward", "rmsnorm_backward", "layernorm_forward", "layernorm_backward",
      // elementwise / activation
      "add_", "add", "swiglu_forward", "swiglu_backward", "activation_forward", "activation_backward", "bias_add_",
      // embedding
      "embedding_forward", "embedding_backward", "position_embedding_add_forward", "position_embedding_backward",
      // rope, dropout
      "rope_forward", "rope_backward", "dropout_forward", "dropout_backward",
      // qat
      "fake_quant_per_token_forward", "fake_quant_per_token_backward", "fake_quant_group_forward",
      "fake_quant_group_backward",
      // attention
      "attention_eager_forward", "attention_eager_backward", "attention_flash_forward", "attention_flash_backward",
      // loss
      "cross_entropy_forward", "cross_entropy_backward", "count_target_tokens",
      // optimizer
      "adamw_update", "sum_of_squares", "has_non_finite", "scale_",
      // fused
      "rmsnorm_residual_forward", "rmsnorm_residual_backward", "rmsnorm_recompute", "layernorm_residual_forward",
      "layernorm_residual_backward", "layernorm_recompute", "swiglu_backward_recompute",
      "swiglu_down_backward_recompute", "bias_relu_forward", "bias_relu_backward", "fused_linear_cross_entropy",
      "fused_linear_cross_entropy_forward"};
  return ops;
}

namespace {

// The backend of a device, or nullptr with the reason.
Backend* backend_or_null(DeviceType device, std::string* why) {
  switch (device) {
    case DeviceType::kCPU: {
      static cpu::CpuBackend backend;
      return &backend;
    }
    case DeviceType::kMeta: {
      static meta::MetaBackend backend;
      return &backend;
    }
    case DeviceType::kCUDA:
      return cuda_backend_or_null(why);
  }
  if (why) *why = "unknown device kind";
  return nullptr;
}

}  // namespace

Backend& backend_for(DeviceType device, const char* op) {
  std::string why;
  Backend* b = backend_or_null(device, &why);
  if (b == nullptr) throw BackendUnavailable(op, device, why);
  return *b;
}

DeviceType device_of(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) {
      first = t;
    } else if (t->device() != first->device()) {
      throw RuntimeError(std::string("[") + op + "] tensors on different devices: " +
                         device_type_name(first->device()) + " and " + device_type_name(t->device()));
    }
  }
  return first != nullptr ? first->device() : DeviceType::kCPU;
}

bool supports(std::string_view op, DeviceType device) {
  Backend* b = backend_or_null(device, nullptr);
  if (b == nullptr) return false;
  const std::vector<std::string> ops = b->ops();
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

}  // namespace scalelab::kernels
