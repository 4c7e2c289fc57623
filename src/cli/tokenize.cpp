// `scalelab tokenize`: a text corpus (or a JSONL field) into the token file `train --data`
// reads (flat little-endian uint32 ids), with a Hugging Face tokenizer.json.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/command.h"
#include "core/error.h"
#include "core/parallel.h"
#include "model/tokenizer/tokenizer.h"
#include "train/text_data.h"

namespace scalelab::cli {

namespace {

struct TokenizeFlags {
  std::string tokenizer, input, out, eos_token;
  bool append_eos = false, no_special_tokens = false, quiet = false;
  int threads = 0;
};

// "data.jsonl:field" / "data.jsonl" (field "text") / anything else: plain text.
Corpus read_input(const std::string& input) {
  namespace fs = std::filesystem;
  const std::size_t colon = input.rfind(':');
  if (colon != std::string::npos && !fs::exists(input)) {
    const std::string path = input.substr(0, colon), field = input.substr(colon + 1);
    if (field.empty()) throw InvalidInput("[tokenize] --input '" + input + "': empty field after ':' — write FILE.jsonl:FIELD");
    if (fs::path(path).extension() == ".parquet") return Corpus::read_parquet(path, field);
    return Corpus::read_jsonl(path, field);
  }
  const std::string ext = fs::path(input).extension().string();
  if (ext == ".parquet") return Corpus::read_parquet(input, "text");
  if (ext == ".jsonl" || ext == ".ndjson") return Corpus::read_jsonl(input, "text");
  return Corpus::read_text(input);
}

int run(const TokenizeFlags& f) {
  namespace fs = std::filesystem;
  if (f.threads > 0) set_num_threads(f.threads);
  const tok::Tokenizer tok = tok::find_tokenizer(f.tokenizer);  // a tokenizer.json, a model directory or a GGUF file
  const Corpus corpus = read_input(f.input);
  TokenizeOptions o;
  o.add_special_tokens = !f.no_special_tokens;
  o.threads = num_threads();
  if (f.append_eos || !f.eos_token.empty()) {
    std::optional<std::uint32_t> eos = tok.eos_id();
    if (!f.eos_token.empty()) {
      eos = tok.token_to_id(f.eos_token);
      if (!eos) throw InvalidInput("[tokenize] --eos-token '" + f.eos_token + "' is not a token of " + f.tokenizer);
    }
    if (!eos) {
      throw InvalidInput("[tokenize] " + f.tokenizer + " names no EOS token (tokenizer_config.json eos_token) — pass --eos-token TOKEN");
    }
    o.eos = eos;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  if (!f.quiet) {
    std::fprintf(stderr, "scalelab tokenize: %s: %zu documents, %.1f MB; tokenizer %s; %d threads\n", corpus.path().c_str(),
                 corpus.size(), static_cast<double>(corpus.bytes()) / 1e6, tok.describe().c_str(), o.threads);
  }
  o.progress = [&](std::size_t done, std::size_t total, std::uint64_t bytes, std::uint64_t total_bytes) {
    const auto now = std::chrono::steady_clock::now();
    if (f.quiet || done == total || now - last < std::chrono::seconds(2)) return;
    last = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    std::fprintf(stderr, "  %zu/%zu documents, %.1f/%.1f MB, %.1f MB/s\n", done, total, static_cast<double>(bytes) / 1e6,
                 static_cast<double>(total_bytes) / 1e6, static_cast<double>(bytes) / 1e6 / s);
  };
  // Written to a temporary name beside the output, renamed when complete.
  const fs::path out(f.out);
  const fs::path tmp = out.parent_path() / (out.filename().string() + ".tmp." + std::to_string(::getpid()));
  std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
  if (!file) throw InvalidInput("[tokenize] cannot write '" + tmp.string() + "' — check that the --out directory exists and is writable");
  std::uint64_t n_tokens = 0;
  std::uint32_t max_id = 0;
  std::vector<unsigned char> buf;
  try {
    tokenize_corpus(tok, corpus, o, [&](const std::vector<std::vector<std::uint32_t>>& batch) {
      for (const auto& ids : batch) {
        buf.resize(ids.size() * 4);
        for (std::size_t i = 0; i < ids.size(); ++i) {
          const std::uint32_t v = ids[i];
          max_id = std::max(max_id, v);
          buf[4 * i] = static_cast<unsigned char>(v);
          buf[4 * i + 1] = static_cast<unsigned char>(v >> 8);
          buf[4 * i + 2] = static_cast<unsigned char>(v >> 16);
          buf[4 * i + 3] = static_cast<unsigned char>(v >> 24);
        }
        file.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
        n_tokens += ids.size();
      }
    });
    file.close();
    if (!file) throw RuntimeError("[tokenize] writing '" + tmp.string() + "' failed (disk full?)");
    if (n_tokens == 0) throw InvalidInput("[tokenize] '" + f.input + "' gives no tokens — the corpus is empty");
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %llu tokens from %zu documents (%.1f MB, %.2f s, %.1f MB/s); largest id %u, vocab %lld\n", f.out.c_str(),
              static_cast<unsigned long long>(n_tokens), corpus.size(), static_cast<double>(corpus.bytes()) / 1e6, s,
              static_cast<double>(corpus.bytes()) / 1e6 / std::max(s, 1e-9), max_id, static_cast<long long>(tok.vocab_size()));
  return 0;
}

}  // namespace

Subcommand add_tokenize_command(CLI::App& root) {
  auto* app = root.add_subcommand("tokenize", "Tokenize a text, JSONL or Parquet corpus into a token file for train --data");
  auto f = std::make_shared<TokenizeFlags>();
  app->add_option("--tokenizer", f->tokenizer, "Hugging Face tokenizer.json (byte-level BPE), a model directory holding one, or a GGUF file")
      ->required();
  app->add_option("--input", f->input,
                  "Corpus: a text file (documents are blank-line-separated blocks), FILE.jsonl[:FIELD] or FILE.parquet[:COLUMN] "
                  "(default field: text; Parquet needs python3 with pyarrow)")
      ->required();
  app->add_option("--out", f->out, "Output token file (little-endian uint32 ids)")->required();
  app->add_flag("--append-eos", f->append_eos, "Append the EOS token after each document");
  app->add_option("--eos-token", f->eos_token, "EOS token to append (default: tokenizer_config.json's eos_token); implies --append-eos");
  app->add_flag("--no-special-tokens", f->no_special_tokens, "Do not apply the tokenizer's template (no BOS)");
  app->add_option("--threads", f->threads, "Threads (0 = all cores)")->capture_default_str();
  app->add_flag("--quiet", f->quiet, "No progress lines");
  return {app, [f] { return run(*f); }};
}

}  // namespace scalelab::cli
