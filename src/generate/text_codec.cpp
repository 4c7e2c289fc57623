#include "generate/text_codec.h"

#include "core/error.h"
#include "model/tokenizer/tokenizer.h"

namespace scalelab {
namespace {

// The model directory's tokenizer.json (src/model/tokenizer/): encode with the post-processor
// template (BOS where the tokenizer adds one, as `tokenizer(prompt)` does before HF generate),
// decode byte-level with special tokens kept.
class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(tok::Tokenizer t, std::optional<tok::ChatTemplate> chat, std::string chat_error)
      : t_(std::move(t)), chat_(std::move(chat)), chat_error_(std::move(chat_error)) {}
  std::vector<std::int32_t> encode(const std::string& text) const override {
    const std::vector<std::uint32_t> ids = t_.encode(text, true);
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<std::int32_t>& ids) const override {
    std::vector<std::uint32_t> u;
    u.reserve(ids.size());
    for (std::int32_t id : ids) {
      if (id < 0) throw InvalidInput("[generate] token id " + std::to_string(id) + " is negative");
      u.push_back(static_cast<std::uint32_t>(id));
    }
    return t_.decode(u);
  }
  std::string describe() const override { return t_.describe(); }

  std::vector<std::int32_t> encode_plain(const std::string& text) const override {
    const std::vector<std::uint32_t> ids = t_.encode(text, false);
    return {ids.begin(), ids.end()};
  }
  const tok::ChatTemplate* chat_template() const override { return chat_ ? &*chat_ : nullptr; }

  std::string render_chat(const std::vector<tok::ChatMessage>& messages) const override {
    if (!chat_error_.empty()) throw InvalidInput(chat_error_);
    if (!chat_) {
      throw InvalidInput("[--chat] " + t_.path() +
                         ": the model has no chat template (a GGUF's tokenizer.chat_template, tokenizer_config.json's "
                         "chat_template or chat_template.jinja) — drop --chat, or add the template to tokenizer_config.json");
    }
    // transformers passes tokenizer.special_tokens_map: the roles that are set, as token strings.
    std::vector<std::pair<std::string, std::string>> special;
    auto role = [&](const char* name, std::optional<std::uint32_t> id) {
      if (id) special.emplace_back(name, t_.decode(std::vector<std::uint32_t>{*id}));
    };
    role("bos_token", t_.bos_id());
    role("eos_token", t_.eos_id());
    role("pad_token", t_.pad_id());
    return chat_->render(messages, true, special);
  }

  std::vector<std::int32_t> chat_end_ids() const override {
    std::vector<std::int32_t> out;
    if (!chat_) return out;
    for (const std::string& t : chat_->end_of_turn_tokens()) {
      const std::vector<std::uint32_t> ids = t_.encode(t, false);
      if (ids.size() == 1 && t_.is_special(ids[0])) out.push_back(static_cast<std::int32_t>(ids[0]));
    }
    return out;
  }

 private:
  tok::Tokenizer t_;
  std::optional<tok::ChatTemplate> chat_;
  std::string chat_error_;  // an unreadable template, reported only when --chat needs it
};

}  // namespace

std::unique_ptr<TextCodec> find_text_codec(const std::string& model_dir) {
  std::optional<tok::Tokenizer> t;
  try {
    t = tok::find_tokenizer(model_dir);
  } catch (const InvalidInput&) {
    return nullptr;  // no tokenizer.json beside the model: ids only (callers say so for text prompts)
  }
  std::optional<tok::ChatTemplate> chat;
  std::string chat_error;
  try {
    chat = tok::ChatTemplate::find(model_dir);
  } catch (const InvalidInput& e) {
    chat_error = e.what();  // e.g. a malformed tokenizer_config.json: only --chat needs the template
  }
  return std::make_unique<TokenizerCodec>(std::move(*t), std::move(chat), chat_error);
}

}  // namespace scalelab
