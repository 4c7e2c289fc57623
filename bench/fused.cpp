// bench_fused: unfused vs fused kernels at llama-small / opt-small shapes (T = 4×1024 tokens,
// H 512, I (ffn) 2048, V 32768), fp32 on the CPU. For each pair it prints the median and best
// time over the repetitions, the speedup (unfused median / fused median), the peak bytes the pair
// allocates through the allocator while it runs (outputs and scratch made inside the call, as
// the model makes them), and what each keeps for backward per layer.
//
//   build/bench/bench_fused [--reps N] [--threads N] [--tokens T] [--hidden H] [--ffn I] [--vocab V]
//                           [--only norm|mlp|opt|loss]
//
// e.g. SmolLM2-135M's head: --only loss --tokens 512 --hidden 576 --vocab 49152.
//
// The pairs compose what the model runs: e.g. "mlp down backward" is the down projection's
// backward plus the SwiGLU backward, because the fused form's point is to rebuild the activation
// between the two GEMMs instead of keeping it from forward.
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
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/fused.h"
#include "kernels/layernorm.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"

using namespace scalelab;
using namespace scalelab::kernels;

namespace {

struct Bench {
  DeviceAllocator alloc{make_host_backend(), std::size_t{16} << 30};
  ExecContext ctx{&alloc, nullptr};
  int reps = 5;

  Tensor randn(const Shape& s, float stddev, std::uint32_t seed) {
    Tensor t = Tensor::empty(s, DType::kF32, alloc);
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, stddev);
    float* p = t.f32();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
    return t;
  }
  Tensor zeros(const Shape& s) { return Tensor::zeros(s, DType::kF32, alloc); }

  struct Timing {
    double median_ms = 0, best_ms = 0;
    std::size_t peak_bytes = 0;
  };
  // Peak bytes of one call (also the warm-up).
  std::size_t peak_of(const std::function<void()>& fn) {
    const std::size_t before = alloc.stats().allocated;
    alloc.reset_peaks();
    fn();
    return alloc.stats().peak_allocated - before;
  }
  // Setup inside a timed call (restoring an input that a call overwrites in place) runs through
  // untimed(), which takes its time out of the measurement.
  double untimed_ms = 0;
  void untimed(const std::function<void()>& fn) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    untimed_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
  }
  // The calls alternate (a b c a b c ...), so that all see the same background load on a shared
  // machine; each gets one warm-up call first, which also measures its peak.
  std::vector<Timing> interleave(const std::vector<std::function<void()>>& fns) {
    std::vector<Timing> t(fns.size());
    std::vector<std::vector<double>> ms(fns.size());
    for (std::size_t k = 0; k < fns.size(); ++k) t[k].peak_bytes = peak_of(fns[k]);
    for (int i = 0; i < reps; ++i) {
      for (std::size_t k = 0; k < fns.size(); ++k) {
        untimed_ms = 0;
        const auto a = std::chrono::steady_clock::now();
        fns[k]();
        ms[k].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count() -
                        untimed_ms);
      }
    }
    for (std::size_t k = 0; k < fns.size(); ++k) {
      std::sort(ms[k].begin(), ms[k].end());
      t[k].median_ms = ms[k][ms[k].size() / 2];
      t[k].best_ms = ms[k].front();
    }
    return t;
  }
};

double mib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

