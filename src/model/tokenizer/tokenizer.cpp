#include "model/tokenizer/tokenizer.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/utf8.h"

namespace scalelab::tok {

using nlohmann::json;

struct AddedToken {
  std::string content;  // raw text it matches
  std::uint32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct PreStep {
  std::unique_ptr<SplitRegex> regex;  // null: ByteLevel without regex
  bool add_prefix_space = false;      // ByteLevel's
};

struct TokenizerImpl {
  std::string path;
  std::uint64_t generation = 0;  // tells per-thread caches of different tokenizers apart
  BpeModel bpe;
  std::vector<std::string> id_bytes;  // what each id decodes to
  std::vector<std::uint8_t> defined, special;
  std::unordered_map<std::string, std::uint32_t> token_ids;  // byte-level spelling -> id
  std::vector<AddedToken> added;
  // Added tokens by first byte, longest first, for the two passes of tokenizers'
  // AddedVocabulary (tokens with normalized=false first, then the others).
  std::vector<std::uint32_t> by_first[2][256];
  bool any_added[2] = {false, false};
  std::vector<PreStep> pre;
  std::string pre_kind;
  std::vector<std::uint32_t> prefix, suffix;  // TemplateProcessing's single template around $A
  std::int64_t vocab_size = 0;

  void encode(std::string_view text, bool add_special, std::vector<std::uint32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<std::uint32_t>& out) const;
  void split_added(std::string_view text, int pass, std::vector<std::uint32_t>& out) const;
};

namespace {

std::atomic<std::uint64_t> g_generation{1};

[[noreturn]] void bad(const std::string& origin, const std::string& what) {
  throw InvalidInput("[tokenizer] " + origin + ": " + what);
}

bool is_white(std::uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// The code point that ends at byte `end` (exclusive) of valid UTF-8.
std::uint32_t prev_code_point(std::string_view s, std::size_t end, std::size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  std::size_t i = start;
  return next_code_point(s, i);
}

bool is_word_char(std::uint32_t cp) {
  // Approximates Rust's char::is_alphanumeric (single_word tokens only): ASCII letters and
  // digits, and every non-ASCII, non-space character.
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  return !is_white(cp);
}

std::string json_string_field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return {};
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

void parse_pre_tokenizer(const json& p, const std::string& origin, TokenizerImpl& t) {
  if (p.is_null()) bad(origin, "no pre_tokenizer — a byte-level BPE tokenizer needs a ByteLevel pre-tokenizer");
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const json& s : p.at("pretokenizers")) parse_pre_tokenizer(s, origin, t);
    return;
  }
  if (type == "ByteLevel") {
    PreStep step;
    step.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      step.regex = std::make_unique<SplitRegex>(kGpt2Pattern, origin);
      t.pre_kind += t.pre_kind.empty() ? "gpt2" : "+gpt2";
    }
    t.pre.push_back(std::move(step));
    return;
  }
  if (type == "Split") {
    const std::string behavior = p.value("behavior", "");
    if (behavior != "Isolated") {
      bad(origin, "Split pre-tokenizer with behavior '" + behavior + "' is not supported (only Isolated, as GPT-2/Llama 3/Qwen2 use)");
    }
    if (p.value("invert", false)) bad(origin, "Split pre-tokenizer with invert=true is not supported");
    const json& pat = p.at("pattern");
    PreStep step;
    if (pat.contains("Regex")) {
      step.regex = std::make_unique<SplitRegex>(pat["Regex"].get<std::string>(), origin);
    } else if (pat.contains("String")) {
      step.regex = std::make_unique<SplitRegex>(quote_pattern(pat["String"].get<std::string>()), origin);
    } else {
      bad(origin, "Split pre-tokenizer without a Regex or String pattern");
    }
    t.pre_kind += t.pre_kind.empty() ? "split" : "+split";
    t.pre.push_back(std::move(step));
    return;
  }
  if (type == "Digits") {
    // tokenizers' Digits splits on char::is_numeric (the N categories): each digit alone, or
    // runs of them; the same as an Isolated split on \p{N} or \p{N}+ (SmolLM's tokenizer).
    PreStep step;
    step.regex = std::make_unique<SplitRegex>(p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", origin);
    t.pre_kind += t.pre_kind.empty() ? "digits" : "+digits";
    t.pre.push_back(std::move(step));
    return;
  }
  bad(origin, "pre-tokenizer type '" + type +
                  "' is not supported — only ByteLevel, Split (Isolated), Digits and Sequence of them (byte-level BPE tokenizers)");
}

bool has_byte_level(const json& d) {
  if (!d.is_object()) return false;
  const std::string type = d.value("type", "");
  if (type == "ByteLevel") return true;
  if (type == "Sequence" && d.contains("decoders")) {
    for (const json& s : d["decoders"]) {
      if (has_byte_level(s)) return true;
    }
  }
  return false;
}

void parse_post_processor(const json& p, const std::string& origin, TokenizerImpl& t) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const json& s : p.at("processors")) parse_post_processor(s, origin, t);
    return;
  }
  if (type != "TemplateProcessing") {
    bad(origin, "post_processor type '" + type + "' is not supported — only TemplateProcessing and ByteLevel");
  }
  const json& specials = p.value("special_tokens", json::object());
  bool seen_a = false;
  for (const json& piece : p.at("single")) {
    if (piece.contains("Sequence")) {
      if (piece["Sequence"].value("id", "A") != "A") bad(origin, "TemplateProcessing 'single' refers to sequence B");
      seen_a = true;
    } else if (piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].at("id").get<std::string>();
      if (!specials.contains(name)) bad(origin, "TemplateProcessing names special token '" + name + "' that its special_tokens lack");
      for (const json& id : specials[name].at("ids")) (seen_a ? t.suffix : t.prefix).push_back(id.get<std::uint32_t>());
    } else {
      bad(origin, "TemplateProcessing piece " + piece.dump() + " is neither Sequence nor SpecialToken");
    }
  }
}

}  // namespace

