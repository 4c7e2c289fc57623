#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "model/tokenizer/utf8.h"

namespace scalelab {

namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr int kMaxArrayDepth = 4;

struct BlockType {
  std::uint32_t id;
  const char* name;
  std::int64_t block;  // elements per block
  std::int64_t bytes;  // bytes per block
  bool supported;
};

// ggml's types (ggml.h); the ones scalelab dequantizes are marked.
constexpr BlockType kTypes[] = {
    {0, "F32", 1, 4, true},      {1, "F16", 1, 2, true},       {2, "Q4_0", 32, 18, true},  {3, "Q4_1", 32, 20, true},
    {6, "Q5_0", 32, 22, false},  {7, "Q5_1", 32, 24, false},   {8, "Q8_0", 32, 34, true},  {9, "Q8_1", 32, 36, false},
    {10, "Q2_K", 256, 84, false}, {11, "Q3_K", 256, 110, false}, {12, "Q4_K", 256, 144, false},
    {13, "Q5_K", 256, 176, false}, {14, "Q6_K", 256, 210, false}, {15, "Q8_K", 256, 292, false},
    {24, "I8", 1, 1, false},     {25, "I16", 1, 2, false},     {26, "I32", 1, 4, false},   {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},    {30, "BF16", 1, 2, true},
};

const BlockType* find_type(std::uint32_t id) {
  for (const auto& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

class Cursor {
 public:
  Cursor(const std::uint8_t* p, std::size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    const auto len = get<std::uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<std::size_t>(len));
    pos_ += static_cast<std::size_t>(len);
    return s;
  }
  void need(std::uint64_t bytes, const char* what) const {
    if (bytes > n_ - pos_) {
      throw InvalidInput("[gguf] '" + path_ + "' is truncated or corrupt: " + what + " needs " + std::to_string(bytes) +
                         " bytes at offset " + std::to_string(pos_) + ", the file has " + std::to_string(n_) +
                         " — download or convert it again");
    }
  }
  std::size_t pos() const { return pos_; }
  std::size_t remaining() const { return n_ - pos_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_, pos_ = 0;
  const std::string& path_;
};

nlohmann::json read_value(Cursor& c, std::uint32_t type, const std::string& path, const std::string& key, int depth) {
  switch (type) {
    case 0: return c.get<std::uint8_t>("a uint8 value");
    case 1: return c.get<std::int8_t>("an int8 value");
    case 2: return c.get<std::uint16_t>("a uint16 value");
    case 3: return c.get<std::int16_t>("an int16 value");
    case 4: return c.get<std::uint32_t>("a uint32 value");
    case 5: return c.get<std::int32_t>("an int32 value");
    case 6: {
      // As the shortest decimal that reads back as this float32 (1e-05, not 9.99999974e-06):
      // the value the converter wrote from the config.
      const float v = c.get<float>("a float32 value");
      char buf[32];
      const auto r = std::to_chars(buf, buf + sizeof buf, v);
      return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
    }
    case 7: return c.get<std::uint8_t>("a bool value") != 0;
    case 8: return c.str("a string value");
    case 9: {
      if (depth >= kMaxArrayDepth) throw InvalidInput("[gguf] '" + path + "': key '" + key + "' nests arrays too deeply");
      const auto elem = c.get<std::uint32_t>("an array type");
      const auto n = c.get<std::uint64_t>("an array length");
      // Every element takes at least one byte: a length past the file is corruption, not an allocation.
      if (n > c.remaining()) {
        throw InvalidInput("[gguf] '" + path + "': key '" + key + "' claims " + std::to_string(n) +
                           " elements, more than the rest of the file holds — the file is truncated or corrupt");
      }
      nlohmann::json a = nlohmann::json::array();
      for (std::uint64_t i = 0; i < n; ++i) a.push_back(read_value(c, elem, path, key, depth + 1));
      return a;
    }
    case 10: return c.get<std::uint64_t>("a uint64 value");
    case 11: return c.get<std::int64_t>("an int64 value");
    case 12: return c.get<double>("a float64 value");
    default:
      throw InvalidInput("[gguf] '" + path + "': key '" + key + "' has unknown value type " + std::to_string(type) +
                         " — the file is corrupt or from a newer GGUF version");
  }
}

float half(const std::uint8_t* p) {
  std::uint16_t b;
  std::memcpy(&b, p, 2);
  return fp16_to_float(fp16{b});
}

// d * q + m without contraction into an FMA (the reference rounds the product first).
inline float mul_add_unfused(float d, float q, float m) {
  float p = d * q;
  asm volatile("" : "+x"(p));
  return p + m;
}

}  // namespace

std::int64_t GgufTensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const char* ggml_type_name(std::uint32_t type) {
  const BlockType* t = find_type(type);
  return t ? t->name : "unknown";
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw InvalidInput("[gguf] cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  f.size_ = static_cast<std::size_t>(st.st_size);
  if (f.size_ < 24) {
    ::close(fd);
    throw InvalidInput("[gguf] '" + path + "' has " + std::to_string(f.size_) + " bytes, too few for a GGUF header — truncated?");
  }
  void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw InvalidInput("[gguf] cannot map '" + path + "': " + std::strerror(errno));
  f.data_ = static_cast<const std::uint8_t*>(p);

  Cursor c(f.data_, f.size_, f.path_);
  if (c.get<std::uint32_t>("the magic") != kMagic) {
    throw InvalidInput("[gguf] '" + path + "' is not a GGUF file (no 'GGUF' magic)");
  }
  f.version_ = c.get<std::uint32_t>("the version");
  if (f.version_ != 2 && f.version_ != 3) {
    throw InvalidInput("[gguf] '" + path + "' is GGUF version " + std::to_string(f.version_) + "; versions 2 and 3 are supported");
  }
  const auto n_tensors = c.get<std::uint64_t>("the tensor count");
  const auto n_kv = c.get<std::uint64_t>("the metadata count");
  if (n_tensors > c.remaining() || n_kv > c.remaining()) {
    throw InvalidInput("[gguf] '" + path + "' claims " + std::to_string(n_tensors) + " tensors and " + std::to_string(n_kv) +
                       " metadata keys, more than the file holds — the file is truncated or corrupt");
  }
  f.metadata_ = nlohmann::json::object();
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.str("a metadata key");
    const auto type = c.get<std::uint32_t>("a metadata type");
    f.metadata_[key] = read_value(c, type, path, key, 0);
  }
  std::uint64_t alignment = 32;
  if (f.metadata_.contains("general.alignment")) {
    const auto& a = f.metadata_["general.alignment"];
    if (!a.is_number_unsigned() || a.get<std::uint64_t>() == 0 || (a.get<std::uint64_t>() & (a.get<std::uint64_t>() - 1)) != 0) {
      throw InvalidInput("[gguf] '" + path + "': general.alignment must be a power of two");
    }
    alignment = a.get<std::uint64_t>();
  }
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.str("a tensor name");
    const auto n_dims = c.get<std::uint32_t>("a tensor's dimension count");
    if (n_dims == 0 || n_dims > 4) {
      throw InvalidInput("[gguf] '" + path + "': tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions (1 to 4 expected)");
    }
    std::vector<std::int64_t> ne(n_dims);
    std::int64_t numel = 1;
    for (auto& d : ne) {
      const auto v = c.get<std::uint64_t>("a tensor dimension");
      if (v == 0 || v > (1ull << 40) || static_cast<std::uint64_t>(numel) > (1ull << 42) / v) {
        throw InvalidInput("[gguf] '" + path + "': tensor '" + t.name + "' has an implausible dimension " + std::to_string(v));
      }
      d = static_cast<std::int64_t>(v);
      numel *= d;
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    t.type = c.get<std::uint32_t>("a tensor type");
    t.offset = c.get<std::uint64_t>("a tensor offset");
    const BlockType* bt = find_type(t.type);
    if (!bt || !bt->supported) {
      throw InvalidInput("[gguf] '" + path + "': tensor '" + t.name + "' has type " + ggml_type_name(t.type) + " (" +
                         std::to_string(t.type) + "), which scalelab does not dequantize (F32, F16, BF16, Q8_0, Q4_0, Q4_1) — "
                         "convert the model to one of those (llama.cpp's llama-quantize or convert_hf_to_gguf.py --outtype)");
    }
    if (ne[0] % bt->block != 0) {
      throw InvalidInput("[gguf] '" + path + "': tensor '" + t.name + "' has rows of " + std::to_string(ne[0]) + " elements, not a multiple of the " +
                         bt->name + " block (" + std::to_string(bt->block) + ")");
    }
    t.bytes = static_cast<std::uint64_t>(numel / bt->block * bt->bytes);
    f.tensors_.push_back(std::move(t));
  }
  const std::uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  for (GgufTensor& t : f.tensors_) {
    if (t.offset > f.size_ || data_start > f.size_ - t.offset || t.bytes > f.size_ - data_start - t.offset) {
      throw InvalidInput("[gguf] '" + path + "' is truncated: tensor '" + t.name + "' (" + std::to_string(t.bytes) + " bytes at data offset " +
                         std::to_string(t.offset) + ") runs past the end of the file (" + std::to_string(f.size_) + " bytes)");
    }
    t.offset += data_start;
  }
  return f;
}

GgufFile::~GgufFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    version_ = o.version_;
    metadata_ = std::move(o.metadata_);
    tensors_ = std::move(o.tensors_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  throw InvalidInput("[gguf] '" + path_ + "' has no tensor '" + name + "'");
}

std::vector<float> GgufFile::dequantize(const GgufTensor& t) const {
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<float> out(n);
  const std::uint8_t* p = data_ + t.offset;
  switch (static_cast<GgmlType>(t.type)) {
    case GgmlType::kF32:
      std::memcpy(out.data(), p, n * 4);
      break;
    case GgmlType::kF16:
      for (std::size_t i = 0; i < n; ++i) out[i] = half(p + 2 * i);
      break;
    case GgmlType::kBF16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = bf16_to_float(bf16{b});
      }
      break;
    case GgmlType::kQ8_0:
      for (std::size_t b = 0; b < n / 32; ++b) {
        const std::uint8_t* blk = p + b * 34;
        const float d = half(blk);
        for (int j = 0; j < 32; ++j) out[b * 32 + static_cast<std::size_t>(j)] = static_cast<float>(static_cast<std::int8_t>(blk[2 + j])) * d;
      }
      break;
    case GgmlType::kQ4_0:
      // Block: fp16 scale, 16 bytes; element j is the low nibble of byte j, element j+16 the high one.
      for (std::size_t b = 0; b < n / 32; ++b) {
        const std::uint8_t* blk = p + b * 18;
        const float d = half(blk);
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + static_cast<std::size_t>(j)] = d * static_cast<float>((blk[2 + j] & 0x0F) - 8);
          out[b * 32 + static_cast<std::size_t>(j) + 16] = d * static_cast<float>((blk[2 + j] >> 4) - 8);
        }
      }
      break;
    case GgmlType::kQ4_1:
      for (std::size_t b = 0; b < n / 32; ++b) {
        const std::uint8_t* blk = p + b * 20;
        const float d = half(blk), m = half(blk + 2);
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + static_cast<std::size_t>(j)] = mul_add_unfused(d, static_cast<float>(blk[4 + j] & 0x0F), m);
          out[b * 32 + static_cast<std::size_t>(j) + 16] = mul_add_unfused(d, static_cast<float>(blk[4 + j] >> 4), m);
        }
      }
      break;
    default:
      throw InvalidInput("[gguf] '" + path_ + "': tensor '" + t.name + "' has an unsupported type");
  }
  return out;
}