void row(const char* name, const Bench::Timing& u, const Bench::Timing& f, std::size_t kept_u, std::size_t kept_f) {
  std::printf("| %-30s | %8.2f (%8.2f) | %8.2f (%8.2f) | %5.2fx | %9.1f | %9.1f | %9.1f | %9.1f |\n", name, u.median_ms,
              u.best_ms, f.median_ms, f.best_ms, u.median_ms / f.median_ms, mib(u.peak_bytes), mib(f.peak_bytes),
              mib(kept_u), mib(kept_f));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  std::string only;  // norm | mlp | opt | loss: one section
  std::int64_t T = 4 * 1024, H = 512, I = 2048, V = 32768;
  Bench b;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--reps") b.reps = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--tokens") T = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--hidden") H = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--ffn") I = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--vocab") V = std::max(2, std::atoi(argv[i + 1]));
    else if (a == "--only") only = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: bench_fused [--reps N] [--threads N] [--tokens T] [--hidden H] [--ffn I] [--vocab V] "
                   "[--only norm|mlp|opt|loss]\n");
      return 2;
    }
  }
  set_num_threads(threads);
  const float eps = 1e-5f;
  const std::size_t f4 = sizeof(float);
  std::printf("bench_fused: T=%lld tokens, H=%lld, I=%lld, V=%lld, fp32, %d threads, %d reps (median (best) ms)\n\n",
              static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(I),
              static_cast<long long>(V), num_threads(), b.reps);
  std::printf("| %-30s | %-19s | %-19s | %-6s | %-9s | %-9s | %-9s | %-9s |\n", "kernel", "unfused ms", "fused ms",
              "speed", "peak MiB", "peak MiB", "kept MiB", "kept MiB");
  std::printf("| %-30s | %-19s | %-19s | %-6s | %-9s | %-9s | %-9s | %-9s |\n", "", "", "", "", "unfused", "fused",
              "unfused", "fused");
  std::printf("|--------------------------------|---------------------|---------------------|--------|-----------|"
              "-----------|-----------|-----------|\n");

  Bench::Timing recompute;
  const std::size_t TH = static_cast<std::size_t>(T * H) * f4, TI = static_cast<std::size_t>(T * I) * f4;
  auto want = [&](const char* s) { return only.empty() || only == s; };
  if (want("norm")) {  // RMSNorm + residual. Kept for backward per norm: h and rstd both ways (y too unless recomputed).
    Tensor x = b.randn({T, H}, 1, 1), delta = b.randn({T, H}, 1, 2), w = b.randn({H}, 1, 3);
    Tensor h = b.zeros({T, H}), y = b.zeros({T, H}), rstd = b.zeros({T});
    auto t = b.interleave({[&] {
                             add(h, x, delta, b.ctx);
                             rmsnorm_forward(y, rstd, h, w, eps, b.ctx);
                           },
                           [&] { rmsnorm_residual_forward(h, y, rstd, x, delta, w, eps, b.ctx); }});
    row("rmsnorm+residual forward", t[0], t[1], TH, TH);
    Tensor dy = b.randn({T, H}, 1, 4), dh = b.randn({T, H}, 1, 5), dw = b.zeros({H});
    t = b.interleave({[&] { rmsnorm_backward(dh, dw, dy, h, rstd, w, b.ctx, true); },
                      [&] { rmsnorm_residual_backward(dh, dw, dy, h, rstd, w, b.ctx); }});
    row("rmsnorm+residual backward", t[0], t[1], 0, 0);
    recompute = b.interleave({[&] { rmsnorm_recompute(y, h, rstd, w, b.ctx); }})[0];
  }
  if (want("norm")) {  // LayerNorm + residual (OPT). Backward is one implementation for both forms.
    Tensor x = b.randn({T, H}, 1, 1), delta = b.randn({T, H}, 1, 2), w = b.randn({H}, 1, 3), bb = b.randn({H}, 1, 4);
    Tensor h = b.zeros({T, H}), y = b.zeros({T, H}), mean = b.zeros({T}), rstd = b.zeros({T});
    const auto t = b.interleave({[&] {
                                   add(h, x, delta, b.ctx);
                                   layernorm_forward(y, mean, rstd, h, w, bb, eps, b.ctx);
                                 },
                                 [&] { layernorm_residual_forward(h, y, mean, rstd, x, delta, w, bb, eps, b.ctx); }});
    row("layernorm+residual forward", t[0], t[1], TH, TH);
  }
  if (want("mlp")) {  // SwiGLU: forward is swiglu_forward in both; the fused rung frees act after the down GEMM.
    Tensor gu = b.randn({T, 2 * I}, 1, 1), dh = b.randn({T, I}, 1, 2);
    Tensor act = b.zeros({T, I}), dgu = b.zeros({T, 2 * I});
    auto t = b.interleave({[&] { swiglu_backward(dgu, dh, gu, b.ctx); },
                           [&] { swiglu_backward_recompute(dgu, act, dh, gu, b.ctx); }});
    row("swiglu backward (+recompute)", t[0], t[1], TI, 0);
    Tensor wdown = b.randn({H, I}, 0.02f, 3), dout = b.randn({T, H}, 1, 4), dwd = b.zeros({H, I});
    swiglu_forward(act, gu, b.ctx);
    Tensor gu2 = b.zeros({T, 2 * I});
    t = b.interleave({[&] {
                        Tensor dact = Tensor::empty({T, I}, DType::kF32, b.alloc, "mlp activation gradient");
                        linear_backward(&dact, dwd, nullptr, dout, act, wdown, b.ctx);
                        Tensor g = Tensor::empty({T, 2 * I}, DType::kF32, b.alloc, "mlp gate/up gradient");
                        swiglu_backward(g, dact, gu, b.ctx);
                      },
                      [&] {
                        // The fused form writes dgu over gu (dead after in the model); restore it.
                        b.untimed([&] { gu2.copy_from(gu); });
                        swiglu_down_backward_recompute(gu2, dwd, dout, gu2, wdown, b.ctx);
                      }});
    row("mlp down backward (llama)", t[0], t[1], TI, 0);
  }
  if (want("opt")) {  // OPT fc1: GEMM + bias + ReLU. Unfused: linear_forward adds the bias, ReLU into a new buffer.
    Tensor x = b.randn({T, H}, 1, 1), w1 = b.randn({I, H}, 0.05f, 2), b1 = b.randn({I}, 0.1f, 3);
    Tensor keep_u, keep_f;
    auto t = b.interleave({[&] {
                             keep_u = Tensor();
                             Tensor pre = Tensor::empty({T, I}, DType::kF32, b.alloc, "fc1 output");
                             linear_forward(pre, x, w1, &b1, b.ctx);
                             keep_u = Tensor::empty({T, I}, DType::kF32, b.alloc, "relu output");
                             bias_relu_forward(keep_u, pre, Tensor(), b.ctx);
                           },
                           [&] {
                             keep_f = Tensor();
                             keep_f = Tensor::empty({T, I}, DType::kF32, b.alloc, "fc1 output");
                             linear_forward(keep_f, x, w1, nullptr, b.ctx);
                             bias_relu_forward(keep_f, keep_f, b1, b.ctx);
                           }});
    row("fc1+bias+relu forward (opt)", t[0], t[1], TI, TI);
    Tensor dy = b.randn({T, I}, 1, 4), dx = b.zeros({T, H}), dw1 = b.zeros({I, H}), db1 = b.zeros({I});
    Tensor dy2 = b.zeros({T, I});
    t = b.interleave({[&] {
                        Tensor du = Tensor::empty({T, I}, DType::kF32, b.alloc, "fc1 output gradient");
                        bias_relu_backward(du, nullptr, dy, keep_u, b.ctx);
                        linear_backward(&dx, dw1, &db1, du, x, w1, b.ctx);
                      },
                      [&] {
                        // In place over the incoming gradient (dead after in the model); restore it.
                        b.untimed([&] { dy2.copy_from(dy); });
                        bias_relu_backward(dy2, &db1, dy2, keep_f, b.ctx);
                        linear_backward(&dx, dw1, nullptr, dy2, x, w1, b.ctx);
                      }});
    row("fc1+bias+relu backward (opt)", t[0], t[1], 0, 0);
  }
  if (want("loss")) {  // LM head + cross-entropy. Unfused holds [T, V] logits (their gradient in place).
    Tensor x = b.randn({T, H}, 1, 1), w = b.randn({V, H}, 0.02f, 2), dx = b.zeros({T, H}), dw = b.zeros({V, H});
    Tensor targets = Tensor::empty({T}, DType::kI32, b.alloc);
    std::mt19937 rng(3);
    for (std::int64_t i = 0; i < T; ++i) targets.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng() % V);
    const float scale = 1.0f / static_cast<float>(count_target_tokens(targets));
    const std::size_t logits = static_cast<std::size_t>(T * V) * f4;
    const std::int64_t def = fused_linear_cross_entropy_default_chunk(V);
    std::vector<std::int64_t> chunks = {def};
    for (std::int64_t c : {64, 128, 256, 512, 1024})
      if (c != def) chunks.push_back(c);
    std::vector<std::function<void()>> fns = {[&] {
      Tensor lg = Tensor::empty({T, V}, DType::kF32, b.alloc, "logits");
      Tensor lse = Tensor::empty({T}, DType::kF32, b.alloc, "loss lse");
      linear_forward(lg, x, w, nullptr, b.ctx);
      cross_entropy_forward(lse, lg, targets, b.ctx);
      cross_entropy_backward(lg, lg, lse, targets, scale, b.ctx);
      linear_backward(&dx, dw, nullptr, lg, x, w, b.ctx);
    }};
    for (std::int64_t c : chunks)
      fns.push_back([&, c] { fused_linear_cross_entropy(dx, dw, x, w, targets, scale, c, b.ctx); });
    const auto t = b.interleave(fns);
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      const std::string n =
          "linear+CE chunk " + std::to_string(chunks[k]) + (chunks[k] == def ? " (default)" : "");
      row(n.c_str(), t[0], t[k + 1], logits, 0);
    }
    const auto te = b.interleave({[&] {
                                    Tensor lg = Tensor::empty({T, V}, DType::kF32, b.alloc, "logits");
                                    Tensor lse = Tensor::empty({T}, DType::kF32, b.alloc, "loss lse");
                                    linear_forward(lg, x, w, nullptr, b.ctx);
                                    cross_entropy_forward(lse, lg, targets, b.ctx);
                                  },
                                  [&] { fused_linear_cross_entropy_forward(x, w, targets, 0, b.ctx); }});
    row("linear+CE forward (eval)", te[0], te[1], 0, 0);
  }
  if (want("norm"))
    std::printf("\nrmsnorm_recompute (rebuild a dropped norm output, %.1f MiB): %.2f (%.2f) ms\n", mib(TH),
              recompute.median_ms, recompute.best_ms);
  std::printf("kept: bytes the pair keeps from forward for backward, per layer (per model for the head);\n"
              "peak: allocator peak during the pair minus what was allocated before it.\n");
  return 0;
}
