#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include "core/error.h"
#include "model/family.h"
#include "model/nf4.h"

namespace scalelab {

void ParamLayout::add(std::string name, Shape shape, ParamKind kind) {
  ParamInfo p;
  p.name = std::move(name);
  p.shape = shape;
  p.offset = total_;
  p.numel = shape.numel();
  p.decay = kind == ParamKind::kLinear || kind == ParamKind::kEmbedding;
  p.is_norm = kind == ParamKind::kNormWeight || kind == ParamKind::kNormBias;
  p.is_bias = kind == ParamKind::kNormBias || kind == ParamKind::kBias;
  p.is_embedding = kind == ParamKind::kEmbedding;
  p.decay = p.decay || kind == ParamKind::kAdapter;  // the HF Trainer decays every non-bias, non-norm weight
  p.is_adapter = kind == ParamKind::kAdapter;
  total_ += p.numel;
  dense_ += p.numel;
  trainable_ += p.numel;
  if (kind == ParamKind::kLinear) matmul_numel_ += p.numel;
  params_.push_back(std::move(p));
}

ParamLayout ParamLayout::build(const ModelConfig& c) {
  ParamLayout L;
  family_of(c).build_layout(c, L);
  return L;
}

ParamLayout ParamLayout::build(const ModelConfig& c, const std::string& freeze_regex, const LoraConfig& lora) {
  ParamLayout L = build(c);
  if (lora.enabled()) {
    if (!freeze_regex.empty()) {
      throw InvalidInput("[--freeze] LoRA (--lora-rank) already freezes every base parameter; --freeze with "
                         "--lora-rank is not supported — drop --freeze");
    }
    L.add_lora(lora);
  } else if (!freeze_regex.empty()) {
    L.freeze(freeze_regex);
  }
  return L;
}

double LoraConfig::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

std::vector<std::string> LoraConfig::resolved_targets() const {
  return targets.empty() ? std::vector<std::string>{"q_proj", "v_proj"} : targets;
}

bool ParamLayout::qat_applies(const std::string& weight) const {
  if (!qat_.enabled()) return false;
  const ParamInfo* p = find(weight);
  return p != nullptr && !p->is_adapter && !p->is_embedding && p->shape.rank() == 2 &&
         weight.find(".layers.") != std::string::npos;
}

void ParamLayout::set_qat(const QatConfig& qat) {
  if (qat.enabled()) {
    if (qat.scheme != "8da4w") {
      throw InvalidInput("[--qat] unknown scheme '" + qat.scheme + "' — the one implemented is 8da4w (int8 dynamic "
                         "per-token activations, int4 grouped weights)");
    }
    if (qat.group_size <= 1) {
      throw InvalidInput("[--qat-group-size] must be > 1, got " + std::to_string(qat.group_size));
    }
  }
  qat_ = qat;
  for (const ParamInfo& p : params_) {
    if (!qat_applies(p.name)) continue;
    const std::int64_t in = p.shape[1];
    if (in % qat.group_size != 0) {
      qat_ = QatConfig{};
      throw InvalidInput("[--qat-group-size] " + std::to_string(qat.group_size) + " does not divide the " +
                         std::to_string(in) + " input features of " + p.name + " " + p.shape.str() +
                         " — use a group size that divides every linear module's input features (e.g. 32 or a "
                         "common divisor of the hidden and intermediate sizes)");
    }
  }
}

void ParamLayout::add_lora(const LoraConfig& lora) {
  SCALELAB_CHECK(lora.enabled(), "[params] add_lora without a rank");
  const std::vector<std::string> targets = lora.resolved_targets();
  // The linear weights of the decoder layers: "<prefix>layers.N.<path>.<module>.weight".
  struct Site {
    std::string module;  // the module path, "model.layers.0.self_attn.q_proj"
    std::string short_name;
    std::int64_t out, in;
  };
  std::vector<Site> sites;
  std::set<std::string> existing;
  for (const ParamInfo& p : params_) {
    if (p.is_embedding || p.is_norm || p.is_bias || p.shape.rank() != 2) continue;
    if (p.name.find("layers.") == std::string::npos || !p.name.ends_with(".weight")) continue;
    const std::string module = p.name.substr(0, p.name.size() - 7);
    const std::string short_name = module.substr(module.rfind('.') + 1);
    existing.insert(short_name);
    sites.push_back({module, short_name, p.shape[0], p.shape[1]});
  }
  std::string names;
  for (const auto& e : existing) names += (names.empty() ? "" : ",") + e;
  for (const auto& t : targets) {
    if (existing.count(t) == 0) {
      throw InvalidInput("[--lora-targets] '" + t + "' matches no linear module of this model's layers — the "
                         "modules are: " + names);
    }
  }
  if (lora.alpha <= 0 || !std::isfinite(lora.alpha)) {
    throw InvalidInput("[--lora-alpha] must be a positive number, got " + std::to_string(lora.alpha));
  }
  // Appended layer by layer in the family's order, so that a layer's adapters are one run: first
  // every lora_A of the layer, then every lora_B. The A's of the modules that read one input (q, k,
  // v; gate, up) are thus adjacent, one [parts·r, in] matrix, so LoraAdapter multiplies the input
  // by all of them in one GEMM (model/decoder/lora.cpp). (Initialization is keyed by name, not by
  // position: model/init.cpp.)
  const std::vector<ParamInfo> base = params_;
  auto layer_of = [](const std::string& module) {
    const std::size_t at = module.find("layers.");
    const std::size_t end = module.find('.', at + 7);
    return module.substr(0, end);
  };
  std::vector<const Site*> targeted;
  for (const Site& s : sites) {
    if (std::find(targets.begin(), targets.end(), s.short_name) == targets.end()) continue;
    if (lora.rank > std::min(s.out, s.in)) {
      throw InvalidInput("[--lora-rank] " + std::to_string(lora.rank) + " is above a dimension of " + s.module +
                         " [" + std::to_string(s.out) + ", " + std::to_string(s.in) + "] — use a rank of at most " +
                         std::to_string(std::min(s.out, s.in)));
    }
    targeted.push_back(&s);
  }
  for (std::size_t i = 0; i < targeted.size();) {
    std::size_t j = i;
    while (j < targeted.size() && layer_of(targeted[j]->module) == layer_of(targeted[i]->module)) ++j;
    for (std::size_t k = i; k < j; ++k)
      add(targeted[k]->module + ".lora_A.weight", Shape{lora.rank, targeted[k]->in}, ParamKind::kAdapter);
    for (std::size_t k = i; k < j; ++k)
      add(targeted[k]->module + ".lora_B.weight", Shape{targeted[k]->out, lora.rank}, ParamKind::kAdapter);
    i = j;
  }
  for (auto& p : params_) p.trainable = p.is_adapter;
  if (!lora.quantize_base.empty()) {
    const Nf4Flavor flavor = *parse_quantize_base(lora.quantize_base);
    for (auto& p : params_) {
      const bool site = std::any_of(sites.begin(), sites.end(), [&](const Site& s) { return s.module + ".weight" == p.name; });
      if (!site) continue;
      const std::string why = nf4_refusal(flavor, p.numel);
      if (!why.empty()) {
        throw InvalidInput("[--quantize-base] " + p.name + " [" + std::to_string(p.shape[0]) + ", " +
                           std::to_string(p.shape[1]) + "] cannot be stored as " + nf4_flavor_name(flavor) + ": " + why);
      }
      p.quantized = true;
    }
  }
  lora_ = lora;
  relayout();
}

void ParamLayout::relayout() {
  grad_segments_.clear();  // offsets change: a shared-gradient mapping no longer applies
  grad_numel_ = 0;
  std::int64_t off = 0;
  for (auto& p : params_)
    if (p.trainable) {
      p.offset = off;
      off += p.numel;
    }
  trainable_ = off;
  for (auto& p : params_)
    if (!p.trainable && !p.quantized) {
      p.offset = off;
      off += p.numel;
    }
  dense_ = off;
  for (auto& p : params_)  // QLoRA: after the flat buffer (a full-size staging buffer on load holds them)
    if (p.quantized) {
      p.offset = off;
      off += p.numel;
    }
}

void ParamLayout::freeze(const std::string& pattern) {
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw InvalidInput("[--freeze] '" + pattern + "' is not a valid regular expression (" + e.what() +
                       ") — ECMAScript syntax, e.g. 'embed_tokens|layers\\.0\\.'");
  }
  std::int64_t matched = 0;
  for (auto& p : params_) {
    if (std::regex_search(p.name, re)) {
      p.trainable = false;
      ++matched;
    }
  }
  if (matched == 0) {
    std::string names;
    for (std::size_t i = 0; i < params_.size() && i < 3; ++i) names += (i ? ", " : "") + params_[i].name;
    throw InvalidInput("[--freeze] '" + pattern + "' matches no parameter of this model — it is searched in the "
                       "Hugging Face names (" + names + ", ...)");
  }
  relayout();  // trainable first, then frozen, each in the family's order
  if (trainable_ == 0) {
    throw InvalidInput("[--freeze] '" + pattern + "' matches every parameter of this model: nothing would train — "
                       "freeze fewer");
  }
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamInfo& ParamLayout::at(const std::string& name) const {
  const ParamInfo* p = find(name);
  SCALELAB_CHECK(p != nullptr, "[params] no parameter named '" + name + "' in this model");
  return *p;
}

std::int64_t ParamLayout::non_embedding_numel() const {
  std::int64_t n = 0;
  for (const auto& p : params_)
    if (!p.is_embedding) n += p.numel;
  return n;
}

Tensor ParamLayout::view(const Tensor& flat, const ParamInfo& p) const {
  return flat.view({flat.numel()}).slice(p.offset, p.offset + p.numel).view(p.shape);
}

Tensor ParamLayout::view(const Tensor& flat, const std::string& name) const { return view(flat, at(name)); }

Tensor ParamLayout::grad_view(const Tensor& grads, const std::string& name) const {
  const ParamInfo* p = find(name);
  return p ? grad_view(grads, *p) : Tensor();
}

Tensor ParamLayout::grad_view(const Tensor& grads, const ParamInfo& p) const {
  if (!p.trainable) return Tensor();
  const std::int64_t g = grad_offset(p.offset);
  SCALELAB_CHECK(grad_offset(p.offset + p.numel - 1) == g + p.numel - 1,
                 "[model] " + p.name + "'s gradient is split across gradient segments (a bug)");
  return grads.view({grads.numel()}).slice(g, g + p.numel).view(p.shape);
}

void ParamLayout::share_layer_gradients(const std::vector<std::pair<std::int64_t, std::int64_t>>& layer_ranges) {
  std::vector<std::pair<std::int64_t, std::int64_t>> layers;
  for (const auto& r : layer_ranges)
    if (r.second > r.first) layers.push_back(r);
  std::sort(layers.begin(), layers.end());
  std::int64_t slot = 0, prev_end = 0;
  for (const auto& r : layers) {
    SCALELAB_CHECK(r.first >= prev_end && r.second <= trainable_, "[model] layer gradient ranges overlap (a bug)");
    prev_end = r.second;
    slot = std::max(slot, r.second - r.first);
  }
  // Outside the layers: the gaps between their ranges, packed in order.
  std::vector<GradSegment> segs;
  std::int64_t packed = 0, at = 0;
  auto own = [&](std::int64_t b, std::int64_t e) {
    if (e <= b) return;
    segs.push_back({b, e, packed, false});
    packed += e - b;
  };
  for (const auto& r : layers) {
    own(at, r.first);
    at = r.second;
  }
  own(at, trainable_);
  for (const auto& r : layers) segs.push_back({r.first, r.second, packed, true});
  std::sort(segs.begin(), segs.end(), [](const GradSegment& a, const GradSegment& b) { return a.begin < b.begin; });
  grad_segments_ = std::move(segs);
  grad_numel_ = packed + slot;
}

std::int64_t ParamLayout::grad_offset(std::int64_t offset) const {
  if (grad_segments_.empty()) return offset;
  auto it = std::upper_bound(grad_segments_.begin(), grad_segments_.end(), offset,
                             [](std::int64_t o, const GradSegment& s) { return o < s.begin; });
  SCALELAB_CHECK(it != grad_segments_.begin() && offset < std::prev(it)->end,
                 "[model] offset " + std::to_string(offset) + " is outside the trainable buffer (a bug)");
  --it;
  return it->grad_begin + (offset - it->begin);
}

std::vector<ParamLayout::GradSegment> ParamLayout::grad_segments(std::int64_t begin, std::int64_t end) const {
  std::vector<GradSegment> out;
  if (end <= begin) return out;
  if (grad_segments_.empty()) return {{begin, end, begin, false}};
  for (const auto& s : grad_segments_) {
    const std::int64_t b = std::max(begin, s.begin), e = std::min(end, s.end);
    if (e > b) out.push_back({b, e, s.grad_begin + (b - s.begin), s.shared});
  }
  return out;
}

}  // namespace scalelab
