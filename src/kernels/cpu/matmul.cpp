// The matmul family on the CPU: OpenBLAS sgemm, low-precision operands widened panel by panel.
#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/skinny_gemm.h"
#include "kernels/cpu/small_k_gemm.h"
#include "kernels/cpu/stage.h"

namespace scalelab::kernels {

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS leaves C untouched when k == 0 only if beta == 1; make the definition explicit.
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (m == 1 && !trans_a) {
    // One row (a decoding step: one token through a projection): a matrix-vector product. This
    // OpenBLAS (0.3.21, Debian 12) runs sgemm with m = 1 as a full GEMM that packs all of B, the
    // weights, for every call — about twice the memory traffic of sgemv, which it does not
    // forward to before 0.3.27. c[1, n] = alpha · a[1, k] · op(B) + beta · c.
    cblas_sgemv(CblasRowMajor, trans_b ? CblasNoTrans : CblasTrans, static_cast<blasint>(trans_b ? n : k),
                static_cast<blasint>(trans_b ? k : n), alpha, b, static_cast<blasint>(ldb), a, 1, beta, c, 1);
    return;
  }
  if (cpu::small_k_gemm_applies(trans_a, m, n, k)) {  // rank-r products that stream C (LoRA): see there
    cpu::small_k_gemm(trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (cpu::skinny_gemm_applies(trans_a, trans_b, m, n, k)) {  // rank-r products that reduce (LoRA): see there
    cpu::skinny_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

namespace {

// Tiles for low-precision operands, which are widened to fp32 one tile at a time: k is cut into
// blocks of kKBlock, and an operand dimension is cut only where it has to be converted (an fp32
// operand is read in place), so each sgemm stays large (at least 64 x 64 x kKBlock) while the
// workspace stays bounded: A tile mb·kb, B tile kb·nb, C tile mb·nb floats (at most 16 MiB each).
constexpr std::int64_t kKBlock = 2048;
constexpr std::int64_t kTileFloatsA = std::int64_t{1} << 22;  // 16 MiB
constexpr std::int64_t kTileFloatsB = std::int64_t{1} << 22;  // 16 MiB
constexpr std::int64_t kTileFloatsC = std::int64_t{1} << 22;  // 16 MiB

struct Panels {
  std::int64_t mb, nb, kb;
};

Panels panel_sizes(std::int64_t m, std::int64_t n, std::int64_t k, DType at, DType bt, DType ct) {
  Panels p;
  p.kb = std::max<std::int64_t>(1, std::min(k, kKBlock));
  p.mb = m;
  p.nb = n;
  if (at != DType::kF32) p.mb = std::min(p.mb, std::max<std::int64_t>(64, kTileFloatsA / p.kb));
  if (bt != DType::kF32) p.nb = std::min(p.nb, std::max<std::int64_t>(64, kTileFloatsB / p.kb));
  if (ct != DType::kF32 && p.mb * p.nb > kTileFloatsC) {
    // Shrink the larger side first, keeping both at least 64.
    if (p.nb >= p.mb) {
      p.nb = std::max<std::int64_t>(64, kTileFloatsC / std::max<std::int64_t>(p.mb, 1));
    } else {
      p.mb = std::max<std::int64_t>(64, kTileFloatsC / std::max<std::int64_t>(p.nb, 1));
    }
  }
  p.mb = std::max<std::int64_t>(1, std::min(p.mb, m));
  p.nb = std::max<std::int64_t>(1, std::min(p.nb, n));
  return p;
}

// Copies rows [r0, r1) x columns [c0, c1) of a row-major matrix (leading dimension ld, dtype dt)
// into dst (fp32, leading dimension c1 - c0).
void convert_block(const void* src, DType dt, std::int64_t ld, std::int64_t r0, std::int64_t r1, std::int64_t c0,
                   std::int64_t c1, float* dst) {
  const std::int64_t w = c1 - c0;
  parallel_for(r1 - r0, row_grain(w), [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      convert(elem(src, dt, (r0 + i) * ld + c0), dt, dst + i * w, DType::kF32, static_cast<std::size_t>(w));
    }
  });
}

void store_block(const float* src, void* dst, DType dt, std::int64_t ld, std::int64_t r0, std::int64_t r1,
                 std::int64_t c0, std::int64_t c1) {
  const std::int64_t w = c1 - c0;
  parallel_for(r1 - r0, row_grain(w), [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      convert(src + i * w, DType::kF32, elem(dst, dt, (r0 + i) * ld + c0), dt, static_cast<std::size_t>(w));
    }
  });
}

}  // namespace

std::vector<std::size_t> gemm_ex_workspace_blocks(std::int64_t m, std::int64_t n, std::int64_t k, DType at, DType bt,
                                                  DType ct) {
  std::vector<std::size_t> blocks;
  if ((at == DType::kF32 && bt == DType::kF32 && ct == DType::kF32) || m == 0 || n == 0) return blocks;
  const Panels p = panel_sizes(m, n, k, at, bt, ct);
  if (at != DType::kF32) blocks.push_back(static_cast<std::size_t>(p.mb * p.kb) * sizeof(float));
  if (bt != DType::kF32) blocks.push_back(static_cast<std::size_t>(p.kb * p.nb) * sizeof(float));
  if (ct != DType::kF32) blocks.push_back(static_cast<std::size_t>(p.mb * p.nb) * sizeof(float));
  return blocks;
}

std::size_t gemm_ex_workspace_bytes(std::int64_t m, std::int64_t n, std::int64_t k, DType at, DType bt, DType ct) {
  std::size_t total = 0;
  for (std::size_t b : gemm_ex_workspace_blocks(m, n, k, at, bt, ct)) total += b;
  return total;
}

namespace cpu {

void CpuBackend::gemm_ex_group(const std::vector<GemmExArgs>& products, ExecContext& ctx) {
  bool fp32 = true;
  for (const GemmExArgs& g : products)
    fp32 = fp32 && g.a_type == DType::kF32 && g.b_type == DType::kF32 && g.c_type == DType::kF32;
  const int nt = omp_get_max_threads();
  if (!fp32 || nt <= 1 || products.size() < 2 || omp_in_parallel()) {
    Backend::gemm_ex_group(products, ctx);
    return;
  }
  // Each product on one thread: OpenBLAS (its OpenMP build) runs single-threaded inside a parallel
  // region. Which thread takes which product does not change any result (a product is computed
  // by one thread in its own order), so the results are those of the products one by one on one
  // thread, at every thread count. Dynamic: the products differ in size.
  const int n = static_cast<int>(products.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::min(nt, n))
  for (int i = 0; i < n; ++i) {
    const GemmExArgs& g = products[static_cast<std::size_t>(i)];
    gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, static_cast<const float*>(g.a), g.lda,
         static_cast<const float*>(g.b), g.ldb, g.beta, static_cast<float*>(g.c), g.ldc);
  }
}

void CpuBackend::gemm_ex(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
                         DType at, std::int64_t lda, const void* b, DType bt, std::int64_t ldb, float beta, void* c,
                         DType ct, std::int64_t ldc, ExecContext& ctx) {
  if (at == DType::kF32 && bt == DType::kF32 && ct == DType::kF32) {
    gemm(ta, tb, m, n, k, alpha, static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb, beta,
         static_cast<float*>(c), ldc);
    return;
  }
  if (m == 0 || n == 0) return;
  const Panels p = panel_sizes(m, n, k, at, bt, ct);
  Tensor ws_a, ws_b, ws_c;
  if (at != DType::kF32) ws_a = Tensor::empty({p.mb * p.kb}, DType::kF32, *ctx.alloc, "matmul workspace");
  if (bt != DType::kF32) ws_b = Tensor::empty({p.kb * p.nb}, DType::kF32, *ctx.alloc, "matmul workspace");
  if (ct != DType::kF32) ws_c = Tensor::empty({p.mb * p.nb}, DType::kF32, *ctx.alloc, "matmul workspace");
  for (std::int64_t n0 = 0; n0 < n; n0 += p.nb) {
    const std::int64_t n1 = std::min(n, n0 + p.nb), nw = n1 - n0;
    for (std::int64_t m0 = 0; m0 < m; m0 += p.mb) {
      const std::int64_t m1 = std::min(m, m0 + p.mb), mw = m1 - m0;
      // The C tile: in place when fp32, else staged (loaded first when beta needs it).
      float* cp;
      std::int64_t ldc_f;
      if (ct == DType::kF32) {
        cp = static_cast<float*>(c) + m0 * ldc + n0;
        ldc_f = ldc;
      } else {
        cp = ws_c.f32();
        ldc_f = nw;
        if (beta != 0.0f) convert_block(c, ct, ldc, m0, m1, n0, n1, cp);
      }
      if (k == 0) {
        for (std::int64_t i = 0; i < mw; ++i)
          for (std::int64_t j = 0; j < nw; ++j) cp[i * ldc_f + j] = beta == 0.0f ? 0.0f : beta * cp[i * ldc_f + j];
      }
      for (std::int64_t k0 = 0; k0 < k; k0 += p.kb) {
        const std::int64_t k1 = std::min(k, k0 + p.kb), kw = k1 - k0;
        // op(A) rows [m0, m1) x columns [k0, k1): A is [k, m] when transposed.
        const float* ap;
        std::int64_t lda_f;
        if (at == DType::kF32) {
          ap = static_cast<const float*>(a) + (ta ? k0 * lda + m0 : m0 * lda + k0);
          lda_f = lda;
        } else if (ta) {
          convert_block(a, at, lda, k0, k1, m0, m1, ws_a.f32());
          ap = ws_a.f32();
          lda_f = mw;
        } else {
          convert_block(a, at, lda, m0, m1, k0, k1, ws_a.f32());
          ap = ws_a.f32();
          lda_f = kw;
        }
        // op(B) rows [k0, k1) x columns [n0, n1): B is [n, k] when transposed.
        const float* bp;
        std::int64_t ldb_f;
        if (bt == DType::kF32) {
          bp = static_cast<const float*>(b) + (tb ? n0 * ldb + k0 : k0 * ldb + n0);
          ldb_f = ldb;
        } else if (tb) {
          convert_block(b, bt, ldb, n0, n1, k0, k1, ws_b.f32());
          bp = ws_b.f32();
          ldb_f = kw;
        } else {
          convert_block(b, bt, ldb, k0, k1, n0, n1, ws_b.f32());
          bp = ws_b.f32();
          ldb_f = nw;
        }
        gemm(ta, tb, mw, nw, kw, alpha, ap, lda_f, bp, ldb_f, k0 == 0 ? beta : 1.0f, cp, ldc_f);
      }
      if (ct != DType::kF32) store_block(cp, c, ct, ldc, m0, m1, n0, n1);
    }
  }
}

namespace {

struct LinearDims {
  std::int64_t tokens, in, out;
};

// Sizes of a linear layer the front has validated: x[tokens, in], w[out, in].
LinearDims linear_dims(const Tensor& x, const Tensor& w) { return {x.numel() / w.dim(1), w.dim(1), w.dim(0)}; }

}  // namespace

void CpuBackend::linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) {
  const auto d = linear_dims(x, w);
  const bool has_bias = bias != nullptr && bias->defined();
  if (has_bias && y.dtype() == DType::kF32) {
    // Seed the output with the bias and accumulate the product into it (beta = 1).
    float* yp = y.f32();
    parallel_for(d.tokens, row_grain(d.out), [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t t = t0; t < t1; ++t) convert(bias->raw(), bias->dtype(), yp + t * d.out, DType::kF32,
                                                     static_cast<std::size_t>(d.out));
    });
    gemm_ex(false, true, d.tokens, d.out, d.in, 1.0f, x.raw(), x.dtype(), d.in, w.raw(), w.dtype(), d.in, 1.0f,
            y.raw(), y.dtype(), d.out, ctx);
    return;
  }
  gemm_ex(false, true, d.tokens, d.out, d.in, 1.0f, x.raw(), x.dtype(), d.in, w.raw(), w.dtype(), d.in, 0.0f, y.raw(),
          y.dtype(), d.out, ctx);
  if (has_bias) bias_add_(y, *bias, ctx);
}

