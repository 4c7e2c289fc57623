#include "model/gguf_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "core/dtype.h"
#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer/tokenizer.h"

namespace scalelab {

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0 && std::filesystem::is_regular_file(path, ec);
}

namespace {

const nlohmann::json& need(const GgufFile& f, const std::string& key) {
  if (!f.metadata().contains(key)) {
    throw InvalidInput("[gguf] '" + f.path() + "' has no metadata key '" + key + "' — not a complete llama.cpp model file");
  }
  return f.metadata()[key];
}

// HF name -> GGUF name (llama.cpp's tensor names for the Llama architecture).
std::string gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> top = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                         {"model.norm.weight", "output_norm.weight"},
                                                         {"lm_head.weight", "output.weight"}};
  if (auto it = top.find(hf); it != top.end()) return it->second;
  static const std::map<std::string, std::string> layer = {
      {"input_layernorm.weight", "attn_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},   {"self_attn.o_proj.weight", "attn_output.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) == 0) {
    const std::size_t dot = hf.find('.', prefix.size());
    const std::string n = hf.substr(prefix.size(), dot - prefix.size());
    if (auto it = layer.find(hf.substr(dot + 1)); it != layer.end()) return "blk." + n + "." + it->second;
  }
  return {};
}

}  // namespace

ModelConfig config_from_gguf(const std::string& path) {
  const GgufFile f = GgufFile::open(path);
  const std::string arch = f.metadata().value("general.architecture", std::string());
  if (arch != "llama") {
    throw InvalidInput("[gguf] '" + path + "' is a '" + arch + "' model; scalelab loads Llama-architecture GGUF files "
                       "— convert the Hugging Face checkpoint instead");
  }
  const auto get = [&](const std::string& k) { return need(f, "llama." + k); };
  nlohmann::json j = {{"model_type", "llama"},
                      {"architectures", {"LlamaForCausalLM"}},
                      {"hidden_size", get("embedding_length")},
                      {"intermediate_size", get("feed_forward_length")},
                      {"num_hidden_layers", get("block_count")},
                      {"num_attention_heads", get("attention.head_count")},
                      {"max_position_embeddings", get("context_length")},
                      {"rms_norm_eps", get("attention.layer_norm_rms_epsilon")},
                      {"hidden_act", "silu"}};
  const auto& m = f.metadata();
  j["num_key_value_heads"] = m.contains("llama.attention.head_count_kv") ? m["llama.attention.head_count_kv"] : j["num_attention_heads"];
  j["rope_theta"] = m.contains("llama.rope.freq_base") ? m["llama.rope.freq_base"] : nlohmann::json(10000.0);
  if (m.contains("llama.rope.scaling.type") && m["llama.rope.scaling.type"] != "none") {
    throw InvalidInput("[gguf] '" + path + "': RoPE scaling '" + m["llama.rope.scaling.type"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "' is not supported");
  }
  const GgufTensor& emb = f.tensor("token_embd.weight");
  j["vocab_size"] = emb.shape[0];
  bool tied = true;
  for (const auto& t : f.tensors()) tied = tied && t.name != "output.weight";
  j["tie_word_embeddings"] = tied;
  if (m.contains("llama.attention.key_length")) {
    j["head_dim"] = m["llama.attention.key_length"];
  }
  for (const char* role : {"bos", "eos"}) {
    const std::string k = std::string("tokenizer.ggml.") + role + "_token_id";
    if (m.contains(k)) j[std::string(role) + "_token_id"] = m[k];
  }
  return config_from_hf_json(j, path);
}

LoadSummary load_gguf_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                              const Tensor& flat) {
  const GgufFile f = GgufFile::open(path);
  LoadSummary s;
  s.files.push_back(path);
  std::map<std::string, bool> used;
  for (const ParamInfo& p : layout.params()) {
    const std::string g = gguf_name(p.name);
    if (g.empty()) throw InvalidInput("[gguf] no llama.cpp name for parameter '" + p.name + "' (loading '" + path + "')");
    const GgufTensor& t = f.tensor(g);
    used[g] = true;
    Shape want = p.shape;
    bool same = static_cast<int>(t.shape.size()) == want.rank();
    for (int d = 0; same && d < want.rank(); ++d) same = t.shape[static_cast<std::size_t>(d)] == want[d];
    if (!same) {
      std::string got;
      for (auto d : t.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
      throw InvalidInput("[gguf] '" + path + "': tensor '" + g + "' has shape [" + got + "], the config (" +
                         describe_config(config) + ") needs " + want.str() + " for " + p.name);
    }
    std::vector<float> v = f.dequantize(t);
    const bool q = p.name.find("self_attn.q_proj.weight") != std::string::npos;
    const bool k = p.name.find("self_attn.k_proj.weight") != std::string::npos;
    if (q || k) {
      // llama.cpp stores the rows of each head interleaved (row 2i+j of a head is HF's row
      // j·D/2 + i, D the head dim): its converter's permute() for the rotary layout. Undone here.
      const std::int64_t heads = q ? config.num_attention_heads : config.num_key_value_heads;
      const std::int64_t rows = want[0], cols = want[1], D = rows / heads, half = D / 2;
      std::vector<float> u(v.size());
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t i = 0; i < half; ++i) {
          for (std::int64_t jj = 0; jj < 2; ++jj) {
            const std::int64_t hf_row = h * D + jj * half + i, gg_row = h * D + 2 * i + jj;
            std::memcpy(&u[static_cast<std::size_t>(hf_row * cols)], &v[static_cast<std::size_t>(gg_row * cols)],
                        static_cast<std::size_t>(cols) * sizeof(float));
          }
        }
      }
      v.swap(u);
    }
    const auto n = static_cast<std::size_t>(want.numel());
    switch (flat.dtype()) {
      case DType::kF32:
        std::memcpy(const_cast<Tensor&>(flat).data<float>() + p.offset, v.data(), n * sizeof(float));
        break;
      case DType::kBF16: {
        auto* dst = const_cast<Tensor&>(flat).data<bf16>() + p.offset;
        for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(v[i]);
        break;
      }
      case DType::kF16: {
        auto* dst = const_cast<Tensor&>(flat).data<fp16>() + p.offset;
        for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_fp16(v[i]);
        break;
      }
      default:
        throw RuntimeError("[gguf] the parameter buffer must be a float dtype");
    }
    ++s.tensors;
    const std::string type = ggml_type_name(t.type);
    if (std::find(s.file_dtypes.begin(), s.file_dtypes.end(), type) == s.file_dtypes.end()) s.file_dtypes.push_back(type);
  }
  for (const auto& t : f.tensors()) {
    if (!used.count(t.name) && t.name != "rope_freqs.weight") s.ignored.push_back(t.name);
  }
  return s;
}

