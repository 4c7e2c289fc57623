#pragma once
// GGUF files (the llama.cpp ecosystem's format, version 2 and 3): the metadata, the tensor
// directory, tensors dequantized to fp32 (F32, F16, BF16, Q8_0, Q4_0, Q4_1 — the values the
// PyPI `gguf` package's dequantize gives, bit for bit) and the byte-level BPE tokenizer stored in
// the metadata (tokenizer.ggml.model "gpt2").
// Loading a GGUF as a model (`train --model x.gguf`) is model/gguf_model.h.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"

namespace scalelab {

enum class GgmlType : std::uint32_t { kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kBF16 = 30 };

struct GgufTensor {
  std::string name;
  std::vector<std::int64_t> shape;  // outermost first (PyTorch order; GGUF stores innermost first)
  std::uint32_t type = 0;           // a ggml type id
  std::uint64_t offset = 0;         // from the start of the file
  std::uint64_t bytes = 0;
  std::int64_t numel() const;
};

class GgufFile {
 public:
  // Maps and checks the file: magic, version, every length and offset inside the file, tensor
  // types known. Throws InvalidInput naming the file (truncated, corrupt, unsupported type).
  static GgufFile open(const std::string& path);
  ~GgufFile();
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  // Every key/value: numbers, bools, strings, arrays (as JSON).
  const nlohmann::json& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor& tensor(const std::string& name) const;  // throws InvalidInput when absent

  // The tensor's values as fp32, in row-major order of `shape`.
  std::vector<float> dequantize(const GgufTensor& t) const;

  // The tokenizer of tokenizer.ggml.* ("gpt2" model: byte-level BPE; pre-tokenizer by
  // tokenizer.ggml.pre: llama-bpe/llama3 → Llama 3's, smollm → SmolLM's, gpt-2/default → GPT-2's).
  tok::Tokenizer tokenizer() const;
  // The same tokenizer as a Hugging Face tokenizer.json document (what tokenizer() parses).
  // Throws InvalidInput as tokenizer() does for missing or unsupported metadata.
  nlohmann::json tokenizer_json() const;

 private:
  GgufFile() = default;
  std::string path_;
  std::uint32_t version_ = 0;
  nlohmann::json metadata_;
  std::vector<GgufTensor> tensors_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

const char* ggml_type_name(std::uint32_t type);

}  // namespace scalelab
