// The cost of an hf-trainer memory prediction: one prediction (schedule generation + replay
// through the allocator replica, 3 optimizer steps) and the largest-micro-batch search, for
// Llama-3.2-1B and Llama-3.1-8B at seq-len 1024 / 4096 on an 80 GiB GPU, fp32 eager and bf16
// sdpa. Beside it, the peer: one trial of the real job on the GPU (the wall time of
// bench/gpu/hf_memory.py's fresh-process trials on the H200, 25-73 s each, in
// bench/gpu/results/2026-11-26-h200-hf-memory/hf_memory.jsonl), which the trial-and-error OOM
// search repeats about log2(range) times per rung.
//
//   build/bench/bench_predict_cost [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/config.h"
#include "predict/hf_predict.h"

using namespace scalelab;
using namespace scalelab::predict;

namespace {

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  HfPredictOptions o;
  o.device_memory = std::size_t{80} << 30;
  struct Case {
    const char* model;
    std::int64_t seq, mb;
    const char* prec;
    const char* mixed;
    const char* attn;
  } cases[] = {
      {"llama-3.2-1b", 1024, 6, "fp32", "no", "eager"},
      {"llama-3.2-1b", 1024, 16, "bf16", "bf16", "sdpa"},
      {"llama-3.1-8b", 1024, 1, "fp32", "no", "eager"},
      {"llama-3.1-8b", 4096, 2, "bf16", "bf16", "sdpa"},
  };
  std::printf("| model | seq | precision | attn | events | one prediction (ms, median of %d) | largest mb | search (ms) | "
              "peer: one GPU trial (s) |\n|---|---:|---|---|---:|---:|---:|---:|---:|\n",
              reps);
  for (const Case& c : cases) {
    HfJob j;
    j.model = preset_config(c.model);
    j.seq_len = c.seq;
    j.micro_batch = c.mb;
    j.model_precision = c.prec;
    j.mixed_precision = c.mixed;
    j.attn = c.attn;
    std::vector<double> one, search;
    std::size_t events = 0;
    std::int64_t largest = 0;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      const HfPrediction p = predict_hf(j, o);
      auto t1 = std::chrono::steady_clock::now();
      largest = largest_micro_batch(j, o);
      auto t2 = std::chrono::steady_clock::now();
      events = p.events;
      one.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      search.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::printf("| %s | %lld | %s/%s | %s | %zu | %.1f | %lld | %.1f | 25-73 |\n", c.model, static_cast<long long>(c.seq),
                c.prec, c.mixed, c.attn, events, median_ms(one), static_cast<long long>(largest), median_ms(search));
  }
  return 0;
}