nlohmann::json GgufFile::tokenizer_json() const {
  const auto& m = metadata_;
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!m.contains(key)) throw InvalidInput("[gguf] '" + path_ + "' has no " + key + " — it carries no tokenizer; pass --tokenizer");
    return m[key];
  };
  const auto& model = need("tokenizer.ggml.model");
  if (!model.is_string() || model.get<std::string>() != "gpt2") {
    throw InvalidInput("[gguf] '" + path_ + "': tokenizer.ggml.model is " + model.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                       "; only \"gpt2\" (byte-level BPE) is supported — pass --tokenizer with a tokenizer.json");
  }
  const auto& tokens = need("tokenizer.ggml.tokens");
  const auto& merges = need("tokenizer.ggml.merges");
  if (!tokens.is_array() || !merges.is_array()) throw InvalidInput("[gguf] '" + path_ + "': tokenizer tokens/merges are not arrays");
  const nlohmann::json types = m.value("tokenizer.ggml.token_type", nlohmann::json::array());
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].is_string()) throw InvalidInput("[gguf] '" + path_ + "': token " + std::to_string(i) + " is not a string");
    const std::string s = tokens[i].get<std::string>();
    if (!tok::is_valid_utf8(s)) {
      throw InvalidInput("[gguf] '" + path_ + "': token " + std::to_string(i) + " is not valid UTF-8 — the tokenizer metadata is corrupt");
    }
    // llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    const int type = i < types.size() && types[i].is_number() ? types[i].get<int>() : 1;
    if (type == 3 || type == 4) {
      added.push_back({{"id", i}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", type == 4}, {"special", type == 3}});
    }
    if (!vocab.contains(s)) vocab[s] = i;
  }
  const std::string pre = m.value("tokenizer.ggml.pre", std::string("default"));
  nlohmann::json pre_tok;
  bool ignore_merges = false;
  const nlohmann::json byte_level_plain = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  const nlohmann::json byte_level_gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe") {
    pre_tok = {{"type", "Sequence"},
               {"pretokenizers",
                {{{"type", "Split"},
                  {"pattern", {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
                  {"behavior", "Isolated"},
                  {"invert", false}},
                 byte_level_plain}}};
    ignore_merges = true;
  } else if (pre == "smollm") {
    pre_tok = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level_gpt2}}};
  } else if (pre == "gpt-2" || pre == "default") {
    pre_tok = byte_level_gpt2;
  } else {
    throw InvalidInput("[gguf] '" + path_ + "': tokenizer.ggml.pre '" + pre +
                       "' is not known to scalelab (llama-bpe, smollm, gpt-2) — pass --tokenizer with the model's tokenizer.json");
  }
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", added},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", pre_tok},
                      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                      {"model",
                       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false},
                        {"byte_fallback", false}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", merges}}}};
  // BOS when the file says to add it (llama.cpp's tokenizer.ggml.add_bos_token).
  if (m.value("tokenizer.ggml.add_bos_token", false) && m.contains("tokenizer.ggml.bos_token_id")) {
    const auto bos = m["tokenizer.ggml.bos_token_id"].get<std::uint32_t>();
    if (bos >= tokens.size()) throw InvalidInput("[gguf] '" + path_ + "': bos_token_id is outside the vocabulary");
    const std::string name = tokens[bos].get<std::string>();
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", name}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"pair", nlohmann::json::array()},
                           {"special_tokens", {{name, {{"id", name}, {"ids", {bos}}, {"tokens", {name}}}}}}};
  }
  return j;
}

tok::Tokenizer GgufFile::tokenizer() const {
  const auto& m = metadata_;
  // Invalid UTF-8 elsewhere (a merge) is replaced in the dump; the merge then fails to match
  // the vocabulary and from_json says so.
  tok::Tokenizer t = tok::Tokenizer::from_json(tokenizer_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                                               path_ + " (tokenizer.ggml.*)");
  if (m.contains("tokenizer.ggml.eos_token_id") && m["tokenizer.ggml.eos_token_id"].is_number_unsigned()) {
    const auto eos = m["tokenizer.ggml.eos_token_id"].get<std::uint32_t>();
    if (eos < t.vocab_size()) t.set_eos_id(eos);
  }
  return t;
}

}  // namespace scalelab
