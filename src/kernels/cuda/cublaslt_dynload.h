#pragma once
// cuBLASLt, opened on first use instead of linked. Linking it made every scalelab process — a CPU
// training run, `scalelab --version`, each trial of a sweep — map and relocate libcublasLt at
// start: 147 MB of resident memory that a CPU run never uses (measured with /proc/self/status
// around dlopen; it was counted in every CPU run's peak RSS). The CUDA runtime opens the library
// when it sets a GPU up (runtime.cu), so a GPU run loads it once, as before.
//
// Each function here has cuBLASLt's signature under the name without its `cublasLt` prefix
// (lt::Create is cublasLtCreate). The first call loads the library (soname of the toolkit this was
// built with: libcublasLt.so.<major>) and resolves every symbol; a library that cannot be loaded or
// lacks a symbol throws RuntimeError saying which, and so does every later call.
#include <cublasLt.h>

#include <string>

namespace scalelab::kernels::cuda::lt {

// The soname opened ("libcublasLt.so.13"), and whether it loads with every symbol (no throw).
const char* library_name();
bool available(std::string* why = nullptr);

cublasStatus_t Create(cublasLtHandle_t* handle);
cublasStatus_t MatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale);
cublasStatus_t MatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t MatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                                      size_t size);
cublasStatus_t MatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols,
                                  int64_t ld);
cublasStatus_t MatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t MatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                        const void* buf, size_t size);
cublasStatus_t MatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t MatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t MatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                                            const void* buf, size_t size);
cublasStatus_t MatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                      cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                      cublasLtMatmulPreference_t pref, int requested,
                                      cublasLtMatmulHeuristicResult_t results[], int* returned);
cublasStatus_t Matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                      cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc, const void* beta,
                      const void* c, cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                      const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace scalelab::kernels::cuda::lt
