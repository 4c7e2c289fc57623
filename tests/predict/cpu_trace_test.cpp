// The generated schedule against the real Trainer traced on the CPU (tools/predict/trace_hf.py,
// goldens in tests/golden/predict/cpu/): what autograd saves for backward is the same on the CPU
// as on CUDA, so the tensors of step 2's forward still live when its backward starts (saved
// activations, the fp32 log-softmax, labels, loss scalars) must be the same sizes, one for one.
// Kernel temporaries and cuBLAS workspaces are CUDA's own and are checked against the H200
// traces instead (trace_replay_test.cpp, hf_predict_test.cpp).
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "model/config.h"
#include "predict/hf_predict.h"
#include "predict/hf_schedule.h"

namespace scalelab::predict {
namespace {

// Sizes (with multiplicity) allocated during step 2's forward and live at its backward marker.
std::multiset<std::size_t> saved_at_backward(std::istream& in) {
  std::map<std::size_t, std::pair<std::size_t, bool>> allocs;  // index -> (bytes, born in step 2 forward)
  std::set<std::size_t> live;
  std::string line, phase;
  int step = 0;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0) {
      std::istringstream ls(line.substr(2));
      std::string ph;
      ls >> ph;
      if (ph == "forward") ++step;
      if (ph == "backward" && step == 2) {
        std::multiset<std::size_t> out;
        for (std::size_t i : live)
          if (allocs[i].second) out.insert(allocs[i].first);
        return out;
      }
      phase = ph;
      continue;
    }
    std::istringstream ls(line);
    std::string op;
    std::size_t v = 0;
    ls >> op >> v;
    if (op == "a") {
      allocs[n] = {v, step == 2 && phase == "forward"};
      live.insert(n++);
    } else if (op == "f") {
      live.erase(v);
    }
  }
  return {};
}

struct Case {
  const char* golden;
  const char* prec;
  const char* mixed;
};

class CpuTrace : public ::testing::TestWithParam<Case> {};

TEST_P(CpuTrace, SavedForBackwardMatchesTheRealTrainer) {
  const Case& c = GetParam();
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/cpu/" + c.golden + ".cpu.events");
  ASSERT_TRUE(in.good()) << c.golden;
  const auto traced = saved_at_backward(in);
  ASSERT_GT(traced.size(), 30u);
  HfJob j;
  j.model = preset_config("llama-tiny");
  j.seq_len = 32;
  j.micro_batch = 2;
  j.model_precision = c.prec;
  j.mixed_precision = c.mixed;
  j.steps = 2;
  std::istringstream gen(schedule_text(hf_trainer_schedule(j)));
  const auto generated = saved_at_backward(gen);
  EXPECT_EQ(generated, traced);
}

INSTANTIATE_TEST_SUITE_P(LlamaTiny, CpuTrace,
                         ::testing::Values(Case{"llama-tiny-fp32-eager", "fp32", "no"},
                                           Case{"llama-tiny-bf16mixed-eager", "fp32", "bf16"},
                                           Case{"llama-tiny-bf16-eager", "bf16", "bf16"}),
                         [](const auto& info) {
                           std::string n = info.param.golden;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace scalelab::predict
