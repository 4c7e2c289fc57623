// The fuzz build (SCALELAB_FUZZ=ON) compiles the parsers, not the engine: the family descriptors
// (model/*/family.cpp) hold a pointer to their decoder's constructor, which would pull the whole
// decoder and every kernel into the link. No harness builds a model (they parse, lay out, load
// weights into a flat buffer and read batches), so the constructors are replaced here by ones
// that refuse; if a harness ever reached one, the ContractViolation would abort the fuzzer as a
// finding. The normal build (scalelab_fuzz_tests) links the real ones.
#include <memory>

#include "fuzz/targets.h"
#include "model/llama/llama.h"
#include "model/opt/opt.h"

namespace scalelab {

std::unique_ptr<Model> make_llama_model(const ModelConfig&, const ParamLayout&, Tensor&, Tensor&, const ModelOptions&) {
  throw fuzz::ContractViolation("the fuzz build has no decoder: a harness must not build a Llama model");
}

std::unique_ptr<Model> make_opt_model(const ModelConfig&, const ParamLayout&, Tensor&, Tensor&, const ModelOptions&) {
  throw fuzz::ContractViolation("the fuzz build has no decoder: a harness must not build an OPT model");
}

}  // namespace scalelab
