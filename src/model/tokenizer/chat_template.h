#pragma once
// A model's chat template: where it is found and how a conversation becomes the text an instruct
// model was trained on, as transformers' apply_chat_template does it (jinja.h renders it).
//
//   a GGUF file            its metadata's tokenizer.chat_template
//   a model directory      tokenizer_config.json's chat_template (a string, or transformers' list of
//                          {name, template} whose "default" is used), else chat_template.jinja
//   a tokenizer.json path  the same, in its directory
//
// The context is transformers': messages (a list of {role, content}), add_generation_prompt,
// tools and documents (none), and the tokenizer's special tokens by role (bos_token, eos_token,
// pad_token, unk_token) as strings. The rendered text is tokenized without the post-processor's
// BOS/EOS (the template writes its own), as apply_chat_template(tokenize=True) does.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab::jinja {
class Template;
}

namespace scalelab::tok {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // Keeps the source; it is parsed on first use (check() parses now), so a model whose template
  // scalelab cannot read still generates from plain prompts.
  ChatTemplate(std::string source, std::string origin);

  // The template of a model (see above); nullopt when it has none. Throws InvalidInput for an
  // unreadable tokenizer_config.json or GGUF.
  static std::optional<ChatTemplate> find(const std::string& model);

  // Parses the template now: InvalidInput naming origin() and the construct it cannot read.
  void check() const;

  // The conversation as text: transformers' apply_chat_template(messages, tokenize=False,
  // add_generation_prompt=...). `special_tokens`: ("bos_token", "<s>"), ... Throws InvalidInput
  // for what check() throws, for raise_exception (the template's own message) and for errors of
  // evaluation, each naming origin().
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::vector<std::pair<std::string, std::string>>& special_tokens) const;
  // The same with a whole context (messages with more fields, tools, ...).
  std::string render(const nlohmann::ordered_json& context) const;

  // The end-of-turn tokens the template writes (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>,
  // <|eom_id|>, </s>, <|endoftext|>, <|end_of_text|>: those that appear in its source), where a
  // chat answer stops besides the model's EOS.
  std::vector<std::string> end_of_turn_tokens() const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }

 private:
  std::string source_, origin_;
  mutable std::shared_ptr<const jinja::Template> parsed_;
};

}  // namespace scalelab::tok