void CpuBackend::linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x,
                                 const Tensor& w, ExecContext& ctx, bool accumulate_dx) {
  const auto d = linear_dims(x, w);
  if (dx != nullptr) {
    gemm_ex(false, false, d.tokens, d.in, d.out, 1.0f, dy.raw(), dy.dtype(), d.out, w.raw(), w.dtype(), d.in,
            accumulate_dx ? 1.0f : 0.0f, dx->raw(), dx->dtype(), d.in, ctx);
  }
  if (dw.defined()) {  // undefined: a frozen weight
    gemm_ex(true, false, d.out, d.in, d.tokens, 1.0f, dy.raw(), dy.dtype(), d.out, x.raw(), x.dtype(), d.in, 1.0f,
            dw.raw(), dw.dtype(), d.in, ctx);
  }
  if (dbias != nullptr && dbias->defined()) {
    // Column sums in fp32, split over columns so threads never share an output.
    float* acc = row_buffer(d.out, 2);
    std::fill(acc, acc + d.out, 0.0f);
    const DType gt = dy.dtype();
    parallel_for(d.out, row_grain(d.tokens), [&](std::int64_t j0, std::int64_t j1) {
      for (std::int64_t t = 0; t < d.tokens; ++t) {
        if (gt == DType::kF32) {
          const float* row = dy.f32() + t * d.out;
          for (std::int64_t j = j0; j < j1; ++j) acc[j] += row[j];
        } else {
          // One conversion per row segment (not per element): biases make this hot for OPT.
          const float* row = load_row(elem(dy.raw(), gt, t * d.out + j0), gt, j1 - j0, 0);
          for (std::int64_t j = j0; j < j1; ++j) acc[j] += row[j - j0];
        }
      }
    });
    float* db = inout_row(dbias->raw(), dbias->dtype(), d.out, 3);
    for (std::int64_t j = 0; j < d.out; ++j) db[j] += acc[j];
    store_row(db, dbias->raw(), dbias->dtype(), d.out);
  }
}

}  // namespace cpu
}  // namespace scalelab::kernels
