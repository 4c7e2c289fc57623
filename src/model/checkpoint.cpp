#include "model/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/gguf_model.h"
#include "model/family.h"
#include "model/safetensors.h"

namespace scalelab {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

std::string join(const fs::path& dir, const std::string& file) { return (dir / file).string(); }

bool is_shard_name(const std::string& f) {
  static const std::regex re(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return std::regex_match(f, re);
}

// "a, b, c and 7 more"
std::string list_names(const std::vector<std::string>& v, std::size_t show = 5) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < show; ++i) s += (i ? ", " : "") + ("'" + v[i] + "'");
  if (v.size() > show) s += " and " + std::to_string(v.size() - show) + " more";
  return s;
}

bool same_shape(const std::vector<std::int64_t>& file, const Shape& want) {
  if (static_cast<int>(file.size()) != want.rank()) return false;
  for (int i = 0; i < want.rank(); ++i)
    if (file[static_cast<std::size_t>(i)] != want[i]) return false;
  return true;
}

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kI32: break;
  }
  throw RuntimeError("[checkpoint] parameters cannot be saved as int32");
}

// Where a tensor lives: which open file and which header entry.
struct Located {
  const SafetensorsFile* file;
  const SafetensorsTensor* tensor;
};

// True when two tensors hold the same values: bytes when the dtypes agree, else as fp32.
bool tensors_equal(const Located& a, const Located& b) {
  if (a.tensor->numel() != b.tensor->numel()) return false;
  if (a.tensor->dtype_name == b.tensor->dtype_name) {
    return std::memcmp(a.file->bytes(*a.tensor), b.file->bytes(*b.tensor), a.tensor->end - a.tensor->begin) == 0;
  }
  // Rare (a tied checkpoint whose head has another dtype than the embedding): fp32 copies of both.
  std::vector<float> x(static_cast<std::size_t>(a.tensor->numel())), y(x.size());
  a.file->read(*a.tensor, x.data(), DType::kF32);
  b.file->read(*b.tensor, y.data(), DType::kF32);
  return x == y;
}

}  // namespace

std::string describe_config(const ModelConfig& c) {
  const ModelFamilySpec& f = family_of(c);
  std::string s = f.name + ": hidden_size " + std::to_string(c.hidden_size) + ", " + f.intermediate_key + " " +
                  std::to_string(c.intermediate_size) + ", num_hidden_layers " + std::to_string(c.num_hidden_layers) +
                  ", num_attention_heads " + std::to_string(c.num_attention_heads);
  if (f.describe) s += f.describe(c);
  s += ", vocab_size " + std::to_string(c.vocab_size) + ", tie_word_embeddings " +
       (c.tie_word_embeddings ? "true" : "false");
  return s;
}

bool has_weights(const std::string& dir) {
  if (is_gguf_path(dir)) return true;
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kSingle, ec) || fs::is_regular_file(fs::path(dir) / kIndex, ec);
}