namespace {

// Writes `text` to dir/name through a temporary name and a rename (never half a file).
void write_text_file(const std::filesystem::path& dir, const std::string& name, const std::string& text) {
  const std::filesystem::path dst = dir / name, tmp = dir / ("." + name + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw InvalidInput("[--save] cannot write '" + tmp.string() + "' — check that the directory is writable");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, dst, ec);
  if (ec) throw InvalidInput("[--save] cannot move '" + tmp.string() + "' to '" + dst.string() + "': " + ec.message());
}

std::optional<std::uint32_t> token_id(const GgufFile& f, const char* key, std::size_t vocab) {
  const auto& m = f.metadata();
  if (!m.contains(key) || !m[key].is_number_unsigned()) return std::nullopt;
  const auto id = m[key].get<std::uint64_t>();
  if (id >= vocab) return std::nullopt;
  return static_cast<std::uint32_t>(id);
}

}  // namespace

std::vector<std::int32_t> gguf_eos_token_ids(const std::string& path) {
  const GgufFile f = GgufFile::open(path);
  const auto& m = f.metadata();
  const std::size_t vocab = m.contains("tokenizer.ggml.tokens") && m["tokenizer.ggml.tokens"].is_array()
                                ? m["tokenizer.ggml.tokens"].size()
                                : std::numeric_limits<std::size_t>::max();
  if (auto eos = token_id(f, "tokenizer.ggml.eos_token_id", vocab)) return {static_cast<std::int32_t>(*eos)};
  return {};
}

std::vector<std::string> write_gguf_side_files(const std::string& path, const std::string& dir) {
  const GgufFile f = GgufFile::open(path);
  const auto& m = f.metadata();
  if (!m.contains("tokenizer.ggml.model")) return {};  // no tokenizer in the file: nothing to write
  const nlohmann::json tj = f.tokenizer_json();
  static_cast<void>(f.tokenizer());  // the document parses (and the vocabulary matches) before it is written
  const auto& tokens = m["tokenizer.ggml.tokens"];
  const std::size_t vocab = tokens.size();
  std::vector<std::string> written;
  auto dump = [](const nlohmann::json& j) { return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"; };
  write_text_file(dir, "tokenizer.json", dump(tj));
  written.push_back("tokenizer.json");
  // The roles by name (as transformers' tokenizer_config.json names them; Tokenizer::load reads
  // them back) and by id for generate's stopping rule.
  nlohmann::json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                       {"add_bos_token", m.value("tokenizer.ggml.add_bos_token", false)},
                       {"clean_up_tokenization_spaces", false}};
  nlohmann::json gc = {{"_from_model_config", true}};
  for (const auto& [key, role] : {std::pair{"tokenizer.ggml.bos_token_id", "bos"}, std::pair{"tokenizer.ggml.eos_token_id", "eos"},
                                  std::pair{"tokenizer.ggml.padding_token_id", "pad"}, std::pair{"tokenizer.ggml.unknown_token_id", "unk"}}) {
    if (auto id = token_id(f, key, vocab)) {
      tc[std::string(role) + "_token"] = tokens[*id];
      if (std::string(role) != "unk") gc[std::string(role) + "_token_id"] = *id;
    }
  }
  if (m.contains("tokenizer.chat_template") && m["tokenizer.chat_template"].is_string()) {
    tc["chat_template"] = m["tokenizer.chat_template"];
  }
  write_text_file(dir, "tokenizer_config.json", dump(tc));
  written.push_back("tokenizer_config.json");
  if (gc.contains("eos_token_id")) {
    write_text_file(dir, "generation_config.json", dump(gc));
    written.push_back("generation_config.json");
  }
  return written;
}

}  // namespace scalelab
