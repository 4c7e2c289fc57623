// DDP per rank (--ranks > 1) against a real 2-process torchrun-style DDP Trainer on the CPU (gloo),
// traced on rank 0 (tools/predict/trace_hf.py, tests/golden/predict/cpu/llama-ddp-*-ddp2): the
// tensors DistributedDataParallel allocates when the Trainer wraps the model (the flat broadcast
// of the module states, the Reducer's gradient buckets in their order and sizes), the bucket
// rebuild before step 2 under checkpointing, and _DDPSink's clone of the logits in every forward;
// with gradient accumulation (the Trainer's no_sync micro-steps) the rebuild after the first
// synchronized backward and the buffers' broadcast only after a synchronized forward.
// Only tensors of 1 KiB and more are compared: the smaller ones are host scalars and metadata
// under CUDA (and the CPU trace also has the DataLoader's).
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "predict/hf_predict.h"
#include "predict/hf_schedule.h"
#include "event_log.h"
#include "step_match.h"

namespace scalelab::predict {
namespace {

constexpr std::size_t kMin = 1024;

// "a SIZE" / "f SIZE" for allocations of kMin bytes or more between the `from` marker (its
// `nth` occurrence) and the next `# forward`; frees only when `frees`.
std::vector<std::string> window(std::istream& in, const std::string& from, int nth, bool frees) {
  std::vector<std::string> out = test::phase_events(in, from, nth, kMin, {"forward"}, {}, false);
  if (!frees) out.erase(std::remove_if(out.begin(), out.end(), [](const std::string& e) { return e[0] == 'f'; }), out.end());
  return out;
}

// Allocations of exactly `bytes` in each forward phase, in order.
std::vector<int> per_forward(std::istream& in, std::size_t bytes) {
  std::vector<int> out;
  std::string line, phase;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string op;
    ls >> op;
    if (op == "#") {
      ls >> phase;
      if (phase == "forward") out.push_back(0);
      continue;
    }
    std::size_t v = 0;
    ls >> v;
    if (op == "a" && phase == "forward" && v == bytes) ++out.back();
  }
  return out;
}

// Allocations of exactly `bytes` between the phase marker before each forward and that forward:
// what DDP's _pre_forward makes (the buffers' flat broadcast).
std::vector<int> before_forward(std::istream& in, std::size_t bytes) {
  std::vector<int> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string op;
    ls >> op;
    if (op == "#") {
      std::string ph;
      ls >> ph;
      if (ph == "forward") out.push_back(n);
      if (!ph.empty()) n = 0;
      continue;
    }
    std::size_t v = 0;
    ls >> v;
    if (op == "a" && v == bytes) ++n;
  }
  return out;
}

struct Case {
  std::string golden;
  const char* prec;
  const char* mixed;
  bool ckpt = false;
  std::int64_t bucket_cap_mb = 0;
  std::int64_t grad_accum = 1;
  std::int64_t ranks = 2;              // 1: torchrun with one process ("-torchrun1"), DDP all the same
  std::string transformers = kSupportedTransformers;
  std::string torch = kSupportedTorch;
  std::string preset = "llama-ddp";  // llama-ddp: llama-tiny widened as the tracer's DDP_SHAPE
  std::string attn = "eager";
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.golden; }

HfJob job_of(const Case& c) {
  HfJob j;
  if (c.preset == "llama-ddp") {
    j.model = preset_config("llama-tiny");  // widened as the tracer's DDP_SHAPE
    j.model.hidden_size = 128;
    j.model.intermediate_size = 512;
    j.model.head_dim = 32;
    j.model.vocab_size = 4096;
  } else {
    j.model = preset_config(c.preset);  // qwen2-tiny, opt-tiny (residual dropout 0)
  }
  j.attn = c.attn;
  j.seq_len = 32;
  j.micro_batch = 2;
  j.model_precision = c.prec;
  j.mixed_precision = c.mixed;
  j.activation_checkpointing = c.ckpt;
  j.steps = 2;
  j.ranks = c.ranks;
  j.launcher = "torchrun";
  j.versions.transformers = c.transformers;
  j.cpu_kernels = true;  // compared with CPU traces
  j.versions.torch = c.torch;
  j.ddp_bucket_cap_mb = c.bucket_cap_mb;
  j.grad_accum_steps = c.grad_accum;
  return j;
}

