// The generated schedule against the real Trainer traced on the CPU (tools/predict/trace_hf.py,
// goldens in tests/golden/predict/cpu/): what autograd saves for backward is the same on the CPU
// as on CUDA, so the tensors of step 2's forward still live when its backward starts (saved
// activations, the fp32 log-softmax, labels, loss scalars) must be the same sizes, one for one
// and (Qwen2) in the same order; so must the parameter gradients live when step 2's optimizer
// step starts and the optimizer states step 1 created. Kernel temporaries and cuBLAS workspaces
// are CUDA's own and are checked against the H200 traces instead (trace_replay_test.cpp,
// hf_predict_test.cpp).
#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "predict/hf_predict.h"
#include "predict/hf_schedule.h"
#include "event_log.h"
#include "step_match.h"

namespace scalelab::predict {
namespace {

// What one event log (the tracer's or the generated schedule's text) says about steps 1 and 2.
struct TraceFacts {
  std::vector<std::size_t> saved;        // born in step 2's forward, live at its backward (in order)
  std::multiset<std::size_t> grads;      // born after step 2's backward marker, live at its optimizer step
  std::multiset<std::size_t> states;     // born in step 1's optimizer step, live at step 2's forward
};

TraceFacts facts_of(std::istream& in) {
  struct Alloc {
    std::size_t bytes;
    std::string phase;
    int step;
  };
  std::map<std::size_t, Alloc> allocs;
  std::set<std::size_t> live;
  TraceFacts f;
  std::string line, phase;
  int step = 0;
  std::size_t n = 0;
  auto live_born = [&](const std::string& ph, int st) {
    std::vector<std::size_t> out;
    for (std::size_t i : live)
      if (allocs[i].phase == ph && allocs[i].step == st) out.push_back(allocs[i].bytes);
    return out;
  };
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0) {
      std::istringstream ls(line.substr(2));
      std::string ph;
      ls >> ph;
      if (ph == "forward") {
        ++step;
        if (step == 2) {
          auto s = live_born("optimizer_step", 1);
          f.states.insert(s.begin(), s.end());
        }
      }
      if (ph == "backward" && step == 2) f.saved = live_born("forward", 2);
      if (ph == "optimizer_step" && step == 2) {
        // born after the backward marker: the schedule's clip_grad_norm phase counts as backward
        for (std::size_t i : live)
          if (allocs[i].step == 2 && (allocs[i].phase == "backward" || allocs[i].phase == "clip_grad_norm"))
            f.grads.insert(allocs[i].bytes);
      }
      // the marker lines only the schedule has (load, clip_grad_norm, zero_grad) keep their name
      phase = ph;
      continue;
    }
    std::istringstream ls(line);
    std::string op;
    std::size_t v = 0;
    ls >> op >> v;
    if (op == "a") {
      allocs[n] = {v, phase, step};
      live.insert(n++);
    } else if (op == "f") {
      live.erase(v);
    }
  }
  return f;
}

TraceFacts golden_facts(const std::string& name) {
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/cpu/" + name + ".cpu.events");
  EXPECT_TRUE(in.good()) << name;
  return facts_of(in);
}

struct Case {
  const char* golden;
  const char* preset;
  const char* prec;
  const char* mixed;
  const char* attn = "eager";
  bool ckpt = false;
  bool untied = false;
  bool check_order = false;  // the saved tensors in allocation order (checked for Qwen2)
  const char* transformers = kSupportedTransformers;  // golden NAME.tf4.45 for kOlderTransformers
  const char* torch = kSupportedTorch;                // golden NAME.tf4.45.torch2.4 for kOlderTorch
};

HfJob job_of(const Case& c) {
  HfJob j;
  j.model = preset_config(c.preset);
  if (c.untied) j.model.tie_word_embeddings = false;
  j.seq_len = 32;
  j.micro_batch = 2;
  j.model_precision = c.prec;
  j.mixed_precision = c.mixed;
  j.attn = c.attn;
  j.activation_checkpointing = c.ckpt;
  j.steps = 2;
  j.versions.transformers = c.transformers;
  j.cpu_kernels = true;  // compared with CPU traces
  j.versions.torch = c.torch;
  return j;
}

// The older transformers releases traced on the CPU (--transformers-version), each in these
// precisions: {golden name part, model precision, mixed precision}.
constexpr const char* kOlderReleases[] = {"4.43", "4.44", "4.45", "4.46", "4.47", "4.48"};
// Qwen2 (from 4.45: 4.43 and 4.44 compute its rotary tables in every layer) takes the same schedule
// with its q/k/v biases; its 4.45 frees the final norm's output before the shifted copy.
constexpr const char* kQwen2OlderReleases[] = {"4.45", "4.46", "4.47", "4.48"};
// OPT: 4.43 to 4.47 write OPTAttention's eager path inline; 4.48 rewrote it, allocating the same (its
// loss is ForCausalLMLoss then); traced with fp32 weights.
constexpr const char* kOptOlderReleases[] = {"4.43", "4.44", "4.45", "4.46", "4.47", "4.48"};
constexpr const char* kTinyPrecisions[][3] = {
    {"fp32-eager", "fp32", "no"}, {"bf16mixed-eager", "fp32", "bf16"}, {"bf16-eager", "bf16", "bf16"}};

std::size_t param_count(const HfJob& j) {
  std::size_t n = 0;
  for (const auto& e : hf_trainer_schedule(j))
    if (e.kind == ScheduleEvent::kAlloc && e.category == Category::kWeights) ++n;
  return n;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.golden; }

// The schedule without what only the CUDA kernels make: flash sdpa's philox seed and offset (0-d
// int64 tensors it saves per layer, read off the H200 traces; the CPU kernel makes none).
std::vector<ScheduleEvent> cpu_comparable(std::vector<ScheduleEvent> ev) {
  std::set<std::uint32_t> gpu_only;
  for (const ScheduleEvent& e : ev)
    if (e.kind == ScheduleEvent::kAlloc && std::string(e.label).rfind("flash attention philox", 0) == 0)
      gpu_only.insert(e.tensor);
  ev.erase(std::remove_if(ev.begin(), ev.end(),
                          [&](const ScheduleEvent& e) { return e.kind != ScheduleEvent::kPhase && gpu_only.count(e.tensor); }),
           ev.end());
  return ev;
}

