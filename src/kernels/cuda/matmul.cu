// The matmul family on the GPU: row-major GEMMs through cuBLASLt with fp32 accumulation.
//
// Row-major C[m,n] = op(A)·op(B) is the column-major product Cᵀ[n,m] = op(B)ᵀ·op(A)ᵀ over the same
// memory, so every call hands cuBLASLt our B as its A and our A as its B, each described by a
// column-major layout of the stored matrix (rows = the row-major column count, ld unchanged).
//
// cuBLASLt multiplies A and B of one type (fp32, bf16 or fp16) into C of that type or fp32, with
// CUBLAS_COMPUTE_32F (true fp32: no TF32 unless set_allow_tf32) and fp32 alpha/beta. Other
// combinations are brought to one of those (the rule the plan replays: kernels/matmul.h
// cuda_gemm_ex_workspace_blocks), through device scratch from ctx.alloc ("matmul
// workspace", freed when the call returns, stream-ordered like every block of the allocator):
//   - A and B of different types: each low-precision operand is widened to fp32 (exact, so the
//     result is the CPU's, which widens too); scratch = the operand's rows x cols x 4 bytes.
//     The engine's own calls never mix them (activations and compute weights share a dtype).
//   - C of a type the product cannot write (fp32 operands into bf16/fp16, bf16 x bf16 into fp16,
//     ...): the product goes to an fp32 [m, n] scratch (loaded from C first when beta != 0), then
//     is rounded into C.
// Plans (descriptor, layouts, the heuristic's best algorithm) are cached per shape, leading
// dimensions, dtypes, transposes, TF32 switch, pointer alignments and bias use. A case for which
// cuBLASLt offers no algorithm (e.g. operands of odd alignment) runs a plain tiled kernel instead.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matmul_options.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels::cuda {

namespace {
std::atomic<bool> g_allow_tf32{false};
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

namespace {

constexpr const char* kWorkspaceLabel = "matmul workspace";

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: throw RuntimeError("[gemm_ex] unsupported dtype " + std::string(dtype_name(t)));
  }
}

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic must know it.
unsigned alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (unsigned al = 256; al > 1; al /= 2)
    if (a % al == 0) return al;
  return 1;
}

// ---------------------------------------------------------------------------------------------
// Small kernels: conversions, C scaling, bias add, bias gradient, the fallback GEMM
// ---------------------------------------------------------------------------------------------

// dst[r * cols + c] = src[r * ld + c] for a rows x cols row-major block (any float types).
template <class S, class D>
__global__ void copy_matrix_kernel(const S* __restrict__ src, std::int64_t ld_src, D* __restrict__ dst,
                                   std::int64_t ld_dst, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, c = i - r * cols;
    dst[r * ld_dst + c] = from_f32<D>(to_f32<S>(src[r * ld_src + c]));
  }
}

void copy_matrix(const void* src, DType st, std::int64_t ld_src, void* dst, DType dt, std::int64_t ld_dst,
                 std::int64_t rows, std::int64_t cols) {
  if (rows == 0 || cols == 0) return;
  dispatch_float(st, "gemm_ex", [&]<class S>() {
    dispatch_float(dt, "gemm_ex", [&]<class D>() {
      copy_matrix_kernel<S, D><<<grid_for(rows * cols), 256, 0, stream()>>>(
          static_cast<const S*>(src), ld_src, static_cast<D*>(dst), ld_dst, rows, cols);
    });
  });
  check_launch("gemm_ex (operand conversion)");
}

// C = beta · C (C = 0 when beta == 0, NaN included, as BLAS does for k == 0).
template <class T>
__global__ void scale_matrix_kernel(T* c, std::int64_t ldc, std::int64_t rows, std::int64_t cols, float beta) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, j = i - r * cols;
    T& v = c[r * ldc + j];
    v = from_f32<T>(beta == 0.0f ? 0.0f : beta * to_f32<T>(v));
  }
}

