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
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/config.h"
#include "predict/hf_predict.h"
#include "predict/hf_schedule.h"
#include "event_log.h"

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
  const char* golden;
  const char* prec;
  const char* mixed;
  bool ckpt = false;
  std::int64_t bucket_cap_mb = 0;
  std::int64_t grad_accum = 1;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.golden; }

HfJob job_of(const Case& c) {
  HfJob j;
  j.model = preset_config("llama-tiny");  // widened as the tracer's DDP_SHAPE
  j.model.hidden_size = 128;
  j.model.intermediate_size = 512;
  j.model.head_dim = 32;
  j.model.vocab_size = 4096;
  j.seq_len = 32;
  j.micro_batch = 2;
  j.model_precision = c.prec;
  j.mixed_precision = c.mixed;
  j.activation_checkpointing = c.ckpt;
  j.steps = 2;
  j.ranks = 2;
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
  const std::size_t logits32 = 2 * 32 * 4096 * 4, logits = 2 * 32 * 4096 * e;
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

// broadcast_buffers: the rotary tables (2 x head_dim/2 fp32 = 128 bytes) broadcast before a forward
// when the forward before it synchronized: before every forward without gradient accumulation,
// before each step's first micro-step with it (the others follow no_sync forwards).
TEST_P(DdpTrace, BuffersAreBroadcastBeforeTheForwardsThatFollowASynchronizedOne) {
  const Case& c = GetParam();
  const HfJob j = job_of(c);
  std::ifstream in = golden(c);
  std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
  const std::vector<int> traced = before_forward(in, 128), generated = before_forward(gen, 128);
  EXPECT_EQ(generated, traced);
  ASSERT_EQ(traced.size(), static_cast<std::size_t>(j.steps * j.grad_accum_steps));
  for (std::size_t f = 0; f < traced.size(); ++f)
    EXPECT_EQ(traced[f] > 0, f % j.grad_accum_steps == 0) << "forward " << f;
}

INSTANTIATE_TEST_SUITE_P(LlamaDdp, DdpTrace,
                         ::testing::Values(Case{"llama-ddp-fp32-eager-ddp2", "fp32", "no"},
                                           Case{"llama-ddp-bf16-eager-ddp2", "bf16", "bf16"},
                                           Case{"llama-ddp-bf16mixed-eager-ckpt-ddp2", "fp32", "bf16", true},
                                           Case{"llama-ddp-fp32-eager-cap1-ddp2", "fp32", "no", false, 1},
                                           Case{"llama-ddp-fp32-eager-ga2-ddp2", "fp32", "no", false, 0, 2},
                                           Case{"llama-ddp-bf16mixed-eager-ckpt-ga2-ddp2", "fp32", "bf16", true, 0, 2}),
                         [](const auto& info) {
                           std::string n = info.param.golden;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace scalelab::predict
