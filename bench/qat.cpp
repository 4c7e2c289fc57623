// bench_qat: the qat family's CPU kernels (kernels/qat.h) side by side with the scalar loop they
// replaced (qat_math.h's steps one element at a time, min/max by a sequential scan: the kernel up
// to 2026-11-26), at llama-small's shapes (H 512, I 2048, 2 KV heads of 64, group 32, T = 256
// tokens = seq 128 × micro-batch 2), with the GEMM of the same linear for scale. Both compute the
// same bits (checked here on every run).
//
//   build/bench/bench_qat [--reps N] [--threads N] [--tokens T] [--group G] [--dtype fp32|bf16|fp16]
//
// Per module and op: median ms of the scalar loop (one thread, as it ran per row chunk), of the
// kernel, the speedup, and the kernel's time as a share of the linear's forward GEMM.
// --dtype bf16 / fp16: the tensors in that dtype, so the kernel computes torchao's arithmetic in it
// (kernels/qat.h: the scales in the dtype, the STE's two products rounded to it) and converts each
// row in and out; the scalar loop runs qat_math.h's steps in that dtype on the widened values
// (rounding each stored element, as the kernel's store does), and one more column gives the fp32
// kernel on the same values in the same run: what the dtype costs.
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
#include "kernels/qat.h"
#include "kernels/qat_math.h"

using namespace scalelab;
using namespace scalelab::kernels;