// ---- encoding ---------------------------------------------------------------------------

namespace {

struct PieceCache {
  std::uint64_t generation = 0;
  std::unordered_map<std::string, std::vector<std::uint32_t>, StringHash, std::equal_to<>> map;
};

constexpr std::size_t kCacheMaxPiece = 64, kCacheMaxEntries = 1 << 16;

}  // namespace

void TokenizerImpl::encode_plain(std::string_view text, std::vector<std::uint32_t>& out) const {
  if (text.empty()) return;
  thread_local PieceCache cache;
  thread_local std::vector<std::pair<std::size_t, std::size_t>> spans, next_spans;
  thread_local std::vector<std::string> owned;  // pieces with a prefix space added
  if (cache.generation != generation) {
    cache.map.clear();
    cache.generation = generation;
  }
  // Pieces are spans into `base`; a ByteLevel step with add_prefix_space rebuilds the text.
  std::string rebuilt;
  std::string_view base = text;
  spans.assign(1, {0, text.size()});
  for (const PreStep& step : pre) {
    if (step.add_prefix_space) {
      rebuilt.clear();
      next_spans.clear();
      for (auto [b, e] : spans) {
        const std::size_t nb = rebuilt.size();
        if (base[b] != ' ') rebuilt += ' ';
        rebuilt.append(base.substr(b, e - b));
        next_spans.emplace_back(nb, rebuilt.size());
      }
      owned.assign(1, std::move(rebuilt));
      rebuilt.clear();
      base = owned[0];
      spans.swap(next_spans);
    }
    if (step.regex) {
      next_spans.clear();
      for (auto [b, e] : spans) {
        const std::size_t before = next_spans.size();
        step.regex->split(base.substr(b, e - b), next_spans);
        for (std::size_t k = before; k < next_spans.size(); ++k) {
          next_spans[k].first += b;
          next_spans[k].second += b;
        }
      }
      spans.swap(next_spans);
    }
  }
  for (auto [b, e] : spans) {
    const std::string_view piece = base.substr(b, e - b);
    if (piece.size() <= kCacheMaxPiece) {
      const auto it = cache.map.find(piece);
      if (it != cache.map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
      const std::size_t start = out.size();
      bpe.encode_piece(piece, out);
      if (cache.map.size() >= kCacheMaxEntries) cache.map.clear();
      cache.map.emplace(std::string(piece), std::vector<std::uint32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
    } else {
      bpe.encode_piece(piece, out);
    }
  }
}

void TokenizerImpl::split_added(std::string_view text, int pass, std::vector<std::uint32_t>& out) const {
  if (pass == 2) {
    encode_plain(text, out);
    return;
  }
  if (!any_added[pass]) {
    split_added(text, pass + 1, out);
    return;
  }
  const auto& table = by_first[pass];
  std::size_t done = 0;  // text[done, i) not yet emitted
  std::size_t i = 0;
  while (i < text.size()) {
    const auto& cands = table[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (std::uint32_t k : cands) {  // longest first
      const AddedToken& a = added[k];
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word) {
        std::size_t s = 0;
        if (i > 0 && is_word_char(prev_code_point(text, i, s))) continue;
        std::size_t j = i + a.content.size();
        if (j < text.size() && is_word_char(next_code_point(text, j))) continue;
      }
      hit = &a;
      break;
    }
    if (!hit) {
      ++i;
      continue;
    }
    std::size_t start = i, stop = i + hit->content.size();
    if (hit->lstrip) {
      while (start > done) {
        std::size_t s = 0;
        if (!is_white(prev_code_point(text, start, s))) break;
        start = s;
      }
    }
    if (hit->rstrip) {
      while (stop < text.size()) {
        std::size_t j = stop;
        if (!is_white(next_code_point(text, j))) break;
        stop = j;
      }
    }
    if (start > done) split_added(text.substr(done, start - done), pass + 1, out);
    out.push_back(hit->id);
    done = i = stop;
  }
  if (done < text.size()) split_added(text.substr(done), pass + 1, out);
}

void TokenizerImpl::encode(std::string_view text, bool add_special, std::vector<std::uint32_t>& out) const {
  if (add_special) out.insert(out.end(), prefix.begin(), prefix.end());
  if (is_valid_utf8(text)) {
    split_added(text, 0, out);
  } else {
    const std::string clean = sanitize_utf8(text);
    split_added(clean, 0, out);
  }
  if (add_special) out.insert(out.end(), suffix.begin(), suffix.end());
}

// ---- loading ----------------------------------------------------------------------------

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(origin, std::string("not valid JSON (") + e.what() + ") — pass a Hugging Face tokenizer.json");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    bad(origin, "no 'model' object — pass a Hugging Face tokenizer.json");
  }
  auto t = std::make_shared<TokenizerImpl>();
  t->path = origin;
  t->generation = g_generation.fetch_add(1);
  try {
    const json& m = j["model"];
    const std::string type = m.value("type", "BPE");  // old files omit the type of a BPE model
    if (type != "BPE") {
      bad(origin, "model type '" + type + "' is not supported — only byte-level BPE tokenizers (GPT-2, OPT, Llama 3, Qwen2...)");
    }
    if (!m.contains("vocab") || !m["vocab"].is_object()) bad(origin, "the BPE model has no 'vocab' object");
    if (!m.contains("merges") || !m["merges"].is_array()) bad(origin, "the BPE model has no 'merges' array");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty()) {
        bad(origin, std::string("BPE ") + k + " is not supported by byte-level BPE");
      }
    }
    if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0.0) {
      bad(origin, "BPE dropout is random at encode time; set \"dropout\": null to use this tokenizer");
    }
    const json& norm = j.value("normalizer", json());
    if (!norm.is_null()) {
      bad(origin, "normalizer '" + norm.value("type", std::string("?")) + "' is not supported — only tokenizers without a normalizer (GPT-2, OPT, Llama 3)");
    }
    parse_pre_tokenizer(j.value("pre_tokenizer", json()), origin, *t);
    {
      const json& p = j["pre_tokenizer"];
      std::string dump = p.dump();
      if (dump.find("\"ByteLevel\"") == std::string::npos) {
        bad(origin, "the pre-tokenizer has no ByteLevel step — only byte-level BPE tokenizers are supported");
      }
    }
    if (!has_byte_level(j.value("decoder", json()))) {
      bad(origin, "the decoder is not ByteLevel — only byte-level BPE tokenizers are supported");
    }
    t->bpe.ignore_merges = m.value("ignore_merges", false);
    t->bpe.fuse_unk = m.value("fuse_unk", false);

    // Vocabulary.
    const json& vocab = m["vocab"];
    std::uint32_t max_id = 0;
    bool any = false;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_unsigned()) bad(origin, "vocab entry '" + it.key() + "' has a non-integer id");
      max_id = std::max(max_id, it.value().get<std::uint32_t>());
      any = true;
    }
    const json added = j.value("added_tokens", json::array());
    for (const json& a : added) max_id = std::max(max_id, a.at("id").get<std::uint32_t>()), any = true;
    if (!any) bad(origin, "the vocabulary is empty");
    if (max_id >= (1u << 22)) {
      bad(origin, "token id " + std::to_string(max_id) + " is implausibly large (vocabularies have fewer than 4,194,304 tokens)");
    }
    t->vocab_size = static_cast<std::int64_t>(max_id) + 1;
    t->id_bytes.assign(static_cast<std::size_t>(t->vocab_size), {});
    t->defined.assign(static_cast<std::size_t>(t->vocab_size), 0);
    t->special.assign(static_cast<std::size_t>(t->vocab_size), 0);
    std::fill(std::begin(t->bpe.byte_id), std::end(t->bpe.byte_id), -1);
    t->token_ids.reserve(vocab.size());
    t->bpe.vocab.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const auto id = it.value().get<std::uint32_t>();
      bool mapped = false;
      std::string bytes = byte_level_to_bytes(it.key(), &mapped);
      t->token_ids.emplace(it.key(), id);
      if (mapped) {
        if (bytes.size() == 1) t->bpe.byte_id[static_cast<unsigned char>(bytes[0])] = static_cast<std::int32_t>(id);
        t->bpe.vocab.emplace(bytes, id);
      }
      t->id_bytes[id] = std::move(bytes);
      t->defined[id] = 1;
    }
    const std::string unk = m.value("unk_token", json()).is_string() ? m["unk_token"].get<std::string>() : "";
    if (!unk.empty()) {
      const auto u = t->token_ids.find(unk);
      if (u == t->token_ids.end()) bad(origin, "unk_token '" + unk + "' is not in the vocabulary");
      t->bpe.unk_id = u->second;
    }

    // Merges: "a b" strings or [a, b] pairs; rank = index.
    const json& merges = m["merges"];
    std::vector<std::uint64_t> keys, values;
    keys.reserve(merges.size());
    values.reserve(merges.size());
    std::uint32_t rank = 0;
    for (const json& mg : merges) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          bad(origin, "merge " + std::to_string(rank) + " '" + s + "' is not two tokens separated by one space");
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        bad(origin, "merge " + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      const auto ia = t->token_ids.find(a), ib = t->token_ids.find(b), iab = t->token_ids.find(a + b);
      for (const auto& [name, found] : {std::pair{a, ia}, std::pair{b, ib}, std::pair{a + b, iab}}) {
        if (found == t->token_ids.end()) {
          bad(origin, "merge " + std::to_string(rank) + " ('" + a + "', '" + b + "') uses '" + name +
                          "', which is not in the vocabulary — vocab and merges do not match (a corrupt or mixed-up tokenizer.json)");
        }
      }
      keys.push_back((static_cast<std::uint64_t>(ia->second) << 32) | ib->second);
      values.push_back((static_cast<std::uint64_t>(rank) << 32) | iab->second);
      ++rank;
    }
    t->bpe.merges.build(keys, values);

    // Added tokens.
    for (const json& a : added) {
      AddedToken tok;
      tok.content = a.at("content").get<std::string>();
      tok.id = a.at("id").get<std::uint32_t>();
      tok.special = a.value("special", false);
      tok.lstrip = a.value("lstrip", false);
      tok.rstrip = a.value("rstrip", false);
      tok.single_word = a.value("single_word", false);
      tok.normalized = a.value("normalized", !tok.special);
      if (tok.content.empty()) bad(origin, "an added token with id " + std::to_string(tok.id) + " is empty");
      if (!t->defined[tok.id]) t->id_bytes[tok.id] = byte_level_to_bytes(tok.content);
      t->defined[tok.id] = 1;
      t->special[tok.id] = tok.special ? 1 : 0;
      t->token_ids.emplace(tok.content, tok.id);
      t->added.push_back(std::move(tok));
    }
    for (std::uint32_t k = 0; k < t->added.size(); ++k) {
      const int pass = t->added[k].normalized ? 1 : 0;
      t->by_first[pass][static_cast<unsigned char>(t->added[k].content[0])].push_back(k);
      t->any_added[pass] = true;
    }
    for (auto& pass : t->by_first) {
      for (auto& v : pass) {
        std::stable_sort(v.begin(), v.end(), [&](std::uint32_t x, std::uint32_t y) {
          return t->added[x].content.size() > t->added[y].content.size();
        });
      }
    }
    parse_post_processor(j.value("post_processor", json()), origin, *t);
    for (std::uint32_t id : t->prefix) {
      if (id >= t->vocab_size) bad(origin, "the post-processor adds id " + std::to_string(id) + ", outside the vocabulary");
    }
    for (std::uint32_t id : t->suffix) {
      if (id >= t->vocab_size) bad(origin, "the post-processor adds id " + std::to_string(id) + ", outside the vocabulary");
    }
  } catch (const json::exception& e) {
    bad(origin, std::string("unexpected structure (") + e.what() + ") — pass a Hugging Face tokenizer.json");
  }
  Tokenizer out;
  out.impl_ = t;
  // Roles by well-known names (a file's neighbours may override them, see load()).
  for (const char* name : {"<|begin_of_text|>", "<s>", "<|startoftext|>"}) {
    if (!out.bos_) out.bos_ = out.token_to_id(name);
  }
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>"}) {
    if (!out.eos_) out.eos_ = out.token_to_id(name);
  }
  for (const char* name : {"<pad>", "<|finetune_right_pad_id|>", "<|pad|>"}) {
    if (!out.pad_) out.pad_ = out.token_to_id(name);
  }
  return out;
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput("[tokenizer] cannot read '" + path + "' — pass a Hugging Face tokenizer.json");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    throw InvalidInput("[tokenizer] '" + path + "' is a directory — pass its tokenizer.json");
  }
  Tokenizer t = from_json(read_file(path), path);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  // transformers' tokenizer_config.json names the roles; config.json has their ids.
  const auto cfg_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    try {
      const json c = json::parse(read_file(cfg_path.string()));
      auto role = [&](const char* key, std::optional<std::uint32_t>& slot) {
        const std::string name = json_string_field(c, key);
        if (name.empty()) return;
        if (auto id = t.token_to_id(name)) slot = id;
      };
      role("bos_token", t.bos_);
      role("eos_token", t.eos_);
      role("pad_token", t.pad_);
    } catch (const json::exception& e) {
      throw InvalidInput("[tokenizer] " + cfg_path.string() + ": not valid JSON (" + e.what() + ")");
    }
  } else if (std::filesystem::exists(dir / "config.json")) {
    try {
      const json c = json::parse(read_file((dir / "config.json").string()));
      auto role = [&](const char* key, std::optional<std::uint32_t>& slot) {
        if (!c.contains(key)) return;
        const json& v = c[key].is_array() && !c[key].empty() ? c[key][0] : c[key];
        if (v.is_number_unsigned() && v.get<std::int64_t>() < t.vocab_size()) slot = v.get<std::uint32_t>();
      };
      role("bos_token_id", t.bos_);
      role("eos_token_id", t.eos_);
      role("pad_token_id", t.pad_);
    } catch (const json::exception&) {
      // config.json is the model loader's to validate; roles stay as named.
    }
  }
  return t;
}