// y[t, j] += b[j] (fp32 add, one rounding into y's type).
template <class TY, class TB>
__global__ void bias_add_kernel(TY* __restrict__ y, const TB* __restrict__ b, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i % cols;
    y[i] = from_f32<TY>(to_f32<TY>(y[i]) + to_f32<TB>(b[j]));
  }
}

// db[j] += Σ_t dy[t, j]. Block (32, kRowLanes): 32 adjacent columns (coalesced rows), row lanes
// stride over the tokens; the lanes' partial sums are added in a fixed order (deterministic).
constexpr int kRowLanes = 16;
template <class TG, class TB>
__global__ void bias_grad_kernel(TB* __restrict__ db, const TG* __restrict__ dy, std::int64_t rows,
                                 std::int64_t cols) {
  __shared__ float part[kRowLanes][33];
  for (std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * 32; c0 < cols;
       c0 += static_cast<std::int64_t>(gridDim.x) * 32) {
    const std::int64_t j = c0 + threadIdx.x;
    float acc = 0.0f;
    if (j < cols)
      for (std::int64_t t = threadIdx.y; t < rows; t += kRowLanes) acc += to_f32<TG>(dy[t * cols + j]);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
      float s = 0.0f;
      for (int u = 0; u < kRowLanes; ++u) s += part[u][threadIdx.x];
      db[j] = from_f32<TB>(to_f32<TB>(db[j]) + s);
    }
    __syncthreads();
  }
}

