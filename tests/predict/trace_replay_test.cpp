// The allocator replica against PyTorch itself: the caching allocator's recorded requests of real
// Trainer jobs on an H200 (bench/gpu/hf_memory.py --trace; tests/golden/predict/*.events made by
// tools/predict/trace_to_events.py) replayed through the replica must give the segment peak the
// GPU's allocator reached, to the byte, and cudaMalloc a new segment at exactly the requests where
// the GPU's did (the goldens' `s ADDR` lines). Once with the replica's own segment addresses (each
// new segment below the others, as the driver placed them in these runs) and once with the
// recorded ones.
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "predict/caching_allocator.h"
#include "model/config.h"
#include "predict/hf_predict.h"
#include "predict/hf_schedule.h"
#include "event_log.h"

namespace scalelab::predict {
namespace {

struct Replay {
  std::size_t measured_segment_peak = 0;
  std::size_t peak_reserved = 0;
  std::size_t allocations = 0;
  std::size_t recorded_segments = 0;   // `s` lines: the GPU's cudaMallocs
  std::size_t segment_mismatches = 0;  // requests where exactly one of the two cudaMalloc'd
  std::size_t first_mismatch = 0;      // its allocation number
  std::size_t small_pool_mismatches = 0;  // of those, requests of 1 MiB or less (the small pool's)
};

// `recorded_addresses`: each new segment at the base address the GPU's cudaMalloc gave it instead
// of the replica's own placement.
Replay replay(const std::string& name, bool recorded_addresses) {
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/" + name + ".events");
  EXPECT_TRUE(in.good()) << name;
  Replay r;
  CachingAllocator a(std::size_t{1} << 50);
  std::vector<BlockId> ids;
  std::string line;
  bool gpu_segment = false;  // the GPU cudaMalloc'd for the next request
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string op;
    std::size_t v = 0;
    ls >> op >> v;
    if (op == "max_reserved") {
      r.measured_segment_peak = v;
    } else if (op == "s") {
      gpu_segment = true;
      ++r.recorded_segments;
      if (recorded_addresses) a.place_next_segment_at(v);
    } else if (op == "a") {
      const std::size_t before = a.stats().num_device_mallocs;
      MallocResult m = a.malloc(v);
      EXPECT_FALSE(m.oom);
      // the first request (the context's 4-byte temporary) predates the recording
      const bool replica_segment = a.stats().num_device_mallocs != before && !ids.empty();
      if (replica_segment != gpu_segment) {
        if (r.segment_mismatches++ == 0) r.first_mismatch = ids.size();
        if (v <= (std::size_t{1} << 20)) ++r.small_pool_mismatches;
      }
      gpu_segment = false;
      ids.push_back(m.id);
    } else if (op == "f") {
      a.free(ids.at(v));
    }
  }
  r.peak_reserved = a.stats().peak_reserved;
  r.allocations = ids.size();
  return r;
}

class TraceReplay : public ::testing::TestWithParam<const char*> {};

// Every cudaMalloc of the replica is the GPU's, at the same request. In the OPT 4.45.2 traces
// the small pool disagreed once (the GPU made a second 2 MiB segment for a 16 KiB request where
// the replica found room) until the replay freed the harness's context tensor at once, as
// torch.empty(1) does: with a live 512-byte block at the first small segment's base, every later
// small block sat 512 bytes off the GPU's and the segment filled differently.
void expect_segments_match(const std::string& name, const Replay& r) {
  EXPECT_EQ(r.peak_reserved, r.measured_segment_peak) << name;
  EXPECT_EQ(r.segment_mismatches, 0u) << name << ": first at allocation " << r.first_mismatch << ", "
                                      << r.small_pool_mismatches << " of them in the small pool";
}

TEST_P(TraceReplay, SegmentPeakEqualsTheGpuAllocators) {
  const Replay r = replay(GetParam(), false);
  ASSERT_GT(r.allocations, 5000u);
  ASSERT_GT(r.recorded_segments, 100u);
  expect_segments_match(GetParam(), r);
}

TEST_P(TraceReplay, WithTheRecordedSegmentAddressesToo) { expect_segments_match(GetParam(), replay(GetParam(), true)); }

// The generated schedule against the same traces, request by request: every allocation and free of
// 1 MiB or more in the schedule's first forward appears in the trace's, in the same order (the
// cuBLAS workspace excepted: the trace's first is made before its `forward` marker). This holds
// what the traces taught: under bf16 autocast the query's rope output goes before the key's and
// the probabilities are cast after the scores are rebound (1201 of 1233 before), in fp32 bmm
// saves the repeated key with no contiguous copy of its transpose (890 of 922 before), in full
// bf16 the repeated key goes only after o_proj's output is made (1090 of 1106 before).
// The first `phase` of a trace or schedule, up to the next of `ends` (the traces mark the end of
// backward `backward_end`, the schedule `clip_grad_norm`), 1 MiB and more, without the 32 MiB
// requests (the cuBLAS workspaces; the trace makes its first before its `forward` marker).
std::vector<std::string> first_phase(std::istream& in, const std::string& phase, const std::set<std::string>& ends) {
  std::vector<std::string> out = test::phase_events(in, phase, 1, std::size_t{1} << 20, ends);
  const std::string ws = std::to_string(std::size_t{32} << 20);
  out.erase(std::remove_if(out.begin(), out.end(), [&](const std::string& e) { return e.substr(2) == ws; }), out.end());
  return out;
}

// The job each trace recorded (Llama-3.2-1B or OPT-1.3B without dropout, seq 1024), from its name.
HfJob job_for(const std::string& name) {
  HfJob j;
  const bool opt = name.rfind("opt-", 0) == 0, qwen2 = name.rfind("qwen2-", 0) == 0;
  j.model = preset_config(opt ? "opt-1.3b" : qwen2 ? "qwen2.5-0.5b" : "llama-3.2-1b");
  if (opt) j.model.dropout = 0;  // hf_memory.py runs OPT without dropout
  j.seq_len = 1024;
  j.micro_batch = std::stoi(name.substr(name.find("-mb") + 3));
  const bool bf16_autocast = name.find("bf16mixed") != std::string::npos;
  const bool fp16_autocast = name.find("fp16mixed") != std::string::npos;
  const bool autocast = bf16_autocast || fp16_autocast;
  j.model_precision = name.find("fp32") != std::string::npos || autocast ? "fp32" : "bf16";
  j.mixed_precision = fp16_autocast ? "fp16" : bf16_autocast || j.model_precision == "bf16" ? "bf16" : "no";
  j.attn = name.find("sdpa") != std::string::npos ? "sdpa" : "eager";
  j.fused_kernels = name.find("-liger") != std::string::npos;
  j.activation_checkpointing = name.find("-ckpt") != std::string::npos;
  // `-torchrun1`: started by torchrun with one process (accelerate's DDP over a world of one);
  // `.tfX.Y`: run under an older transformers (bench/gpu/run.sh versions), with the image's torch
  if (name.find("-torchrun1") != std::string::npos) j.launcher = "torchrun";
  if (const std::size_t tf = name.find(".tf"); tf != std::string::npos) {
    j.versions.transformers = name.substr(tf + 3);
    j.versions.torch = "2.11";
  }
  j.steps = 1;
  return j;
}

TEST_P(TraceReplay, TheSchedulesFirstForwardIsTheGpusRequestByRequest) {
  const std::string name = GetParam();
  const HfJob j = job_for(name);
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/" + name + ".events");
  ASSERT_TRUE(in.good());
  std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
  const std::vector<std::string> traced = first_phase(in, "forward", {"backward"}),
                                 generated = first_phase(gen, "forward", {"backward"});
  ASSERT_GT(generated.size(), 200u);  // (OPT in fp32 at micro-batch 4: 236 of 1 MiB and more)
  EXPECT_EQ(test::common_subsequence(traced, generated), generated.size());
}

// And the first backward, request by request. Reading these traces set its order: the lm_head's
// weight gradient before autograd's cuBLAS workspace; fp32's bmm without contiguous copies of the
// output gradient; fp32 RMSNorm's mul gradient added into the residual buffer at once; sdpa's
// one workspace and the key's rotary backward before the query's, each made contiguous for its
// projection; the normalized input gate/up saved released before their gradients are summed.
// Under bf16 autocast: the key's gradient made before the query's and cast after it, repeat_kv's
// value sum first, the rotary backward's g*sin and g*cos each cast to bf16, contiguous copies of
// the projections' gradients, softmax backward's transient freed after its inputs. Every event of
// all four traces' first backward matches (before: 2001 of 2082, 2279 of 2296, 1623 of 1944, 2374
// of 2775).
TEST_P(TraceReplay, TheSchedulesFirstBackwardIsTheGpusRequestByRequest) {
  const std::string name = GetParam();
  const HfJob j = job_for(name);
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/" + name + ".events");
  ASSERT_TRUE(in.good());
  std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
  const std::vector<std::string> traced = first_phase(in, "backward", {"backward_end"}),
                                 generated = first_phase(gen, "backward", {"clip_grad_norm"});
  ASSERT_GT(generated.size(), 700u);  // (OPT in fp32 at micro-batch 4: 779)
  EXPECT_EQ(test::common_subsequence(traced, generated), generated.size());
}

// And what follows backward up to the step's end: gradient clipping (the foreach norms' chunk
// partials sized by the gradients' dtype: 2,340,864 bytes in full bf16, half that before), AdamW's
// lazily made states and foreach temporaries, zero_grad.
TEST_P(TraceReplay, TheSchedulesOptimizerStepIsTheGpusRequestByRequest) {
  const std::string name = GetParam();
  const HfJob j = job_for(name);
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/" + name + ".events");
  ASSERT_TRUE(in.good());
  std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
  // the trace marks `backward_end`, `optimizer_step`, `optimizer_step_end`; the schedule
  // `clip_grad_norm`, `optimizer_step`, `zero_grad`: each read from its first marker to step_end
  std::vector<std::string> traced = first_phase(in, "backward_end", {"step_end"});
  const std::vector<std::string> generated = first_phase(gen, "clip_grad_norm", {"step_end"});
  ASSERT_GT(generated.size(), 300u);
  EXPECT_EQ(test::common_subsequence(traced, generated), generated.size());
}

// What torch.cuda.max_memory_reserved reads at each step's end and max_memory_allocated at the end,
// replaying a request log (`a BYTES ...`, `f N`, `# PHASE`): the trace's, or the generated
// schedule's in the same form (schedule_text).
struct Peaks {
  std::vector<std::size_t> reserved_after_step;
  std::size_t allocated = 0;
};

Peaks replay_peaks(std::istream& in) {
  CachingAllocator a(std::size_t{1} << 50);
  std::vector<BlockId> ids;
  Peaks p;
  std::string line;
  while (std::getline(in, line)) {
    if (line == "# step_end") p.reserved_after_step.push_back(a.stats().peak_reserved);
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string op;
    std::size_t v = 0;
    ls >> op >> v;
    if (op == "a") ids.push_back(a.malloc(v).id);
    if (op == "f") a.free(ids.at(v));
  }
  p.allocated = a.stats().peak_allocated;
  return p;
}

Peaks trace_peaks(const std::string& name) {
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/" + name + ".events");
  EXPECT_TRUE(in.good()) << name;
  return replay_peaks(in);
}

Peaks schedule_peaks(HfJob j) {
  j.steps = 3;
  std::istringstream in(schedule_text(hf_trainer_schedule(j)));
  return replay_peaks(in);
}

// The generated schedule's segment peak after each step equals the GPU's to the byte on every traced
// job: the request sizes alone did not give that; which tensor is freed matters too (the
// same sizes at other addresses), read off the traces: OPT's addmm backward (input gradient first,
// the bias gradient's reduction staging, 64 and 132 MiB), its norms' out-of-place residual sums
// and its final norm's output freed before autocast's cache; up's gradient made before silu's;
// the copy bmm needs of the rotated q once the micro-batch is above 1 (fp32 micro-batch 2: its
// peak comes in step 3, not 2, as on the GPU); and for the small pool's 2 MiB segments, the
// rotary tables' temporaries and the causal mask's boolean patterns (1 MiB at T = 1024).
void expect_step_peaks(const std::string& name, const HfJob& j) {
  const std::vector<std::size_t> traced = trace_peaks(name).reserved_after_step,
                                 generated = schedule_peaks(j).reserved_after_step;
  ASSERT_EQ(traced.size(), 3u);
  EXPECT_EQ(generated, traced);
}

TEST_P(TraceReplay, TheSchedulesPeakAfterEachStepIsTheGpus) { expect_step_peaks(GetParam(), job_for(GetParam())); }

// Allocated bytes at the peak (max_memory_allocated) equal the trace's. Read off the traces to get
// there (they had been 2 KiB to 130 KiB off): the batch is held until the next step's batches are
// fetched, flash sdpa saves a philox seed and offset per layer, nll_loss's target goes as its node
// finishes, and the Trainer keeps the last loss until the next training_step returns and the last
// total norm until the next clipping.
TEST_P(TraceReplay, TheSchedulesAllocatedPeakIsTheGpus) {
  const std::size_t traced = trace_peaks(GetParam()).allocated, generated = schedule_peaks(job_for(GetParam())).allocated;
  EXPECT_EQ(traced, generated);
}

// Qwen2.5-0.5B in bf16 with Liger and gradient checkpointing, micro-batch 8 (its trace is checked
// by its peaks only: a few adjacent frees come in another order, which changes no segment). It was
// −0.08 % and 148 large segments against 146 until the trace showed the recompute's addmm taking
// the autograd thread's own cuBLAS and cuBLASLt workspaces after its output, the recomputed input
// q/k/v saved freed as q's node returns (before its bias reduction), and v's and k's input
// gradients summed out of place.
TEST(TraceReplayQwen2, TheSchedulesPeakAfterEachStepIsTheGpus) {
  HfJob j = job_for("qwen2-bf16-sdpa-mb8-liger-ckpt");
  j.mixed_precision = "no";  // the trace's job: bf16 weights without the Trainer's bf16=True
  const Replay r = replay("qwen2-bf16-sdpa-mb8-liger-ckpt", false);
  EXPECT_EQ(r.peak_reserved, r.measured_segment_peak);
  // to the byte (it was 4 MiB below, 5,295,308,800 against 5,299,503,104)
  const Peaks traced = trace_peaks("qwen2-bf16-sdpa-mb8-liger-ckpt"), generated = schedule_peaks(j);
  EXPECT_EQ(generated.reserved_after_step, traced.reserved_after_step);
  EXPECT_EQ(traced.allocated, generated.allocated);
}

// sdpa's backward (full bf16, micro-batch 6): after dq, dk, dv, one workspace request of exactly
// softmax_d + the fp32 dq accumulator + the expanded dk and dv + 256 bytes, as the trace has it.
TEST(TraceReplaySdpa, TheBackwardWorkspaceIsOneRequestOfTheTracesSize) {
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/llama-bf16-sdpa-mb6.events");
  ASSERT_TRUE(in.good());
  const std::size_t ws = 6 * 32 * 1024 * 4 + 6 * 1024 * 2048 * 4 + 2 * 6 * 1024 * 2048 * 2 + 256;
  ASSERT_EQ(ws, 101449984u);
  std::size_t traced = 0;
  std::string line;
  while (std::getline(in, line)) traced += line == "a " + std::to_string(ws);
  HfJob j = job_for("llama-bf16-sdpa-mb6");
  j.steps = 3;
  std::size_t generated = 0;
  for (const ScheduleEvent& e : hf_trainer_schedule(j)) generated += e.kind == ScheduleEvent::kAlloc && e.bytes == ws;
  EXPECT_EQ(traced, 3u * 16);  // one per layer and step
  EXPECT_EQ(generated, traced);
}

INSTANTIATE_TEST_SUITE_P(H200, TraceReplay,
                         ::testing::Values("llama-bf16mixed-eager-mb6", "llama-bf16-sdpa-mb6", "llama-bf16-eager-mb6",
                                           "llama-fp32-eager-mb1", "llama-fp32-eager-mb2", "llama-fp16mixed-eager-mb6",
                                           "opt-bf16mixed-eager-mb4",
                                           // under transformers 4.45.2 and 4.55.4 (the H200, 2026-11-27)
                                           "llama-fp32-eager-mb6.tf4.45", "llama-fp32-eager-mb6-torchrun1.tf4.45",
                                           "opt-fp32-eager-mb4.tf4.45", "opt-bf16mixed-eager-mb4.tf4.45",
                                           "llama-fp32-eager-mb6.tf4.55", "llama-bf16-sdpa-mb6.tf4.55",
                                           "opt-fp32-eager-mb4.tf4.55"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-' || c == '.') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace scalelab::predict
