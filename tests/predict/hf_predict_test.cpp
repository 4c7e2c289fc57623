// The hf-trainer prediction against what the real job measured on an NVIDIA H200 (torch
// 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0; bench/gpu/hf_memory.py, records in
// bench/gpu/results/2026-11-26-h200-hf-memory/hf_memory.jsonl), and its invariants.
//
// Tolerances: max_memory_allocated is a sum of tensor sizes that the schedule reproduces; the
// few bytes it misses are the Trainer's scalar tensors (a handful of 512-byte blocks), so 1e-4
// relative is already three orders above the observed error (at most 4e-5). It also counts the
// remainders under 1 MiB that the allocator does not split off a large block, which depend on
// where the replay placed each request: for the small Liger runs (5 and 12 GB) these move it by up
// to a few MiB (4.7e-4 at 5 GB), hence 2e-4 and 1e-3 there. max_memory_reserved
// also depends on how the allocator's segments fragment, which the schedule follows op by op but
// not every backward temporary: the bound is 1 % (the worst of these rows: 0.86 %), and each
// configuration's own error is printed by bench/predict_vs_measured.py.
#include "predict/hf_predict.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/config.h"

namespace scalelab::predict {
namespace {

constexpr std::size_t GiB = std::size_t{1} << 30;

HfJob job(std::int64_t mb, const char* prec = "fp32", const char* mixed = "no", const char* attn = "eager") {
  HfJob j;
  j.model = preset_config("llama-3.2-1b");
  j.seq_len = 1024;
  j.micro_batch = mb;
  j.model_precision = prec;
  j.mixed_precision = mixed;
  j.attn = attn;
  return j;
}

// validate_job refuses `j` with a message that contains `why`.
void expect_refused(const HfJob& j, const char* why) {
  try {
    validate_job(j);
    ADD_FAILURE() << "not refused: " << why;
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

HfPredictOptions h200() {
  HfPredictOptions o;
  o.device_memory = 150109880320;  // torch.cuda.mem_get_info()[1] on the H200
  return o;
}

struct Measured {
  const char* name;
  std::int64_t mb;
  const char* prec;
  const char* mixed;
  const char* attn;
  std::size_t reserved, allocated;
};

const Measured kH200[] = {
    {"fp32_eager_mb1", 1, "fp32", "no", "eager", 26006781952, 24783145984},
    {"fp32_eager_mb2", 2, "fp32", "no", "eager", 30580670464, 29374353920},
    {"fp32_eager_mb4", 4, "fp32", "no", "eager", 44029706240, 43851297280},
    {"fp32_eager_mb6", 6, "fp32", "no", "eager", 58747518976, 58328240640},
    {"fp32_eager_mb7", 7, "fp32", "no", "eager", 66787999744, 65569858048},
    {"bf16mixed_eager_mb6", 6, "fp32", "bf16", "eager", 62602084352, 59566608896},
    {"bf16_eager_mb6", 6, "bf16", "bf16", "eager", 51541704704, 47644680704},
    {"fp32_sdpa_mb6", 6, "fp32", "no", "sdpa", 58774781952, 58328240640},
    {"bf16_sdpa_mb6", 6, "bf16", "bf16", "sdpa", 30784094208, 27724898816},
    // the earlier scalelab-vs-HF runs (bench/gpu/results/2026-11-26-h200-{1,2}: hf_benchmark.py,
    // 5-6 steps, full bf16 without autocast)
    {"bf16_noautocast_eager_mb8", 8, "bf16", "no", "eager", 63797460992, 61031105024},
    {"fp32_eager_mb16", 16, "fp32", "no", "eager", 137820635136, 130712957440},
    {"bf16mixed_eager_mb16", 16, "fp32", "bf16", "eager", 134356140032, 129896116736},
    {"bf16_noautocast_eager_mb16", 16, "bf16", "no", "eager", 124820389888, 114576802304},
    {"bf16_noautocast_sdpa_mb16", 16, "bf16", "no", "sdpa", 69522685952, 61458055680},
};

class H200Measured : public ::testing::TestWithParam<Measured> {};

TEST_P(H200Measured, PredictsThePeaks) {
  const Measured& m = GetParam();
  HfJob j = job(m.mb, m.prec, m.mixed, m.attn);
  j.steps = 6;  // the earlier runs went 5-6 steps; the peak is reached by step 3 in every one
  const HfPrediction p = predict_hf(j, h200());
  ASSERT_FALSE(p.oom);
  const double ea = (static_cast<double>(p.max_allocated) - static_cast<double>(m.allocated)) / m.allocated;
  const double er = (static_cast<double>(p.max_reserved) - static_cast<double>(m.reserved)) / m.reserved;
  EXPECT_LT(std::fabs(ea), 1e-4) << "allocated " << p.max_allocated << " vs measured " << m.allocated;
  EXPECT_LT(std::fabs(er), 0.01) << "reserved " << p.max_reserved << " vs measured " << m.reserved;
  EXPECT_GE(p.max_reserved, p.max_allocated);
}

INSTANTIATE_TEST_SUITE_P(Llama32_1B, H200Measured, ::testing::ValuesIn(kH200),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(HfPredict, Opt13bMatchesTheH200) {
  // opt-1.3b, seq 1024, micro-batch 4, fp32, eager, dropout 0 (as hf_memory.py runs it):
  // measured 42255515648 reserved, 40947191296 allocated.
  HfJob j = job(4);
  j.model = preset_config("opt-1.3b");
  j.model.dropout = 0;
  const HfPrediction p = predict_hf(j, h200());
  EXPECT_LT(std::fabs(static_cast<double>(p.max_allocated) - 40947191296.0) / 40947191296.0, 1e-4);
  EXPECT_LT(std::fabs(static_cast<double>(p.max_reserved) - 42255515648.0) / 42255515648.0, 0.01);
  // OPT's residual dropout (0.1 in the published config) saves a bool mask per dropout: the
  // earlier run with it (bf16 weights, no autocast, eager, micro-batch 16, 5 steps) measured
  // 117490843648 reserved, 116234997248 allocated.
  j.model.dropout = 0.1;
  EXPECT_GT(predict_hf(j, h200()).max_allocated, p.max_allocated);
  j.micro_batch = 16;
  j.model_precision = "bf16";
  j.steps = 5;
  const HfPrediction q = predict_hf(j, h200());
  EXPECT_LT(std::fabs(static_cast<double>(q.max_allocated) - 116234997248.0) / 116234997248.0, 1e-4);
  EXPECT_LT(std::fabs(static_cast<double>(q.max_reserved) - 117490843648.0) / 117490843648.0, 0.01);
}

TEST(HfPredict, LigerMatchesTheH200) {
  // Liger (apply_liger_kernel_to_llama: RMSNorm, RoPE, SwiGLU, fused linear cross-entropy), bf16
  // weights without autocast, sdpa; the earlier runs (hf_benchmark.py --liger, 5-6 steps).
  struct Point {
    std::int64_t mb, steps;
    std::size_t reserved, allocated;
  } points[] = {{8, 5, 19086180352, 18162160128}, {16, 6, 29137829888, 28280001024}, {95, 5, 130008743936, 128209539584}};
  for (const Point& pt : points) {
    HfJob j = job(pt.mb, "bf16", "no", "sdpa");
    j.fused_kernels = true;
    j.steps = pt.steps;
    const HfPrediction p = predict_hf(j, h200());
    ASSERT_FALSE(p.oom) << pt.mb;
    EXPECT_LT(std::fabs(static_cast<double>(p.max_allocated) - pt.allocated) / pt.allocated, 1e-4) << pt.mb;
    EXPECT_LT(std::fabs(static_cast<double>(p.max_reserved) - pt.reserved) / pt.reserved, 0.01) << pt.mb;
  }
}

// The configurations that were modelled from the sources before any GPU run, measured on an H200
// on 2026-11-27 (bench/gpu/results/2026-11-27-h200-1/hf_memory.jsonl, 3 steps each): Qwen2 with and
// without Liger, Liger under gradient checkpointing (Llama, Qwen2), Liger under autocast over fp32
// weights, fp32 checkpointing, OPT under autocast over fp32 weights, and OPT with bf16 weights
// under autocast (its layer norms run in fp32 there: hf_schedule_opt.cpp's ln_upcast; before it was
// modelled this row was 12.6 % below the measured allocated peak). Allocated within 1e-4 as above,
// except Qwen2 with Liger: 1.1e-4 and 7.8e-4 above (the fused loss's tied-embedding gradient at
// the optimizer step, modelled from Liger's source and not traced); reserved within 1 %. The
// cache's layout is checked too: the large segments the allocator holds after step 3 within 3 of
// the GPU's (most rows now equal). Before the checkpointed first forward freed each tensor when
// the Trainer does, Qwen2 + Liger + checkpointing had 26 segments more than the GPU (+1.74 %
// reserved); before sdpa's backward workspace was one request, the Liger rows had 3-8 more.
TEST(HfPredict, SourceModelledConfigurationsMatchTheH200) {
  struct Row {
    const char* name;
    const char* model;
    std::int64_t mb;
    const char *prec, *mixed, *attn;
    bool ckpt, liger;
    std::size_t reserved, allocated;
    double allocated_tol, reserved_tol = 0.01;
    std::size_t large_segments = 0;  // after step 3 (hf_memory.jsonl); 0: not checked
  } rows[] = {
      {"qwen2-bf16-sdpa-mb8", "qwen2.5-0.5b", 8, "bf16", "no", "sdpa", false, false, 34915483648, 29324929536, 1e-4,
       0.01, 295},
      {"qwen2-bf16-sdpa-mb8-liger", "qwen2.5-0.5b", 8, "bf16", "no", "sdpa", false, true, 12222201856, 11385303552,
       2e-4, 0.01, 305},
      {"qwen2-bf16-sdpa-mb8-liger-ckpt", "qwen2.5-0.5b", 8, "bf16", "no", "sdpa", true, true, 5299503104, 5049441280,
       1e-3, 0.01, 146},
      {"llama-bf16-sdpa-mb16-liger-ckpt", "llama-3.2-1b", 16, "bf16", "no", "sdpa", true, true, 13239320576,
       12430625792, 1e-4, 0.01, 231},
      {"llama-bf16mixed-sdpa-mb4-liger", "llama-3.2-1b", 4, "fp32", "bf16", "sdpa", false, true, 27856470016,
       25396264448, 1e-4, 0.01, 492},
      {"llama-fp32-eager-mb6-ckpt", "llama-3.2-1b", 6, "fp32", "no", "eager", true, false, 34259075072, 25335067136,
       1e-4, 0.01, 247},
      {"opt-bf16mixed-eager-mb4", "opt-1.3b", 4, "fp32", "bf16", "eager", false, false, 47508881408, 46773472768, 1e-4,
       0.01, 255},
      {"opt-bf16-sdpa-mb8", "opt-1.3b", 8, "bf16", "bf16", "sdpa", false, false, 27707572224, 25922760192, 1e-4, 0.01,
       308},
  };
  for (const Row& r : rows) {
    HfJob j = job(r.mb, r.prec, r.mixed, r.attn);
    j.model = preset_config(r.model);
    if (j.model.family == ModelFamily::kOPT) j.model.dropout = 0;  // hf_memory.py runs OPT without dropout
    j.activation_checkpointing = r.ckpt;
    j.fused_kernels = r.liger;
    j.steps = 3;
    const HfPrediction p = predict_hf(j, h200());
    ASSERT_FALSE(p.oom) << r.name;
    const double ea = (static_cast<double>(p.max_allocated) - static_cast<double>(r.allocated)) / r.allocated;
    const double er = (static_cast<double>(p.max_reserved) - static_cast<double>(r.reserved)) / r.reserved;
    EXPECT_LT(std::fabs(ea), r.allocated_tol) << r.name << ": allocated " << p.max_allocated << " vs " << r.allocated;
    EXPECT_LT(std::fabs(er), r.reserved_tol) << r.name << ": reserved " << p.max_reserved << " vs " << r.reserved;
    if (r.large_segments != 0) {
      ASSERT_EQ(p.steps.size(), 3u);
      const std::size_t large = p.steps[2].segments - p.steps[2].small_segments;
      EXPECT_LE(large, r.large_segments + 3) << r.name;
      EXPECT_GE(large + 3, r.large_segments) << r.name;
    }
  }
}

// A Linear with a bias (OPT's all, Qwen2's q/k/v) runs as addmm with the bias in cuBLASLt's
// epilogue, whose 1 MiB workspace the caching allocator hands out at the first such call and keeps.
// Without it every OPT and Qwen2 row missed 1 MiB of allocated (and Qwen2 one small segment);
// with it their allocated peaks are off only by the Trainer's scalar tensors, as Llama's are.
TEST(HfPredict, BiasedLinearsKeepCublasLtsWorkspace) {
  auto lt = [](const HfJob& j) {
    std::size_t made = 0, freed = 0;
    std::uint32_t id = 0;
    for (const ScheduleEvent& e : hf_trainer_schedule(j)) {
      if (e.kind == ScheduleEvent::kAlloc && std::string(e.label).find("cuBLASLt workspace") != std::string::npos) {
        ++made;
        id = e.tensor;
        EXPECT_EQ(e.bytes, std::size_t{1} << 20);
      }
      if (e.kind == ScheduleEvent::kFree && id != 0 && e.tensor == id) ++freed;
    }
    return std::make_pair(made, freed);
  };
  HfJob llama = job(1);
  llama.seq_len = 128;
  EXPECT_EQ(lt(llama).first, 0u);  // no biases: plain mm
  HfJob opt = llama;
  opt.model = preset_config("opt-1.3b");
  opt.model.dropout = 0;
  EXPECT_EQ(lt(opt), std::make_pair(std::size_t{1}, std::size_t{0}));  // once, kept
  HfJob qwen = llama;
  qwen.model = preset_config("qwen2.5-0.5b");
  EXPECT_EQ(lt(qwen), std::make_pair(std::size_t{1}, std::size_t{0}));
  // the H200 rows (hf_memory.jsonl): allocated within the Trainer's scalars (32 KiB)
  struct Row {
    const char* model;
    std::int64_t mb;
    const char *prec, *mixed, *attn;
    std::size_t allocated;
  } rows[] = {{"opt-1.3b", 4, "fp32", "bf16", "eager", 46773472768},
              {"opt-1.3b", 8, "bf16", "bf16", "sdpa", 25922760192},
              {"qwen2.5-0.5b", 8, "bf16", "no", "sdpa", 29324929536}};
  for (const Row& r : rows) {
    HfJob j = job(r.mb, r.prec, r.mixed, r.attn);
    j.model = preset_config(r.model);
    if (j.model.family == ModelFamily::kOPT) j.model.dropout = 0;
    j.steps = 3;
    const HfPrediction p = predict_hf(j, h200());
    const double diff = static_cast<double>(p.max_allocated) - static_cast<double>(r.allocated);
    EXPECT_LT(std::fabs(diff), 32768.0) << r.model << " mb " << r.mb << ": " << p.max_allocated;
  }
}

TEST(HfPredict, OptWithBf16WeightsUnderAutocastAndCheckpointingIsRefused) {
  HfJob j = job(8, "bf16", "bf16", "sdpa");
  j.model = preset_config("opt-1.3b");
  j.activation_checkpointing = true;
  try {
    (void)predict_hf(j, h200());
    FAIL() << "expected InvalidInput";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("OPT with bf16 weights under autocast"), std::string::npos) << e.what();
  }
}

TEST(HfPredict, ReproducesTheMeasuredSixtyFourGiBLimit) {
  // The same job with the allocator capped at 64 GiB less the context (set_per_process_memory_
  // fraction on the H200): micro-batch 7 ran (62.20 GiB reserved). With these versions the
  // published "6 fits, 7 does not" moves up by one; 8 needs more than 64 GiB.
  HfPredictOptions o;
  o.device_memory = 64 * GiB;
  EXPECT_FALSE(predict_hf(job(7), o).oom);
  EXPECT_TRUE(predict_hf(job(8), o).oom);
  EXPECT_EQ(largest_micro_batch(job(1), o), 7);
}

TEST(HfPredict, BreakdownAddsUpToTheAllocatedPeak) {
  const HfPrediction p = predict_hf(job(6), h200());
  std::size_t sum = 0;
  for (std::size_t b : p.breakdown) sum += b;
  EXPECT_EQ(sum, p.max_allocated);
  // fp32 weights of 1.236 B parameters, and Adam's two states, exactly (plus the rotary buffers).
  EXPECT_EQ(p.breakdown[static_cast<int>(Category::kWeights)], 4943257600u);
  EXPECT_EQ(p.breakdown[static_cast<int>(Category::kOptimizerStates)], 2 * 4943257600u);
  EXPECT_EQ(p.peak_step, 2);  // the states appear in step 1's optimizer step, the peak after
}

TEST(HfPredict, PeakGrowsWithTheMicroBatch) {
  std::size_t prev = 0;
  for (std::int64_t b = 1; b <= 5; ++b) {
    const HfPrediction p = predict_hf(job(b, "bf16", "bf16", "sdpa"), h200());
    EXPECT_GT(p.max_allocated, prev);
    prev = p.max_allocated;
  }
}

TEST(HfPredict, FusedAdamWHasNoSqrtTemporaries) {
  HfJob a = job(1), b = job(1);
  b.optimizer = "adamw_torch_fused";
  // batch 1: the foreach sqrt buffers (one parameter set, 4.9 GB) are the step-1 peak.
  EXPECT_LT(predict_hf(b, h200()).max_allocated, predict_hf(a, h200()).max_allocated);
}

// fp16 autocast's GradScaler (torch/amp/grad_scaler.py, as accelerate drives it): the fp16 schedule
// is the bf16 one plus the scaler's 0-d tensors. Its scale and growth tracker are made once and
// kept; per step the scaled loss lives through backward, found_inf from unscale_ (inside
// clip_grad_norm_, or scaler.step without clipping) to update(); the fused AdamW adds
// sum([found_inf]) and, when nothing unscaled first, _check_inf_per_device's tensors and grad_scale.
struct ScalerTensors {
  std::size_t made = 0, kept = 0, extra_events = 0;
  std::size_t scale = 0, scaled_loss = 0, found_inf = 0, grad_scale = 0, sums = 0;
  std::size_t found_inf_in_clip = 0;  // found_inf made inside the clip_grad_norm phase
};

ScalerTensors scaler_tensors(const HfJob& j) {
  const std::vector<ScheduleEvent> ev = hf_trainer_schedule(j);
  HfJob b = j;
  b.mixed_precision = "bf16";
  ScalerTensors r;
  r.extra_events = ev.size() - hf_trainer_schedule(b).size();
  std::vector<bool> live(ev.size() + 1, false);
  std::vector<std::string> label(ev.size() + 1);
  std::string phase;
  for (const ScheduleEvent& e : ev) {
    if (e.kind == ScheduleEvent::kPhase) phase = e.label;
    if (e.kind == ScheduleEvent::kFree) live[e.tensor] = false;
    if (e.kind != ScheduleEvent::kAlloc) continue;
    const std::string l = e.label;
    if (l.rfind("GradScaler", 0) != 0) continue;
    EXPECT_LE(e.bytes, 8u) << l;  // 0-d tensors
    ++r.made;
    live[e.tensor] = true;
    label[e.tensor] = l;
    if (l == "GradScaler _scale") ++r.scale;
    if (l == "GradScaler loss * scale") ++r.scaled_loss;
    if (l == "GradScaler found_inf") {
      ++r.found_inf;
      if (phase == "clip_grad_norm") ++r.found_inf_in_clip;
    }
    if (l == "GradScaler grad_scale") ++r.grad_scale;
    if (l == "GradScaler sum(found_inf)") ++r.sums;
  }
  for (std::size_t i = 0; i < live.size(); ++i)
    if (live[i]) {
      ++r.kept;
      EXPECT_TRUE(label[i] == "GradScaler _scale" || label[i] == "GradScaler _growth_tracker") << label[i];
    }
  return r;
}

TEST(HfPredict, Fp16AddsTheGradScalersTensors) {
  HfJob j = job(1, "fp32", "fp16");
  j.seq_len = 128;
  j.steps = 3;
  ScalerTensors s = scaler_tensors(j);
  EXPECT_EQ(s.scale, 1u);  // made at the first scale() only
  EXPECT_EQ(s.kept, 2u);   // scale and growth tracker
  EXPECT_EQ(s.scaled_loss, 3u);
  EXPECT_EQ(s.found_inf, 3u);
  EXPECT_EQ(s.found_inf_in_clip, 3u);  // max_grad_norm 1.0: clip_grad_norm_ unscales
  EXPECT_EQ(s.grad_scale + s.sums, 0u);
  // per step: the scaled loss, the seed, MulBackward0's output, unscale_'s three and found_inf
  EXPECT_EQ(s.made, 2 + 3 * 7u);
  EXPECT_EQ(s.extra_events, 2 * s.made - s.kept);  // every one allocated, all but two freed
  // the peak: the bf16 one plus at most the scaler's few 512-byte blocks
  HfJob b = j;
  b.mixed_precision = "bf16";
  const HfPrediction pf = predict_hf(j, h200()), pb = predict_hf(b, h200());
  EXPECT_GE(pf.max_allocated, pb.max_allocated + 2 * 512);
  EXPECT_LE(pf.max_allocated, pb.max_allocated + 4 * 512);

  j.max_grad_norm = 0;  // no clipping: scaler.step unscales
  s = scaler_tensors(j);
  EXPECT_EQ(s.found_inf, 3u);
  EXPECT_EQ(s.found_inf_in_clip, 0u);
  j.optimizer = "adamw_torch_fused";  // _step_supports_amp_scaling: the scaler passes grad_scale
  s = scaler_tensors(j);
  EXPECT_EQ(s.found_inf, 3u);
  EXPECT_EQ(s.sums, 3u);
  EXPECT_EQ(s.grad_scale, 3u);
  j.max_grad_norm = 1.0;  // unscaled by clipping: the fused step gets no grad_scale
  s = scaler_tensors(j);
  EXPECT_EQ(s.sums, 3u);
  EXPECT_EQ(s.grad_scale, 0u);
  EXPECT_EQ(s.found_inf_in_clip, 3u);
}

// Qwen2's schedule loads, differentiates and steps every parameter, the q/k/v biases included:
// the weight requests are Qwen2.5-0.5B's 494,032,768 parameters (tied), the step-1 gradients
// (one embedding more) and AdamW's two states the same again, and the biases are in the no-decay group (their own
// foreach sqrt buffers): 24 x 3 bias tensors more than a Llama of the same shapes.
TEST(HfPredict, Qwen2HasEveryParameterWithItsBiases) {
  HfJob j = job(1, "bf16", "bf16");
  j.model = preset_config("qwen2.5-0.5b");
  j.seq_len = 128;
  j.steps = 1;
  std::uint64_t weights = 0, grads = 0, states = 0;
  std::size_t n_weights = 0;
  for (const auto& e : hf_trainer_schedule(j)) {
    if (e.kind != ScheduleEvent::kAlloc) continue;
    if (e.category == Category::kWeights) {
      weights += e.bytes;
      ++n_weights;
    }
    if (e.category == Category::kGradients) grads += e.bytes;
    if (e.category == Category::kOptimizerStates) states += e.bytes;
  }
  EXPECT_EQ(weights, 494032768ull * 2);
  // the tied embedding gets two gradients (lm_head's, then the lookup's) and their sum, made out of
  // place (bf16 weights: the LM head's gradient is linear's own; see TiedEmbeddingGradients...)
  EXPECT_EQ(grads, weights + 2 * 151936ull * 896 * 2);
  EXPECT_EQ(states, 2 * weights);
  HfJob l = j;
  l.model.family = ModelFamily::kLlama;
  l.model.qkv_bias = false;
  std::size_t n_llama = 0;
  for (const auto& e : hf_trainer_schedule(l))
    if (e.kind == ScheduleEvent::kAlloc && e.category == Category::kWeights) ++n_llama;
  EXPECT_EQ(n_weights, n_llama + 24 * 3);
}

// What the fp32 micro-batch-1 trace (bench/gpu/results/2026-11-27-h200-1) showed at the end of
// every backward: the tied embedding's two gradients summed into a new [V, H] tensor (the LM
// head's, linear's own, is not summed into in place), and no sort buffers in the embedding's
// backward at 1024 indices. Under autocast over fp32 weights (the bf16 autocast trace) and with
// Liger the sum is in place.
struct TiedSum {
  std::size_t sums = 0, sort_buffers = 0;
  bool inputs_freed_after_sum = false;
};

TiedSum tied_sum(const HfJob& j) {
  const std::vector<ScheduleEvent> ev = hf_trainer_schedule(j);
  TiedSum r;
  std::vector<std::uint32_t> big;  // [V, H]-sized gradients, in allocation order
  const std::size_t vh = static_cast<std::size_t>(j.model.vocab_size * j.model.hidden_size);
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const ScheduleEvent& e = ev[i];
    if (e.kind != ScheduleEvent::kAlloc) continue;
    if (std::string(e.label).find("sorted indices") != std::string::npos) ++r.sort_buffers;
    if (std::string(e.label).find("tied embedding grad") == std::string::npos) continue;
    ++r.sums;
    EXPECT_EQ(e.bytes % vh, 0u);
    EXPECT_EQ(e.category, Category::kGradients);
    // the next two events free the LM head's gradient and the lookup's: both [V, H]
    std::size_t freed = 0;
    for (std::size_t k = i + 1; k < ev.size() && k <= i + 2; ++k)
      if (ev[k].kind == ScheduleEvent::kFree) ++freed;
    r.inputs_freed_after_sum = freed == 2;
  }
  return r;
}

TEST(HfPredict, TiedEmbeddingGradientsAreSummedAsTheTracesShow) {
  HfJob j = job(1);
  j.steps = 2;
  TiedSum s = tied_sum(j);
  EXPECT_EQ(s.sums, 2u);  // one per backward
  EXPECT_TRUE(s.inputs_freed_after_sum);
  EXPECT_EQ(s.sort_buffers, 0u);  // 1024 indices: the direct kernel
  j.micro_batch = 3;              // 3072: still the direct kernel
  EXPECT_EQ(tied_sum(j).sort_buffers, 0u);
  j.micro_batch = 4;  // 4096: sorted, per backward
  EXPECT_EQ(tied_sum(j).sort_buffers, 2u);
  // gradient accumulation: each micro-step sums the pair; from the second on, AccumulateGrad adds
  // the sum into the existing .grad in place and it goes at once
  j = job(1);
  j.steps = 1;
  j.grad_accum_steps = 2;
  {
    const std::vector<ScheduleEvent> ev = hf_trainer_schedule(j);
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < ev.size(); ++i)
      if (ev[i].kind == ScheduleEvent::kAlloc && std::string(ev[i].label).find("tied embedding grad") != std::string::npos)
        at.push_back(i);
    ASSERT_EQ(at.size(), 2u);
    ASSERT_LT(at[1] + 3, ev.size());
    EXPECT_EQ(ev[at[1] + 3].kind, ScheduleEvent::kFree);
    EXPECT_EQ(ev[at[1] + 3].tensor, ev[at[1]].tensor);  // the second sum, after both its inputs
    for (std::size_t k = at[0] + 1; k < ev.size(); ++k)  // the first is .grad until zero_grad
      EXPECT_FALSE(ev[k].kind == ScheduleEvent::kFree && ev[k].tensor == ev[at[0]].tensor && k < at[1]);
  }
  j = job(1, "bf16", "no");  // linear's own gradient in bf16 too (the bf16 eager mb-6 trace)
  j.steps = 1;
  EXPECT_EQ(tied_sum(j).sums, 1u);
  j = job(1, "fp32", "bf16");  // autocast: the head's gradient is the cast's fp32 copy
  j.steps = 1;
  EXPECT_EQ(tied_sum(j).sums, 0u);
  j = job(1, "bf16", "no", "sdpa");
  j.fused_kernels = true;  // Liger: the fused loss's own grad_weight
  j.steps = 1;
  EXPECT_EQ(tied_sum(j).sums, 0u);
  j = job(1);
  j.model = preset_config("opt-1.3b");  // OPT's LM head is tied too
  j.steps = 1;
  EXPECT_EQ(tied_sum(j).sums, 1u);
  j = job(1, "bf16", "no", "sdpa");
  j.model = preset_config("qwen2.5-0.5b");
  j.model.tie_word_embeddings = false;  // untied: nothing to sum
  j.steps = 1;
  EXPECT_EQ(tied_sum(j).sums, 0u);
}

// The step-2 growth the fp32 micro-batch-1 run measured: reserved 24,956,108,800 after step 1,
// 26,006,781,952 after step 2 (one [V, H] fp32 segment more: the tied sum finding no cached block
// at the end of step 2's backward), allocated 24,783,145,984 (hf_memory.jsonl's per_step).
TEST(HfPredict, Fp32MicroBatch1GrowsBySegmentInStep2AsMeasured) {
  HfJob j = job(1);
  j.steps = 3;
  const HfPrediction p = predict_hf(j, h200());
  ASSERT_EQ(p.steps.size(), 3u);
  EXPECT_EQ(p.steps[0].max_reserved, 24956108800u);
  EXPECT_EQ(p.steps[1].max_reserved, 26006781952u);
  EXPECT_EQ(p.steps[2].max_reserved, 26006781952u);
  EXPECT_LT(std::fabs(static_cast<double>(p.max_allocated) - 24783145984.0) / 24783145984.0, 1e-4);
  // and the cache's layout: the segments after each step, small pool + large pool, as the H200 had
  // them (hf_memory.jsonl: 2 + 316, 2 + 317, 2 + 317)
  const std::size_t small[3] = {2, 2, 2}, large[3] = {316, 317, 317};
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(p.steps[s].small_segments, small[s]) << "step " << s + 1;
    EXPECT_EQ(p.steps[s].segments - p.steps[s].small_segments, large[s]) << "step " << s + 1;
  }
}

TEST(HfPredict, RefusesWhatItDoesNotModel) {
  HfJob j = job(1);
  j.versions.transformers = "4.58";  // 4.43 to 4.57 and 5.0 to 5.24 are modelled
  EXPECT_THROW(validate_job(j), InvalidInput);
  j.versions.transformers = "4.57";  // but 4.56 and 4.57 with eager attention only
  EXPECT_NO_THROW(validate_job(j));
  j.mixed_precision = "bf16";  // autocast over fp32 weights: for grouped-query attention (Llama-3.2-1B's)
  EXPECT_NO_THROW(validate_job(j));
  j.model.num_key_value_heads = j.model.num_attention_heads;
  EXPECT_THROW(validate_job(j), InvalidInput);
  j = job(1);
  j.versions.transformers = "4.56";
  j.attn = "sdpa";  // fp32 sdpa: PyTorch's math path, eager's sequence (CPU-traced with it forced)
  EXPECT_NO_THROW(validate_job(j));
  j.versions.transformers = "4.54";  // and 4.54's, whose copies of q, k and v are forward transients
  EXPECT_NO_THROW(validate_job(j));
  j.versions.transformers = "4.53";  // but not after 4.53's repeats (CUDA's memory-efficient kernel then)
  expect_refused(j, "sdpa in fp32 from 4.54 only");
  j = job(1);
  j.versions.transformers = "4.42";  // before Llama 3.2's rope_type "llama3"
  EXPECT_THROW(validate_job(j), InvalidInput);
  j = job(0);
  EXPECT_THROW(validate_job(j), InvalidInput);
  j = job(1);
  j.model = preset_config("qwen2-tiny");
  j.seq_len = 64;
  EXPECT_NO_THROW(validate_job(j));  // Qwen2 is modelled (cpu_trace_test.cpp checks it)
  j.fused_kernels = true;             // and Liger's Qwen2 patch (liger_schedule_test.cpp)
  EXPECT_NO_THROW(validate_job(j));
  j = job(1, "fp32", "bf16");
  j.fused_kernels = true;  // Liger under autocast over fp32 weights: modelled (liger_schedule_test.cpp)
  EXPECT_NO_THROW(validate_job(j));
  j = job(1);
  j.model = preset_config("opt-1.3b");
  j.fused_kernels = true;  // Liger has no OPT patch
  EXPECT_THROW(validate_job(j), InvalidInput);
  j = job(1 << 30);
  j.seq_len = 1 << 17;
  j.model.max_position_embeddings = 1 << 20;
  EXPECT_THROW(validate_job(j), InvalidInput);  // tensors beyond 2^62 bytes
}

// --transformers-version 4.45 is modelled for Llama with eager attention, without
// checkpointing or Liger (what its CPU trace checks: cpu_trace_test.cpp CpuTrace445); each other switch is refused
// with the reason, and its prediction says it was not measured on a GPU.
// transformers 5.0 to 5.24 take 5.17's schedule (their CPU traces: cpu_trace_test.cpp,
// CpuTraceTransformersReleases): the same prediction, with a line saying so; others refused with
// the supported ones named; OPT from 5.2; the 5.x releases besides 5.17 under torch 2.9 or later.
TEST(HfPredict, TransformersFiveReleasesTakeTheSchedule) {
  HfPredictOptions o;
  o.device_memory = 64 * GiB;
  const HfJob pinned = job(6);
  const HfPrediction want = predict_hf(pinned, o);
  for (const char* v : {"5.0", "5.2", "5.9", "5.24"}) {
    HfJob j = pinned;
    j.versions.transformers = v;
    ASSERT_NO_THROW(validate_job(j)) << v;
    const HfPrediction got = predict_hf(j, o);
    EXPECT_EQ(got.max_reserved, want.max_reserved) << v;
    EXPECT_EQ(got.max_allocated, want.max_allocated) << v;
    EXPECT_NE(prediction_table(j, o, got, 0).find("5.17's schedule"), std::string::npos) << v;
  }
  EXPECT_EQ(prediction_table(pinned, o, want, 0).find("5.17's schedule"), std::string::npos);
  for (const char* v : {"5.25", "4.58", "4.42", "5", "5.x", "6.0"}) {
    HfJob j = pinned;
    j.versions.transformers = v;
    expect_refused(j, "5.0 to 5.24 take its schedule");
  }
  HfJob opt = pinned;
  opt.model = preset_config("opt-1.3b");
  opt.versions.transformers = "5.1";
  EXPECT_NO_THROW(validate_job(opt));  // eager: its own 4-D mask (Dims::opt_mask_4x)
  opt.attn = "sdpa";
  expect_refused(opt, "eager attention without");
  opt.versions.transformers = "5.2";
  EXPECT_NO_THROW(validate_job(opt));
  HfJob old_torch = pinned;
  old_torch.versions.transformers = "5.24";
  old_torch.versions.torch = "2.8";
  expect_refused(old_torch, "traced under torch 2.11 only");
  old_torch.versions.torch = "2.9";
  EXPECT_NO_THROW(validate_job(old_torch));
}

// transformers 4.49 to 4.55 (cpu_trace_test.cpp, CpuTraceLate4): Llama and Qwen2 (OPT from 4.54),
// eager or sdpa in bf16, checkpointing with eager, no Liger, under torch 2.9 or later; the table
// says what the schedule adds.
TEST(HfPredict, Transformers449To455AreLlamaAndQwen2Eager) {
  HfPredictOptions o;
  o.device_memory = 80 * GiB;
  HfJob j = job(8);
  j.versions.transformers = "4.53";
  ASSERT_NO_THROW(validate_job(j));
  const HfPrediction late = predict_hf(j, o);
  EXPECT_NE(prediction_table(j, o, late, 0).find("training DynamicCache"), std::string::npos);
  // the cache goes before backward, where this job peaks: the same peak as 5.17's but for one
  // 512-byte block 4.53 does not have, the rotary original_inv_freq buffer (an alias of inv_freq
  // before 5.x); num_items_in_batch's device copy (kept on the host by 4.50 to 4.55) has its
  // counterpart in the 0-d tensor the backward keeps (the H200 traces of 4.55.4)
  const HfPrediction now = predict_hf(job(8), o);
  EXPECT_EQ(late.max_allocated + 512, now.max_allocated);
  HfJob r = j;
  r.attn = "sdpa";
  r.model_precision = "bf16";
  r.mixed_precision = "bf16";
  EXPECT_NO_THROW(validate_job(r));
  r.model_precision = "fp32";
  r.mixed_precision = "no";
  expect_refused(r, "sdpa in fp32 from 4.54 only");
  r = j;
  r.activation_checkpointing = true;  // eager: use_cache=False, 5.17's checkpointing (traced for Qwen2)
  EXPECT_NO_THROW(validate_job(r));
  r.attn = "sdpa";
  r.model_precision = "bf16";
  r.mixed_precision = "bf16";
  expect_refused(r, "--activation-checkpointing with eager attention, for Llama and Qwen2, only");
  r = j;
  r.model = preset_config("opt-1.3b");
  EXPECT_NO_THROW(validate_job(r));  // 4.53: OPT, python or torchrun (its legacy cache tuple cloned)
  r.launcher = "torchrun";
  EXPECT_NO_THROW(validate_job(r));
  r.model_precision = "bf16";
  r.mixed_precision = "bf16";
  expect_refused(r, "bf16 weights were not traced");
  r.model_precision = "fp32";
  r.mixed_precision = "no";
  r.launcher = "python";
  r.versions.transformers = "4.55";
  EXPECT_NO_THROW(validate_job(r));
  r = j;
  r.versions.torch = "2.8";
  expect_refused(r, "torch 2.9 to 2.11 only");
  r = j;
  r.model = preset_config("qwen2-tiny");
  r.seq_len = 64;
  EXPECT_NO_THROW(validate_job(r));
}

TEST(HfPredict, Transformers445IsEagerOnly) {
  auto refused = [](HfJob j, const char* why) {
    j.versions.transformers = kOlderTransformers;
    expect_refused(j, why);
  };
  HfJob ok = job(6);
  ok.versions.transformers = kOlderTransformers;
  EXPECT_NO_THROW(validate_job(ok));
  HfPredictOptions o;
  o.device_memory = 64 * GiB;
  const HfPrediction p = predict_hf(ok, o);
  // 4.45.2 ran on an H200 (the traces in tests/golden/predict/*.tf4.45.events); 4.44 did not
  EXPECT_NE(prediction_table(ok, o, p, 0).find("measured to the byte on an H200 under 4.45.2"), std::string::npos);
  HfJob unmeasured = ok;
  unmeasured.versions.transformers = "4.44";
  EXPECT_NE(prediction_table(unmeasured, o, predict_hf(unmeasured, o), 0).find("not measured on a GPU"), std::string::npos);
  refused(job(6, "fp32", "no", "sdpa"), "eager attention only");
  HfJob bf16 = job(6, "bf16", "bf16");
  bf16.versions.transformers = kOlderTransformers;
  EXPECT_NO_THROW(validate_job(bf16));
  for (const char* mixed : {"bf16", "fp16"}) {
    HfJob m = job(6, "fp32", mixed);
    m.versions.transformers = kOlderTransformers;
    EXPECT_NO_THROW(validate_job(m)) << mixed;
  }
  HfJob j = job(6);
  j.activation_checkpointing = true;
  refused(j, "--activation-checkpointing");
  j = job(6);
  j.fused_kernels = true;
  refused(j, "--fused-kernels");
  j = job(6);
  j.versions.transformers = kOlderTransformers;
  j.ranks = 2;  // DDP under 4.4x: traced with two ranks and with torchrun's one (ddp_trace_test.cpp)
  EXPECT_NO_THROW(validate_job(j));
  j.ranks = 1;
  j.launcher = "torchrun";
  EXPECT_NO_THROW(validate_job(j));
  j = job(6);
  j.seq_len = 1;
  refused(j, "--seq-len 2 or more");
  j = job(6);  // OPT: 4.43 to 4.47 (its inline attention), fp32 weights (the traced ones)
  j.model = preset_config("opt-1.3b");
  j.versions.transformers = "4.45";
  EXPECT_NO_THROW(validate_job(j));
  j.mixed_precision = "bf16";
  EXPECT_NO_THROW(validate_job(j));
  j.model_precision = "bf16";
  refused(j, "OPT with fp32 weights only");
  j = job(6);  // 4.48: OPTForCausalLM's loss is ForCausalLMLoss (cpu_trace_test.cpp, its traces)
  j.model = preset_config("opt-1.3b");
  j.versions.transformers = "4.48";
  EXPECT_NO_THROW(validate_job(j));
  j.versions.torch = "2.4";  // not traced under the torch releases that record full slices
  expect_refused(j, "OPT under 4.48 with torch 2.9 or later only");
  j = job(6);  // Qwen2 from 4.45 (4.43 and 4.44 compute its rotary tables per layer)
  j.model = preset_config("qwen2-tiny");
  j.seq_len = 64;
  j.versions.transformers = "4.45";
  EXPECT_NO_THROW(validate_job(j));
  j.versions.transformers = "4.44";
  try {
    validate_job(j);
    ADD_FAILURE() << "Qwen2 under 4.44 not refused";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("Qwen2 from 4.45 only"), std::string::npos) << e.what();
  }
}