// The fallback GEMM (no cuBLASLt algorithm for the case): row-major, 16 x 16 tiles in shared
// memory, fp32 accumulation. Slow but correct for any alignment and leading dimension.
constexpr int kTile = 16;
template <class TAB, class TC>
__global__ void fallback_gemm_kernel(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                                     const TAB* a, std::int64_t lda, const TAB* b, std::int64_t ldb, float beta,
                                     TC* c, std::int64_t ldc) {
  __shared__ float as[kTile][kTile + 1], bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (std::int64_t bm = blockIdx.y; bm * kTile < m; bm += gridDim.y) {
    for (std::int64_t bn = blockIdx.x; bn * kTile < n; bn += gridDim.x) {
      const std::int64_t i = bm * kTile + ty, j = bn * kTile + tx;
      float acc = 0.0f;
      for (std::int64_t k0 = 0; k0 < k; k0 += kTile) {
        // as[ty][tx] = op(A)[bm*16 + ty, k0 + tx]; bs[ty][tx] = op(B)[k0 + ty, bn*16 + tx]
        const std::int64_t ai = bm * kTile + ty, ak = k0 + tx;
        as[ty][tx] = (ai < m && ak < k) ? to_f32<TAB>(ta ? a[ak * lda + ai] : a[ai * lda + ak]) : 0.0f;
        const std::int64_t bk = k0 + ty, bj = bn * kTile + tx;
        bs[ty][tx] = (bk < k && bj < n) ? to_f32<TAB>(tb ? b[bj * ldb + bk] : b[bk * ldb + bj]) : 0.0f;
        __syncthreads();
        for (int u = 0; u < kTile; ++u) acc += as[ty][u] * bs[u][tx];
        __syncthreads();
      }
      if (i < m && j < n) {
        TC& out = c[i * ldc + j];
        const float prev = beta == 0.0f ? 0.0f : beta * to_f32<TC>(out);
        out = from_f32<TC>(alpha * acc + prev);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt plans
// ---------------------------------------------------------------------------------------------

struct PlanKey {
  bool ta, tb, tf32;
  std::int64_t m, n, k, lda, ldb, ldc;
  DType ab, c;
  unsigned align_a, align_b, align_c, align_bias;  // align_bias 0: no bias epilogue
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;  // strided batched (gemm_strided_batched)
  auto tie() const {
    return std::tie(ta, tb, tf32, m, n, k, lda, ldb, ldc, ab, c, align_a, align_b, align_c, align_bias, batch,
                    stride_a, stride_b, stride_c);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Host objects only; errors at teardown are not actionable.
    if (desc) lt::MatmulDescDestroy(desc);
    if (a) lt::MatrixLayoutDestroy(a);
    if (b) lt::MatrixLayoutDestroy(b);
    if (c) lt::MatrixLayoutDestroy(c);
  }
};

struct PlanCache {
  std::mutex mu;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

PlanCache& plan_cache() {
  // Never destroyed: the descriptors would outlive the CUDA context at exit.
  static auto* cache = new PlanCache;
  return *cache;
}

constexpr std::size_t kMaxPlans = 4096;

std::unique_ptr<Plan> make_plan(const PlanKey& key, const void* bias) {
  auto p = std::make_unique<Plan>();
  const char* op = "gemm_ex (cuBLASLt plan)";
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_cublas(lt::MatmulDescCreate(&p->desc, compute, CUDA_R_32F), op);
  const cublasOperation_t op_a = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t op_b = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our A
  check_cublas(lt::MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), op);
  check_cublas(lt::MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), op);
  if (key.align_bias != 0) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    check_cublas(lt::MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), op);
    // The heuristic reads the pointer's value for its alignment; each call sets the real one.
    check_cublas(lt::MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), op);
  }
  const cudaDataType_t tab = cuda_type(key.ab), tc = cuda_type(key.c);
  // Column-major views of the row-major operands: rows = the row-major column count.
  const std::uint64_t a_rows = static_cast<std::uint64_t>(key.tb ? key.k : key.n);
  const std::uint64_t a_cols = static_cast<std::uint64_t>(key.tb ? key.n : key.k);
  const std::uint64_t b_rows = static_cast<std::uint64_t>(key.ta ? key.m : key.k);
  const std::uint64_t b_cols = static_cast<std::uint64_t>(key.ta ? key.k : key.m);
  check_cublas(lt::MatrixLayoutCreate(&p->a, tab, a_rows, a_cols, key.ldb), op);
  check_cublas(lt::MatrixLayoutCreate(&p->b, tab, b_rows, b_cols, key.lda), op);
  check_cublas(lt::MatrixLayoutCreate(&p->c, tc, static_cast<std::uint64_t>(key.n),
                                          static_cast<std::uint64_t>(key.m), key.ldc),
               op);

  if (key.batch > 1) {
    const auto count = static_cast<std::int32_t>(key.batch);
    // cuBLASLt's A is our B, its B our A.
    const std::int64_t strides[3] = {key.stride_b, key.stride_a, key.stride_c};
    cublasLtMatrixLayout_t layouts[3] = {p->a, p->b, p->c};
    for (int i = 0; i < 3; ++i) {
      check_cublas(lt::MatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), op);
      check_cublas(lt::MatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                                sizeof strides[i]),
                   op);
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(lt::MatmulPreferenceCreate(&pref), op);
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { lt::MatmulPreferenceDestroy(p); }
  } guard{pref};
  std::size_t ws_bytes = 0;
  cublaslt_workspace(&ws_bytes);
  check_cublas(lt::MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof ws_bytes),
               op);
  const std::uint32_t al_a = key.align_b, al_b = key.align_a, al_c = key.align_c;
  check_cublas(lt::MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a), op);
  check_cublas(lt::MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b), op);
  check_cublas(lt::MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c), op);
  check_cublas(lt::MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c), op);

  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t s =
      lt::MatmulAlgoGetHeuristic(cublaslt(), p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &count);
  // NOT_SUPPORTED (or no result) means no algorithm for this case: the caller falls back.
  if (s == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    p->algo = result.algo;
    p->found = true;
  } else if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) {
    check_cublas(s, op);
  }
  return p;
}

