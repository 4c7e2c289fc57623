#pragma once
// Hugging Face checkpoints <-> the flat parameter buffer, and parameter initialization.
//
// A checkpoint directory is what transformers' save_pretrained writes: config.json plus either
// model.safetensors or shards model-00001-of-0000N.safetensors listed by
// model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}).
// Tensors use Hugging Face names and shapes (ParamLayout); F32, BF16 and F16 files load into a
// flat buffer of any float dtype (converted with round-to-nearest-even).
//
// Tied embeddings (config tie_word_embeddings): the layout has no lm_head.weight. A tied
// checkpoint may omit lm_head.weight (transformers does) or hold one equal to the embedding;
// one that differs is refused. An untied config needs lm_head.weight in the file.
// Names saved from the bare base model ("layers.0...", "decoder.layers.0...") are accepted for
// "model.layers.0...", as transformers does; buffers the family names
// (ModelFamilySpec::ignored_tensor_suffixes, e.g. Llama's "*.rotary_emb.inv_freq") are ignored.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"

namespace scalelab {

// True when `dir` holds model.safetensors or model.safetensors.index.json.
bool has_weights(const std::string& dir);

struct LoadSummary {
  std::vector<std::string> files;        // the safetensors files read, in order
  std::vector<std::string> file_dtypes;  // distinct dtypes found ("F32", "BF16", ...)
  std::int64_t tensors = 0;              // tensors copied into the buffer
  bool tied_lm_head_in_file = false;     // a tied checkpoint carried lm_head.weight (checked equal)
  std::vector<std::string> ignored;      // buffers skipped (rotary inv_freq)
};

// Loads every parameter of `layout` from the checkpoint in `dir` into `flat` (a CPU tensor of
// layout.total_numel() elements, fp32 / bf16 / fp16). `config` is the one built from
// dir/config.json (or a compatible one); it names the expected shapes in errors. LoRA adapters
// (ParamInfo::is_adapter) are loaded when the checkpoint holds them all (a resumable checkpoint of
// a LoRA run) and left untouched when it holds none (a base model).
// QLoRA: `flat` may instead hold layout.dense_numel() elements (the run's parameter buffer, without
// the NF4-quantized weights): then the quantized parameters are neither needed nor read.
// Throws InvalidInput naming the file and the tensor when weights are absent, missing, extra,
// mis-shaped, of an unreadable dtype, or when a shard index is malformed.
LoadSummary load_weights(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                         const Tensor& flat);

struct SaveOptions {
  DType dtype = DType::kF32;          // dtype of the saved tensors (fp32, bf16 or fp16)
  std::uint64_t max_shard_bytes = 0;  // 0: one model.safetensors; else shards of at most this
                                      // (a single tensor above it gets a shard of its own), as
                                      // save_pretrained(max_shard_size=...) does
};

// Writes config.json (ModelConfig::to_hf_json(), "torch_dtype" set to the saved dtype) and the
// weights of `flat` to `dir` (created if needed) so that transformers' from_pretrained loads it.
// Weight files of the other layout left by an earlier save (model.safetensors, the index, shards
// model-NNNNN-of-NNNNN.safetensors) are removed, so the directory holds exactly one checkpoint.
// QLoRA: with `flat` of layout.dense_numel() elements, the quantized weights (not in it) are left
// out: the files hold the dense parameters and the adapters (a resumable checkpoint; the NF4
// base is re-quantized from the base model on --resume, train/train_checkpoint.h).
// Throws InvalidInput when `dir` cannot be created or written.
void save_checkpoint(const std::string& dir, const ModelConfig& config, const ParamLayout& layout, const Tensor& flat,
                     const SaveOptions& options = {});

// One-line summary of the shape-defining fields of a config, for error messages.
std::string describe_config(const ModelConfig& config);

}  // namespace scalelab
