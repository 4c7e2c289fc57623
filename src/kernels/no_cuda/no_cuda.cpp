// The CUDA backend's stand-in in builds without the CUDA toolkit: every CUDA request is refused
// with the reason, never a crash. CMake compiles this folder instead of src/kernels/cuda/.
#include "core/device.h"
#include "kernels/backend.h"
#include "kernels/logprobs_impl.h"

namespace scalelab {

DeviceRuntime* cuda_runtime_or_null(std::string* why) {
  if (why) {
    *why = "this scalelab was built without the CUDA backend (SCALELAB_WITH_CUDA=OFF, or CMake did not find the "
           "CUDA toolkit) — rebuild where /usr/local/cuda exists, or use --device cpu";
  }
  return nullptr;
}

namespace kernels {

Backend* cuda_backend_or_null(std::string* why) {
  cuda_runtime_or_null(why);
  return nullptr;
}

// Never reached: loss.cpp asks backend_for(kCUDA) first, which refuses in this build.
namespace cuda {
void token_logprobs_forward(Tensor&, const Tensor&, const Tensor&, const Tensor&, ExecContext&) {
  throw BackendUnavailable("token_logprobs_forward", DeviceType::kCUDA, "built without CUDA");
}
void token_logprobs_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, ExecContext&) {
  throw BackendUnavailable("token_logprobs_backward", DeviceType::kCUDA, "built without CUDA");
}
}  // namespace cuda

}  // namespace kernels
}  // namespace scalelab
