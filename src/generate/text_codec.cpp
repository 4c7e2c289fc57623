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
  explicit TokenizerCodec(tok::Tokenizer t) : t_(std::move(t)) {}
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

 private:
  tok::Tokenizer t_;
};

}  // namespace

std::unique_ptr<TextCodec> find_text_codec(const std::string& model_dir) {
  try {
    return std::make_unique<TokenizerCodec>(tok::find_tokenizer(model_dir));
  } catch (const InvalidInput&) {
    return nullptr;  // no tokenizer.json beside the model: ids only (callers say so for text prompts)
  }
}

}  // namespace scalelab