Tokenizer find_tokenizer(const std::string& model) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(model) && model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0) {
    return GgufFile::open(model).tokenizer();  // the tokenizer.ggml.* metadata
  }
  if (fs::is_regular_file(model)) return Tokenizer::load(model);
  if (fs::is_directory(model)) {
    const fs::path p = fs::path(model) / "tokenizer.json";
    if (fs::exists(p)) return Tokenizer::load(p.string());
    throw InvalidInput("[tokenizer] no tokenizer.json in '" + model +
                       "' — copy the model's tokenizer.json (and tokenizer_config.json) there, or pass --tokenizer FILE");
  }
  throw InvalidInput("[tokenizer] '" + model + "' is neither a tokenizer.json nor a directory holding one — pass --tokenizer FILE");
}

// ---- the public face --------------------------------------------------------------------

std::vector<std::uint32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<std::uint32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, add_special_tokens, out);
  return out;
}

void Tokenizer::encode_append(std::string_view text, bool add_special_tokens, std::vector<std::uint32_t>& out) const {
  impl_->encode(text, add_special_tokens, out);
}

std::vector<std::vector<std::uint32_t>> Tokenizer::encode_batch(const std::vector<std::string_view>& texts,
                                                                bool add_special_tokens, int threads) const {
  std::vector<std::vector<std::uint32_t>> out(texts.size());
  const auto n = static_cast<std::int64_t>(texts.size());
  const int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 16) num_threads(nt)
  for (std::int64_t i = 0; i < n; ++i) impl_->encode(texts[static_cast<std::size_t>(i)], add_special_tokens, out[static_cast<std::size_t>(i)]);
  return out;
}