TEST(HfPredict, LargestMicroBatchIsExactAtTheBoundary) {
  HfPredictOptions o;
  o.device_memory = 80 * GiB;
  const std::int64_t b = largest_micro_batch(job(1, "bf16", "bf16", "sdpa"), o);
  ASSERT_GT(b, 1);
  EXPECT_FALSE(predict_hf(job(b, "bf16", "bf16", "sdpa"), o).oom);
  EXPECT_TRUE(predict_hf(job(b + 1, "bf16", "bf16", "sdpa"), o).oom);
}

}  // namespace
}  // namespace scalelab::predict

namespace scalelab::predict {
namespace {

// The torch releases modelled and their two groups (hf_schedule.h): 2.4 to 2.8 record full slices,
// 2.9 to 2.11 do not (CpuTraceTorchReleases holds each group against CPU traces).
TEST(HfPredict, TorchReleasesAndTheirGroups) {
  EXPECT_EQ(torch_minor("2.4"), 4);
  EXPECT_EQ(torch_minor("2.11"), 11);
  for (const char* bad : {"2.3", "2.12", "3.0", "2.", "2.x", "2.4.1", "", "12.4"}) EXPECT_EQ(torch_minor(bad), -1) << bad;
  EXPECT_TRUE(records_full_slices("2.4"));
  EXPECT_TRUE(records_full_slices("2.8"));
  EXPECT_FALSE(records_full_slices("2.9"));
  EXPECT_FALSE(records_full_slices("2.11"));
  EXPECT_FALSE(records_full_slices("2.3"));
}

}  // namespace
}  // namespace scalelab::predict

