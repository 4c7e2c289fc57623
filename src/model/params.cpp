#include "model/params.h"

#include <regex>

#include "core/error.h"
#include "model/family.h"

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
  total_ += p.numel;
  trainable_ += p.numel;
  if (kind == ParamKind::kLinear) matmul_numel_ += p.numel;
  params_.push_back(std::move(p));
}

ParamLayout ParamLayout::build(const ModelConfig& c) {
  ParamLayout L;
  family_of(c).build_layout(c, L);
  return L;
}

ParamLayout ParamLayout::build(const ModelConfig& c, const std::string& freeze_regex) {
  ParamLayout L = build(c);
  if (!freeze_regex.empty()) L.freeze(freeze_regex);
  return L;
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
  // Trainable first, then frozen, each in the family's order.
  std::int64_t off = 0;
  for (auto& p : params_)
    if (p.trainable) {
      p.offset = off;
      off += p.numel;
    }
  trainable_ = off;
  for (auto& p : params_)
    if (!p.trainable) {
      p.offset = off;
      off += p.numel;
    }
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
  return p && p->trainable ? view(grads, *p) : Tensor();
}

}  // namespace scalelab
