#include "model/params.h"

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
  if (kind == ParamKind::kLinear) matmul_numel_ += p.numel;
  params_.push_back(std::move(p));
}

ParamLayout ParamLayout::build(const ModelConfig& c) {
  ParamLayout L;
  family_of(c).build_layout(c, L);
  return L;
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

}  // namespace scalelab
