#pragma once
// Host-side declarations of the CUDA runtime of this process (runtime.cu), for files compiled by the
// host compiler (the cuDNN frontend's .cpp); kernel files include common.cuh, which includes this.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace scalelab::kernels::cuda {

// Throws RuntimeError "[where] CUDA error <name>: <string>" when e is not cudaSuccess.
void check(cudaError_t e, const char* where);
void check_cublas(cublasStatus_t s, const char* where);

// The process's stream and cuBLASLt handle, and a device workspace for cuBLASLt (created once).
cudaStream_t stream();
cublasLtHandle_t cublaslt();
void* cublaslt_workspace(std::size_t* bytes);
const cudaDeviceProp& device_props();

}  // namespace scalelab::kernels::cuda