class CpuTrace : public ::testing::TestWithParam<Case> {};

TEST_P(CpuTrace, SavedForBackwardMatchesTheRealTrainer) {
  const Case& c = GetParam();
  const TraceFacts traced = golden_facts(c.golden);
  ASSERT_GT(traced.saved.size(), 10u);
  std::istringstream gen(schedule_text(cpu_comparable(hf_trainer_schedule(job_of(c)))));
  const TraceFacts generated = facts_of(gen);
  constexpr std::size_t kCpuRngState = 5056;
  std::multiset<std::size_t> traced_saved(traced.saved.begin(), traced.saved.end());
  if (c.ckpt) traced_saved.erase(kCpuRngState);
  // eager attention's `* scaling` operand (and OPT's `q_proj(x) * scaling`): a wrapped Python
  // scalar (8-byte 0-d tensor) that MulBackward saves, per layer; a host tensor under CUDA, so
  // not in the schedule
  const HfJob j = job_of(c);
  // (OPT under 4.43 to 4.47, and 4.49 to 4.51, scales only q: its attention has no second scalar)
  const bool opt = j.model.family == ModelFamily::kOPT,
             opt4x = opt && (is_older_transformers(c.transformers) ||
                             (is_late4_transformers(c.transformers) && late4_minor(c.transformers) <= 51));
  const int per_layer = (std::string(c.attn) == "eager" && !opt4x ? 1 : 0) + (opt ? 1 : 0);
  for (int k = 0; k < per_layer; ++k) {
    for (std::int64_t l = 0; l < j.model.num_hidden_layers; ++l) {
      auto it = traced_saved.find(8);
      ASSERT_NE(it, traced_saved.end());
      traced_saved.erase(it);
    }
  }
  EXPECT_EQ(std::multiset<std::size_t>(generated.saved.begin(), generated.saved.end()), traced_saved);
  if (c.check_order) {
    // In allocation order, with what is on the host also under CUDA left out: the scalars
    // (counted in the multiset above) and, with checkpointing, the CPU RNG state
    // each checkpoint saves (5056 bytes, torch.get_rng_state(); the CUDA RNG state is a host
    // tensor too).
    auto tensors = [&](const std::vector<std::size_t>& v) {
      std::vector<std::size_t> out;
      for (std::size_t x : v)
        if (x >= 64 && x != kCpuRngState) out.push_back(x);
      return out;
    };
    EXPECT_EQ(tensors(generated.saved), tensors(traced.saved));
  }
}

// The gradients live when step 2's optimizer step starts (every parameter's, Qwen2's biases
// included, in the parameter dtype) and the AdamW states created in step 1. The CPU trace also
// has the Trainer's grad-norm scalar (4 bytes, kept for logging) and AdamW's `step` counters
// (fp32 scalars, one per parameter, on the CPU also when training on CUDA); sizes under 8 bytes
// are left out of the gradient comparison and the counters are counted.
TEST_P(CpuTrace, GradientsAndOptimizerStatesMatchTheRealTrainer) {
  const Case& c = GetParam();
  const HfJob j = job_of(c);
  TraceFacts traced = golden_facts(c.golden);
  std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
  const TraceFacts generated = facts_of(gen);
  auto big = [](const std::multiset<std::size_t>& s) {
    std::multiset<std::size_t> out;
    for (std::size_t v : s)
      if (v >= 8) out.insert(v);
    return out;
  };
  ASSERT_FALSE(traced.grads.empty());
  EXPECT_EQ(big(generated.grads), big(traced.grads));
  const std::size_t params = param_count(j);
  ASSERT_GE(traced.states.count(4), params);
  for (std::size_t i = 0; i < params; ++i) traced.states.erase(traced.states.find(4));
  EXPECT_EQ(generated.states, traced.states);
}

