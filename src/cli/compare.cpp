// `scalelab compare`: a base and a tuned model side by side — each one's answers to the same
// prompts (generate/generator.h, the same sampling for both) and each one's validation loss and
// perplexity on the same held-out data — as Markdown (stdout, --markdown FILE) and JSON (--json).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <unistd.h>

#include "cli/command.h"
#include "cli/generate_common.h"
#include "model/tokenizer/utf8.h"
#include "core/error.h"
#include "core/parallel.h"
#include "train/trainer.h"

namespace scalelab::cli {

namespace {

struct CompareFlags {
  std::string base, tuned;
  PromptFlags prompts;
  GenerateOptions gen;
  std::vector<std::int32_t> eos;
  bool no_eos = false;
  std::string val_data;
  std::int64_t seq_len = 0;  // 0: min(256, max_position_embeddings)
  std::int64_t micro_batch_size = 4;
  std::int64_t eval_batches = 0;
  int threads = 0;
  std::string markdown, json;
};

struct Side {
  std::string dir;
  std::unique_ptr<TextCodec> codec;
  std::unique_ptr<TextGenerator> gen;
  std::vector<std::int32_t> eos;
  std::optional<EvalRecord> eval;
  nlohmann::json answers = nlohmann::json::array();
};

std::string answer_text(const Side& s, const std::vector<std::int32_t>& tokens) {
  if (s.codec) return tok::sanitize_utf8(s.codec->decode(tokens));
  std::string out;
  for (auto t : tokens) {
    if (!out.empty()) out += ' ';
    out += std::to_string(t);
  }
  return out;
}

// Markdown table cells and quotes hold one line.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) throw InvalidInput("[--markdown] cannot write '" + path + "' — check the directory is writable");
    out << text;
    if (!out) throw RuntimeError("[--markdown] writing '" + path + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw RuntimeError("[--markdown] cannot move the report into '" + path + "': " + ec.message());
}

}  // namespace

Subcommand add_compare_command(CLI::App& root) {
  auto f = std::make_shared<CompareFlags>();
  auto* app = root.add_subcommand(
      "compare", "A base and a tuned model side by side: answers to the same prompts, validation loss and perplexity");
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("--base", f->base, "The base model directory")->required();
  app->add_option("--tuned", f->tuned, "The tuned model directory")->required();
  add_prompt_flags(*app, f->prompts);
  app->get_option("--prompt-ids")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->get_option("--prompt")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add_sampling_flags(*app, f->gen, f->eos, f->no_eos);
  app->get_option("--eos-token-id")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_option("--val-data", f->val_data, "Held-out data for both models (the forms of train --data)");
  app->add_option("--seq-len", f->seq_len, "Tokens per validation sample (0: min(256, max_position_embeddings))")
      ->capture_default_str();
  app->add_option("--micro-batch-size", f->micro_batch_size, "Validation samples per forward")->capture_default_str();
  app->add_option("--eval-batches", f->eval_batches, "Validation micro-batches (0: the whole set once)")
      ->capture_default_str();
  app->add_option("--threads", f->threads, "CPU threads (0 = all cores)")->capture_default_str();
  app->add_option("--markdown", f->markdown, "Also write the Markdown report to this file");
  app->add_option("--json", f->json, "Write the comparison (JSON) to this file");
  return {app, [f] {
            GenerateOptions g = f->gen;
            validate_sampling(g.sampling);
            if (g.max_new_tokens < 1) throw InvalidInput("[--max-new-tokens] must be >= 1");
            if (f->eval_batches < 0) throw InvalidInput("[--eval-batches] must be >= 0 (0: the whole set)");
            if (f->threads < 0) throw InvalidInput("[--threads] must be >= 0 (0 = all cores)");
            set_num_threads(f->threads);
            Side sides[2];
            sides[0].dir = f->base;
            sides[1].dir = f->tuned;
            for (Side& s : sides) s.codec = find_text_codec(s.dir);
            // The prompts are encoded with the base model's tokenizer; the tuned one must share it.
            const std::vector<Prompt> prompts = read_prompts(f->prompts, sides[0].codec.get());
            for (Side& s : sides) {
              s.gen = std::make_unique<TextGenerator>(s.dir);
              s.eos = f->no_eos ? std::vector<std::int32_t>{}
                      : !f->eos.empty() ? f->eos
                                        : chat_stop_ids(f->prompts, s.codec.get(), model_eos_token_ids(s.dir));
            }
            if (sides[0].gen->config().vocab_size != sides[1].gen->config().vocab_size) {
              throw InvalidInput("[--tuned] " + f->tuned + " has vocab_size " +
                                 std::to_string(sides[1].gen->config().vocab_size) + " and --base " + f->base + " " +
                                 std::to_string(sides[0].gen->config().vocab_size) +
                                 " — compare a model with its own fine-tuned version (same tokenizer)");
            }
            const std::int64_t seq_len =
                f->seq_len > 0 ? f->seq_len
                               : std::min<std::int64_t>({256, sides[0].gen->config().max_position_embeddings,
                                                         sides[1].gen->config().max_position_embeddings});
            for (Side& s : sides) {
              if (!f->val_data.empty()) {
                s.eval = s.gen->validation_loss(f->val_data, seq_len, f->micro_batch_size, f->eval_batches);
                std::fprintf(stderr, "scalelab compare: %s: validation loss %.4f, perplexity %.3f (%lld tokens)\n",
                             s.dir.c_str(), s.eval->loss, s.eval->perplexity, static_cast<long long>(s.eval->tokens));
              }
              GenerateOptions go = g;
              go.eos_token_ids = s.eos;
              for (const Prompt& p : prompts) {
                GenerationResult r = s.gen->generate(p.ids, go);
                nlohmann::json a = r.to_json();
                a["prompt"] = p.text;
                a["answer"] = answer_text(s, r.tokens);
                s.answers.push_back(a);
              }
              s.gen.reset();  // one model in memory at a time
            }
            std::ostringstream md;
            md << "# Base vs tuned\n\n| | base | tuned |\n|---|---|---|\n";
            md << "| model | `" << f->base << "` | `" << f->tuned << "` |\n";
            if (!f->val_data.empty()) {
              char buf[256];
              std::snprintf(buf, sizeof buf, "| validation loss | %.4f | %.4f |\n| perplexity | %.3f | %.3f |\n",
                            sides[0].eval->loss, sides[1].eval->loss, sides[0].eval->perplexity,
                            sides[1].eval->perplexity);
              md << buf;
              md << "\nValidation data: `" << f->val_data << "`, " << sides[0].eval->tokens << " target tokens, seq len "
                 << seq_len << ".\n";
            }
            md << "\nDecoding: "
               << (g.sampling.greedy() ? std::string("greedy")
                                       : "sampling (temperature " + std::to_string(g.sampling.temperature) +
                                             ", top-k " + std::to_string(g.sampling.top_k) + ", top-p " +
                                             std::to_string(g.sampling.top_p) + ", seed " +
                                             std::to_string(g.sampling.seed) + ")")
               << ", at most " << g.max_new_tokens << " new tokens.\n";
            if (f->prompts.chat) {
              md << "\nPrompts: user messages in the base model's chat template (`"
                 << sides[0].codec->chat_template()->origin() << "`)"
                 << (f->prompts.system.empty() ? std::string(", no system message") : ", system message: \"" + one_line(f->prompts.system) + "\"")
                 << "; answers stop at its end-of-turn token.\n";
            }
            for (std::size_t i = 0; i < prompts.size(); ++i) {
              md << "\n## Prompt " << (i + 1) << "\n\n> " << one_line(prompts[i].text) << "\n\n";
              md << "| base | tuned |\n|---|---|\n| " << one_line(sides[0].answers[i]["answer"].get<std::string>())
                 << " | " << one_line(sides[1].answers[i]["answer"].get<std::string>()) << " |\n";
            }
            const std::string text = md.str();
            std::fwrite(text.data(), 1, text.size(), stdout);
            if (!f->markdown.empty()) write_text_atomically(f->markdown, text);
            if (!f->json.empty()) {
              nlohmann::json j;
              for (int k = 0; k < 2; ++k) {
                nlohmann::json s = {{"model", sides[k].dir}, {"answers", sides[k].answers}, {"eos_token_ids", sides[k].eos}};
                if (sides[k].eval) {
                  s["val_loss"] = sides[k].eval->loss;
                  s["val_perplexity"] = sides[k].eval->perplexity;
                  s["val_tokens"] = sides[k].eval->tokens;
                }
                j[k == 0 ? "base" : "tuned"] = s;
              }
              j["prompts"] = nlohmann::json::array();
              for (const auto& p : prompts) {
                nlohmann::json pj = {{"text", p.text}, {"ids", p.ids}};
                if (f->prompts.chat) pj["chat_prompt"] = p.rendered;
                j["prompts"].push_back(pj);
              }
              if (f->prompts.chat) {
                j["chat_template"] = sides[0].codec->chat_template()->origin();
                j["system"] = f->prompts.system;
              }
              j["val_data"] = f->val_data;
              j["seq_len"] = seq_len;
              j["sampling"] = {{"temperature", g.sampling.temperature}, {"top_k", g.sampling.top_k},
                               {"top_p", g.sampling.top_p}, {"min_tokens_to_keep", g.sampling.min_tokens_to_keep},
                               {"seed", g.sampling.seed}, {"greedy", g.sampling.greedy()}};
              j["max_new_tokens"] = g.max_new_tokens;
              write_json_file(f->json, j);
            }
            return 0;
          }};
}

}  // namespace scalelab::cli