LoadSummary load_weights(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                         const Tensor& flat) {
  if (is_gguf_path(dir)) return load_gguf_weights(dir, config, layout, flat);
  const fs::path d(dir);
  std::error_code ec;
  // How errors name the config: its file when it came from a directory, else its preset name.
  std::string cfg_name = "config " + (config.name.empty() ? join(d, "config.json") : config.name);
  if (!config.name.empty() && fs::is_directory(config.name, ec)) cfg_name = join(config.name, "config.json");
  SCALELAB_CHECK(flat.device() == DeviceType::kCPU,
                 "[checkpoint] load_weights fills host memory — load into a CPU buffer and copy it to the device");
  SCALELAB_CHECK(flat.dtype() != DType::kI32, "[checkpoint] the parameter buffer must be a float dtype");
  // QLoRA's parameter buffer holds the dense parameters only: the quantized ones are skipped.
  const bool dense_only = layout.quantized_numel() > 0 && flat.numel() == layout.dense_numel();
  SCALELAB_CHECK(flat.numel() == layout.total_numel() || dense_only,
                 "[checkpoint] buffer has " + std::to_string(flat.numel()) + " elements, the layout " +
                     std::to_string(layout.total_numel()));
  auto skipped = [&](const ParamInfo& p) { return dense_only && p.quantized; };

  // Which files, and for a sharded checkpoint which tensor is in which file.
  std::vector<std::string> file_names;
  std::map<std::string, std::string> weight_map;  // sharded only
  if (fs::is_regular_file(d / kSingle, ec)) {
    file_names.push_back(kSingle);
  } else if (fs::is_regular_file(d / kIndex, ec)) {
    const std::string ipath = join(d, kIndex);
    std::ifstream in(ipath);
    json idx;
    try {
      idx = json::parse(in);
    } catch (const json::exception& e) {
      throw InvalidInput("[checkpoint] " + ipath + " is not valid JSON (" + e.what() +
                         ") — re-save the checkpoint, or remove the index and provide model.safetensors");
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object()) {
      throw InvalidInput("[checkpoint] " + ipath + " has no \"weight_map\" object — re-save the checkpoint");
    }
    std::set<std::string> seen;
    for (const auto& [name, file] : idx["weight_map"].items()) {
      if (!file.is_string()) {
        throw InvalidInput("[checkpoint] " + ipath + ": weight_map[\"" + name + "\"] is not a file name");
      }
      const std::string f = file.get<std::string>();
      if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\\') != std::string::npos) {
        throw InvalidInput("[checkpoint] " + ipath + ": weight_map[\"" + name + "\"] = \"" + f +
                           "\" is not a plain file name in the checkpoint directory — fix the index");
      }
      weight_map[name] = f;
      if (seen.insert(f).second) file_names.push_back(f);
    }
    std::sort(file_names.begin(), file_names.end());
    if (file_names.empty()) throw InvalidInput("[checkpoint] " + ipath + ": weight_map is empty — re-save the checkpoint");
  } else {
    std::string hint = "save the model with transformers' save_pretrained(dir) (safetensors is its default) or "
                       "with scalelab train --save DIR";
    if (fs::exists(d / "pytorch_model.bin", ec) || fs::exists(d / "pytorch_model.bin.index.json", ec)) {
      hint = "it has PyTorch .bin weights only; scalelab reads safetensors — convert with transformers: "
             "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)";
    }
    throw InvalidInput("[checkpoint] " + dir + " has no " + kSingle + " or " + kIndex + " — " + hint);
  }

  std::vector<SafetensorsFile> files;
  files.reserve(file_names.size());
  for (const auto& f : file_names) {
    const fs::path p = d / f;
    if (!fs::is_regular_file(p, ec)) {
      throw InvalidInput("[checkpoint] " + join(d, kIndex) + " lists " + f + ", which is not in " + dir +
                         " — the checkpoint is incomplete; copy every shard");
    }
    files.push_back(SafetensorsFile::open(p.string()));
  }

  // Every tensor of every file under its canonical (layout) name.
  const ModelFamilySpec& family = family_of(config);
  auto is_ignored = [&](const std::string& name) {
    for (const auto& suffix : family.ignored_tensor_suffixes)
      if (name.ends_with(suffix)) return true;
    return false;
  };
  LoadSummary summary;
  std::map<std::string, Located> found;
  std::vector<std::string> extra;
  std::set<std::string> dtypes;
  for (std::size_t fi = 0; fi < files.size(); ++fi) {
    const SafetensorsFile& file = files[fi];
    summary.files.push_back(file.path());
    for (const SafetensorsTensor& t : file.tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end() || it->second != file_names[fi]) {
          throw InvalidInput("[checkpoint] " + file.path() + " holds tensor '" + t.name + "' but " + join(d, kIndex) +
                             (it == weight_map.end() ? std::string(" does not list it")
                                                     : " places it in " + it->second) +
                             " — the index and the shards do not belong together; re-save the checkpoint");
        }
      }
      if (is_ignored(t.name)) {
        summary.ignored.push_back(t.name);
        continue;
      }
      std::string name = t.name;
      if (name != "lm_head.weight" && layout.find(name) == nullptr && layout.find("model." + name) != nullptr) {
        name = "model." + name;  // saved from the base model (LlamaModel / OPTModel)
      }
      if (found.count(name) != 0) {
        throw InvalidInput("[checkpoint] tensor '" + name + "' appears twice (in " + found.at(name).file->path() +
                           " and " + file.path() + ") — re-save the checkpoint");
      }
      const bool tied_head = name == "lm_head.weight" && config.tie_word_embeddings;
      if (!tied_head && layout.find(name) == nullptr) {
        extra.push_back(t.name);
        continue;
      }
      found[name] = {&file, &t};
      dtypes.insert(t.dtype_name);
    }
  }
  for (const auto& [name, file] : weight_map) {
    bool present = false;
    for (const auto& f : files)
      if (f.path() == join(d, file) && f.find(name) != nullptr) present = true;
    if (!present) {
      throw InvalidInput("[checkpoint] " + join(d, kIndex) + " places tensor '" + name + "' in " + file +
                         ", which does not hold it — the index is stale; re-save the checkpoint");
    }
  }
  if (!extra.empty()) {
    throw InvalidInput("[checkpoint] " + dir + " holds " + std::to_string(extra.size()) + " tensor(s) that a " +
                       family_name(config.family) + " model with " + cfg_name + " (" + describe_config(config) +
                       ") does not have: " + list_names(extra) +
                       " — the weights do not match config.json; use the config.json saved with them");
  }
  std::vector<std::string> missing;
  for (const ParamInfo& p : layout.params())
    if (!p.is_adapter && !skipped(p) && found.count(p.name) == 0) missing.push_back(p.name);  // adapters: not in a base model
  {
    std::int64_t adapters = 0, present = 0;
    for (const ParamInfo& p : layout.params())
      if (p.is_adapter) {
        ++adapters;
        present += found.count(p.name) != 0 ? 1 : 0;
      }
    if (present != 0 && present != adapters) {
      throw InvalidInput("[checkpoint] " + dir + " holds " + std::to_string(present) + " of the " +
                         std::to_string(adapters) + " LoRA adapter tensors this run has — it was written with other "
                         "--lora-targets; resume with the LoRA flags of the run that wrote it");
    }
  }
  if (!missing.empty()) {
    std::string hint = "the checkpoint is incomplete or belongs to another config; use the config.json saved with it";
    if (missing.size() == 1 && missing[0] == "lm_head.weight") {
      hint = "config.json says tie_word_embeddings false but the checkpoint has no lm_head.weight; set "
             "\"tie_word_embeddings\": true if the head shares the embedding";
    }
    throw InvalidInput("[checkpoint] " + dir + " lacks " + std::to_string(missing.size()) + " tensor(s) that " +
                       cfg_name + " (" + describe_config(config) + ") needs: " + list_names(missing) + " — " + hint);
  }

  // Shapes.
  for (const ParamInfo& p : layout.params()) {
    if ((p.is_adapter || skipped(p)) && found.count(p.name) == 0) continue;
    const Located& loc = found.at(p.name);
    if (!same_shape(loc.tensor->shape, p.shape)) {
      throw InvalidInput("[checkpoint] " + loc.file->path() + ": tensor '" + loc.tensor->name + "' has shape " +
                         loc.tensor->shape_str() + " but " + cfg_name + " (" + describe_config(config) + ") needs " +
                         p.shape.str() + " — the weights and config.json do not belong together; use the "
                         "config.json saved with these weights");
    }
  }
  // A tied checkpoint may carry lm_head.weight, if it equals the embedding.
  if (config.tie_word_embeddings && found.count("lm_head.weight") != 0) {
    const ParamInfo& emb = layout.at(family.token_embedding);
    const Located& head = found.at("lm_head.weight");
    const Located& e = found.at(emb.name);
    if (!same_shape(head.tensor->shape, emb.shape) || !tensors_equal(head, e)) {
      throw InvalidInput("[checkpoint] " + head.file->path() + ": lm_head.weight " + head.tensor->shape_str() +
                         " differs from " + emb.name + " " + e.tensor->shape_str() + " but " + cfg_name +
                         " says tie_word_embeddings true — set \"tie_word_embeddings\": false in config.json to "
                         "train an untied head, or drop lm_head.weight from the checkpoint");
    }
    summary.tied_lm_head_in_file = true;
  }

  const std::size_t es = dtype_size(flat.dtype());
  auto* base = static_cast<std::uint8_t*>(flat.raw());
  for (const ParamInfo& p : layout.params()) {
    // LoRA adapters are loaded when the file has them (a resumable checkpoint of a LoRA run);
    // otherwise (a base model) the caller initializes or loads them (init_adapters, load_adapter).
    if (p.is_adapter && found.count(p.name) == 0) continue;
    if (skipped(p)) continue;  // QLoRA: not in the buffer (quantized from the base model)
    const Located& loc = found.at(p.name);
    loc.file->read(*loc.tensor, base + static_cast<std::size_t>(p.offset) * es, flat.dtype());
    ++summary.tensors;
  }
  summary.file_dtypes.assign(dtypes.begin(), dtypes.end());
  return summary;
}