std::string Tokenizer::decode(std::span<const std::uint32_t> ids, bool skip_special_tokens) const {
  std::string out;
  for (std::uint32_t id : ids) {
    if (id >= impl_->vocab_size || !impl_->defined[id]) {
      throw InvalidInput("[tokenizer] " + impl_->path + ": cannot decode id " + std::to_string(id) +
                         ", which the vocabulary does not define (vocab size " + std::to_string(impl_->vocab_size) + ")");
    }
    if (skip_special_tokens && impl_->special[id]) continue;
    out += impl_->id_bytes[id];
  }
  return out;
}

std::int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<std::uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->token_ids.find(std::string(token));
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(std::uint32_t id) const { return id < impl_->vocab_size && impl_->special[id]; }
std::optional<std::uint32_t> Tokenizer::bos_id() const { return bos_; }
std::optional<std::uint32_t> Tokenizer::eos_id() const { return eos_; }
std::optional<std::uint32_t> Tokenizer::pad_id() const { return pad_; }
void Tokenizer::set_eos_id(std::uint32_t id) { eos_ = id; }
const std::string& Tokenizer::path() const { return impl_->path; }

std::string Tokenizer::describe() const {
  bool jit = false;
  for (const PreStep& s : impl_->pre) jit = jit || (s.regex && s.regex->jit());
  return impl_->path + " (byte-level BPE, " + std::to_string(impl_->vocab_size) + " tokens, pre-tokenizer " +
         (impl_->pre_kind.empty() ? "bytes" : impl_->pre_kind) + (jit ? ", PCRE2 JIT" : ", PCRE2") + ")";
}

}  // namespace scalelab::tok
