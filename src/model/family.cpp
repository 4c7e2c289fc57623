#include "model/family.h"

#include <map>

#include "core/error.h"

namespace scalelab {

// Defined in src/model/<family>/family.cpp. Adding a family: declare it here and list it below.
const ModelFamilySpec& llama_family();
const ModelFamilySpec& opt_family();
const ModelFamilySpec& qwen2_family();

const std::vector<const ModelFamilySpec*>& model_families() {
  static const std::vector<const ModelFamilySpec*> all = [] {
    std::vector<const ModelFamilySpec*> v = {&llama_family(), &opt_family(), &qwen2_family()};
    std::map<std::string, std::string> presets;
    for (std::size_t i = 0; i < v.size(); ++i) {
      SCALELAB_CHECK(static_cast<std::size_t>(v[i]->id) == i,
                     "[family] " + v[i]->name + " is registered out of ModelFamily order");
      for (const ModelConfig& p : v[i]->presets) {
        SCALELAB_CHECK(p.family == v[i]->id, "[family] preset " + p.name + " has another family than " + v[i]->name);
        SCALELAB_CHECK(presets.emplace(p.name, v[i]->name).second, "[family] preset " + p.name + " is defined twice");
      }
    }
    return v;
  }();
  return all;
}

const ModelFamilySpec& family_spec(ModelFamily id) {
  const auto& all = model_families();
  const auto i = static_cast<std::size_t>(id);
  SCALELAB_CHECK(i < all.size(), "[family] no family registered for id " + std::to_string(i));
  return *all[i];
}

const ModelFamilySpec* find_family_by_hf_type(const std::string& model_type) {
  for (const ModelFamilySpec* f : model_families())
    for (const auto& t : f->hf_model_types)
      if (t == model_type) return f;
  return nullptr;
}

const ModelFamilySpec* find_family_by_name(const std::string& name) {
  for (const ModelFamilySpec* f : model_families())
    if (f->name == name) return f;
  return nullptr;
}

const ModelFamilySpec* find_family_by_preset(const std::string& preset) {
  for (const ModelFamilySpec* f : model_families())
    for (const ModelConfig& p : f->presets)
      if (p.name == preset) return f;
  return nullptr;
}

const char* family_name(ModelFamily f) { return family_spec(f).name.c_str(); }

Tensor Model::forward_cached(const Batch&, KvCache&, ExecContext&) {
  throw InvalidInput("[generate] this model family has no cached inference path yet");
}

void Model::forward_logprobs(Tensor&, const Batch&, ExecContext&) {
  throw InvalidInput("[dpo] this model family has no per-token log-probability path yet (Llama, Qwen2 and OPT have one)");
}

double Model::forward_backward_logprobs(const Batch&, const LogprobLoss&, ExecContext&) {
  throw InvalidInput("[dpo] this model family has no per-token log-probability path yet (Llama, Qwen2 and OPT have one)");
}

double resolve_dropout(const ModelConfig& c, double dropout_flag) {
  if (dropout_flag >= 0) return dropout_flag;
  return family_of(c).dropout ? c.dropout : 0.0;
}

void check_model_options(const ModelConfig& c, const ModelOptions& o) {
  const ModelFamilySpec& f = family_of(c);
  if (!(o.dropout >= 0.0 && o.dropout < 1.0)) {
    throw InvalidInput("[--dropout] must be in [0, 1), got " + std::to_string(o.dropout));
  }
  if (!f.dropout && o.dropout > 0) {
    throw InvalidInput("[--dropout] the " + f.display_name + " family has no dropout — omit --dropout (or give 0)");
  }
  if (f.check_options) f.check_options(c, o);
}

std::unique_ptr<Model> make_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                  const ModelOptions& o) {
  check_model_options(c, o);
  return family_of(c).make_model(c, layout, params, grads, o);
}

}  // namespace scalelab
