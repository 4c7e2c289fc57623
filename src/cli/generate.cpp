// `scalelab generate`: answers to prompts from a model directory, streamed token by token, with a
// KV cache (generate/generator.h) and transformers' greedy / temperature / top-k / top-p choice.
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/generate_common.h"
#include "model/tokenizer/utf8.h"
#include "core/error.h"
#include "core/parallel.h"
#include "train/trainer.h"

namespace scalelab::cli {

namespace {

struct GenerateFlags {
  std::string model;
  PromptFlags prompts;
  GenerateOptions gen;
  std::vector<std::int32_t> eos;
  bool no_eos = false;
  int threads = 0;
  std::string device_memory;
  std::string json;
  std::string adapter;
  bool quiet = false;
};

}  // namespace

Subcommand add_generate_command(CLI::App& root) {
  auto f = std::make_shared<GenerateFlags>();
  auto* app = root.add_subcommand("generate", "Generate text from a model with a KV cache (text prompts through its tokenizer.json, or token ids)");
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("--model", f->model, "A Hugging Face model directory (config.json + model.safetensors)")->required();
  add_prompt_flags(*app, f->prompts);
  app->get_option("--prompt-ids")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->get_option("--prompt")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add_sampling_flags(*app, f->gen, f->eos, f->no_eos);
  app->get_option("--eos-token-id")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_option("--threads", f->threads, "CPU threads (0 = all cores)")->capture_default_str();
  app->add_option("--device-memory", f->device_memory, "Memory capacity to enforce (weights + KV cache), e.g. 2GiB");
  app->add_option("--json", f->json, "Write the answers, timings and memory plan (JSON) to this file");
  app->add_flag("--quiet", f->quiet, "Only the answers (no header lines on stderr)");
  app->add_option("--adapter", f->adapter,
                  "A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) applied to --model");
  return {app, [f] {
            GenerateOptions g = f->gen;
            validate_sampling(g.sampling);
            if (g.max_new_tokens < 1) throw InvalidInput("[--max-new-tokens] must be >= 1");
            if (f->threads < 0) throw InvalidInput("[--threads] must be >= 0 (0 = all cores)");
            set_num_threads(f->threads);
            auto codec = find_text_codec(f->model);
            const std::vector<Prompt> prompts = read_prompts(f->prompts, codec.get());
            TextGenerator gen(f->model, f->device_memory, 0, f->adapter);
            g.eos_token_ids = f->no_eos ? std::vector<std::int32_t>{}
                              : !f->eos.empty() ? f->eos
                                                : chat_stop_ids(f->prompts, codec.get(), model_eos_token_ids(f->model));
            if (!f->quiet) {
              std::string eos;
              for (auto e : g.eos_token_ids) {
                if (!eos.empty()) eos += ',';
                eos += std::to_string(e);
              }
              std::fprintf(stderr, "scalelab generate: %s (%s, %lld parameters), %s, eos %s, %d threads\n",
                           f->model.c_str(), gen.config().name.c_str(), static_cast<long long>(gen.params()),
                           g.sampling.greedy() ? "greedy" : "sampling", eos.empty() ? "none" : eos.c_str(),
                           num_threads());
              if (f->prompts.chat) std::fprintf(stderr, "    chat template: %s\n", codec->chat_template()->origin().c_str());
            }
            nlohmann::json answers = nlohmann::json::array();
            std::int64_t longest = 0;
            for (std::size_t i = 0; i < prompts.size(); ++i) {
              const Prompt& p = prompts[i];
              longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(p.ids.size()) + g.max_new_tokens);
              std::printf("[%zu] %s\n=> ", i + 1, p.text.c_str());
              std::fflush(stdout);
              bool first = true;
              // Streaming: each token as soon as it is chosen — its text with a tokenizer (the bytes the
              // answer so far adds, held back while they end inside a UTF-8 character), else its id.
              std::vector<std::int32_t> so_far;
              std::size_t shown = 0;
              GenerationResult r = gen.generate(p.ids, g, [&](std::int32_t tok) {
                if (codec) {
                  so_far.push_back(tok);
                  const std::string text = codec->decode(so_far);
                  std::size_t end = text.size();
                  // Back off an incomplete trailing UTF-8 sequence (at most 3 bytes).
                  for (std::size_t k = 1; k <= 3 && k <= end; ++k) {
                    const auto c = static_cast<unsigned char>(text[end - k]);
                    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
                    const std::size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
                    if (need > k) end -= k;
                    break;
                  }
                  if (end > shown) {
                    // Bytes that are no UTF-8 (a random or byte-fallback model) print as U+FFFD, as
                    // the tokenizers library's decode gives them to Python.
                    const std::string out = tok::sanitize_utf8(std::string_view(text).substr(shown, end - shown));
                    std::fwrite(out.data(), 1, out.size(), stdout);
                    shown = end;
                  }
                } else {
                  std::printf(first ? "%d" : " %d", tok);
                }
                first = false;
                std::fflush(stdout);
              });
              if (codec) {
                const std::string text = codec->decode(so_far);
                if (text.size() > shown) {
                  const std::string out = tok::sanitize_utf8(std::string_view(text).substr(shown));
                  std::fwrite(out.data(), 1, out.size(), stdout);
                }
              }
              std::printf("\n");
              std::fflush(stdout);  // before the stderr line that follows
              if (!f->quiet) {
                std::fprintf(stderr, "    %zu tokens (%s), prefill %.3f s, %.1f tokens/s decoding\n", r.tokens.size(),
                             r.stop.c_str(), r.prefill_s, r.to_json()["decode_tokens_per_s"].get<double>());
              }
              nlohmann::json a = r.to_json();
              a["prompt"] = p.text;
              a["prompt_ids"] = p.ids;
              if (f->prompts.chat) a["chat_prompt"] = p.rendered;
              if (codec) a["text"] = tok::sanitize_utf8(codec->decode(r.tokens));
              answers.push_back(a);
            }
            if (!f->json.empty()) {
              nlohmann::json j;
              j["model"] = f->model;
              if (!f->adapter.empty()) j["adapter"] = f->adapter;
              j["sampling"] = {{"temperature", g.sampling.temperature}, {"top_k", g.sampling.top_k},
                               {"top_p", g.sampling.top_p}, {"min_tokens_to_keep", g.sampling.min_tokens_to_keep},
                               {"seed", g.sampling.seed}, {"greedy", g.sampling.greedy()}};
              j["max_new_tokens"] = g.max_new_tokens;
              j["eos_token_ids"] = g.eos_token_ids;
              if (f->prompts.chat) {
                j["chat_template"] = codec->chat_template()->origin();
                j["system"] = f->prompts.system;
              }
              j["threads"] = num_threads();
              j["memory_plan"] = gen.plan(longest);
              const MemoryStats st = gen.allocator().stats();
              j["max_allocated_bytes"] = st.peak_allocated;
              j["max_reserved_bytes"] = st.peak_reserved;
              j["answers"] = answers;
              write_json_file(f->json, j);
            }
            return 0;
          }};
}

}  // namespace scalelab::cli
