#pragma once
// LoRA adapters in PEFT's format (docs/finetuning.md): a directory with
//   adapter_model.safetensors  "base_model.model.<module>.lora_A.weight" [r, in] and
//                              "base_model.model.<module>.lora_B.weight" [out, r], the names
//                              peft's get_peft_model_state_dict writes for a causal LM
//   adapter_config.json        peft's LoraConfig: peft_type LORA, r, lora_alpha, lora_dropout,
//                              target_modules, use_rslora, base_model_name_or_path, ...
#include <string>

#include "core/tensor.h"
#include "model/params.h"

namespace scalelab {

// peft's tensor name of a layout adapter parameter ("base_model.model." + name).
std::string peft_tensor_name(const std::string& layout_name);

// The LoRA settings of a PEFT adapter directory (dir/adapter_config.json: r, lora_alpha,
// target_modules, use_rslora, lora_dropout), for loading it without repeating them as flags.
// InvalidInput (--adapter) when the file is absent or not a LoRA config this engine supports
// (a regex target_modules, rank_pattern / alpha_pattern, DoRA, trained biases, modules_to_save).
LoraConfig read_adapter_config(const std::string& dir);

// Loads every adapter of `layout` (ParamInfo::is_adapter) from dir/adapter_model.safetensors into
// `flat` (a CPU buffer of the layout). InvalidInput (--adapter) naming the file and the tensor
// when the file is absent, a tensor is missing, extra or of another shape, or when
// adapter_config.json (when present) disagrees with the layout's r, lora_alpha or use_rslora.
void load_adapter(const std::string& dir, const ParamLayout& layout, const Tensor& flat);

// Folds the adapters into the base weights: for each adapted "<module>.weight" W [out, in],
// W + s·B·A (one sgemm with beta = 1, as peft's merge adds scaling·(B @ A) in fp32). `flat`
// (CPU, fp32) is of `lora_layout`; `merged` (CPU, fp32) of `base_layout`, the same model without
// adapters: every base parameter is copied, the adapted weights then updated.
void merge_adapter(const ParamLayout& lora_layout, const Tensor& flat, const ParamLayout& base_layout,
                   const Tensor& merged);

// Writes the adapters of `layout` from `flat` (CPU) into dir (created), fp32 or `dtype`:
// adapter_model.safetensors and adapter_config.json (each written to a temporary and renamed).
void save_adapter(const std::string& dir, const ParamLayout& layout, const Tensor& flat, DType dtype,
                  const std::string& base_model);

}  // namespace scalelab