// Every traced configuration: the pinned release's, then each older release's
// (NAME.tf<release>.cpu.events, traced in the three precisions of kTinyPrecisions).
std::vector<Case> all_cases() {
  std::vector<Case> cases = {
      Case{"llama-tiny-fp32-eager", "llama-tiny", "fp32", "no"},
      Case{"llama-tiny-bf16mixed-eager", "llama-tiny", "fp32", "bf16"},
      Case{"llama-tiny-bf16-eager", "llama-tiny", "bf16", "bf16"},
      Case{"qwen2-tiny-fp32-eager", "qwen2-tiny", "fp32", "no", "eager", false, false, true},
      Case{"qwen2-tiny-fp32-eager-ckpt", "qwen2-tiny", "fp32", "no", "eager", true, false, true},
      Case{"qwen2-tiny-bf16mixed-eager", "qwen2-tiny", "fp32", "bf16", "eager", false, false, true},
      Case{"qwen2-tiny-bf16mixed-eager-ckpt", "qwen2-tiny", "fp32", "bf16", "eager", true, false,
           true},
      Case{"qwen2-tiny-bf16-eager", "qwen2-tiny", "bf16", "bf16", "eager", false, false, true},
      Case{"qwen2-tiny-bf16mixed-sdpa", "qwen2-tiny", "fp32", "bf16", "sdpa", false, false, true},
      Case{"qwen2-tiny-bf16mixed-sdpa-ckpt", "qwen2-tiny", "fp32", "bf16", "sdpa", true, false,
           true},
      Case{"qwen2-tiny-bf16-sdpa", "qwen2-tiny", "bf16", "bf16", "sdpa", false, false, true},
      Case{"qwen2-tiny-bf16-sdpa-ckpt", "qwen2-tiny", "bf16", "bf16", "sdpa", true, false, true},
      Case{"qwen2-tiny-bf16-eager-ckpt", "qwen2-tiny", "bf16", "bf16", "eager", true, false, true},
      Case{"qwen2-tiny-untied-fp32-eager", "qwen2-tiny", "fp32", "no", "eager", false, true, true},
      Case{"opt-tiny-fp32-eager", "opt-tiny", "fp32", "no", "eager", false, false, true},
      Case{"opt-tiny-bf16mixed-eager", "opt-tiny", "fp32", "bf16", "eager", false, false, true},
      Case{"opt-tiny-fp32-eager-ckpt", "opt-tiny", "fp32", "no", "eager", true, false, true},
      Case{"opt-tiny-bf16mixed-eager-ckpt", "opt-tiny", "fp32", "bf16", "eager", true, false, true}};
  static std::deque<std::string> names;  // the older goldens' names, alive for the whole run
  static std::deque<std::string> names_preset;
  // fp32 sdpa as CUDA runs it, PyTorch's math path (traced with the CPU's fp32 flash kernel off):
  // the pinned release and 4.54 to 4.57
  for (const char* release : {kSupportedTransformers, "4.54", "4.55", "4.56", "4.57"}) {
    for (const char* family : {"llama", "qwen2"}) {
      const bool pinned = std::string(release) == kSupportedTransformers;
      names.push_back(std::string(family) + "-tiny-fp32-sdpa-math" + (pinned ? "" : std::string(".tf") + release));
      names_preset.push_back(std::string(family) + "-tiny");
      cases.push_back(Case{names.back().c_str(), names_preset.back().c_str(), "fp32", "no", "sdpa", false, false,
                           std::string(family) != "llama", release});
    }
  }
  for (const char* release : kQwen2OlderReleases) {
    for (const auto& p : kTinyPrecisions) {
      names.push_back(std::string("qwen2-tiny-") + p[0] + ".tf" + release);
      cases.push_back(Case{names.back().c_str(), "qwen2-tiny", p[1], p[2], "eager", false, false, true, release});
    }
  }
  // Llama, Qwen2 and OPT (fp32 weights) under 4.49 to 4.57 (eager; the DynamicCache held through
  // the forward; from 4.56 its torch.cat copies)
  for (const char* release : {"4.49", "4.50", "4.51", "4.52", "4.53", "4.54", "4.55", "4.56", "4.57"}) {
    for (const char* family : {"llama", "qwen2", "opt"}) {
      for (const auto& p : kTinyPrecisions) {
        if (std::string(family) == "opt" && std::string(p[1]) != "fp32") continue;
        names.push_back(std::string(family) + "-tiny-" + p[0] + ".tf" + release);
        names_preset.push_back(std::string(family) + "-tiny");
        cases.push_back(Case{names.back().c_str(), names_preset.back().c_str(), p[1], p[2], "eager", false, false,
                             std::string(family) != "llama", release});
      }
    }
  }
  // OPT 4.43 to 4.47 (fp32 weights: fp32 and bf16 autocast), and 4.45 under torch 2.4
  for (const char* release : kOptOlderReleases) {
    for (const auto& p : kTinyPrecisions) {
      if (std::string(p[1]) != "fp32") continue;
      for (const char* torch : {kSupportedTorch, kOlderTorch}) {
        if (std::string(torch) == kOlderTorch && std::string(release) != "4.45") continue;
        names.push_back(std::string("opt-tiny-") + p[0] + ".tf" + release +
                        (std::string(torch) == kOlderTorch ? std::string(".torch") + torch : ""));
        cases.push_back(
            Case{names.back().c_str(), "opt-tiny", p[1], p[2], "eager", false, false, true, release, torch});
      }
    }
  }
  for (const char* torch : {kSupportedTorch, kOlderTorch}) {
    for (const char* release : kOlderReleases) {
      for (const auto& p : kTinyPrecisions) {
        names.push_back(std::string("llama-tiny-") + p[0] + ".tf" + release +
                        (std::string(torch) == kOlderTorch ? std::string(".torch") + torch : ""));
        cases.push_back(
            Case{names.back().c_str(), "llama-tiny", p[1], p[2], "eager", false, false, false, release, torch});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, CpuTrace, ::testing::ValuesIn(all_cases()),
    [](const auto& info) {
      std::string n = info.param.golden;
      for (char& ch : n)
        if (ch == '-' || ch == '.') ch = '_';
      return n;
    });

}  // namespace
}  // namespace scalelab::predict

namespace scalelab::predict {
namespace {

// Under activation checkpointing (use_reentrant=False) a layer's first forward keeps nothing for
// backward: each tensor goes when Python drops it (a projection's output once the next op has
// used it, gate_proj's after silu, the attention's locals as it returns, its weights at the layer's
// end). The schedule's first forward, its requests and frees of 4 KiB and more in order, must
// appear in the real Trainer's CPU trace in the same order — every one of them but the cuBLAS
// workspace, which only CUDA has (the trace has more: the CPU kernels' own temporaries). Freeing
// the saved tensors at each layer's end instead, as the schedule did before, leaves 14 to 41 of
// these events out of order (and on the H200, 26 more large segments than the GPU made for
// Qwen2.5-0.5B + Liger + checkpointing).
std::vector<std::string> first_forward_of_trace(const std::string& name) {
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/cpu/" + name + ".cpu.events");
  EXPECT_TRUE(in.good()) << name;
  return test::phase_events(in, "forward", 1, 4096);
}

// The schedule's (test::schedule_text_without_workspaces: what only CUDA has left out).
std::vector<std::string> first_forward_of_schedule(const HfJob& j) {
  std::istringstream in(test::schedule_text_without_workspaces(j));
  return test::phase_events(in, "forward", 1, 4096);
}

TEST(CpuTraceCheckpointing, TheFirstForwardLetsGoOfEachTensorWhenTheTrainerDoes) {
  const Case cases[] = {Case{"qwen2-tiny-fp32-eager-ckpt", "qwen2-tiny", "fp32", "no", "eager", true},
                        Case{"qwen2-tiny-bf16-sdpa-ckpt", "qwen2-tiny", "bf16", "bf16", "sdpa", true},
                        Case{"opt-tiny-fp32-eager-ckpt", "opt-tiny", "fp32", "no", "eager", true}};
  for (const Case& c : cases) {
    const std::vector<std::string> traced = first_forward_of_trace(c.golden);
    const std::vector<std::string> generated = first_forward_of_schedule(job_of(c));
    ASSERT_GT(generated.size(), 80u) << c.golden;
    EXPECT_EQ(test::common_subsequence(traced, generated), generated.size()) << c.golden;
  }
}

}  // namespace
}  // namespace scalelab::predict

namespace scalelab::predict {
namespace {

// The recompute in backward stops early (torch.utils.checkpoint's default): once the last saved
// tensor of the layer is back, which is when down_proj's (OPT: fc2's) mm packs its input, before
// that mm makes its output. In the five Qwen2 and two OPT checkpointed CPU traces the recompute
// makes neither that output nor the layer's: the eight events per 2-layer trace the schedule had
// for them were all unmatched. So no recompute allocates them.
TEST(CpuTraceCheckpointing, TheRecomputeStopsAtTheLastSavedTensor) {
  for (const Case& c : {Case{"qwen2-tiny-fp32-eager-ckpt", "qwen2-tiny", "fp32", "no", "eager", true},
                        Case{"qwen2-tiny-bf16mixed-eager-ckpt", "qwen2-tiny", "fp32", "bf16", "eager", true},
                        Case{"opt-tiny-fp32-eager-ckpt", "opt-tiny", "fp32", "no", "eager", true}}) {
    bool backward = false;
    std::size_t forward_outputs = 0, recomputed_outputs = 0, recomputed_products = 0;
    for (const ScheduleEvent& e : hf_trainer_schedule(job_of(c))) {
      if (e.kind == ScheduleEvent::kPhase) {
        const std::string ph = e.label;
        if (ph == "forward") backward = false;
        if (ph == "backward") backward = true;
        continue;
      }
      if (e.kind != ScheduleEvent::kAlloc) continue;
      const std::string l = e.label;
      const bool output = l == "down_proj output" || l == "fc2 output" || l == "residual + mlp";
      (backward ? recomputed_outputs : forward_outputs) += output;
      if (backward && (l == "silu(gate) * up" || l == "relu (saved)")) ++recomputed_products;
    }
    EXPECT_EQ(forward_outputs, 2u * 2 * 2) << c.golden;  // 2 steps x 2 layers x (the mm's, the layer's)
    EXPECT_EQ(recomputed_outputs, 0u) << c.golden;
    EXPECT_EQ(recomputed_products, 2u * 2) << c.golden;  // the recompute did run up to there
  }
}

}  // namespace
}  // namespace scalelab::predict

namespace scalelab::predict {
namespace {

// Gradient accumulation (one process): in the second micro-step a weight's new gradient is added
// into .grad and freed by AccumulateGrad, which runs after the matmul's backward node is done, so
// after the input gradient is made. The second micro-step's backward in the CPU trace of the real
// Trainer matches the schedule as well as the first's does, but for 4 events (two of the
// gradient frees land elsewhere); accumulating before the input gradient, as the schedule did,
// left 13 more unmatched.
TEST(CpuTraceGradientAccumulation, EachNewWeightGradientIsAddedAfterItsMatmulsNode) {
  const Case c{"llama-tiny-fp32-eager-ga2", "llama-tiny", "fp32", "no"};
  HfJob j = job_of(c);
  j.grad_accum_steps = 2;
  std::size_t unmatched[2] = {};
  for (int micro = 1; micro <= 2; ++micro) {
    std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/cpu/" + c.golden + ".cpu.events");
    ASSERT_TRUE(in.good());
    std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
    const std::set<std::string> schedule_only = {"clip_grad_norm", "zero_grad"};
    const std::vector<std::string> traced = test::phase_events(in, "backward", micro, 4096, {}, schedule_only);
    const std::vector<std::string> generated = test::phase_events(gen, "backward", micro, 4096, {}, schedule_only);
    ASSERT_GT(generated.size(), 200u);
    unmatched[micro - 1] = generated.size() - test::common_subsequence(traced, generated);
  }
  EXPECT_LE(unmatched[1], unmatched[0] + 4) << unmatched[0] << " unmatched in micro-step 1";
}

}  // namespace
}  // namespace scalelab::predict

namespace scalelab::predict {
namespace {

// transformers 4.45 (--transformers-version 4.45, fp32): step 2's forward and backward, every
// request and free of 4 KiB and more in order, against the real Trainer's CPU trace under
// transformers 4.45.2. What differs from 5.17 there (the [T, T+1] causal mask, the DynamicCache
// holding each layer's rotated key and value until compute_loss returns, the shifted logits' copy,
// the B·(T−1)-row loss, the slice's full-size gradient, and the q/k/v projections' backward with
// their three gradient copies first: 4.45 views and transposes them after all three projections,
// so those nodes outrank the matmuls in autograd's queue) must leave each phase as well matched as
// the 5.17 schedule's against its own trace. The 5.17 schedule against the 4.45 trace leaves more.
std::size_t unmatched(const Case& c, const std::string& golden, const std::string& phase) {
  return test::match_step(golden, job_of(c), phase).unmatched_generated();
}

TEST(CpuTrace445, TheStepMatchesTheTransformers445Trace) {
  for (const char* family : {"llama", "qwen2"})
  for (const char* version : kOlderReleases) {
    if (family == std::string("qwen2") && std::string(version) < "4.45") continue;
    for (const auto& pr : kTinyPrecisions) {
      const std::string preset = std::string(family) + "-tiny";
      const std::string name = preset + "-" + pr[0];
      const std::string older_trace = name + ".tf" + version;
      const Case now{"", preset.c_str(), pr[1], pr[2]};
      Case older = now;
      older.transformers = version;
      for (const char* phase : {"forward", "backward"}) {
        const std::size_t own = unmatched(now, name, phase);
        const std::size_t older_own = unmatched(older, older_trace, phase);
        const std::size_t crossed = unmatched(now, older_trace, phase);
        EXPECT_LE(older_own, own) << older_trace << " " << phase;
        EXPECT_GT(crossed, older_own) << older_trace << " " << phase << ": the trace does not tell the versions apart";
      }
    }
  }
}

// OPT under 4.43 to 4.47 (hf_schedule_opt.cpp, opt_attention_forward_tf4x: the inline eager
// attention's q/k/v copies, the masked scores torch.max saves, its backward's masks; the
// 4-D float mask; the loss over the shifted copy in the compute dtype) against each release's
// trace, fp32 and bf16 autocast: every request and free of 4 KiB and more the schedule makes in
// forward and backward is in the trace, in order (the 5.17 schedule leaves 1 and 5 to 9 out against
// its own trace, and 12 to 18 against these: the traces tell the releases apart).
TEST(CpuTraceOpt4x, TheStepMatchesEachOlderRelease) {
  for (const char* version : kOptOlderReleases) {
    for (const auto& pr : kTinyPrecisions) {
      if (std::string(pr[1]) != "fp32") continue;
      const std::string name = std::string("opt-tiny-") + pr[0];
      const std::string older_trace = name + ".tf" + version;
      const Case now{"", "opt-tiny", pr[1], pr[2]};
      Case older = now;
      older.transformers = version;
      for (const char* phase : {"forward", "backward"}) {
        const std::size_t own = unmatched(now, name, phase);
        const std::size_t older_own = unmatched(older, older_trace, phase);
        const std::size_t crossed = unmatched(now, older_trace, phase);
        EXPECT_EQ(older_own, 0u) << older_trace << " " << phase << " (the 5.17 schedule on its own trace: " << own
                                 << ")";
        EXPECT_GT(crossed, older_own) << older_trace << " " << phase;
      }
    }
  }
}

// The loss's tensors and the cache, one for one with the trace: from the fp32 logits to the
// backward marker, the 4.4x traces free the shifted copy, under mixed precision copy the 16-bit
// logits (4.46+) and the cache's 16-bit keys and values to fp32 and free the originals (accelerate's
// convert_outputs_to_fp32),
// then free the logits and, from 4.45, the cache (2 per layer for grouped-query attention).
TEST(CpuTrace445, TheCacheGoesAfterTheLogitsWhenComputeLossReturns) {
  for (const char* family : {"llama", "qwen2"})
  for (const char* version : kOlderReleases)
  for (const auto& pr : kTinyPrecisions) {
    if (family == std::string("qwen2") && std::string(version) < "4.45") continue;
    const std::string preset = std::string(family) + "-tiny";
    Case older{"", preset.c_str(), pr[1], pr[2]};
    older.transformers = version;
    const HfJob j = job_of(older);
    const std::size_t logits = static_cast<std::size_t>(j.micro_batch * j.seq_len * j.model.vocab_size * 4);
    auto tail_of_forward = [&](std::istream& in) {
      const std::vector<std::string> ev = test::phase_events(in, "forward", 2, 4096, {"backward"}, {}, false);
      std::vector<std::string> out;
      bool on = false;
      for (const std::string& e : ev) {
        if (e == "a " + std::to_string(logits)) on = true;
        if (on) out.push_back(e);
      }
      return out;
    };
    const std::string golden = preset + "-" + pr[0] + ".tf" + version;
    std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/cpu/" + golden + ".cpu.events");
    ASSERT_TRUE(in.good()) << golden;
    const std::vector<std::string> traced = tail_of_forward(in);
    std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
    const std::vector<std::string> generated = tail_of_forward(gen);
    const std::size_t kv32 = static_cast<std::size_t>(j.micro_batch * j.seq_len * j.model.num_key_value_heads *
                                                      j.model.head_dim * 4);
    const bool cache = std::string(version) >= "4.45";  // 4.43 and 4.44 make no cache while training
    ASSERT_GE(traced.size(), 5u + (cache ? 2 * static_cast<std::size_t>(j.model.num_hidden_layers) : 0)) << golden;
    EXPECT_EQ(generated, traced) << golden;
    // 4.45 to 4.47 free the legacy cache tuple last entry first (the first layer's key, fp32 under
    // autocast, goes last); 4.48's DynamicCache its keys, then its values (the first layer's value,
    // in the projections' dtype, goes last)
    const std::size_t last_kv = std::string(version) == "4.48" && pr[2] != std::string("no") ? kv32 / 2 : kv32;
    EXPECT_EQ(traced.back(), "f " + std::to_string(cache ? last_kv : logits)) << golden;
  }
}

// torch 2.4 (--torch-version 2.4, the reference practice's container): its autograd records a
// SliceBackward node for every full slice `[:]` (2.11 records none, or an alias), and each node's
// backward copies the gradient into a new zero-filled tensor. The releases' full slices are
// `logits[..., :-1, :]`'s last one, the three of `hidden_states[:, -num_logits_to_keep:, :]`
// (4.45 to 4.47) and the four of repeat_kv's `[:, :, None, :, :]` per key and value. Step 2 against
// the real Trainer's CPU trace under torch 2.4.0, both ways (what the trace has that the schedule
// lacks counts too: these copies are what tells the two torch releases apart): the 2.4 schedule
// misses no more of its trace than the 2.11 schedule of its own, and the 2.11 schedule misses more
// of the 2.4 trace.
std::size_t mismatched(const Case& c, const std::string& golden, const std::string& phase) {
  return test::match_step(golden, job_of(c), phase).mismatched();
}

// TrainingArguments(optim="adamw_torch_fused"): torch._fused_adamw_ (a CPU kernel since torch 2.4)
// makes the states on step 1 as the foreach path does and no temporaries at all, where the foreach
// path has _foreach_sqrt's. The optimizer step of steps 1 and 2, every request and free of 4 KiB
// and more, equals the real Trainer's trace under 5.17 / torch 2.11 and 4.45 under torch 2.11 and
// 2.4; the foreach schedule against the same trace does not.
TEST(CpuTraceFusedAdamW, TheStepMakesTheStatesAndNoTemporaries) {
  for (const auto& [golden, transformers, torch] :
       {std::tuple<const char*, const char*, const char*>{"llama-tiny-fp32-eager-fusedadam", kSupportedTransformers,
                                                          kSupportedTorch},
        {"llama-tiny-fp32-eager-fusedadam.tf4.45", "4.45", kSupportedTorch},
        {"llama-tiny-fp32-eager-fusedadam.tf4.45.torch2.4", "4.45", kOlderTorch}}) {
    Case c{"", "llama-tiny", "fp32", "no"};
    c.transformers = transformers;
    c.torch = torch;
    HfJob j = job_of(c);
    j.optimizer = "adamw_torch_fused";
    HfJob foreach = j;
    foreach.optimizer = "adamw_torch";
    for (int step = 1; step <= 2; ++step) {
      const test::StepMatch fused = test::match_step(golden, j, "optimizer_step", step, 4096, 0);
      EXPECT_GT(fused.traced, 0u) << golden << " step " << step;
      EXPECT_EQ(fused.mismatched(), 0u) << golden << " step " << step;
      EXPECT_GT(test::match_step(golden, foreach, "optimizer_step", step, 4096, 0).mismatched(), 0u)
          << golden << " step " << step;
    }
  }
}

// The transformers 5.x releases beside 5.17: 5.0 to 5.24 take 5.17's schedule (hf_schedule.h,
// is_current_transformers). One traced configuration or more per release, Llama, Qwen2 (eager and
// sdpa, with checkpointing) and OPT across the range: the schedule for that release leaves each
// phase of step 2 exactly as matched, both ways, as it leaves 5.17's own trace of the same
// configuration. OPT under 5.0 and 5.1 builds its mask its own way, which their schedule follows.
TEST(CpuTraceTransformersReleases, EachFiveReleaseMatchesAsFiveSeventeenDoes) {
  const std::pair<const char*, Case> runs[] = {
      {"5.0", Case{"llama-tiny-bf16mixed-eager", "llama-tiny", "fp32", "bf16"}},
      {"5.0", Case{"qwen2-tiny-bf16-sdpa", "qwen2-tiny", "bf16", "bf16", "sdpa"}},
      {"5.2", Case{"opt-tiny-fp32-eager", "opt-tiny", "fp32", "no"}},
      {"5.5", Case{"qwen2-tiny-bf16mixed-eager", "qwen2-tiny", "fp32", "bf16"}},
      {"5.8", Case{"qwen2-tiny-fp32-eager-ckpt", "qwen2-tiny", "fp32", "no", "eager", true}},
      {"5.12", Case{"llama-tiny-bf16-eager", "llama-tiny", "bf16", "bf16"}},
      {"5.16", Case{"opt-tiny-bf16mixed-eager", "opt-tiny", "fp32", "bf16"}},
      {"5.18", Case{"llama-tiny-fp32-eager", "llama-tiny", "fp32", "no"}},
      {"5.22", Case{"qwen2-tiny-bf16mixed-sdpa", "qwen2-tiny", "fp32", "bf16", "sdpa"}},
      {"5.24", Case{"llama-tiny-fp32-eager", "llama-tiny", "fp32", "no"}},
      {"5.24", Case{"llama-tiny-bf16-eager", "llama-tiny", "bf16", "bf16"}},
      {"5.24", Case{"qwen2-tiny-bf16-sdpa-ckpt", "qwen2-tiny", "bf16", "bf16", "sdpa", true}},
      {"5.24", Case{"opt-tiny-bf16mixed-eager", "opt-tiny", "fp32", "bf16"}},
      {"5.24", Case{"opt-tiny-fp32-eager-ckpt", "opt-tiny", "fp32", "no", "eager", true}},
  };
  for (const auto& [release, c] : runs) {
    const std::string trace = std::string(c.golden) + ".tf" + release;
    Case then = c;
    then.transformers = release;
    EXPECT_NO_THROW(validate_job(job_of(then))) << trace;
    for (const char* phase : {"forward", "backward"}) {
      const std::size_t own = test::match_step(c.golden, job_of(c), phase).mismatched();
      EXPECT_EQ(test::match_step(trace, job_of(then), phase).mismatched(), own) << trace << " " << phase;
    }
  }
  // the gradient-accumulation trace of 5.24: the same through both micro-steps
  Case ga{"llama-tiny-fp32-eager-ga2", "llama-tiny", "fp32", "no"};
  HfJob j = job_of(ga);
  j.grad_accum_steps = 2;
  HfJob j524 = j;
  j524.versions.transformers = "5.24";
  for (const char* phase : {"forward", "backward"})
    for (int nth : {2, 3}) {
      EXPECT_EQ(test::match_step("llama-tiny-fp32-eager-ga2.tf5.24", j524, phase, nth).mismatched(),
                test::match_step("llama-tiny-fp32-eager-ga2", j, phase, nth).mismatched())
          << phase << " " << nth;
    }
  // OPT under 5.1 builds its 4-D mask its own way (Dims::opt_mask_4x): 5.17's schedule leaves more
  // of its trace unmatched than 5.1's schedule does, which matches it as 5.17's own trace is matched
  const Case opt{"opt-tiny-fp32-eager", "opt-tiny", "fp32", "no"};
  Case opt51 = opt;
  opt51.transformers = "5.1";
  EXPECT_NO_THROW(validate_job(job_of(opt51)));
  for (const char* phase : {"forward", "backward"}) {
    const std::size_t own = test::match_step("opt-tiny-fp32-eager", job_of(opt), phase).unmatched_generated();
    EXPECT_LE(test::match_step("opt-tiny-fp32-eager.tf5.1", job_of(opt51), phase).unmatched_generated(), own) << phase;
  }
  EXPECT_GT(test::match_step("opt-tiny-fp32-eager.tf5.1", job_of(opt), "forward").mismatched(),
            test::match_step("opt-tiny-fp32-eager.tf5.1", job_of(opt51), "forward").mismatched());
}

// transformers 4.49 to 4.55, Llama and Qwen2, eager (hf_schedule.h, is_late4_transformers): 5.17's
// schedule with the training DynamicCache (each layer's rotated key and value until compute_loss
// returns), to 4.52 the [T, T+1] mask, to 4.50 the rotary tables made as 4.4x's. Against each
// release's trace (4.49.0, 4.50.3, 4.51.3, 4.52.4,
// 4.53.3, 4.54.1, 4.55.4) in fp32, bf16 autocast and full bf16: each phase of step 2 leaves no more
// of the schedule's requests and frees of 4 KiB and more unmatched than 5.17's schedule leaves
// against 5.17's own trace (the trace's CPU-only temporaries aside, such as the mask's float
// temporary of 4.4x), and 5.17's schedule against the release's trace leaves more (the traces tell
// them apart).
// What the schedule of job `c` leaves of `trace`'s phase unmatched: its own requests and frees
// (one way) or those of both (both ways).
std::size_t misses(const std::string& trace, const Case& c, const char* phase, bool both_ways = false) {
  const test::StepMatch m = test::match_step(trace, job_of(c), phase);
  return both_ways ? m.mismatched() : m.unmatched_generated();
}

// The release's trace against its schedule and 5.17's, per phase: the release's no worse than
// 5.17's on 5.17's own trace; 5.17's worse on the release's trace, over the step (when `distinct`).
// `whole_step`: compare the step's total only (see the checkpointing case).
void expect_release_matches(const std::string& name, const Case& now, const char* release, bool both_ways,
                            bool distinct, bool whole_step = false) {
  const std::string trace = name + ".tf" + release;
  Case then = now;
  then.transformers = release;
  ASSERT_NO_THROW(validate_job(job_of(then))) << trace;
  std::size_t own_total = 0, mine_total = 0, crossed_total = 0;
  for (const char* phase : {"forward", "backward"}) {
    const std::size_t own = misses(name, now, phase, both_ways), mine = misses(trace, then, phase, both_ways);
    if (!whole_step) {
      EXPECT_LE(mine, own) << trace << " " << phase;
    }
    own_total += own;
    mine_total += mine;
    crossed_total += misses(trace, now, phase, both_ways);
  }
  EXPECT_LE(mine_total, own_total) << trace;
  if (distinct) {
    EXPECT_GT(crossed_total, mine_total) << trace;
  }
}

TEST(CpuTraceLate4, TheStepMatchesEachRelease) {
  for (const char* release : {"4.49", "4.50", "4.51", "4.52", "4.53", "4.54", "4.55"}) {
    const std::string r = release;
    for (const char* family : {"llama", "qwen2", "opt"}) {
      for (const auto& pr : kTinyPrecisions) {
        // OPT (its cache; its 4-D mask made as Llama's 4.4x one; to 4.51 no `* 1.0`; to 4.53 the
        // legacy cache tuple accelerate converts under autocast), fp32 weights (as traced)
        if (family == std::string("opt") && std::string(pr[1]) != "fp32") continue;
        const std::string preset = std::string(family) + "-tiny";
        expect_release_matches(preset + "-" + pr[0], Case{"", preset.c_str(), pr[1], pr[2]}, release, false, true);
      }
    }
    // gradient checkpointing (Qwen2, traced): use_cache=False, so no cache. Over the whole step:
    // under bf16 autocast with checkpointing a few frees move between forward and backward from one
    // run to the next (two runs of 5.17 itself differ so)
    if (r == "4.49" || r == "4.51" || r == "4.53" || r == "4.55") {
      for (const auto& pr : kTinyPrecisions) {
        if (std::string(pr[0]) != "fp32-eager" && r != "4.53" && r != "4.55") continue;  // (not traced)
        expect_release_matches(std::string("qwen2-tiny-") + pr[0] + "-ckpt",
                               Case{"", "qwen2-tiny", pr[1], pr[2], "eager", true}, release, false, false, true);
      }
    }
    // sdpa (Qwen2; bf16 weights and bf16 autocast: the traced ones): the contiguous copies, and to
    // 4.53 the repeats, counted both ways (what the trace has and the schedule lacks counts too)
    if (r != "4.50" && r != "4.52") {
      for (const auto& [tag, prec, mixed] : {std::tuple<const char*, const char*, const char*>{"bf16", "bf16", "bf16"},
                                             {"bf16mixed", "fp32", "bf16"}}) {
        expect_release_matches(std::string("qwen2-tiny-") + tag + "-sdpa", Case{"", "qwen2-tiny", prec, mixed, "sdpa"},
                               release, true, true);
      }
    }
  }
}

// 4.56 and 4.57 (eager): DynamicLayer.update's torch.cat copies of the rotated key and the value,
// which the attention then runs on (under autocast over fp32 weights an fp32 value, promoted by the
// cat, repeated in fp32 and cast for the matmul). Every request and free of 4 KiB and more in
// forward and backward, both ways: the release's schedule matches its trace as well as 4.55's
// schedule matches 4.55's trace, and 4.55's schedule leaves the copies unmatched on this trace.
TEST(CpuTraceLate4, TheCacheCopiesOf456And457) {
  for (const char* release : {"4.56", "4.57"}) {
    for (const char* family : {"llama", "qwen2", "opt"}) {
      for (const auto& pr : kTinyPrecisions) {
        if (std::string(family) == "opt" && std::string(pr[1]) != "fp32") continue;  // (as 4.54's, traced)
        const std::string preset = std::string(family) + "-tiny", name = preset + "-" + pr[0];
        Case c{"", preset.c_str(), pr[1], pr[2]};
        Case prev = c;
        prev.transformers = "4.55";
        c.transformers = release;
        ASSERT_NO_THROW(validate_job(job_of(c))) << name << " " << release;
        std::size_t mine = 0, own = 0, crossed = 0;
        for (const char* phase : {"forward", "backward"}) {
          mine += misses(name + ".tf" + release, c, phase, true);
          own += misses(name + ".tf4.55", prev, phase, true);
          crossed += misses(name + ".tf" + release, prev, phase, true);
        }
        EXPECT_LE(mine, own) << name << " " << release;
        EXPECT_GT(crossed, mine) << name << " " << release;
      }
    }
    // sdpa in bf16 (Qwen2; bf16 weights and bf16 autocast): no copies any more, and under autocast
    // the kernel gets the cache's fp32 value cast; counted both ways, as 4.49 to 4.55's sdpa
    for (const auto& [tag, prec, mixed] : {std::tuple<const char*, const char*, const char*>{"bf16", "bf16", "bf16"},
                                           {"bf16mixed", "fp32", "bf16"}}) {
      expect_release_matches(std::string("qwen2-tiny-") + tag + "-sdpa", Case{"", "qwen2-tiny", prec, mixed, "sdpa"},
                             release, true, true);
    }
    // with checkpointing the Trainer turns the cache off: 4.55's schedule, over the whole step (a
    // few frees under autocast move between forward and backward from run to run)
    for (const auto& pr : kTinyPrecisions) {
      if (std::string(pr[0]) == "bf16-eager") continue;  // (not traced)
      expect_release_matches(std::string("qwen2-tiny-") + pr[0] + "-ckpt",
                             Case{"", "qwen2-tiny", pr[1], pr[2], "eager", true}, release, false, false, true);
    }
  }
}

// The torch releases between: 2.5 to 2.8 behave as 2.4 (their full slices are SliceBackward nodes),
// 2.9 and 2.10 as 2.11 (none), in the CPU traces of the real Trainer, transformers 4.4x and 5.17
// (which needs torch 2.5 or later) alike. One traced configuration per release and release pair:
// the schedule for that torch leaves each phase of step 2 exactly as matched, both ways, as the
// 2.11 schedule leaves 2.11's own trace of the same configuration (what neither matches is CUDA-only
// or CPU-only work, the same in both); for 2.5 to 2.8 the 2.11 schedule against the release's trace
// leaves the full-slice copies unmatched.
TEST(CpuTraceTorchReleases, EachReleaseMatchesAsItsGroupDoes) {
  struct R {
    const char* base;  // the 2.11 trace (NAME or NAME.tf4.xx)
    Case c;            // the job, its torch set below
    const char* torch;
  };
  auto older = [](const char* name, const char* prec, const char* mixed, const char* release) {
    Case c{name, "llama-tiny", prec, mixed};
    c.transformers = release;
    return c;
  };
  const R runs[] = {
      {"qwen2-tiny-bf16mixed-eager.tf4.45", [] {
         Case c{"", "qwen2-tiny", "fp32", "bf16"};
         c.transformers = "4.45";
         return c;
       }(), "2.4"},
      {"llama-tiny-fp32-eager.tf4.43", older("", "fp32", "no", "4.43"), "2.5"},
      {"llama-tiny-bf16mixed-eager.tf4.45", older("", "fp32", "bf16", "4.45"), "2.6"},
      {"llama-tiny-bf16-eager.tf4.48", older("", "bf16", "bf16", "4.48"), "2.7"},
      {"llama-tiny-fp32-eager.tf4.45", older("", "fp32", "no", "4.45"), "2.8"},
      {"llama-tiny-fp32-eager", Case{"", "llama-tiny", "fp32", "no"}, "2.8"},
      {"llama-tiny-bf16mixed-eager", Case{"", "llama-tiny", "fp32", "bf16"}, "2.8"},
      {"qwen2-tiny-bf16-eager", Case{"", "qwen2-tiny", "bf16", "bf16"}, "2.8"},
      {"opt-tiny-bf16mixed-eager", Case{"", "opt-tiny", "fp32", "bf16"}, "2.8"},
      {"qwen2-tiny-fp32-eager-ckpt", Case{"", "qwen2-tiny", "fp32", "no", "eager", true}, "2.8"},
      {"llama-tiny-bf16mixed-eager", Case{"", "llama-tiny", "fp32", "bf16"}, "2.9"},
      {"opt-tiny-fp32-eager-ckpt", Case{"", "opt-tiny", "fp32", "no", "eager", true}, "2.9"},
      {"qwen2-tiny-bf16-sdpa", Case{"", "qwen2-tiny", "bf16", "bf16", "sdpa"}, "2.10"},
      {"llama-tiny-bf16-eager", Case{"", "llama-tiny", "bf16", "bf16"}, "2.10"},
  };
  for (const R& r : runs) {
    const std::string trace = std::string(r.base) + ".torch" + r.torch;
    Case now = r.c;
    now.torch = kSupportedTorch;
    Case then = r.c;
    then.torch = r.torch;
    for (const char* phase : {"forward", "backward"}) {
      const std::size_t own = test::match_step(r.base, job_of(now), phase).mismatched();
      const std::size_t release = test::match_step(trace, job_of(then), phase).mismatched();
      EXPECT_EQ(release, own) << trace << " " << phase;
      if (records_full_slices(r.torch) && std::string(phase) == "backward") {
        EXPECT_GT(test::match_step(trace, job_of(now), phase).mismatched(), release) << trace;
      }
    }
  }
}

TEST(CpuTraceTorch24, TheStepMatchesTheTorch24Trace) {
  for (const char* version : kOlderReleases) {
    for (const auto& pr : kTinyPrecisions) {
      const std::string trace211 = std::string("llama-tiny-") + pr[0] + ".tf" + version;
      const std::string trace24 = trace211 + ".torch" + kOlderTorch;
      Case now{"", "llama-tiny", pr[1], pr[2]};
      now.transformers = version;
      Case older = now;
      older.torch = kOlderTorch;
      const std::size_t own = mismatched(now, trace211, "backward");
      const std::size_t older_own = mismatched(older, trace24, "backward");
      const std::size_t crossed = mismatched(now, trace24, "backward");
      EXPECT_LE(older_own, own) << trace24;
      // 8 copies per layer (4 for the key, 4 for the value), 1 for the logits, 3 for the final
      // norm's output from 4.45: each an allocation and a free
      const std::size_t copies = 8 * 2 + 1 + (std::string(version) >= "4.45" ? 3 : 0);
      EXPECT_EQ(crossed, older_own + 2 * copies) << trace24;
      // the forward has no full-slice copies: the same either way
      EXPECT_EQ(mismatched(older, trace24, "forward"), mismatched(now, trace211, "forward")) << trace24;
    }
  }
}

}  // namespace
}  // namespace scalelab::predict
