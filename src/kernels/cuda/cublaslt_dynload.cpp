// cuBLASLt opened with dlopen on first use (why: cublaslt_dynload.h). The table is resolved once,
// under std::call_once; the soname comes from the headers this was compiled against, so a library
// of another major version (another ABI) is never picked up.
#include "kernels/cuda/cublaslt_dynload.h"

#include <dlfcn.h>

#include <mutex>

#include "core/error.h"

namespace scalelab::kernels::cuda::lt {

namespace {

#define SCALELAB_STR2(x) #x
#define SCALELAB_STR(x) SCALELAB_STR2(x)
constexpr const char* kSoname = "libcublasLt.so." SCALELAB_STR(CUBLAS_VER_MAJOR);

struct Table {
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&::cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
  std::string error;  // why the library is unusable; empty when it loaded
};

template <class F>
void resolve(void* lib, const char* name, F& slot, std::string& error) {
  dlerror();
  void* sym = dlsym(lib, name);
  if (sym == nullptr && error.empty()) error = std::string(kSoname) + " has no symbol " + name;
  slot = reinterpret_cast<F>(sym);
}

const Table& table() {
  static Table t;
  static std::once_flag once;
  std::call_once(once, [] {
    // RTLD_LOCAL: cuBLASLt's symbols serve this table only. The handle is never closed (the
    // library stays for the process, as a linked one would).
    void* lib = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      t.error = std::string("cuBLASLt could not be loaded (") + (why ? why : kSoname) +
                ") — install the CUDA toolkit's cuBLAS libraries or add their directory to LD_LIBRARY_PATH";
      return;
    }
    resolve(lib, "cublasLtCreate", t.create, t.error);
    resolve(lib, "cublasLtMatmulDescCreate", t.desc_create, t.error);
    resolve(lib, "cublasLtMatmulDescDestroy", t.desc_destroy, t.error);
    resolve(lib, "cublasLtMatmulDescSetAttribute", t.desc_set, t.error);
    resolve(lib, "cublasLtMatrixLayoutCreate", t.layout_create, t.error);
    resolve(lib, "cublasLtMatrixLayoutDestroy", t.layout_destroy, t.error);
    resolve(lib, "cublasLtMatrixLayoutSetAttribute", t.layout_set, t.error);
    resolve(lib, "cublasLtMatmulPreferenceCreate", t.pref_create, t.error);
    resolve(lib, "cublasLtMatmulPreferenceDestroy", t.pref_destroy, t.error);
    resolve(lib, "cublasLtMatmulPreferenceSetAttribute", t.pref_set, t.error);
    resolve(lib, "cublasLtMatmulAlgoGetHeuristic", t.heuristic, t.error);
    resolve(lib, "cublasLtMatmul", t.matmul, t.error);
  });
  return t;
}

const Table& loaded() {
  const Table& t = table();
  if (!t.error.empty()) throw RuntimeError(t.error);
  return t;
}

}  // namespace

const char* library_name() { return kSoname; }

bool available(std::string* why) {
  const Table& t = table();
  if (why != nullptr) *why = t.error;
  return t.error.empty();
}

cublasStatus_t Create(cublasLtHandle_t* handle) { return loaded().create(handle); }
cublasStatus_t MatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  return loaded().desc_create(desc, compute, scale);
}
cublasStatus_t MatmulDescDestroy(cublasLtMatmulDesc_t desc) { return loaded().desc_destroy(desc); }
cublasStatus_t MatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                                      size_t size) {
  return loaded().desc_set(desc, attr, buf, size);
}
cublasStatus_t MatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols,
                                  int64_t ld) {
  return loaded().layout_create(layout, type, rows, cols, ld);
}
cublasStatus_t MatrixLayoutDestroy(cublasLtMatrixLayout_t layout) { return loaded().layout_destroy(layout); }
cublasStatus_t MatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                        const void* buf, size_t size) {
  return loaded().layout_set(layout, attr, buf, size);
}
cublasStatus_t MatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) { return loaded().pref_create(pref); }
cublasStatus_t MatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) { return loaded().pref_destroy(pref); }
cublasStatus_t MatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                                            const void* buf, size_t size) {
  return loaded().pref_set(pref, attr, buf, size);
}
cublasStatus_t MatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                      cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                      cublasLtMatmulPreference_t pref, int requested,
                                      cublasLtMatmulHeuristicResult_t results[], int* returned) {
  return loaded().heuristic(handle, desc, a, b, c, d, pref, requested, results, returned);
}
cublasStatus_t Matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                      cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc, const void* beta,
                      const void* c, cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                      const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return loaded().matmul(handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo, workspace,
                         workspace_bytes, stream);
}

}  // namespace scalelab::kernels::cuda::lt
