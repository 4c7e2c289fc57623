#include "train/text_data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include "core/error.h"
#include "core/subprocess.h"
#include "train/data.h"

namespace scalelab {

namespace {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::shared_ptr<std::string> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput("[data] cannot read '" + path + "' — check the path");
  auto s = std::make_shared<std::string>();
  std::ostringstream ss;
  ss << in.rdbuf();
  *s = std::move(ss).str();
  return s;
}

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

}  // namespace

bool is_text_spec(const std::string& spec) {
  return spec.rfind("text:", 0) == 0 || spec.rfind("jsonl:", 0) == 0 || spec.rfind("parquet:", 0) == 0;
}

TextSpec parse_text_spec(const std::string& spec) {
  TextSpec s;
  s.spec = spec;
  std::string body;
  if (spec.rfind("text:", 0) == 0) {
    s.kind = TextSpec::Kind::kText;
    body = spec.substr(5);
  } else if (spec.rfind("jsonl:", 0) == 0) {
    s.kind = TextSpec::Kind::kJsonl;
    body = spec.substr(6);
  } else if (spec.rfind("parquet:", 0) == 0) {
    s.kind = TextSpec::Kind::kParquet;
    body = spec.substr(8);
  } else {
    throw InvalidInput("[data] '" + spec + "' is not a text:FILE or jsonl:FILE:FIELD spec");
  }
  std::vector<std::string> parts;
  std::size_t b = 0;
  while (true) {
    const std::size_t c = body.find(',', b);
    parts.push_back(body.substr(b, c == std::string::npos ? std::string::npos : c - b));
    if (c == std::string::npos) break;
    b = c + 1;
  }
  s.path = parts[0];
  if (s.kind != TextSpec::Kind::kText) {
    const std::size_t colon = s.path.rfind(':');
    if (colon != std::string::npos) {
      s.field = s.path.substr(colon + 1);
      s.path = s.path.substr(0, colon);
      if (s.field.empty()) throw InvalidInput("[data] '" + spec + "': empty field name after ':' — write jsonl:FILE:FIELD");
    }
  }
  if (s.path.empty()) throw InvalidInput("[data] '" + spec + "' names no file");
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    if (o == "pad") {
      s.pad = true;
    } else if (o == "shuffle") {
      s.shuffle = true;
    } else if (o == "no-eos") {
      s.eos = false;
    } else if (o == "split=train" || o == "split=val") {
      s.split = o.substr(6);
    } else if (o.rfind("val-fraction=", 0) == 0) {
      try {
        std::size_t used = 0;
        s.val_fraction = std::stod(o.substr(13), &used);
        if (used != o.size() - 13) throw std::invalid_argument(o);
      } catch (const std::exception&) {
        throw InvalidInput("[data] '" + spec + "': val-fraction must be a number in (0, 1)");
      }
      if (!(s.val_fraction > 0.0 && s.val_fraction < 1.0)) {
        throw InvalidInput("[data] '" + spec + "': val-fraction must be in (0, 1)");
      }
    } else {
      throw InvalidInput("[data] '" + spec + "': unknown option '" + o +
                         "' — options are pad, shuffle, no-eos, split=train|val, val-fraction=F");
    }
  }
  return s;
}

Corpus Corpus::read(const TextSpec& spec) {
  switch (spec.kind) {
    case TextSpec::Kind::kText: return read_text(spec.path);
    case TextSpec::Kind::kJsonl: return read_jsonl(spec.path, spec.field);
    case TextSpec::Kind::kParquet: return read_parquet(spec.path, spec.field);
  }
  return read_text(spec.path);
}