void save_checkpoint(const std::string& dir, const ModelConfig& config, const ParamLayout& layout, const Tensor& flat,
                     const SaveOptions& options) {
  SCALELAB_CHECK(flat.device() == DeviceType::kCPU,
                 "[checkpoint] save_checkpoint reads host memory — copy the parameters to a CPU buffer first");
  // QLoRA's parameter buffer holds the dense parameters only: the quantized ones are left out.
  const bool dense_only = layout.quantized_numel() > 0 && flat.numel() == layout.dense_numel();
  SCALELAB_CHECK(flat.numel() == layout.total_numel() || dense_only,
                 "[checkpoint] buffer has " + std::to_string(flat.numel()) + " elements, the layout " +
                     std::to_string(layout.total_numel()));
  SCALELAB_CHECK(flat.dtype() != DType::kI32 && options.dtype != DType::kI32,
                 "[checkpoint] parameters are saved as fp32, bf16 or fp16");
  const fs::path d(dir);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (!fs::is_directory(d, ec)) {
    throw InvalidInput("[checkpoint] cannot create the directory " + dir + (ec ? " (" + ec.message() + ")" : "") +
                       " — give --save a writable directory path");
  }

  json cfg = config.to_hf_json();
  cfg["torch_dtype"] = torch_dtype_name(options.dtype);
  {
    const std::string tmp = join(d, "config.json.tmp");
    std::ofstream out(tmp);
    out << cfg.dump(2) << "\n";
    out.close();
    if (!out) throw InvalidInput("[checkpoint] cannot write " + tmp + " — check that " + dir + " is writable");
    fs::rename(tmp, d / "config.json", ec);
    if (ec) throw InvalidInput("[checkpoint] cannot write " + join(d, "config.json") + " (" + ec.message() + ")");
  }

  const std::size_t es = dtype_size(flat.dtype());
  const auto* base = static_cast<const std::uint8_t*>(flat.raw());
  std::vector<SafetensorsSource> all;
  std::uint64_t total = 0;
  for (const ParamInfo& p : layout.params()) {
    if (dense_only && p.quantized) continue;
    SafetensorsSource s;
    s.name = p.name;
    for (int i = 0; i < p.shape.rank(); ++i) s.shape.push_back(p.shape[i]);
    s.data = base + static_cast<std::size_t>(p.offset) * es;
    s.data_dtype = flat.dtype();
    s.file_dtype = options.dtype;
    total += static_cast<std::uint64_t>(p.numel) * dtype_size(options.dtype);
    all.push_back(std::move(s));
  }

  // Shards, grouped as huggingface_hub does: in order; a tensor that would overflow the current
  // shard starts a new one; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<SafetensorsSource>> shards;
  if (options.max_shard_bytes == 0 || total <= options.max_shard_bytes) {
    shards.push_back(all);
  } else {
    std::uint64_t current = 0;
    for (auto& s : all) {
      std::int64_t n = 1;
      for (auto x : s.shape) n *= x;
      const auto bytes = static_cast<std::uint64_t>(n) * dtype_size(options.dtype);
      if (bytes > options.max_shard_bytes) {
        shards.push_back({s});
        current = options.max_shard_bytes;  // the next tensor starts a new shard
        continue;
      }
      if (shards.empty() || current + bytes > options.max_shard_bytes) {
        shards.emplace_back();
        current = 0;
      }
      shards.back().push_back(s);
      current += bytes;
    }
  }

  std::set<std::string> written;
  if (shards.size() == 1) {
    write_safetensors(join(d, kSingle), shards[0]);
    written.insert(kSingle);
  } else {
    json weight_map = json::object();
    const std::size_t n = shards.size();
    char buf[64];
    for (std::size_t i = 0; i < n; ++i) {
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
      write_safetensors(join(d, buf), shards[i]);
      written.insert(buf);
      for (const auto& s : shards[i]) weight_map[s.name] = buf;
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string tmp = join(d, std::string(kIndex) + ".tmp");
    std::ofstream out(tmp);
    out << index.dump(2) << "\n";
    out.close();
    if (!out) throw InvalidInput("[checkpoint] cannot write " + tmp + " — check that " + dir + " is writable");
    fs::rename(tmp, d / kIndex, ec);
    if (ec) throw InvalidInput("[checkpoint] cannot write " + join(d, kIndex) + " (" + ec.message() + ")");
    written.insert(kIndex);
  }
  // Remove weight files of an earlier save that this one does not overwrite: transformers reads
  // model.safetensors before an index, so a stale one would win.
  for (const auto& entry : fs::directory_iterator(d, ec)) {
    const std::string f = entry.path().filename().string();
    if ((f == kSingle || f == kIndex || is_shard_name(f)) && written.count(f) == 0) fs::remove(entry.path(), ec);
  }
}

}  // namespace scalelab
