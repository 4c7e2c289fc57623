#include "model/tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer/jinja.h"

namespace scalelab::tok {

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw InvalidInput("[chat template] cannot read '" + p.string() + "' — check its permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_gguf(const std::string& model) {
  return fs::is_regular_file(model) && model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0;
}

std::optional<ChatTemplate> from_directory(const fs::path& dir) {
  const fs::path cfg = dir / "tokenizer_config.json";
  if (fs::exists(cfg)) {
    nlohmann::json c;
    try {
      c = nlohmann::json::parse(slurp(cfg));
    } catch (const nlohmann::json::exception& e) {
      throw InvalidInput("[chat template] " + cfg.string() + ": not valid JSON (" + e.what() + ")");
    }
    if (c.is_object() && c.contains("chat_template")) {
      const auto& t = c["chat_template"];
      const std::string origin = cfg.string() + " chat_template";
      if (t.is_string()) return ChatTemplate(t.get<std::string>(), origin);
      if (t.is_array()) {  // transformers' named templates: [{"name": ..., "template": ...}]
        for (const auto& e : t) {
          if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
              e["template"].is_string()) {
            return ChatTemplate(e["template"].get<std::string>(), origin + " (\"default\")");
          }
        }
        throw InvalidInput("[chat template] " + cfg.string() +
                           ": chat_template is a list of named templates without one named \"default\" — name one "
                           "\"default\" or make chat_template a string");
      }
      if (!t.is_null()) {
        throw InvalidInput("[chat template] " + cfg.string() + ": chat_template is neither a string nor a list of named templates");
      }
    }
  }
  const fs::path jinja_file = dir / "chat_template.jinja";
  if (fs::exists(jinja_file)) return ChatTemplate(slurp(jinja_file), jinja_file.string());
  return std::nullopt;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string origin) : source_(std::move(source)), origin_(std::move(origin)) {}

std::optional<ChatTemplate> ChatTemplate::find(const std::string& model) {
  if (is_gguf(model)) {
    const GgufFile f = GgufFile::open(model);
    const auto& m = f.metadata();
    if (m.contains("tokenizer.chat_template") && m["tokenizer.chat_template"].is_string()) {
      return ChatTemplate(m["tokenizer.chat_template"].get<std::string>(), model + " tokenizer.chat_template");
    }
    return std::nullopt;
  }
  if (fs::is_directory(model)) return from_directory(model);
  if (fs::is_regular_file(model)) return from_directory(fs::path(model).parent_path().empty() ? fs::path(".") : fs::path(model).parent_path());
  return std::nullopt;
}

void ChatTemplate::check() const {
  if (!parsed_) parsed_ = std::make_shared<const jinja::Template>(jinja::Template::parse(source_, origin_));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  check();
  return parsed_->render(context);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::vector<std::pair<std::string, std::string>>& special_tokens) const {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const auto& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  // transformers: render(messages=..., tools=None, documents=None, add_generation_prompt=...,
  // **tokenizer.special_tokens_map)
  for (const auto& [k, v] : special_tokens) ctx[k] = v;
  ctx["messages"] = std::move(msgs);
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  return render(ctx);
}

std::vector<std::string> ChatTemplate::end_of_turn_tokens() const {
  static const char* const kKnown[] = {"<|im_end|>", "<|eot_id|>",  "<end_of_turn>", "<|end|>",
                                       "<|eom_id|>", "</s>",        "<|endoftext|>", "<|end_of_text|>"};
  std::vector<std::string> out;
  for (const char* t : kKnown)
    if (source_.find(t) != std::string::npos) out.emplace_back(t);
  return out;
}

}  // namespace scalelab::tok
