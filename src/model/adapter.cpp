#include "model/adapter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/matmul.h"
#include "model/safetensors.h"

namespace scalelab {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFile = "adapter_model.safetensors";
constexpr const char* kConfig = "adapter_config.json";
constexpr const char* kPrefix = "base_model.model.";

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.rank(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

std::string peft_tensor_name(const std::string& layout_name) { return kPrefix + layout_name; }

LoraConfig read_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfig).string();
  std::ifstream in(path);
  if (!in) {
    throw InvalidInput("[--adapter] cannot read " + path + " — give a directory written by peft's save_pretrained or "
                       "by scalelab train --lora-rank R --save DIR");
  }
  json c;
  try {
    c = json::parse(in);
  } catch (const json::exception& e) {
    throw InvalidInput("[--adapter] " + path + " is not valid JSON (" + e.what() + ")");
  }
  auto refuse = [&](const std::string& why) {
    throw InvalidInput("[--adapter] " + path + ": " + why + " — not supported yet (docs/finetuning.md)");
  };
  if (c.value("peft_type", std::string()) != "LORA") refuse("peft_type is not LORA");
  if (!c.contains("r") || !c["r"].is_number_integer()) refuse("no integer r");
  LoraConfig l;
  l.rank = c["r"].get<std::int64_t>();
  l.alpha = c.contains("lora_alpha") && c["lora_alpha"].is_number() ? c["lora_alpha"].get<double>() : 8.0;
  l.rslora = c.value("use_rslora", false);
  l.dropout = c.contains("lora_dropout") && c["lora_dropout"].is_number() ? c["lora_dropout"].get<double>() : 0.0;
  if (!c.contains("target_modules") || !c["target_modules"].is_array()) {
    refuse("target_modules is not a list of module names");
  }
  for (const auto& t : c["target_modules"]) l.targets.push_back(t.get<std::string>());
  std::sort(l.targets.begin(), l.targets.end());  // peft writes a set: any order
  if (c.value("use_dora", false)) refuse("use_dora is true");
  if (c.value("bias", std::string("none")) != "none") refuse("bias is not \"none\"");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (c.contains(k) && c[k].is_object() && !c[k].empty()) refuse(std::string(k) + " is not empty");
  if (c.contains("modules_to_save") && !c["modules_to_save"].is_null()) refuse("modules_to_save is set");
  return l;
}

void load_adapter(const std::string& dir, const ParamLayout& layout, const Tensor& flat) {
  SCALELAB_CHECK(flat.device() == DeviceType::kCPU && flat.numel() == layout.total_numel(),
                 "[adapter] load_adapter writes a host buffer of the layout's size");
  const LoraConfig& lora = layout.lora();
  if (!lora.enabled()) throw InvalidInput("[--adapter] loading an adapter needs --lora-rank R (and its targets)");
  const fs::path d(dir);
  std::error_code ec;
  const std::string path = (d / kFile).string();
  if (!fs::is_regular_file(path, ec)) {
    throw InvalidInput("[--adapter] " + dir + " has no " + kFile + " — give a directory written by peft's "
                       "save_pretrained or by scalelab train --lora-rank R --save DIR");
  }
  const std::string cfg_path = (d / kConfig).string();
  if (fs::is_regular_file(cfg_path, ec)) {
    json c;
    try {
      std::ifstream in(cfg_path);
      c = json::parse(in);
    } catch (const json::exception& e) {
      throw InvalidInput("[--adapter] " + cfg_path + " is not valid JSON (" + e.what() + ")");
    }
    auto mismatch = [&](const std::string& what, const std::string& file, const std::string& flag) {
      throw InvalidInput("[--adapter] " + cfg_path + " has " + what + " " + file + " but this run has " + flag +
                         " — give the same LoRA settings as the adapter was trained with");
    };
    if (c.contains("r") && c["r"].is_number() && c["r"].get<std::int64_t>() != lora.rank)
      mismatch("r", c["r"].dump(), "--lora-rank " + std::to_string(lora.rank));
    if (c.contains("lora_alpha") && c["lora_alpha"].is_number() &&
        std::abs(c["lora_alpha"].get<double>() - lora.alpha) > 1e-12 * std::abs(lora.alpha))
      mismatch("lora_alpha", c["lora_alpha"].dump(), "--lora-alpha " + std::to_string(lora.alpha));
    if (c.contains("use_rslora") && c["use_rslora"].is_boolean() && c["use_rslora"].get<bool>() != lora.rslora)
      mismatch("use_rslora", c["use_rslora"].dump(), lora.rslora ? "--rslora" : "no --rslora");
  }
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, const ParamInfo*> want;
  for (const ParamInfo& p : layout.params())
    if (p.is_adapter) want[peft_tensor_name(p.name)] = &p;
  for (const SafetensorsTensor& t : file.tensors()) {
    if (want.count(t.name) == 0) {
      throw InvalidInput("[--adapter] " + path + " holds '" + t.name + "', which this model with --lora-targets " +
                         "does not have — give the targets the adapter was trained with (adapter_config.json's "
                         "target_modules), or an adapter of this base model");
    }
  }
  const std::size_t es = dtype_size(flat.dtype());
  auto* base = static_cast<std::uint8_t*>(flat.raw());
  for (const auto& [name, p] : want) {
    const SafetensorsTensor* t = file.find(name);
    if (t == nullptr) {
      throw InvalidInput("[--adapter] " + path + " lacks '" + name + "' — the adapter has fewer targets than "
                         "--lora-targets, or belongs to another model");
    }
    bool same = static_cast<int>(t->shape.size()) == p->shape.rank();
    for (int i = 0; same && i < p->shape.rank(); ++i) same = t->shape[static_cast<std::size_t>(i)] == p->shape[i];
    if (!same) {
      throw InvalidInput("[--adapter] " + path + ": '" + name + "' has shape " + t->shape_str() + " but this model "
                         "with --lora-rank " + std::to_string(lora.rank) + " needs " + shape_str(p->shape) +
                         " — the adapter is of another base model or rank");
    }
    if (!t->dtype || *t->dtype == DType::kI32) {
      throw InvalidInput("[--adapter] " + path + ": '" + name + "' is " + t->dtype_name + ", not F32/BF16/F16");
    }
    file.read(*t, base + static_cast<std::size_t>(p->offset) * es, flat.dtype());
  }
}

