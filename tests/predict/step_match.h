#pragma once
// One phase of one step of a recorded CPU trace of the real Trainer beside the generated schedule
// of the same job: every request and free of `min_bytes` and more, in order (event_log.h), and how
// many the two have in common in that order. The schedule's cuBLAS workspace requests are left
// out: the CPU has none. Used by the trace tests that compare releases (cpu_trace_test.cpp,
// ddp_trace_test.cpp).
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "event_log.h"
#include "predict/hf_predict.h"
#include "predict/hf_schedule.h"

namespace scalelab::predict::test {

struct StepMatch {
  std::size_t traced = 0, generated = 0, common = 0;
  // what the schedule has that the trace lacks (CUDA-only temporaries, or a modelling error)
  std::size_t unmatched_generated() const { return generated - common; }
  // both ways: what the trace has that the schedule lacks counts too
  std::size_t mismatched() const { return traced + generated - 2 * common; }
};

// min_generated: how many events the schedule's phase must have at least (a guard against comparing
// an empty window).
// The job's schedule as text, less what only CUDA has: the cuBLAS and cuBLASLt workspaces (made
// once, never freed, so leaving them out leaves every free its allocation).
inline std::string schedule_text_without_workspaces(const HfJob& job) {
  std::vector<ScheduleEvent> ev = hf_trainer_schedule(job);
  ev.erase(std::remove_if(ev.begin(), ev.end(),
                          [](const ScheduleEvent& e) {
                            return e.kind == ScheduleEvent::kAlloc && e.category == Category::kWorkspace;
                          }),
           ev.end());
  return schedule_text(ev);
}

inline StepMatch match_step(const std::string& golden, const HfJob& job, const std::string& phase, int nth = 2,
                            std::size_t min_bytes = 4096, std::size_t min_generated = 41) {
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/cpu/" + golden + ".cpu.events");
  EXPECT_TRUE(in.good()) << golden;
  const std::set<std::string> schedule_only = {"clip_grad_norm", "zero_grad"};
  const std::vector<std::string> traced = phase_events(in, phase, nth, min_bytes, {}, schedule_only);
  std::istringstream gen(schedule_text_without_workspaces(job));
  const std::vector<std::string> generated = phase_events(gen, phase, nth, min_bytes, {}, schedule_only);
  EXPECT_GE(generated.size(), min_generated) << golden << " " << phase;
  return {traced.size(), generated.size(), common_subsequence(traced, generated)};
}

}  // namespace scalelab::predict::test
