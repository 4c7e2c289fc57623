#pragma once
// A Llama-family GGUF file as a model: the config from its `llama.*` metadata and its tensors
// (dequantized, llama.cpp names mapped to Hugging Face's, the Q/K row permutation of llama.cpp's
// convert_hf_to_gguf.py undone) into the flat parameter buffer. `--model model.gguf` goes
// through resolve_model / has_weights / load_weights, which call these for a .gguf path.
#include <cstdint>
#include <string>
#include <vector>

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
// The files beside a checkpoint that transformers (and scalelab's generate/compare) read for the
// tokenizer, written into `dir` from the GGUF metadata: tokenizer.json (the tokenizer of
// GgufFile::tokenizer_json), tokenizer_config.json (bos/eos/pad/unk token names, add_bos_token,
// chat_template) and generation_config.json (bos/eos/pad ids). Each through a temporary name and a
// rename. Returns the names written (none when the file has no tokenizer metadata).
std::vector<std::string> write_gguf_side_files(const std::string& path, const std::string& dir);
// tokenizer.ggml.eos_token_id of a GGUF file (empty when absent): generate's default stop.
std::vector<std::int32_t> gguf_eos_token_ids(const std::string& path);

}  // namespace scalelab