Corpus Corpus::read_text(const std::string& path) {
  Corpus c;
  c.path_ = path;
  c.content_ = read_whole(path);
  const std::string_view all = *c.content_;
  c.bytes_ = all.size();
  std::size_t doc_begin = std::string_view::npos, doc_end = 0;
  std::size_t s = 0;
  while (s < all.size()) {
    std::size_t e = all.find('\n', s);
    if (e == std::string_view::npos) e = all.size();
    const std::string_view line = all.substr(s, e - s);
    if (blank(line)) {
      if (doc_begin != std::string_view::npos) c.docs_.push_back(all.substr(doc_begin, doc_end - doc_begin));
      doc_begin = std::string_view::npos;
    } else {
      if (doc_begin == std::string_view::npos) doc_begin = s;
      doc_end = e;
    }
    s = e + 1;
  }
  if (doc_begin != std::string_view::npos) c.docs_.push_back(all.substr(doc_begin, doc_end - doc_begin));
  if (c.docs_.empty()) {
    throw InvalidInput("[data] '" + path + "' is " + (all.empty() ? "empty" : "all whitespace") +
                       " — a text corpus needs at least one non-blank line");
  }
  return c;
}

Corpus Corpus::read_jsonl(const std::string& path, const std::string& field) {
  Corpus c;
  c.path_ = path;
  const auto content = read_whole(path);
  c.bytes_ = content->size();
  c.owned_ = std::make_shared<std::vector<std::string>>();
  std::size_t s = 0, line_no = 0, missing = 0, first_missing = 0, lines = 0;
  while (s < content->size()) {
    std::size_t e = content->find('\n', s);
    if (e == std::string::npos) e = content->size();
    ++line_no;
    const std::string_view line = std::string_view(*content).substr(s, e - s);
    s = e + 1;
    if (blank(line)) continue;
    ++lines;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& ex) {
      throw InvalidInput("[data] '" + path + "' line " + std::to_string(line_no) + " is not JSON (" + ex.what() +
                         ") — a JSONL file holds one JSON object per line");
    }
    if (!j.is_object() || !j.contains(field) || !j[field].is_string()) {
      if (missing++ == 0) first_missing = line_no;
      continue;
    }
    c.owned_->push_back(j[field].get<std::string>());
  }
  if (missing > 0) {
    throw InvalidInput("[data] '" + path + "': " + std::to_string(missing) + " of " + std::to_string(lines) +
                       " lines have no string field '" + field + "' (first: line " + std::to_string(first_missing) +
                       ") — name the field with jsonl:FILE:FIELD (or --input FILE:FIELD), or fix those lines");
  }
  for (const std::string& d : *c.owned_) {
    if (!blank(d)) c.docs_.emplace_back(d);
  }
  if (c.docs_.empty()) {
    throw InvalidInput("[data] '" + path + "' has no non-blank '" + field + "' text — the corpus is empty");
  }
  return c;
}

namespace {

// Writes the column as JSONL ({"text": ...} per non-null row); exit 3: no pyarrow; 4: no such
// column or not a string column; 5: not a Parquet file.
constexpr const char* kParquetHelper = R"(import json, sys
try:
    import pyarrow.parquet as pq
except ImportError:
    sys.exit(3)
path, column, out = sys.argv[1:4]
try:
    names = pq.read_schema(path).names
    if column not in names:
        print(f"no column '{column}'; the columns are {', '.join(names)}", file=sys.stderr); sys.exit(4)
    table = pq.read_table(path, columns=[column])
except SystemExit:
    raise
except Exception as e:
    print(f"not a readable Parquet file: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr); sys.exit(5)
with open(out, "w") as f:
    for v in table.column(column).to_pylist():
        if v is None:
            continue
        if not isinstance(v, str):
            print(f"column '{column}' holds {type(v).__name__} values, not strings", file=sys.stderr); sys.exit(4)
        f.write(json.dumps({"text": v}) + "\n")
)";

}  // namespace