std::ifstream golden(const Case& c) {
  return std::ifstream(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/cpu/" + c.golden + ".cpu.events");
}

class DdpTrace : public ::testing::TestWithParam<Case> {};

TEST_P(DdpTrace, ConstructionMatchesTheRealTrainer) {
  const Case& c = GetParam();
  std::ifstream in = golden(c);
  ASSERT_TRUE(in.good()) << c.golden;
  // With checkpointing the CPU trace shows no free of the flat broadcast buffer before the first
  // forward (nor later): not explained yet, so only the allocations are compared there.
  const bool frees = !c.ckpt;
  const auto traced = window(in, "ddp_init", 1, frees);
  std::istringstream gen(schedule_text(hf_trainer_schedule(job_of(c))));
  const auto generated = window(gen, "ddp_init", 1, frees);
  ASSERT_GE(traced.size(), 2u);
  EXPECT_EQ(generated, traced);
}

TEST_P(DdpTrace, EachForwardMatchesTheRealTrainer) {
  const Case& c = GetParam();
  const HfJob j = job_of(c);
  const std::size_t e = j.model_precision == "bf16" ? 2 : 4;
  const std::size_t v = static_cast<std::size_t>(j.model.vocab_size);
  const std::size_t logits32 = 2 * 32 * v * 4, logits = 2 * 32 * v * e;
  for (std::size_t bytes : {logits, logits32}) {
    std::ifstream in = golden(c);
    std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
    EXPECT_EQ(per_forward(gen, bytes), per_forward(in, bytes)) << bytes;
  }
  // before step 2's forward: the buckets rebuilt in gradient-ready order (checkpointing), or nothing
  std::ifstream in = golden(c);
  std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
  EXPECT_EQ(window(gen, "step_end", 1, true), window(in, "step_end", 1, true));
}

// broadcast_buffers: the rotary tables (2 x head_dim/2 fp32 = 128 bytes; 4.4x: 3 x) broadcast before a forward
// when the forward before it synchronized: before every forward without gradient accumulation,
// before each step's first micro-step with it (the others follow no_sync forwards).
TEST_P(DdpTrace, BuffersAreBroadcastBeforeTheForwardsThatFollowASynchronizedOne) {
  const Case& c = GetParam();
  const HfJob j = job_of(c);
  if (j.model.family == ModelFamily::kOPT) {  // no buffers (its positions are learned parameters)
    for (const ScheduleEvent& e : hf_trainer_schedule(j))
      EXPECT_NE(std::string(e.label), "DDP broadcast of buffers (flat)");
    return;
  }
  std::ifstream in = golden(c);
  std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
  // the rotary inv_freq tables: the model's inv_freq and original_inv_freq, or under 4.43 to 4.47
  // the model's inv_freq and each layer's own (head_dim / 2 fp32 each). 4.48 has the model's
  // inv_freq alone, which is broadcast in place (one tensor: no flat copy, schedule or trace; the
  // trace's 64-byte allocation before each forward is the CPU batch's, as in every release).
  const std::size_t one = static_cast<std::size_t>(j.model.head_dim / 2 * 4);
  if (c.transformers == "4.48" || is_late4_transformers(c.transformers)) {  // (4.49 to 4.55 as 4.48)
    for (int n : before_forward(gen, one)) EXPECT_EQ(n, 0);
    return;
  }
  const std::size_t flat = one * (is_older_transformers(c.transformers) ? j.model.num_hidden_layers + 1 : 2);
  const std::vector<int> traced = before_forward(in, flat), generated = before_forward(gen, flat);
  EXPECT_EQ(generated, traced);
  ASSERT_EQ(traced.size(), static_cast<std::size_t>(j.steps * j.grad_accum_steps));
  for (std::size_t f = 0; f < traced.size(); ++f)
    EXPECT_EQ(traced[f] > 0, f % j.grad_accum_steps == 0) << "forward " << f;
}

// torchrun with one process (the reference practice's single-GPU jobs): accelerate wraps the model
// in DDP all the same, traced for the current release and each older one, in fp32, bf16 autocast
// and full bf16, under torch 2.11 and (the older releases) torch 2.4: NAME-torchrun1[.tfR[.torch2.4]].
constexpr const char* kTorchrunPrecisions[][3] = {{"fp32", "fp32", "no"}, {"bf16mixed", "fp32", "bf16"},
                                                  {"bf16", "bf16", "bf16"}};
constexpr const char* kOlderReleases[] = {"4.43", "4.44", "4.45", "4.46", "4.47", "4.48"};
constexpr const char* kLate4Releases[] = {"4.49", "4.53", "4.55", "4.56", "4.57"};  // traced of 4.49 to 4.57 (fp32, bf16 autocast, full bf16)

Case torchrun1(const char* const (&p)[3], const std::string& transformers, const std::string& torch) {
  Case c{std::string("llama-ddp-") + p[0] + "-eager-torchrun1", p[1], p[2]};
  c.ranks = 1;
  c.transformers = transformers;
  c.torch = torch;
  if (transformers != kSupportedTransformers) c.golden += ".tf" + transformers;
  if (torch != kSupportedTorch) c.golden += ".torch" + torch;
  return c;
}

// OPT (fp32 weights, with or without bf16 autocast) under one torchrun process and an older release.
Case opt_torchrun1(bool autocast, const std::string& release) {
  Case c{std::string("opt-tiny-") + (autocast ? "bf16mixed" : "fp32") + "-eager-torchrun1.tf" + release, "fp32",
         autocast ? "bf16" : "no"};
  c.ranks = 1;
  c.preset = "opt-tiny";
  c.transformers = release;
  return c;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases = {Case{"llama-ddp-fp32-eager-ddp2", "fp32", "no"},
                             Case{"llama-ddp-bf16-eager-ddp2", "bf16", "bf16"},
                             Case{"llama-ddp-bf16mixed-eager-ckpt-ddp2", "fp32", "bf16", true},
                             Case{"llama-ddp-fp32-eager-cap1-ddp2", "fp32", "no", false, 1},
                             Case{"llama-ddp-fp32-eager-ga2-ddp2", "fp32", "no", false, 0, 2},
                             Case{"llama-ddp-bf16mixed-eager-ckpt-ga2-ddp2", "fp32", "bf16", true, 0, 2}};
  // two ranks under the older releases (torch 2.11 with 4.45, torch 2.4 with 4.46)
  Case c{"llama-ddp-fp32-eager-ddp2.tf4.45", "fp32", "no"};
  c.transformers = "4.45";
  cases.push_back(c);
  c.golden = "llama-ddp-fp32-eager-ddp2.tf4.46.torch2.4";
  c.transformers = "4.46";
  c.torch = kOlderTorch;
  cases.push_back(c);
  // the other families under one torchrun process (their tiny shapes: one gradient bucket each)
  for (const auto& [golden, preset, prec, mixed, attn] :
       {std::tuple<const char*, const char*, const char*, const char*, const char*>{
            "qwen2-tiny-fp32-eager-torchrun1", "qwen2-tiny", "fp32", "no", "eager"},
        {"qwen2-tiny-bf16-sdpa-torchrun1", "qwen2-tiny", "bf16", "bf16", "sdpa"},
        {"opt-tiny-fp32-eager-torchrun1", "opt-tiny", "fp32", "no", "eager"},
        {"opt-tiny-bf16mixed-eager-torchrun1", "opt-tiny", "fp32", "bf16", "eager"}}) {
    Case f{golden, prec, mixed};
    f.ranks = 1;
    f.preset = preset;
    f.attn = attn;
    cases.push_back(f);
  }
  // OPT under one torchrun process with the older releases that write its attention inline, and
  // with 4.55 to 4.57 (their DynamicCache object: a pytree node, which _DDPSink clones, to 4.55)
  for (const char* release : {"4.43", "4.44", "4.45", "4.46", "4.47", "4.48", "4.49", "4.50", "4.52", "4.53", "4.55", "4.56", "4.57"}) {
    for (bool autocast : {false, true}) cases.push_back(opt_torchrun1(autocast, release));
  }
  // 4.49, 4.53, 4.55, 4.56 and 4.57 (their DynamicCache object, a pytree node from 4.50 to 4.55), and 4.50 in bf16 autocast
  for (const auto& p : kTorchrunPrecisions)
    for (const char* release : kLate4Releases) cases.push_back(torchrun1(p, release, kSupportedTorch));
  cases.push_back(torchrun1(kTorchrunPrecisions[1], "4.50", kSupportedTorch));
  for (const auto& p : kTorchrunPrecisions) {
    cases.push_back(torchrun1(p, kSupportedTransformers, kSupportedTorch));
    for (const char* release : kOlderReleases)
      for (const char* torch : {kSupportedTorch, kOlderTorch}) cases.push_back(torchrun1(p, release, torch));
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(LlamaDdp, DdpTrace, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) {
                           std::string n = info.param.golden;
                           for (char& ch : n)
                             if (ch == '-' || ch == '.') ch = '_';
                           return n;
                         });

// The whole of step 2's forward and backward under torchrun with one process, every request and
// free of 4 KiB and more in order: each older release (its DynamicCache's keys and values are
// outputs too, so _DDPSink clones them with the logits, and the originals go at once) leaves no
// more of its schedule unmatched in its trace than the current release does in its own (the
// unmatched are CUDA-only temporaries, such as the softmax backward's grad*out).
std::size_t unmatched(const Case& c, const std::string& phase) {
  return test::match_step(c.golden, job_of(c), phase).unmatched_generated();
}

// The end of the forward, event for event (1 KiB and more), from the logits to the backward marker:
// under 4.45 to 4.47 _DDPSink clones the logits and then every cached key and value (the legacy
// cache tuple), the originals go (logits first, the cache last entry first), and the clones go when
// compute_loss returns; with 4.43 and 4.44 (no cache) and 4.48 (a DynamicCache object, which it
// does not flatten) only the logits are cloned. 4.50 to 4.55 register DynamicCache as a pytree
// node, so _DDPSink's tree_flatten enters it and clones every key, then every value; 4.49, 4.56 and
// 4.57 register none (torch 2.11 only).
TEST(DdpTraceTorchrun, DdpClonesTheCacheWithTheLogits) {
  std::vector<std::pair<std::string, std::string>> runs;
  for (const char* release : kOlderReleases)
    for (const char* torch : {kSupportedTorch, kOlderTorch}) runs.emplace_back(release, torch);
  for (const char* release : kLate4Releases) runs.emplace_back(release, kSupportedTorch);
  for (const auto& p : kTorchrunPrecisions)
    for (const auto& [release_s, torch_s] : runs) {
        const char* release = release_s.c_str();
        const char* torch = torch_s.c_str();
        const Case c = torchrun1(p, release, torch);
        const HfJob j = job_of(c);
        const std::size_t e = c.prec == std::string("bf16") ? 2 : 4;
        // the first logits-sized allocation of the forward: the lm_head's output
        const std::size_t logits = static_cast<std::size_t>(j.micro_batch * j.seq_len * j.model.vocab_size) * e;
        auto tail = [&](std::istream& in) {
          std::vector<std::string> out;
          bool on = false;
          for (const std::string& ev : test::phase_events(in, "forward", 2, 1024, {"backward"}, {}, false)) {
            if (ev == "a " + std::to_string(logits)) on = true;
            if (on) out.push_back(ev);
          }
          return out;
        };
        std::ifstream in = golden(c);
        ASSERT_TRUE(in.good()) << c.golden;
        std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
        const std::vector<std::string> generated = tail(gen);
        // the CPU's bf16 GEMM packs its operand into a temporary, freed at once, of a size the
        // schedule never allocates here: CPU-only, dropped
        std::set<std::string> sizes;
        for (const std::string& ev : generated) sizes.insert(ev.substr(2));
        const std::vector<std::string> raw = tail(in);
        std::vector<std::string> traced;
        for (std::size_t i = 0; i < raw.size(); ++i) {
          if (i + 1 < raw.size() && raw[i][0] == 'a' && raw[i + 1] == "f " + raw[i].substr(2) &&
              sizes.count(raw[i].substr(2)) == 0) {
            ++i;
            continue;
          }
          traced.push_back(raw[i]);
        }
        const std::size_t kv = static_cast<std::size_t>(j.micro_batch * j.seq_len * j.model.num_key_value_heads *
                                                        j.model.head_dim);
        // 4.48 returns the DynamicCache object, which _DDPSink does not flatten: no clones
        const bool cache = (std::string(release) >= "4.45" && std::string(release) <= "4.47") ||
                           (std::string(release) >= "4.50" && std::string(release) <= "4.55");
        // the clones of the cache: one per key and value of each layer, of some dtype
        std::size_t kv_clones = 0;
        for (const std::string& ev : traced)
          if (ev == "a " + std::to_string(kv * 4) || ev == "a " + std::to_string(kv * 2)) ++kv_clones;
        EXPECT_GE(kv_clones, cache ? 2 * static_cast<std::size_t>(j.model.num_hidden_layers) : 0) << c.golden;
        EXPECT_EQ(generated, traced) << c.golden;
      }
}

// OPT under one torchrun process, the forward's end event for event (4 KiB and more) from the
// logits' clone on: under 4.49 to 4.53 _DDPSink clones its legacy cache tuple item by item (under
// autocast accelerate's fp32 copies of it), under 4.55 its DynamicCache (a pytree node) keys
// first, under 4.56 and 4.57 nothing but the logits.
TEST(DdpTraceTorchrun, OptClonesItsCacheAsEachReleaseReturnsIt) {
  for (const char* release : {"4.49", "4.50", "4.52", "4.53", "4.55", "4.56", "4.57"}) {
    for (bool autocast : {false, true}) {
      const Case c = opt_torchrun1(autocast, release);
      const HfJob j = job_of(c);
      const std::string clone = "a " + std::to_string(j.micro_batch * j.seq_len * j.model.vocab_size * 4);
      auto tail = [&](std::istream& in) {
        const std::vector<std::string> ev = test::phase_events(in, "forward", 2, 4096, {"backward"}, {}, false);
        std::size_t at = ev.size();
        for (std::size_t i = 0; i < ev.size(); ++i)
          if (ev[i] == clone) at = i;  // the last allocation of the fp32 logits' size: the clone
        return std::vector<std::string>(ev.begin() + static_cast<std::ptrdiff_t>(std::min(at, ev.size())), ev.end());
      };
      std::ifstream in = golden(c);
      ASSERT_TRUE(in.good()) << c.golden;
      std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
      const std::vector<std::string> traced = tail(in), generated = tail(gen);
      EXPECT_GT(traced.size(), 2u) << c.golden;
      EXPECT_EQ(generated, traced) << c.golden;
    }
  }
}

// Qwen2 (eager and sdpa) and OPT under one torchrun process: step 2's forward and backward leave no
// more of the schedule unmatched in the trace than the same job started by python leaves in its own
// trace (DDP adds the buckets and broadcasts at construction and _DDPSink's clones in the forward,
// every one of them matched).
TEST(DdpTraceTorchrun, QwenAndOptMatchAsWithoutDdp) {
  for (const Case& c : all_cases()) {
    if (c.preset == "llama-ddp") continue;
    // NAME-torchrun1[.tfX.Y] beside NAME[.tfX.Y] (OPT under 4.43 to 4.47: its legacy cache tuple is
    // cloned by _DDPSink with the logits)
    const std::size_t at = c.golden.find("-torchrun1");
    const std::string base = c.golden.substr(0, at) + c.golden.substr(at + std::string("-torchrun1").size());
    const HfJob j = job_of(c);
    HfJob alone = j;
    alone.launcher = "python";
    for (const char* phase : {"forward", "backward"}) {
      const test::StepMatch ddp = test::match_step(c.golden, j, phase);
      const test::StepMatch own = test::match_step(base, alone, phase);
      EXPECT_LE(ddp.unmatched_generated(), own.unmatched_generated()) << c.golden << " " << phase;
      if (std::string(phase) == "forward") {  // _DDPSink's clones (backward copies into the buckets: no allocation)
        EXPECT_GT(ddp.generated, own.generated) << c.golden << ": no DDP in the schedule";
      }
    }
  }
}

TEST(DdpTraceTorchrun, EveryReleaseMatchesItsTraceAsTheCurrentOneDoes) {
  for (const auto& p : kTorchrunPrecisions) {
    const Case now = torchrun1(p, kSupportedTransformers, kSupportedTorch);
    for (const char* phase : {"forward", "backward"}) {
      const std::size_t own = unmatched(now, phase);
      for (const char* release : kLate4Releases) {
        const Case c = torchrun1(p, release, kSupportedTorch);
        EXPECT_LE(unmatched(c, phase), own) << c.golden << " " << phase;
      }
      for (const char* release : kOlderReleases)
        for (const char* torch : {kSupportedTorch, kOlderTorch}) {
          const Case c = torchrun1(p, release, torch);
          EXPECT_LE(unmatched(c, phase), own) << c.golden << " " << phase;
        }
    }
  }
}

}  // namespace
}  // namespace scalelab::predict

