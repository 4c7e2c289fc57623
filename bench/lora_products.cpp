// bench_lora_products: LoRA's rank-r products at one decoder layer's shapes, the project's CPU
// kernels (kernels::gemm: cpu/skinny_gemm.h, cpu/small_k_gemm.h) side by side with OpenBLAS's
// cblas_sgemm on the same operands, then one layer's adapters (LoraAdapter forward and backward,
// all seven projections) beside the base GEMMs they ride on. fp32, T tokens, rank r; defaults are
// SmolLM2-135M at micro-batch 4 × seq 256.
//
//   build/bench/bench_lora_products [--threads N] [--reps N] [--tokens T] [--hidden H] [--kv KV]
//                                   [--ffn I] [--rank r]
//
// Per product: the median time over the repetitions and GFLOP/s (2·m·n·k / time). The operands
// are hot in cache (each product repeated back to back); in a training step they come from the
// op before, so the step's "lora" family (scalelab train --profile) is the figure that counts.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/context.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "kernels/matmul.h"
#include "model/decoder/lora.h"

using namespace scalelab;

namespace {

DeviceAllocator& alloc() {
  static DeviceAllocator a{make_host_backend(), std::size_t{16} << 30};
  return a;
}

Tensor randn(const Shape& s, std::uint32_t seed) {
  Tensor t = Tensor::empty(s, DType::kF32, alloc());
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = d(g);
  return t;
}

double median_ms(int reps, const std::function<void()>& f) {
  f();  // warm
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Product {
  std::string name;
  bool ta, tb;
  std::int64_t m, n, k, lda, ldb, ldc;
  float beta;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 30;
  std::int64_t T = 1024, H = 576, KV = 192, I = 1536, r = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (a == "--threads") threads = static_cast<int>(v);
    else if (a == "--reps") reps = static_cast<int>(v);
    else if (a == "--tokens") T = v;
    else if (a == "--hidden") H = v;
    else if (a == "--kv") KV = v;
    else if (a == "--ffn") I = v;
    else if (a == "--rank") r = v;
    else {
      std::fprintf(stderr, "bench_lora_products: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (threads < 1 || reps < 1 || T < 16 || H < 16 || KV < 1 || I < 16 || r < 1 || r > 32) {
    std::fprintf(stderr, "bench_lora_products: bad sizes (rank 1..32, the rest positive)\n");
    return 2;
  }
  set_num_threads(threads);
  std::printf("LoRA products, fp32, T %ld, hidden %ld, kv %ld, ffn %ld, rank %ld, %d threads, median of %d\n\n",
              static_cast<long>(T), static_cast<long>(H), static_cast<long>(KV), static_cast<long>(I),
              static_cast<long>(r), threads, reps);

  // The products of the two widest projections' adapters (gate/up stacked: P = 2; down: P = 1),
  // as LoraAdapter issues them (model/decoder/lora.cpp): leading dimensions of the fused output.
  const std::int64_t gu = 2 * I, R2 = 2 * r;
  const std::vector<Product> products = {
      {"gate/up z = x·Aᵀ", false, true, T, R2, H, H, H, R2, 0.0f},
      {"gate y = s·z·Bᵀ", false, true, T, I, r, R2, r, gu, 0.0f},
      {"gate dB += s·dyᵀ·z", true, false, I, r, T, gu, R2, r, 1.0f},
      {"gate dz = s·dy·B", false, false, T, r, I, gu, r, R2, 0.0f},
      {"gate/up dA += dzᵀ·x", true, false, R2, H, T, R2, H, H, 1.0f},
      {"gate/up dx = dz·A", false, false, T, H, R2, R2, H, H, 0.0f},
      {"down z = x·Aᵀ", false, true, T, r, I, I, I, r, 0.0f},
      {"down dB += s·dyᵀ·z", true, false, H, r, T, H, r, r, 1.0f},
      {"down dz = s·dy·B", false, false, T, r, H, H, r, r, 0.0f},
      {"down dA += dzᵀ·x", true, false, r, I, T, r, I, I, 1.0f},
      {"down dx = dz·A", false, false, T, I, r, r, I, I, 0.0f},
  };
  std::printf("%-22s %18s %18s %9s\n", "product", "scalelab ms GF/s", "OpenBLAS ms GF/s", "speedup");
  for (const Product& p : products) {
    const std::int64_t arows = p.ta ? p.k : p.m, brows = p.tb ? p.n : p.k;
    Tensor a = randn({arows * p.lda}, 1), b = randn({brows * p.ldb}, 2), c = randn({p.m * p.ldc}, 3);
    const double ours = median_ms(reps, [&] {
      kernels::gemm(p.ta, p.tb, p.m, p.n, p.k, 0.5f, a.f32(), p.lda, b.f32(), p.ldb, p.beta, c.f32(), p.ldc);
    });
    const double blas = median_ms(reps, [&] {
      cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans,
                  static_cast<blasint>(p.m), static_cast<blasint>(p.n), static_cast<blasint>(p.k), 0.5f, a.f32(),
                  static_cast<blasint>(p.lda), b.f32(), static_cast<blasint>(p.ldb), p.beta, c.f32(),
                  static_cast<blasint>(p.ldc));
    });
    const double gf = 2.0 * static_cast<double>(p.m * p.n * p.k) / 1e6;
    std::printf("%-22s %8.3f %9.1f %8.3f %9.1f %8.2fx\n", p.name.c_str(), ours, gf / ours, blas, gf / blas, blas / ours);
  }

  // One layer: each projection's adapter (forward assigning y, backward assigning dx, as the Linear
  // runs it) beside its base products.
  std::printf("\n%-8s %12s %12s %12s %14s %14s\n", "layer", "base fwd ms", "base dx ms", "base dW ms", "adapter fwd ms",
              "adapter bwd ms");
  ExecContext ctx{&alloc(), nullptr};
  ctx.train_step = 0;
  struct Proj {
    const char* name;
    std::vector<std::int64_t> outs;
    std::int64_t in;
  };
  const std::vector<Proj> projs = {{"qkv", {H, KV, KV}, H}, {"o", {H}, H}, {"gate/up", {I, I}, H}, {"down", {H}, I}};
  double sum[5] = {0, 0, 0, 0, 0};
  for (const Proj& pr : projs) {
    std::int64_t out = 0;
    for (std::int64_t o : pr.outs) out += o;
    const std::int64_t P = static_cast<std::int64_t>(pr.outs.size()), in = pr.in;
    Tensor w = randn({out, in}, 4), x = randn({T, in}, 5), dy = randn({T, out}, 6), y = randn({T, out}, 7),
           dx = randn({T, in}, 8), dw = randn({out, in}, 9);
    Tensor A = randn({P * r * in}, 10), dA = randn({P * r * in}, 11), B = randn({out * r}, 12),
           dB = randn({out * r}, 13);
    std::vector<LoraAdapter::Part> parts;
    std::int64_t col = 0;
    for (std::int64_t i = 0; i < P; ++i) {
      LoraAdapter::Part q;
      q.a = A.slice(i * r * in, (i + 1) * r * in).view({r, in});
      q.da = dA.slice(i * r * in, (i + 1) * r * in).view({r, in});
      q.b = B.slice(col * r, (col + pr.outs[static_cast<std::size_t>(i)]) * r).view({pr.outs[static_cast<std::size_t>(i)], r});
      q.db = dB.slice(col * r, (col + pr.outs[static_cast<std::size_t>(i)]) * r).view({pr.outs[static_cast<std::size_t>(i)], r});
      q.col = col;
      col += pr.outs[static_cast<std::size_t>(i)];
      parts.push_back(q);
    }
    LoraAdapter adapter(parts, out, 2.0f);
    const double fwd = median_ms(reps, [&] {
      kernels::gemm(false, true, T, out, in, 1.0f, x.f32(), in, w.f32(), in, 1.0f, y.f32(), out);
    });
    const double bdx = median_ms(reps, [&] {
      kernels::gemm(false, false, T, in, out, 1.0f, dy.f32(), out, w.f32(), in, 1.0f, dx.f32(), in);
    });
    const double bdw = median_ms(reps, [&] {
      kernels::gemm(true, false, out, in, T, 1.0f, dy.f32(), out, x.f32(), in, 1.0f, dw.f32(), in);
    });
    const double afw = median_ms(reps, [&] { adapter.forward(y, x, ctx, /*assign=*/true); });
    // Backward after a forward (which keeps z), timing the backward alone.
    std::vector<double> v;
    for (int i = 0; i < reps; ++i) {
      adapter.forward(y, x, ctx, true);
      const auto t0 = std::chrono::steady_clock::now();
      adapter.backward(&dx, dy, x, ctx, /*assign_dx=*/true);
      v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(v.begin(), v.end());
    const double abw = v[v.size() / 2];
    std::printf("%-8s %12.3f %12.3f %12.3f %14.3f %14.3f\n", pr.name, fwd, bdx, bdw, afw, abw);
    const double row[5] = {fwd, bdx, bdw, afw, abw};
    for (int i = 0; i < 5; ++i) sum[i] += row[i];
  }
  std::printf("%-8s %12.3f %12.3f %12.3f %14.3f %14.3f\n", "total", sum[0], sum[1], sum[2], sum[3], sum[4]);
  std::printf("\nadapters / the weight gradients they spare: %.3f (LoRA skips dW, adds the adapters)\n",
              (sum[3] + sum[4]) / sum[2]);
  return 0;
}
