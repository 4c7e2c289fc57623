// Tokenizer throughput: encode every non-empty line of a corpus (as documents) with
// Tokenizer::encode_batch at each thread count, best of --rounds; prints one JSON line per
// thread count. bench/tokenizer_vs_hf.py runs it beside Hugging Face `tokenizers`.
//   build/bench/bench_tokenizer --tokenizer T.json --corpus FILE [--threads 1,2] [--rounds 3]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "model/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  std::string tok_path, corpus_path, threads_arg = "1,0";
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer") tok_path = argv[i + 1];
    else if (a == "--corpus") corpus_path = argv[i + 1];
    else if (a == "--threads") threads_arg = argv[i + 1];
    else if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
  }
  if (tok_path.empty() || corpus_path.empty()) {
    std::fprintf(stderr, "usage: bench_tokenizer --tokenizer T.json --corpus FILE [--threads 1,0] [--rounds 3]\n");
    return 2;
  }
  const auto t_load = std::chrono::steady_clock::now();
  const auto tok = scalelab::tok::Tokenizer::load(tok_path);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  std::ifstream in(corpus_path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string_view> lines;
  for (std::size_t s = 0; s < text.size();) {
    std::size_t e = text.find('\n', s);
    if (e == std::string::npos) e = text.size();
    if (e > s) lines.emplace_back(text.data() + s, e - s);
    s = e + 1;
  }
  std::vector<int> thread_counts;
  for (std::size_t s = 0; s <= threads_arg.size();) {
    std::size_t e = threads_arg.find(',', s);
    if (e == std::string::npos) e = threads_arg.size();
    int t = std::stoi(threads_arg.substr(s, e - s));
    thread_counts.push_back(t > 0 ? t : scalelab::num_threads());
    s = e + 1;
  }
  for (int t : thread_counts) {
    double best = 1e30, first = 0.0;
    std::size_t tokens = 0;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = tok.encode_batch(lines, true, t);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
      if (r == 0) first = s;
      tokens = 0;
      for (const auto& v : ids) tokens += v.size();
    }
    std::printf("{\"impl\": \"scalelab\", \"threads\": %d, \"seconds\": %.4f, \"mb_per_s\": %.2f, \"tokens\": %zu, "
                "\"lines\": %zu, \"bytes\": %zu, \"load_s\": %.3f, \"first_mb_per_s\": %.2f}\n",
                t, best, static_cast<double>(text.size()) / 1e6 / best, tokens, lines.size(), text.size(), load_s,
                static_cast<double>(text.size()) / 1e6 / first);
    std::fflush(stdout);
  }
  return 0;
}
