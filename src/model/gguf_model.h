#pragma once
// A Llama-family GGUF file as a model: the config from its `llama.*` metadata and its tensors
// (dequantized, llama.cpp names mapped to Hugging Face's, the Q/K row permutation of llama.cpp's
// convert_hf_to_gguf.py undone) into the flat parameter buffer. `--model model.gguf` goes
// through resolve_model / has_weights / load_weights, which call these for a .gguf path.
#include <string>

#include "core/tensor.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/params.h"

namespace scalelab {

// True for a path to a regular file whose name ends in .gguf.
bool is_gguf_path(const std::string& path);
// Throws InvalidInput naming the file for another architecture or missing keys.
ModelConfig config_from_gguf(const std::string& path);
LoadSummary load_gguf_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                              const Tensor& flat);

}  // namespace scalelab