Corpus Corpus::read_parquet(const std::string& path, const std::string& column) {
  if (!std::ifstream(path).good()) throw InvalidInput("[data] cannot read '" + path + "' — check the path");
  const std::string convert = "python3 -c \"import json, pyarrow.parquet as pq; [print(json.dumps({'text': t})) for t in "
                              "pq.read_table('" + path + "').column('" + column + "').to_pylist() if t is not None]\" > data.jsonl";
  char tmpl[] = "/tmp/scalelab-parquet-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) throw RuntimeError("[data] cannot create a temporary file for '" + path + "'");
  ::close(fd);
  const std::string out = tmpl;
  SubprocessSpec spec;
  spec.argv = {"python3", "-c", kParquetHelper, path, column, out};
  SubprocessResult r;
  try {
    r = run_subprocess(spec);
  } catch (const SubprocessStartError&) {
    std::remove(out.c_str());
    throw InvalidInput("[data] '" + path + "' is Parquet, read through python3 with pyarrow, but python3 cannot be started — "
                       "convert it to JSONL elsewhere (" + convert + ") and use jsonl:data.jsonl");
  }
  const int code = r.started && r.status.exited ? r.status.code : -1;
  if (code != 0) {
    std::remove(out.c_str());
    if (code == 3) {
      throw InvalidInput("[data] '" + path + "' is Parquet and python3 cannot import pyarrow — pip install pyarrow, or convert it: " +
                         convert + " and use jsonl:data.jsonl");
    }
    std::string why = r.output;
    while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
    if (why.rfind('\n') != std::string::npos) why = why.substr(why.rfind('\n') + 1);
    throw InvalidInput("[data] '" + path + "': cannot read column '" + column + "' (" + why + ")");
  }
  try {
    Corpus c = read_jsonl(out, "text");
    c.path_ = path;
    std::remove(out.c_str());
    return c;
  } catch (const InvalidInput&) {
    std::remove(out.c_str());
    throw InvalidInput("[data] '" + path + "': column '" + column + "' has no non-blank text — the corpus is empty");
  }
}

void Corpus::select(const std::vector<std::size_t>& keep) {
  std::vector<std::string_view> d;
  d.reserve(keep.size());
  for (std::size_t i : keep) d.push_back(docs_.at(i));
  docs_.swap(d);
}

void tokenize_corpus(const tok::Tokenizer& tok, const Corpus& corpus, const TokenizeOptions& o,
                     const std::function<void(const std::vector<std::vector<std::uint32_t>>&)>& sink) {
  const std::size_t n = corpus.size();
  std::uint64_t bytes_done = 0;
  std::size_t i = 0;
  // Batches of about 4 MB of text: enough work for every thread, bounded memory.
  while (i < n) {
    std::vector<std::string_view> batch;
    std::uint64_t batch_bytes = 0;
    while (i < n && (batch.empty() || batch_bytes < (4u << 20))) {
      batch.push_back(corpus.doc(i));
      batch_bytes += corpus.doc(i).size();
      ++i;
    }
    auto ids = tok.encode_batch(batch, o.add_special_tokens, o.threads);
    if (o.eos) {
      for (auto& v : ids) v.push_back(*o.eos);
    }
    sink(ids);
    bytes_done += batch_bytes;
    if (o.progress) o.progress(i, n, bytes_done, corpus.bytes());
  }
}

TokenizedCorpus tokenize_corpus(const tok::Tokenizer& tok, const Corpus& corpus, const TokenizeOptions& o) {
  TokenizedCorpus out;
  out.offsets.reserve(corpus.size() + 1);
  tokenize_corpus(tok, corpus, o, [&](const std::vector<std::vector<std::uint32_t>>& batch) {
    for (const auto& v : batch) {
      out.ids.insert(out.ids.end(), v.begin(), v.end());
      out.offsets.push_back(out.ids.size());
    }
  });
  return out;
}

std::vector<std::int32_t> pack_group_texts(const TokenizedCorpus& c, std::int64_t block) {
  const auto n_blocks = static_cast<std::int64_t>(c.ids.size()) / block;
  return std::vector<std::int32_t>(c.ids.begin(), c.ids.begin() + n_blocks * block);
}

