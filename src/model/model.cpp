// make_model: the one place that maps a config's family to its model class.
#include "model/model.h"

namespace scalelab {

// Defined beside each family's model (src/model/llama.cpp, src/model/opt.cpp).
std::unique_ptr<Model> make_llama_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                        const ModelOptions& o);
std::unique_ptr<Model> make_opt_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                      const ModelOptions& o);

std::unique_ptr<Model> make_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                  const ModelOptions& o) {
  switch (c.family) {
    case ModelFamily::kLlama:
      return make_llama_model(c, layout, params, grads, o);
    case ModelFamily::kOPT:
      return make_opt_model(c, layout, params, grads, o);
  }
  return nullptr;  // unreachable: every family is handled above
}

}  // namespace scalelab
