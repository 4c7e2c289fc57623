#pragma once
// What `generate` and `compare` share: reading prompts (token ids, or text through the model's
// tokenizer seam, generate/text_codec.h) and the sampling flags.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "generate/generator.h"
#include "generate/text_codec.h"

namespace scalelab::cli {

struct PromptFlags {
  std::vector<std::string> prompt_ids;  // --prompt-ids 1,2,3 (repeatable)
  std::vector<std::string> prompts;     // --prompt TEXT (repeatable)
  std::string prompts_file;             // --prompts-file F: one text prompt per line
  std::string prompt_ids_file;          // --prompt-ids-file F: one id list per line
  bool chat = false;                    // --chat: text prompts as user messages through the chat template
  std::string system;                   // --system TEXT: a system message first (with --chat)
};

struct Prompt {
  std::string text;  // as given ("5,17,33" for ids)
  std::vector<std::int32_t> ids;
  std::string rendered;  // with --chat: the chat template's text the ids encode
};

void add_prompt_flags(CLI::App& app, PromptFlags& f);
void add_sampling_flags(CLI::App& app, GenerateOptions& g, std::vector<std::int32_t>& eos, bool& no_eos);

// With --chat: the ids a chat answer stops at — `eos` (the model's) and the chat template's
// end-of-turn tokens (TextCodec::chat_end_ids), without repeats; `eos` unchanged otherwise.
std::vector<std::int32_t> chat_stop_ids(const PromptFlags& f, const TextCodec* codec, std::vector<std::int32_t> eos);

// "1,2,3" or "1 2 3" -> ids; throws InvalidInput naming `what`.
std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& what);
// Every prompt of the flags, in order (ids first, then text, then the files' lines); text needs a
// codec (InvalidInput naming --prompt-ids otherwise). At least one prompt. With --chat each text
// prompt is a user message (after the --system message, if any) rendered through the model's chat
// template with add_generation_prompt and tokenized without added BOS/EOS, as transformers'
// apply_chat_template(..., add_generation_prompt=True, tokenize=True); id prompts are refused.
std::vector<Prompt> read_prompts(const PromptFlags& f, const TextCodec* codec);

}  // namespace scalelab::cli