// One cuBLASLt call when it has an algorithm for the case (returns false otherwise). A and B are
// of type ab, C of type c (fp32 or ab); bias (type c, length n) only with a 16-byte aligned pointer.
bool run_lt(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a, DType ab,
            std::int64_t lda, const void* b, std::int64_t ldb, float beta, void* c, DType ct, std::int64_t ldc,
            const void* bias, std::int64_t batch = 1, std::int64_t stride_a = 0, std::int64_t stride_b = 0,
            std::int64_t stride_c = 0) {
  PlanKey key{ta, tb, ab == DType::kF32 && ct == DType::kF32 && allow_tf32(), m, n, k, lda, ldb, ldc, ab, ct,
              alignment_of(a), alignment_of(b), alignment_of(c), bias ? alignment_of(bias) : 0u,
              batch, stride_a, stride_b, stride_c};
  if (batch > 1) {  // every item's pointer is aligned as well as the first only if the strides keep it
    const auto item_align = [](unsigned al, std::int64_t stride_bytes) {
      while (al > 1 && stride_bytes % al != 0) al /= 2;
      return al;
    };
    key.align_a = item_align(key.align_a, stride_a * static_cast<std::int64_t>(dtype_size(ab)));
    key.align_b = item_align(key.align_b, stride_b * static_cast<std::int64_t>(dtype_size(ab)));
    key.align_c = item_align(key.align_c, stride_c * static_cast<std::int64_t>(dtype_size(ct)));
  }
  PlanCache& pc = plan_cache();
  std::lock_guard<std::mutex> lock(pc.mu);
  auto it = pc.plans.find(key);
  if (it == pc.plans.end()) {
    if (pc.plans.size() >= kMaxPlans) pc.plans.clear();  // calls are enqueued: the descriptors are free to go
    it = pc.plans.emplace(key, make_plan(key, bias)).first;
  }
  Plan& p = *it->second;
  if (!p.found) return false;
  if (bias)
    check_cublas(lt::MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                 "gemm_ex (bias)");
  std::size_t ws_bytes = 0;
  void* ws = cublaslt_workspace(&ws_bytes);
  check_cublas(lt::Matmul(cublaslt(), p.desc, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c, &p.algo, ws, ws_bytes,
                              stream()),
               "gemm_ex (cublasLtMatmul)");
  return true;
}

// A product whose A and B share type ab and whose C type the product can write (fp32 or ab).
void gemm_same_type(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
                    DType ab, std::int64_t lda, const void* b, std::int64_t ldb, float beta, void* c, DType ct,
                    std::int64_t ldc) {
  if (run_lt(ta, tb, m, n, k, alpha, a, ab, lda, b, ldb, beta, c, ct, ldc, nullptr)) return;
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((n + kTile - 1) / kTile, 65535)),
                  static_cast<unsigned>(std::min<std::int64_t>((m + kTile - 1) / kTile, 65535)));
  dispatch_float(ab, "gemm_ex", [&]<class TAB>() {
    dispatch_float(ct, "gemm_ex", [&]<class TC>() {
      fallback_gemm_kernel<TAB, TC><<<grid, block, 0, stream()>>>(ta, tb, m, n, k, alpha, static_cast<const TAB*>(a),
                                                                  lda, static_cast<const TAB*>(b), ldb, beta,
                                                                  static_cast<TC*>(c), ldc);
    });
  });
  check_launch("gemm_ex (fallback kernel)");
}

bool product_can_write(DType ab, DType ct) { return ct == DType::kF32 || ct == ab; }

}  // namespace

void gemm_strided_batched(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
                          DType ab, std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb,
                          std::int64_t stride_b, float beta, void* c, DType ct, std::int64_t ldc, std::int64_t stride_c,
                          std::int64_t batch) {
  SCALELAB_CHECK(product_can_write(ab, ct), "[gemm_strided_batched] the product cannot write C's dtype");
  SCALELAB_CHECK(batch >= 0 && batch <= 0x7fffffffLL, "[gemm_strided_batched] batch out of range");
  if (m == 0 || n == 0 || batch == 0) return;
  SCALELAB_CHECK(k > 0, "[gemm_strided_batched] k must be positive");
  if (batch > 1 && run_lt(ta, tb, m, n, k, alpha, a, ab, lda, b, ldb, beta, c, ct, ldc, nullptr, batch, stride_a,
                          stride_b, stride_c))
    return;
  const std::size_t ea = dtype_size(ab), ec = dtype_size(ct);
  for (std::int64_t i = 0; i < batch; ++i) {
    gemm_same_type(ta, tb, m, n, k, alpha, static_cast<const char*>(a) + i * stride_a * static_cast<std::int64_t>(ea),
                   ab, lda, static_cast<const char*>(b) + i * stride_b * static_cast<std::int64_t>(ea), ldb, beta,
                   static_cast<char*>(c) + i * stride_c * static_cast<std::int64_t>(ec), ct, ldc);
  }
}

