// The CUDA NF4 kernel's stand-in in builds without the CUDA toolkit (kernels/nf4.h): the front
// has already refused (backend_for throws BackendUnavailable with the reason), so this is not reached.
#include "core/error.h"
#include "kernels/nf4.h"

namespace scalelab::kernels::cuda {

void nf4_dequantize(Tensor&, const Nf4View&, std::int64_t, ExecContext&) {
  throw RuntimeError("[nf4_dequantize] this scalelab was built without the CUDA backend — use --device cpu");
}

}  // namespace scalelab::kernels::cuda