namespace {

// The previous CPU kernel's inner loops (one run = a row or a group), in the arithmetic of dtype t
// (fp32: the loops as they were).
qat::Affine scalar_params(const float* x, std::int64_t n, bool per_token, DType t) {
  float lo = x[0], hi = x[0];
  for (std::int64_t i = 1; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  return per_token ? qat::per_token_params(lo, hi, t) : qat::group_params(lo, hi, t);
}
void scalar_forward(float* y, const float* x, std::int64_t runs, std::int64_t n, bool per_token, DType t) {
  for (std::int64_t r = 0; r < runs; ++r) {
    const qat::Affine a = scalar_params(x + r * n, n, per_token, t);
    for (std::int64_t i = 0; i < n; ++i) y[r * n + i] = qat::stored(qat::fake_quant(x[r * n + i], a), t);
  }
}
void scalar_ste(float* d, const float* g, const float* x, std::int64_t runs, std::int64_t n, bool per_token, DType t) {
  for (std::int64_t r = 0; r < runs; ++r) {
    const qat::Affine a = scalar_params(x + r * n, n, per_token, t);
    for (std::int64_t i = 0; i < n; ++i) {
      d[r * n + i] = qat::stored(d[r * n + i] + qat::ste(g[r * n + i], x[r * n + i], a), t);
    }
  }
}

double median_ms(int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 11, threads = 1;
  std::int64_t tokens = 256, group = 32;
  std::string dtype_flag = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--reps") reps = std::atoi(argv[i + 1]);
    else if (k == "--threads") threads = std::atoi(argv[i + 1]);
    else if (k == "--tokens") tokens = std::atoll(argv[i + 1]);
    else if (k == "--group") group = std::atoll(argv[i + 1]);
    else if (k == "--dtype") dtype_flag = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_qat: unknown flag %s (--reps N --threads N --tokens T --group G --dtype D)\n",
                   k.c_str());
      return 2;
    }
  }
  if (dtype_flag != "fp32" && dtype_flag != "bf16" && dtype_flag != "fp16") {
    std::fprintf(stderr, "bench_qat: --dtype must be fp32, bf16 or fp16, got %s\n", dtype_flag.c_str());
    return 2;
  }
  const DType dt = parse_dtype(dtype_flag, "--dtype");
  const bool lowp = dt != DType::kF32;
  set_num_threads(threads);
  DeviceAllocator alloc(make_host_backend(), std::size_t{8} << 30);
  ExecContext ctx{&alloc, nullptr};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // fp32 tensors holding values exact in dt (so the fp32 kernel and the scalar loop see the
  // values of the dt tensors), and their dt copies.
  auto randn = [&](const Shape& s, float sd) {
    Tensor t = Tensor::empty(s, DType::kF32, alloc);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = qat::stored(nd(rng) * sd, dt);
    return t;
  };
  auto as_dt = [&](const Tensor& t) {
    Tensor o = Tensor::empty(t.shape(), dt, alloc);
    convert(t.raw(), DType::kF32, o.raw(), dt, static_cast<std::size_t>(t.numel()));
    return o;
  };
  auto zeros_dt = [&](const Shape& s) { return Tensor::zeros(s, dt, alloc); };
  struct Module {
    const char* name;
    std::int64_t out, in;
  } modules[] = {{"q/k/v (fused)", 768, 512}, {"o_proj", 512, 512}, {"gate/up (fused)", 4096, 512},
                 {"down_proj", 512, 2048}};
  std::printf("bench_qat: llama-small shapes, T = %lld tokens, group %lld, %s, %d thread(s), median of %d\n\n",
              static_cast<long long>(tokens), static_cast<long long>(group), dtype_flag.c_str(), threads, reps);
  std::printf("%-16s %-22s %11s %11s %9s %14s%s\n", "module", "op", "scalar ms", "kernel ms", "speedup", "kernel/GEMM",
              lowp ? "  fp32 kernel ms  kernel/fp32" : "");
  double total_scalar = 0, total_kernel = 0, total_gemm = 0, total_f32 = 0;
  for (const Module& m : modules) {
    Tensor x = randn({tokens, m.in}, 1.0f), w = randn({m.out, m.in}, 0.05f);
    Tensor gx = randn({tokens, m.in}, 1.0f), gw = randn({m.out, m.in}, 1.0f);
    Tensor xl = as_dt(x), wl = as_dt(w), gxl = as_dt(gx), gwl = as_dt(gw);  // what the kernel reads
    Tensor y = Tensor::zeros({tokens, m.out}, DType::kF32, alloc);
    Tensor a = Tensor::zeros(x.shape(), DType::kF32, alloc), b = zeros_dt(x.shape());
    Tensor c = Tensor::zeros(w.shape(), DType::kF32, alloc), d = zeros_dt(w.shape());
    Tensor e = Tensor::zeros(x.shape(), DType::kF32, alloc), f = Tensor::zeros(w.shape(), DType::kF32, alloc);
    const double gemm = median_ms(reps, [&] { linear_forward(y, x, w, nullptr, ctx); });
    total_gemm += 3 * gemm;  // forward, dx and dW GEMMs of a step
    struct Op {
      const char* name;
      std::function<void()> scalar, kernel, kernel_f32;
      Tensor *s, *k;
    } ops[] = {
        {"fq(x) per token", [&] { scalar_forward(a.f32(), x.f32(), tokens, m.in, true, dt); },
         [&] { fake_quant_per_token_forward(b, xl, ctx); }, [&] { fake_quant_per_token_forward(e, x, ctx); }, &a, &b},
        {"fq(W) per group", [&] { scalar_forward(c.f32(), w.f32(), m.out * m.in / group, group, false, dt); },
         [&] { fake_quant_group_forward(d, wl, group, ctx); }, [&] { fake_quant_group_forward(f, w, group, ctx); },
         &c, &d},
        {"ste(x) backward", [&] { scalar_ste(a.f32(), gx.f32(), x.f32(), tokens, m.in, true, dt); },
         [&] { fake_quant_per_token_backward(b, gxl, xl, true, ctx); },
         [&] { fake_quant_per_token_backward(e, gx, x, true, ctx); }, &a, &b},
        {"ste(W) backward", [&] { scalar_ste(c.f32(), gw.f32(), w.f32(), m.out * m.in / group, group, false, dt); },
         [&] { fake_quant_group_backward(d, gwl, wl, group, ctx); },
         [&] { fake_quant_group_backward(f, gw, w, group, ctx); }, &c, &d},
    };
    for (Op& op : ops) {
      std::memset(op.s->raw(), 0, static_cast<std::size_t>(op.s->numel()) * 4);
      std::memset(op.k->raw(), 0, static_cast<std::size_t>(op.k->numel()) * dtype_size(dt));
      const double ts = median_ms(reps, op.scalar), tk = median_ms(reps, op.kernel);
      const double tf = lowp ? median_ms(reps, op.kernel_f32) : tk;
      // The kernel's output widened, against the scalar loop's (whose every store was rounded to dt).
      Tensor got = Tensor::empty(op.k->shape(), DType::kF32, alloc);
      convert(op.k->raw(), dt, got.raw(), DType::kF32, static_cast<std::size_t>(got.numel()));
      const bool same = std::memcmp(op.s->raw(), got.raw(), static_cast<std::size_t>(op.s->numel()) * 4) == 0;
      std::printf("%-16s %-22s %11.3f %11.3f %8.2fx %13.1f%%", m.name, op.name, ts, tk, ts / tk, 100 * tk / gemm);
      if (lowp) std::printf(" %15.3f %11.2fx", tf, tk / tf);
      std::printf("%s\n", same ? "" : "  RESULTS DIFFER");
      // A step runs fq(x) and fq(W) twice (forward, and recomputed in backward) and each STE once.
      const int per_step = (op.name[1] == 'q') ? 2 : 1;
      total_scalar += per_step * ts;
      total_kernel += per_step * tk;
      total_f32 += per_step * tf;
      if (!same) return 1;
    }
  }
  std::printf("\nper layer and micro-step (fq twice, each STE once): scalar %.2f ms, kernel %.2f ms (%.2fx); "
              "the layer's 3 GEMMs per linear %.2f ms: fake quantization = %.1f%% (kernel) vs %.1f%% (scalar) of them\n",
              total_scalar, total_kernel, total_scalar / total_kernel, total_gemm, 100 * total_kernel / total_gemm,
              100 * total_scalar / total_gemm);
  if (lowp) {
    std::printf("%s kernel vs the fp32 kernel on the same values: %.2f vs %.2f ms per layer and micro-step (%.2fx)\n",
                dtype_flag.c_str(), total_kernel, total_f32, total_kernel / total_f32);
  }
  return 0;
}