// ---------------------------------------------------------------------------------------------
// Backend methods
// ---------------------------------------------------------------------------------------------

void CudaBackend::gemm_ex(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                          const void* a, DType at, std::int64_t lda, const void* b, DType bt, std::int64_t ldb,
                          float beta, void* c, DType ct, std::int64_t ldc, ExecContext& ctx) {
  set_allow_tf32(ctx.options.allow_tf32);  // --allow-tf32, carried by the context
  SCALELAB_CHECK(is_float_type(at) && is_float_type(bt) && is_float_type(ct),
                 "[gemm_ex] operands must be fp32, bf16 or fp16");
  SCALELAB_CHECK(m >= 0 && n >= 0 && k >= 0, "[gemm_ex] negative size");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta·C, as the CPU defines it
    dispatch_float(ct, "gemm_ex", [&]<class TC>() {
      scale_matrix_kernel<TC><<<grid_for(m * n), 256, 0, stream()>>>(static_cast<TC*>(c), ldc, m, n, beta);
    });
    check_launch("gemm_ex (k = 0)");
    return;
  }
  // A and B of one type: widen the low-precision operand(s) to fp32 when they differ.
  Tensor wa, wb, wc;
  DType ab = at;
  if (at != bt) {
    ab = DType::kF32;
    if (at != DType::kF32) {
      const std::int64_t rows = ta ? k : m, cols = ta ? m : k;
      wa = Tensor::empty({rows * cols}, DType::kF32, *ctx.alloc, kWorkspaceLabel);
      copy_matrix(a, at, lda, wa.raw(), DType::kF32, cols, rows, cols);
      a = wa.raw();
      lda = cols;
    }
    if (bt != DType::kF32) {
      const std::int64_t rows = tb ? n : k, cols = tb ? k : n;
      wb = Tensor::empty({rows * cols}, DType::kF32, *ctx.alloc, kWorkspaceLabel);
      copy_matrix(b, bt, ldb, wb.raw(), DType::kF32, cols, rows, cols);
      b = wb.raw();
      ldb = cols;
    }
  }
  if (product_can_write(ab, ct)) {
    gemm_same_type(ta, tb, m, n, k, alpha, a, ab, lda, b, ldb, beta, c, ct, ldc);
    return;
  }
  // C through an fp32 [m, n] scratch.
  wc = Tensor::empty({m * n}, DType::kF32, *ctx.alloc, kWorkspaceLabel);
  if (beta != 0.0f) copy_matrix(c, ct, ldc, wc.raw(), DType::kF32, n, m, n);
  gemm_same_type(ta, tb, m, n, k, alpha, a, ab, lda, b, ldb, beta, wc.raw(), DType::kF32, n);
  copy_matrix(wc.raw(), DType::kF32, n, c, ct, ldc, m, n);
}

namespace {

struct LinearDims {
  std::int64_t tokens, in, out;
};

LinearDims linear_dims(const Tensor& y, const Tensor& x, const Tensor& w, const char* op) {
  SCALELAB_CHECK(w.rank() == 2, std::string("[") + op + "] weight must be 2-D, got " + w.shape().str());
  const std::int64_t out = w.dim(0), in = w.dim(1);
  SCALELAB_CHECK(x.rank() >= 1 && x.dim(-1) == in,
                 std::string("[") + op + "] input " + x.shape().str() + " does not end in " + std::to_string(in));
  const std::int64_t tokens = in > 0 ? x.numel() / in : 0;
  require_numel(y, tokens * out, op, "output");
  return {tokens, in, out};
}

}  // namespace

