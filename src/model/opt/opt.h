#pragma once
// The OPT decoder (src/model/opt/model.cpp) and its layer names.
#include <cstdint>
#include <memory>
#include <string>

#include "model/model.h"

namespace scalelab {

std::string opt_layer_prefix(std::int64_t layer);  // "model.decoder.layers.<i>."

std::unique_ptr<Model> make_opt_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                      const ModelOptions& o);

}  // namespace scalelab
