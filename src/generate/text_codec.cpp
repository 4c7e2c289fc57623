#include "generate/text_codec.h"

namespace scalelab {

// No tokenizer in this build yet (src/model/tokenizer/ lands separately): text prompts are refused
// by the callers with a message naming --prompt-ids.
std::unique_ptr<TextCodec> find_text_codec(const std::string& /*model_dir*/) { return nullptr; }

}  // namespace scalelab
