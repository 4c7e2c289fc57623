#include "cli/generate_common.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace scalelab::cli {

void add_prompt_flags(CLI::App& app, PromptFlags& f) {
  app.add_option("--prompt-ids", f.prompt_ids, "A prompt as token ids, e.g. 1,2,3 (repeatable)");
  app.add_option("--prompt", f.prompts, "A text prompt (needs the model's tokenizer.json; repeatable)");
  app.add_option("--prompts-file", f.prompts_file, "Text prompts, one per line (needs the model's tokenizer.json)");
  app.add_option("--prompt-ids-file", f.prompt_ids_file, "Prompts as token ids, one list per line");
  app.add_flag("--chat", f.chat,
               "Ask each text prompt as a user message through the model's chat template (a GGUF's "
               "tokenizer.chat_template, tokenizer_config.json's chat_template); stop at its end-of-turn token");
  app.add_option("--system", f.system, "With --chat: a system message before each prompt");
}

void add_sampling_flags(CLI::App& app, GenerateOptions& g, std::vector<std::int32_t>& eos, bool& no_eos) {
  app.add_option("--max-new-tokens", g.max_new_tokens, "Tokens to generate at most per prompt")->capture_default_str();
  app.add_option("--temperature", g.sampling.temperature,
                 "0: greedy; > 0: sample (logits / temperature, then top-k, then top-p, as transformers)")
      ->capture_default_str();
  app.add_option("--top-k", g.sampling.top_k, "Keep the k most likely tokens (ties with the k-th kept; 0: off)")
      ->capture_default_str();
  app.add_option("--top-p", g.sampling.top_p, "Keep the smallest set of tokens whose probability reaches p (1: off)")
      ->capture_default_str();
  app.add_option("--min-tokens-to-keep", g.sampling.min_tokens_to_keep, "Top-k / top-p keep at least this many")
      ->capture_default_str();
  app.add_option("--seed", g.sampling.seed, "Seed of the sampler")->capture_default_str();
  app.add_option("--eos-token-id", eos,
                 "Stop after this token (repeatable; default: the model's generation_config.json / config.json)");
  app.add_flag("--no-eos", no_eos, "Never stop before --max-new-tokens");
}

std::vector<std::int32_t> chat_stop_ids(const PromptFlags& f, const TextCodec* codec, std::vector<std::int32_t> eos) {
  if (!f.chat || !codec) return eos;
  for (std::int32_t id : codec->chat_end_ids())
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  return eos;
}

std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<std::int32_t> ids;
  std::string t = text;
  for (char& c : t)
    if (c == ',') c = ' ';
  std::istringstream in(t);
  std::string word;
  while (in >> word) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v > 0x7fffffff) {
      throw InvalidInput("[" + what + "] '" + word + "' is not a token id — give non-negative integers like 1,2,3");
    }
    ids.push_back(static_cast<std::int32_t>(v));
  }
  if (ids.empty()) throw InvalidInput("[" + what + "] holds no token id — give ids like 1,2,3");
  return ids;
}

namespace {

std::vector<std::string> read_lines(const std::string& path, const char* flag) {
  std::ifstream f(path);
  if (!f) throw InvalidInput(std::string("[") + flag + "] cannot read '" + path + "' — check the path");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines separate nothing
    lines.push_back(line);
  }
  if (lines.empty()) throw InvalidInput(std::string("[") + flag + "] '" + path + "' holds no prompt (every line is blank)");
  return lines;
}

std::vector<std::int32_t> encode(const TextCodec* codec, const std::string& text, const char* flag) {
  if (!codec) {
    throw InvalidInput(std::string("[") + flag +
                       "] text prompts need the model's tokenizer (tokenizer.json beside its config.json, or a GGUF's "
                       "metadata), and this model has none — copy the model's tokenizer.json there, or pass token ids "
                       "with --prompt-ids 1,2,3 or --prompt-ids-file");
  }
  return codec->encode(text);
}

}  // namespace

std::vector<Prompt> read_prompts(const PromptFlags& f, const TextCodec* codec) {
  if (!f.system.empty() && !f.chat) {
    throw InvalidInput("[--system] a system message needs --chat (it goes through the model's chat template)");
  }
  if (f.chat && (!f.prompt_ids.empty() || !f.prompt_ids_file.empty())) {
    throw InvalidInput(std::string("[--chat] renders text prompts through the chat template, and ") +
                       (f.prompt_ids.empty() ? "--prompt-ids-file" : "--prompt-ids") +
                       " gives token ids — use --prompt / --prompts-file with --chat, or drop --chat");
  }
  std::vector<Prompt> out;
  auto text_prompt = [&](const std::string& text, const char* flag) {
    if (!f.chat) return Prompt{text, encode(codec, text, flag), ""};
    if (!codec) encode(codec, text, flag);  // the refusal without a tokenizer
    std::vector<tok::ChatMessage> messages;
    if (!f.system.empty()) messages.push_back({"system", f.system});
    messages.push_back({"user", text});
    const std::string rendered = codec->render_chat(messages);
    return Prompt{text, codec->encode_plain(rendered), rendered};
  };
  for (const auto& p : f.prompt_ids) out.push_back({p, parse_ids(p, "--prompt-ids"), ""});
  for (const auto& p : f.prompts) out.push_back(text_prompt(p, "--prompt"));
  if (!f.prompts_file.empty())
    for (const auto& line : read_lines(f.prompts_file, "--prompts-file")) out.push_back(text_prompt(line, "--prompts-file"));
  if (!f.prompt_ids_file.empty())
    for (const auto& line : read_lines(f.prompt_ids_file, "--prompt-ids-file"))
      out.push_back({line, parse_ids(line, "--prompt-ids-file"), ""});
  if (out.empty()) {
    throw InvalidInput("[--prompt-ids] no prompt given — use --prompt-ids 1,2,3, --prompt-ids-file, --prompt or --prompts-file");
  }
  return out;
}

}  // namespace scalelab::cli
