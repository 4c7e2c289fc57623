// The CUDA backend object: which ops it implements, and the entry point the fronts reach it by.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"

namespace scalelab::kernels {
namespace cuda {

DeviceType CudaBackend::device() const { return DeviceType::kCUDA; }

// Every op of the interface, fused ones included: a GPU runs none of them as a composed fallback.
std::vector<std::string> CudaBackend::ops() const { return all_ops(); }

}  // namespace cuda

Backend* cuda_backend_or_null(std::string* why) {
  if (cuda_runtime_or_null(why) == nullptr) return nullptr;
  static cuda::CudaBackend backend;
  return &backend;
}

}  // namespace scalelab::kernels