void CudaBackend::linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) {
  set_allow_tf32(ctx.options.allow_tf32);  // --allow-tf32, carried by the context
  const auto d = linear_dims(y, x, w, "linear_forward");
  const bool has_bias = bias != nullptr && bias->defined();
  if (has_bias) require_numel(*bias, d.out, "linear_forward", "bias");
  if (d.tokens == 0 || d.out == 0) return;
  // y = x·wᵀ + bias in one cuBLASLt call when the bias epilogue applies: operands of one type, y
  // writable by the product, the bias in y's type and 16-byte aligned (cuBLASLt's requirement).
  if (has_bias && d.in > 0 && x.dtype() == w.dtype() && product_can_write(x.dtype(), y.dtype()) &&
      bias->dtype() == y.dtype() && alignment_of(bias->raw()) >= 16) {
    if (run_lt(false, true, d.tokens, d.out, d.in, 1.0f, x.raw(), x.dtype(), d.in, w.raw(), d.in, 0.0f, y.raw(),
               y.dtype(), d.out, bias->raw()))
      return;
  }
  gemm_ex(false, true, d.tokens, d.out, d.in, 1.0f, x.raw(), x.dtype(), d.in, w.raw(), w.dtype(), d.in, 0.0f, y.raw(),
          y.dtype(), d.out, ctx);
  if (has_bias) {
    dispatch_float(y.dtype(), "linear_forward", [&]<class TY>() {
      dispatch_float(bias->dtype(), "linear_forward", [&]<class TB>() {
        bias_add_kernel<TY, TB><<<grid_for(d.tokens * d.out), 256, 0, stream()>>>(
            static_cast<TY*>(y.raw()), static_cast<const TB*>(bias->raw()), d.tokens, d.out);
      });
    });
    check_launch("linear_forward (bias)");
  }
}

void CudaBackend::linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x,
                                  const Tensor& w, ExecContext& ctx, bool accumulate_dx) {
  set_allow_tf32(ctx.options.allow_tf32);  // --allow-tf32, carried by the context
  const auto d = linear_dims(dy, x, w, "linear_backward");
  if (dw.defined()) require_numel(dw, d.out * d.in, "linear_backward", "weight gradient");
  if (dx != nullptr) {
    require_numel(*dx, d.tokens * d.in, "linear_backward", "input gradient");
    // dx[T, in] = dy[T, out] · w[out, in]
    gemm_ex(false, false, d.tokens, d.in, d.out, 1.0f, dy.raw(), dy.dtype(), d.out, w.raw(), w.dtype(), d.in,
            accumulate_dx ? 1.0f : 0.0f, dx->raw(), dx->dtype(), d.in, ctx);
  }
  // dw[out, in] += dyᵀ · x (undefined dw: a frozen weight, skipped)
  if (dw.defined()) {
    gemm_ex(true, false, d.out, d.in, d.tokens, 1.0f, dy.raw(), dy.dtype(), d.out, x.raw(), x.dtype(), d.in, 1.0f,
            dw.raw(), dw.dtype(), d.in, ctx);
  }
  if (dbias != nullptr && dbias->defined()) {
    require_numel(*dbias, d.out, "linear_backward", "bias gradient");
    if (d.out == 0) return;
    const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((d.out + 31) / 32, 65535));
    dispatch_float(dy.dtype(), "linear_backward", [&]<class TG>() {
      dispatch_float(dbias->dtype(), "linear_backward", [&]<class TB>() {
        bias_grad_kernel<TG, TB><<<blocks, dim3(32, kRowLanes), 0, stream()>>>(
            static_cast<TB*>(dbias->raw()), static_cast<const TG*>(dy.raw()), d.tokens, d.out);
      });
    });
    check_launch("linear_backward (bias gradient)");
  }
}

}  // namespace scalelab::kernels::cuda
