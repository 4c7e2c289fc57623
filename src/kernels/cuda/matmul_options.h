#pragma once
// Switches of the CUDA GEMMs (src/kernels/cuda/matmul.cu). Plain C++: callable from host code.
// Defined only in CUDA builds (the symbols live in matmul.cu).

namespace scalelab::kernels::cuda {

// fp32 GEMMs compute in true fp32 (CUBLAS_COMPUTE_32F) unless this is set: then fp32 x fp32
// products may use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32), as
// torch.backends.cuda.matmul.allow_tf32 does. Products with bf16/fp16 operands are unaffected.
// Process-wide; default false. Takes effect on the next GEMM (plans are cached per setting).
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace scalelab::kernels::cuda
