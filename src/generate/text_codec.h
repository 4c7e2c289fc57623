#pragma once
// The seam between generation and tokenizers: text in, token ids out, and back. `generate` and
// `compare` take token ids (--prompt-ids) everywhere; text prompts (--prompt, --prompts-file) go
// through the codec that find_text_codec finds for a model directory (its tokenizer.json).
//
// The codec is the model directory's tokenizer.json (src/model/tokenizer/); a model without one
// has none, and text prompts are then refused with a message that says to pass ids.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer/chat_template.h"

namespace scalelab {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<std::int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  virtual std::string describe() const = 0;  // e.g. the tokenizer file

  // Token ids of text without the post-processor's BOS/EOS (special tokens in the text are still
  // recognised): how a rendered chat template is tokenized.
  virtual std::vector<std::int32_t> encode_plain(const std::string& text) const = 0;
  // The model's chat template (tok::ChatTemplate::find), if it has one.
  virtual const tok::ChatTemplate* chat_template() const { return nullptr; }
  // `messages` rendered through the chat template with add_generation_prompt, with this
  // tokenizer's special tokens (bos_token, eos_token, pad_token) in the context. Throws
  // InvalidInput when there is no template, or from the template (tok::ChatTemplate::render).
  virtual std::string render_chat(const std::vector<tok::ChatMessage>& messages) const = 0;
  // The ids where a chat answer ends besides the model's EOS: the template's end-of-turn tokens
  // that are tokens of this vocabulary.
  virtual std::vector<std::int32_t> chat_end_ids() const = 0;
};

// The codec of a model directory (or a tokenizer.json path); null when there is no tokenizer.
std::unique_ptr<TextCodec> find_text_codec(const std::string& model_dir);

}  // namespace scalelab
