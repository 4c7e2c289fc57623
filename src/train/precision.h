#pragma once
// How a run stores and computes each kind of tensor, resolved from --model-precision,
// --mixed-precision and --optim-state-dtype:
//
//   fp32                      weights, gradients, optimizer states, activations: fp32
//   --mixed-precision bf16    fp32 master weights, gradients and optimizer states; a bf16 copy of
//   (or fp16)                 the weights for compute (as autocast caches one); activations in the
//                             low dtype; fp16 adds dynamic loss scaling
//   --model-precision bf16    weights, gradients, activations: bf16; optimizer states in the
//                             parameter dtype (as PyTorch keeps them) unless --optim-state-dtype
//                             fp32; the weight update rounds stochastically
// On the CPU every op computes in fp32 (low-precision operands are widened); the storage savings
// are real. compute_dtypes() says so per op family for the run record.
#include <string>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace scalelab {

struct PrecisionPlan {
  DType param = DType::kF32;            // stored (master) parameters
  DType compute_weights = DType::kF32;  // weights the model multiplies with
  DType grad = DType::kF32;
  DType optim_state = DType::kF32;
  DType activation = DType::kF32;
  bool weight_copy = false;   // a separate compute copy of the weights exists (mixed precision)
  bool loss_scaling = false;  // fp16 dynamic loss scaling
  std::string name;           // "fp32", "mixed-bf16", "mixed-fp16", "bf16"

  nlohmann::json compute_dtypes() const;  // {"matmul": {"storage": "bf16", "compute": "fp32"}, ...}
};

// Throws InvalidInput for combinations that cannot work (named flags and a way out).
PrecisionPlan resolve_precision(const std::string& model_precision, const std::string& mixed_precision,
                                const std::string& optim_state_dtype);

}  // namespace scalelab