void merge_adapter(const ParamLayout& lora_layout, const Tensor& flat, const ParamLayout& base_layout,
                   const Tensor& merged) {
  SCALELAB_CHECK(flat.device() == DeviceType::kCPU && merged.device() == DeviceType::kCPU &&
                     flat.dtype() == DType::kF32 && merged.dtype() == DType::kF32 &&
                     flat.numel() == lora_layout.total_numel() && merged.numel() == base_layout.total_numel(),
                 "[adapter] merge_adapter takes fp32 host buffers of the two layouts");
  const float* src = flat.data<float>();
  float* dst = merged.data<float>();
  for (const ParamInfo& p : base_layout.params()) {
    const ParamInfo& q = lora_layout.at(p.name);
    std::copy(src + q.offset, src + q.offset + q.numel, dst + p.offset);
  }
  const float s = static_cast<float>(lora_layout.lora().scale());
  for (const ParamInfo& a : lora_layout.params()) {
    if (!a.is_adapter || !a.name.ends_with(".lora_A.weight")) continue;
    const std::string module = a.name.substr(0, a.name.size() - std::string(".lora_A.weight").size());
    const ParamInfo& b = lora_layout.at(module + ".lora_B.weight");
    const ParamInfo& w = base_layout.at(module + ".weight");
    const std::int64_t out = w.shape[0], in = w.shape[1], r = a.shape[0];
    kernels::gemm(false, false, out, in, r, s, src + b.offset, r, src + a.offset, in, 1.0f, dst + w.offset, in);
  }
}

void save_adapter(const std::string& dir, const ParamLayout& layout, const Tensor& flat, DType dtype,
                  const std::string& base_model) {
  // QLoRA: the parameter buffer holds the dense part only (ParamLayout::dense_numel); the adapters are in it.
  SCALELAB_CHECK(flat.device() == DeviceType::kCPU &&
                     (flat.numel() == layout.total_numel() || flat.numel() == layout.dense_numel()),
                 "[adapter] save_adapter reads a host buffer of the layout's size");
  const LoraConfig& lora = layout.lora();
  SCALELAB_CHECK(lora.enabled(), "[adapter] save_adapter of a layout without LoRA");
  const fs::path d(dir);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (!fs::is_directory(d, ec)) {
    throw InvalidInput("[--save] cannot create the directory " + dir + " — give a writable directory path");
  }
  const std::size_t es = dtype_size(flat.dtype());
  const auto* base = static_cast<const std::uint8_t*>(flat.raw());
  std::vector<SafetensorsSource> tensors;
  for (const ParamInfo& p : layout.params()) {
    if (!p.is_adapter) continue;
    SafetensorsSource s;
    s.name = peft_tensor_name(p.name);
    for (int i = 0; i < p.shape.rank(); ++i) s.shape.push_back(p.shape[i]);
    s.data = base + static_cast<std::size_t>(p.offset) * es;
    s.data_dtype = flat.dtype();
    s.file_dtype = dtype;
    tensors.push_back(std::move(s));
  }
  write_safetensors((d / kFile).string(), tensors);
  json c = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"base_model_name_or_path", base_model},
            {"r", lora.rank},
            {"lora_alpha", lora.alpha},
            {"lora_dropout", lora.dropout},
            {"target_modules", lora.resolved_targets()},
            {"use_rslora", lora.rslora},
            {"bias", "none"},
            {"fan_in_fan_out", false},
            {"inference_mode", true},
            {"init_lora_weights", true},
            {"modules_to_save", nullptr},
            {"use_dora", false}};
  const std::string tmp = (d / (std::string(kConfig) + ".tmp")).string();
  {
    std::ofstream out(tmp);
    out << c.dump(2) << "\n";
    out.close();
    if (!out) throw InvalidInput("[--save] cannot write " + tmp + " — check that " + dir + " is writable");
  }
  fs::rename(tmp, d / kConfig, ec);
  if (ec) throw InvalidInput("[--save] cannot write " + (d / kConfig).string() + " (" + ec.message() + ")");
}

}  // namespace scalelab
