#include "train/precision.h"

#include "core/error.h"

namespace scalelab {

PrecisionPlan resolve_precision(const std::string& model_precision, const std::string& mixed_precision,
                                const std::string& optim_state_dtype) {
  if (model_precision != "fp32" && model_precision != "bf16") {
    throw InvalidInput("[--model-precision] must be fp32 or bf16, got '" + model_precision + "'");
  }
  if (mixed_precision != "no" && mixed_precision != "bf16" && mixed_precision != "fp16") {
    throw InvalidInput("[--mixed-precision] must be no, bf16 or fp16, got '" + mixed_precision + "'");
  }
  if (optim_state_dtype != "auto" && optim_state_dtype != "fp32") {
    throw InvalidInput("[--optim-state-dtype] must be auto (the parameter dtype) or fp32, got '" +
                       optim_state_dtype + "'");
  }
  PrecisionPlan p;
  if (model_precision == "bf16") {
    if (mixed_precision == "fp16") {
      throw InvalidInput("[--mixed-precision fp16] cannot run over --model-precision bf16 weights (fp16 autocast "
                         "needs fp32 master weights) — use --mixed-precision bf16 or no with bf16 weights");
    }
    // bf16 weights under bf16 autocast compute exactly as without autocast.
    p.param = p.compute_weights = p.grad = p.activation = DType::kBF16;
    p.optim_state = optim_state_dtype == "fp32" ? DType::kF32 : DType::kBF16;
    p.name = "bf16";
    return p;
  }
  if (mixed_precision == "no") {
    if (optim_state_dtype == "fp32" || optim_state_dtype == "auto") p.name = "fp32";
    return p;
  }
  const DType low = mixed_precision == "bf16" ? DType::kBF16 : DType::kF16;
  p.compute_weights = low;
  p.activation = low;
  p.weight_copy = true;
  p.loss_scaling = low == DType::kF16;
  p.name = "mixed-" + mixed_precision;
  return p;
}

nlohmann::json PrecisionPlan::compute_dtypes() const {
  const std::string act(dtype_name(activation)), w(dtype_name(compute_weights));
  nlohmann::json j;
  auto fam = [&](const char* name, const std::string& storage) {
    j[name] = {{"storage", storage}, {"compute", "fp32"}};
  };
  fam("matmul", act == w ? act : act + " activations, " + w + " weights");
  fam("attention", act);
  fam("norm", act);
  fam("rope", act);
  fam("activation", act);
  fam("loss", act);
  fam("embedding", w);
  j["adamw"] = {{"storage", std::string(dtype_name(param)) + " params, " + std::string(dtype_name(optim_state)) +
                                " states, " + std::string(dtype_name(grad)) + " grads"},
                {"compute", "fp32"},
                {"rounding", param == DType::kF32 ? "exact" : "stochastic"}};
  return j;
}

}  // namespace scalelab
