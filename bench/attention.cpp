// Eager vs flash attention on the CPU: forward, backward and total time, and the device memory each
// needs beyond its inputs and outputs (peak from the allocator), for several sequence lengths.
//
//   build/bench/bench_attention [--batch 1 4] [--seq 256 512 1024 2048] [--heads 8] [--kv-heads 2]
//                               [--head-dim 64] [--threads 2] [--reps 5] [--clock wall|cpu]
//
// Defaults are llama-small's attention (8 query heads, 2 kv heads, head_dim 64). Eager and flash
// repetitions alternate so that a noisy neighbour on a shared machine hits both alike; the median
// of the repetitions is printed (and the best total, which is less sensitive to interference).
// --clock cpu measures the process's CPU time instead of wall time: on a machine shared with other
// jobs it is far steadier (with --threads 1; with more threads it also counts OpenMP's spin-waits).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/context.h"
#include "core/parallel.h"
#include "core/tensor.h"
#include "kernels/attention.h"

using namespace scalelab;
using kernels::AttentionShape;

namespace {

bool g_cpu_clock = false;

double now_s() {
  if (g_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void fill_randn(Tensor& t, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = d(rng);
}

// One implementation's buffers in its own allocator, so that its peak is its own.
struct Impl {
  bool flash;
  std::unique_ptr<DeviceAllocator> alloc = std::make_unique<DeviceAllocator>(make_host_backend(), std::size_t{1} << 40);
  ExecContext ctx{alloc.get(), nullptr};
  Tensor qkv, dout, out, dqkv, saved;  // saved: probs (eager) or lse (flash)
  std::size_t base = 0, peak_extra = 0;
  std::vector<double> fwd, bwd, total;

  Impl(bool is_flash, const AttentionShape& s) : flash(is_flash) {
    qkv = Tensor::empty({s.batch * s.seq, s.qkv_width()}, DType::kF32, *alloc);
    dout = Tensor::empty({s.batch * s.seq, s.out_width()}, DType::kF32, *alloc);
    out = Tensor::empty({s.batch * s.seq, s.out_width()}, DType::kF32, *alloc);
    dqkv = Tensor::empty({s.batch * s.seq, s.qkv_width()}, DType::kF32, *alloc);
    fill_randn(qkv, 1);
    fill_randn(dout, 2);
    base = alloc->stats().allocated;
  }

  void step(const AttentionShape& s, float scale, bool record) {
    alloc->reset_peaks();
    const double t0 = now_s();
    // The saved tensor is allocated per step, as the model does per layer.
    if (flash) {
      saved = Tensor::empty({s.batch, s.n_heads, s.seq}, DType::kF32, *alloc, "attention lse");
      kernels::attention_flash_forward(out, saved, qkv, s, scale, ctx);
    } else {
      saved = Tensor::empty({s.batch, s.n_heads, s.seq, s.seq}, DType::kF32, *alloc, "attention scores");
      kernels::attention_eager_forward(out, saved, qkv, s, scale, ctx);
    }
    const double t1 = now_s();
    if (flash) {
      kernels::attention_flash_backward(dqkv, dout, out, saved, qkv, s, scale, ctx);
    } else {
      kernels::attention_eager_backward(dqkv, dout, saved, qkv, s, scale, ctx);
    }
    const double t2 = now_s();
    saved = Tensor();
    peak_extra = alloc->stats().peak_allocated - base;
    if (record) {
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      total.push_back(t2 - t0);
    }
  }
};

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(a.f32()[i] - b.f32()[i])));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"eager vs flash attention (CPU)"};
  std::vector<std::int64_t> batches{1, 4}, seqs{256, 512, 1024, 2048};
  std::int64_t heads = 8, kv_heads = 2, head_dim = 64;
  int threads = 2, reps = 5;
  std::string clock = "wall";
  app.add_option("--batch", batches, "batch sizes");
  app.add_option("--seq", seqs, "sequence lengths");
  app.add_option("--heads", heads, "query heads");
  app.add_option("--kv-heads", kv_heads, "key/value heads");
  app.add_option("--head-dim", head_dim, "head dimension");
  app.add_option("--threads", threads, "threads (OpenMP and BLAS)");
  app.add_option("--reps", reps, "timed repetitions (after one warm-up)")->check(CLI::PositiveNumber);
  app.add_option("--clock", clock, "wall (elapsed) or cpu (process CPU time)")
      ->check(CLI::IsMember({"wall", "cpu"}));
  CLI11_PARSE(app, argc, argv);
  set_num_threads(threads);
  g_cpu_clock = clock == "cpu";

  std::printf("attention fwd+bwd, nh=%lld nkv=%lld hd=%lld, %d threads, median of %d reps (%s ms); "
              "MiB = allocator peak beyond inputs/outputs (saved probs or lse + workspace); dqkv diff = max abs eager-flash; flash tiles %lld stacked query rows x %lld keys\n",
              static_cast<long long>(heads), static_cast<long long>(kv_heads), static_cast<long long>(head_dim),
              num_threads(), reps, clock.c_str(), static_cast<long long>(kernels::kFlashRowTile),
              static_cast<long long>(kernels::kFlashColTile));
  std::printf("%3s %5s | %8s %8s %8s %8s %9s | %8s %8s %8s %8s %9s | %7s %7s %9s\n", "B", "S", "e.fwd", "e.bwd",
              "e.total", "e.best", "e.MiB", "f.fwd", "f.bwd", "f.total", "f.best", "f.MiB", "speedup", "best",
              "dqkv diff");
  for (std::int64_t B : batches) {
    for (std::int64_t S : seqs) {
      const AttentionShape s{B, S, heads, kv_heads, head_dim};
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      Impl eager(false, s), flash(true, s);
      eager.step(s, scale, false);
      flash.step(s, scale, false);
      for (int r = 0; r < reps; ++r) {
        eager.step(s, scale, true);
        flash.step(s, scale, true);
      }
      const double et = median(eager.total), ft = median(flash.total);
      const double eb = *std::min_element(eager.total.begin(), eager.total.end());
      const double fb = *std::min_element(flash.total.begin(), flash.total.end());
      std::printf("%3lld %5lld | %8.2f %8.2f %8.2f %8.2f %9.2f | %8.2f %8.2f %8.2f %8.2f %9.3f | %6.2fx %6.2fx %9.2e\n",
                  static_cast<long long>(B), static_cast<long long>(S), 1e3 * median(eager.fwd),
                  1e3 * median(eager.bwd), 1e3 * et, 1e3 * eb, eager.peak_extra / 1048576.0, 1e3 * median(flash.fwd),
                  1e3 * median(flash.bwd), 1e3 * ft, 1e3 * fb, flash.peak_extra / 1048576.0, et / ft, eb / fb,
                  max_abs_diff(eager.dqkv, flash.dqkv));
      std::fflush(stdout);
    }
  }
  return 0;
}