namespace scalelab::predict {
namespace {

// torch 2.4 to 2.8: the final norm's output is sliced before the lm_head, and each of the three
// full slices copies its gradient in that output's dtype: the compute dtype for full bf16 Llama,
// fp32 under autocast and for OPT's final LayerNorm over bf16 weights (autocast runs it in fp32).
TEST(HfPredict, TheFinalNormSliceCopiesAreInItsOutputsDtype) {
  auto copies = [](HfJob j) {
    j.versions.torch = "2.8";
    j.steps = 1;
    std::vector<std::size_t> sizes;
    for (const ScheduleEvent& e : hf_trainer_schedule(j))
      if (e.kind == ScheduleEvent::kAlloc &&
          std::string(e.label) == "grad final norm output (torch <= 2.8 full-slice backward)")
        sizes.push_back(e.bytes);
    return sizes;
  };
  HfJob llama = job(2, "bf16", "bf16");
  const std::size_t bth = 2 * 1024 * static_cast<std::size_t>(llama.model.hidden_size);
  EXPECT_EQ(copies(llama), std::vector<std::size_t>(3, bth * 2));
  EXPECT_EQ(copies(job(2, "fp32", "bf16")), std::vector<std::size_t>(3, bth * 4));
  HfJob opt = job(2, "bf16", "bf16");
  opt.model = preset_config("opt-1.3b");
  opt.model.dropout = 0;
  EXPECT_EQ(copies(opt), std::vector<std::size_t>(3, 2 * 1024 * static_cast<std::size_t>(opt.model.hidden_size) * 4));
}

}  // namespace
}  // namespace scalelab::predict
