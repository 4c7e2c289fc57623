#pragma once
// The seam between generation and tokenizers: text in, token ids out, and back. `generate` and
// `compare` take token ids (--prompt-ids) everywhere; text prompts (--prompt, --prompts-file) go
// through the codec that find_text_codec finds for a model directory (its tokenizer.json).
//
// The codec is the model directory's tokenizer.json (src/model/tokenizer/); a model without one
// has none, and text prompts are then refused with a message that says to pass ids.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace scalelab {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<std::int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  virtual std::string describe() const = 0;  // e.g. the tokenizer file
};

// The codec of a model directory (or a tokenizer.json path); null when there is no tokenizer.
std::unique_ptr<TextCodec> find_text_codec(const std::string& model_dir);

}  // namespace scalelab