PaddedSamples pack_padded(const TokenizedCorpus& c, std::int64_t block, std::uint32_t pad_id) {
  PaddedSamples p;
  const auto B = static_cast<std::size_t>(block);
  for (std::size_t d = 0; d < c.documents(); ++d) {
    for (std::uint64_t s = c.offsets[d]; s < c.offsets[d + 1]; s += B) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(B, c.offsets[d + 1] - s));
      if (len < 2) continue;  // nothing to predict
      for (std::size_t k = 0; k < B; ++k) {
        p.tokens.push_back(static_cast<std::int32_t>(k < len ? c.ids[s + k] : pad_id));
        p.real.push_back(k < len ? 1 : 0);
      }
    }
  }
  return p;
}

std::vector<std::size_t> seeded_permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = i;
  std::uint64_t state = mix64(seed ^ 0x5ca1ab1eull);
  for (std::size_t i = n; i > 1; --i) {
    state = mix64(state);
    const std::size_t j = static_cast<std::size_t>(((state >> 32) * static_cast<std::uint64_t>(i)) >> 32);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

std::vector<std::size_t> validation_documents(std::size_t n, double fraction, std::uint64_t seed) {
  if (n < 2) return {};
  auto k = static_cast<std::size_t>(std::llround(fraction * static_cast<double>(n)));
  k = std::clamp<std::size_t>(k, 1, n - 1);
  auto p = seeded_permutation(n, seed);
  std::vector<std::size_t> v(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(v.begin(), v.end());
  return v;
}

namespace {

// Samples of seq_len + 1 tokens, read in order or in a per-epoch seeded order.
class TextData final : public DataSource {
 public:
  TextData(const DataOptions& o, std::vector<std::int32_t> tokens, std::vector<std::uint8_t> real, bool shuffle,
           std::string what)
      : o_(o), tokens_(std::move(tokens)), real_(std::move(real)), shuffle_(shuffle), what_(std::move(what)) {
    n_samples_ = static_cast<std::int64_t>(tokens_.size()) / (o.seq_len + 1);
  }
  void next(Batch& b) override {
    const std::int64_t S = o_.seq_len;
    auto* in = b.inputs.data<std::int32_t>();
    auto* tg = b.targets.data<std::int32_t>();
    for (std::int64_t i = 0; i < o_.micro_batch; ++i) {
      const std::int64_t g = (micro_ * o_.world + o_.rank) * o_.micro_batch + i;
      const std::int64_t s = sample_at(g);
      const std::int32_t* src = tokens_.data() + s * (S + 1);
      const std::uint8_t* real = real_.empty() ? nullptr : real_.data() + s * (S + 1);
      for (std::int64_t p = 0; p < S; ++p) {
        in[i * S + p] = src[p];
        tg[i * S + p] = (real && !real[p + 1]) ? -100 : src[p + 1];
      }
    }
    ++micro_;
  }
  void skip(std::int64_t micro_batches, Batch&) override { micro_ += micro_batches; }  // index-based
  std::string describe() const override { return what_; }
  // Known, so evaluation can read "the whole set" of a text:/jsonl: validation source.
  std::int64_t num_samples() const override { return n_samples_; }

 private:
  std::int64_t sample_at(std::int64_t g) {
    const std::int64_t epoch = g / n_samples_, within = g % n_samples_;
    if (!shuffle_) return within;
    if (epoch != perm_epoch_) {
      perm_ = seeded_permutation(static_cast<std::size_t>(n_samples_), o_.seed * 1000003ull + static_cast<std::uint64_t>(epoch));
      perm_epoch_ = epoch;
    }
    return static_cast<std::int64_t>(perm_[static_cast<std::size_t>(within)]);
  }
  DataOptions o_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::uint8_t> real_;
  bool shuffle_;
  std::string what_;
  std::int64_t n_samples_ = 0, micro_ = 0, perm_epoch_ = -1;
  std::vector<std::size_t> perm_;
};

}  // namespace

std::unique_ptr<DataSource> make_text_data_source(const DataOptions& o, const TextSourceOptions& text) {
  const TextSpec spec = parse_text_spec(o.spec);
  tok::Tokenizer tok = [&] {
    if (text.loaded) return *text.loaded;  // shares the loaded tables (a Tokenizer is a handle)
    if (!text.tokenizer.empty()) return tok::find_tokenizer(text.tokenizer);
    try {
      return tok::find_tokenizer(text.model);
    } catch (const InvalidInput& e) {
      throw InvalidInput(text.flag + " " + o.spec + " needs a tokenizer: " + e.what());
    }
  }();
  if (tok.vocab_size() > o.vocab_size) {
    throw InvalidInput("[data] the tokenizer " + tok.path() + " has " + std::to_string(tok.vocab_size()) +
                       " tokens but the model's vocab_size is " + std::to_string(o.vocab_size) +
                       " — use the model's own tokenizer");
  }
  Corpus corpus = Corpus::read(spec);
  if (!spec.split.empty()) {
    const auto val = validation_documents(corpus.size(), spec.val_fraction, o.seed);
    if (val.empty()) {
      throw InvalidInput("[data] " + text.flag + " " + o.spec + ": '" + spec.path + "' holds " + std::to_string(corpus.size()) +
                         " document(s), too few to split — give separate train and validation files");
    }
    std::vector<std::size_t> keep;
    std::size_t v = 0;
    for (std::size_t i = 0; i < corpus.size(); ++i) {
      const bool is_val = v < val.size() && val[v] == i;
      if (is_val) ++v;
      if (is_val == (spec.split == "val")) keep.push_back(i);
    }
    corpus.select(keep);
  }
  TokenizeOptions to;
  if (spec.eos) {
    if (!tok.eos_id()) {
      throw InvalidInput("[data] " + tok.path() + " names no EOS token (tokenizer_config.json eos_token) — add one, or use " +
                         text.flag + " " + o.spec + ",no-eos");
    }
    to.eos = tok.eos_id();
  }
  // Progress on large corpora (a line every 5 s; short ones print nothing).
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  to.progress = [&](std::size_t done, std::size_t total, std::uint64_t bytes, std::uint64_t total_bytes) {
    const auto now = std::chrono::steady_clock::now();
    if (done == total || now - last < std::chrono::seconds(5)) return;
    last = now;
    std::fprintf(stderr, "[data] %s: tokenized %zu/%zu documents (%.1f/%.1f MB)\n", spec.path.c_str(), done, total,
                 static_cast<double>(bytes) / 1e6, static_cast<double>(total_bytes) / 1e6);
  };
  const TokenizedCorpus tc = tokenize_corpus(tok, corpus, to);
  const std::int64_t block = o.seq_len + 1;
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> real;
  std::string mode;
  if (spec.pad) {
    const std::uint32_t pad = tok.pad_id().value_or(tok.eos_id().value_or(0));
    PaddedSamples p = pack_padded(tc, block, pad);
    tokens = std::move(p.tokens);
    real = std::move(p.real);
    mode = "padded, pads masked";
  } else {
    tokens = pack_group_texts(tc, block);
    mode = "packed";
  }
  if (tokens.empty()) {
    throw InvalidInput("[data] " + text.flag + " " + o.spec + ": '" + spec.path + "' gives " + std::to_string(tc.ids.size()) +
                       " tokens, fewer than one sample of seq-len+1 = " + std::to_string(block) +
                       " — use more text or a shorter --seq-len");
  }
  const auto n_samples = static_cast<std::int64_t>(tokens.size()) / block;
  std::string what = o.spec + " (" + std::to_string(corpus.size()) + " documents, " + std::to_string(tc.ids.size()) +
                     " tokens, " + std::to_string(n_samples) + " samples, " + mode + (spec.shuffle ? ", shuffled" : "") + ")";
  return std::make_unique<TextData>(o, std::move(tokens), std::move(real), spec.shuffle, std::move(what));
}

}  // namespace scalelab
