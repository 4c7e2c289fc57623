// `train --trace` / `--profile`, `profile-summary` and `trace-merge` end to end through the binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../profile/trace_check.h"

#include "cli_run.h"

namespace {

using nlohmann::json;

using scalelab::cli_test::CmdResult;
using scalelab::cli_test::run;
using scalelab::cli_test::read_json;

const std::string kData = std::string(SCALELAB_SOURCE_DIR) + "/tests/profile/data/";
const std::string kTiny =
    "train --model llama-tiny --seq-len 16 --micro-batch-size 2 --max-steps 3 --threads 1 --bench-warmup-steps 1 "
    "--quiet ";

struct Counts {
  std::map<std::string, int> cats;           // complete events per category
  std::map<std::string, int> layer_phases;   // layer events per phase
  std::map<std::string, double> counter_max;  // largest value of each counter's first series
  double last_tokens = 0;
  std::string process_name;
};

Counts count(const json& t) {
  Counts c;
  for (const auto& e : t["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "X") {
      ++c.cats[e["cat"].get<std::string>()];
      if (e["cat"] == "layer") ++c.layer_phases[e["args"]["phase"].get<std::string>()];
    } else if (ph == "C") {
      const std::string name = e["name"];
      const double v = e["args"].begin().value().get<double>();
      c.counter_max[name] = std::max(c.counter_max[name], v);
      if (name == "tokens") c.last_tokens = e["args"]["total"].get<double>();
    } else if (ph == "M" && e["name"] == "process_name") {
      c.process_name = e["args"]["name"];
    }
  }
  return c;
}

TEST(ProfileCli, TraceIsAValidNestedTimelineWithCountersAndMetadata) {
  const std::string trace = testing::TempDir() + "prof_llama.trace.json", rec = testing::TempDir() + "prof_llama.json";
  const CmdResult r = run(kTiny + "--trace " + trace + " --json " + rec);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Trace: " + trace), std::string::npos) << r.output;
  const json t = read_json(trace);
  const json record = read_json(rec);
  EXPECT_EQ(record["trace_file"], trace);
  EXPECT_EQ(scalelab::testing_trace::nesting_error(t), "");
  const Counts c = count(t);
  const int layers = record["config"]["model_config"]["num_hidden_layers"].get<int>();
  ASSERT_GT(layers, 0);
  EXPECT_EQ(c.cats.at("step"), 3);
  EXPECT_GT(c.cats.at("op"), 0);
  EXPECT_EQ(c.layer_phases.at("forward"), 3 * layers);
  EXPECT_EQ(c.layer_phases.at("backward"), 3 * layers);
  EXPECT_GE(c.cats.at("phase"), 3 * 5);  // forward, head, backward, gradient sync, optimizer per step
  // The memory counter reaches the run's peak exactly; the tokens counter counts every step.
  EXPECT_EQ(c.counter_max.at("allocated memory"), record["max_allocated_bytes"].get<double>());
  EXPECT_EQ(c.counter_max.at("reserved memory"), record["max_reserved_bytes"].get<double>());
  EXPECT_EQ(c.last_tokens, 3 * 2 * 16);
  EXPECT_EQ(c.process_name.rfind("rank 0 \xC2\xB7 cpu", 0), 0u) << c.process_name;
  EXPECT_EQ(t["otherData"]["status"], "ok");
  EXPECT_EQ(t["otherData"]["world_size"], 1);
  EXPECT_GT(t["otherData"]["measured_from_us"].get<double>(), 0);
}

TEST(ProfileCli, TraceTotalsEqualProfileTotalsPerFamily) {
  const std::string trace = testing::TempDir() + "prof_eq.trace.json", rec = testing::TempDir() + "prof_eq.json";
  const CmdResult r = run(kTiny + "--profile --trace " + trace + " --json " + rec);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* s : {"Op families", "Time (%)", "StdDev (ns)", "matmul", "Steps and phases", "layer 0 (backward)"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  // --profile's table: seconds per (family, phase) over the measured steps.
  std::map<std::string, double> profile_s;
  const json record = read_json(rec);
  for (const auto& row : record["profile"]["rows"]) profile_s[row["family"]] += row["seconds"].get<double>();
  ASSERT_FALSE(profile_s.empty());
  // profile-summary of the trace file: the same steps by default.
  const std::string out = testing::TempDir() + "prof_eq.summary.json";
  const CmdResult s = run("profile-summary " + trace + " --format json -o " + out);
  ASSERT_EQ(s.code, 0) << s.output;
  const json sum = read_json(out);
  EXPECT_EQ(sum["source"], "scalelab");
  std::map<std::string, double> trace_s;
  for (const auto& t : sum["tables"])
    if (t["id"] == "op_families")
      for (const auto& row : t["rows"]) trace_s[row["name"]] = row["total"].get<double>() * 1e-9;
  ASSERT_EQ(trace_s.size(), profile_s.size());
  for (const auto& [family, seconds] : profile_s) {
    ASSERT_TRUE(trace_s.count(family)) << family;
    EXPECT_NEAR(trace_s[family], seconds, 0.01 * seconds + 1e-6) << family;
  }
  EXPECT_EQ(sum["derived"]["steps"], 2);  // the measured steps (3 minus 1 warm-up)
  // The run record holds the same summary.
  EXPECT_EQ(record["profile"]["summary"]["derived"]["steps"], 2);
}

TEST(ProfileCli, OptAndTheMemorySaversNestToo) {
  for (const std::string& flags : std::vector<std::string>
       {"--model opt-tiny --seq-len 16 --micro-batch-size 2 --max-steps 2 --threads 1 --quiet",
        "--model llama-tiny --seq-len 16 --micro-batch-size 2 --max-steps 2 --threads 1 --quiet --fused-kernels "
        "--activation-checkpointing --attn flash --mixed-precision bf16",
        // AdamW inside backward: an optimizer region inside each layer's backward region.
        "--model llama-tiny --seq-len 16 --micro-batch-size 2 --max-steps 2 --threads 1 --quiet "
        "--optimizer-in-backward --max-grad-norm 0"}) {
    const std::string trace = testing::TempDir() + "prof_var.trace.json";
    const CmdResult r = run("train " + flags + " --trace " + trace);
    ASSERT_EQ(r.code, 0) << flags << "\n" << r.output;
    const json t = read_json(trace);
    EXPECT_EQ(scalelab::testing_trace::nesting_error(t), "") << flags;
    Counts c = count(t);
    EXPECT_GT(c.layer_phases["forward"], 0) << flags;
    EXPECT_EQ(c.layer_phases["forward"], c.layer_phases["backward"]) << flags;
  }
}

// Every GEMM of the fine-tuning methods is inside an op scope: LoRA's adapter products as their own
// family ("lora"), QLoRA's NF4 tile products and QAT's weight-gradient product as "matmul".
// (kernels::gemm_ex does not profile itself; before, these fell between the profiled ops.)
TEST(ProfileCli, FineTuningMethodsGemmsAreProfiled) {
  auto ops = [](const json& t) {
    std::map<std::string, int> n;  // "family phase" -> op events
    for (const auto& e : t["traceEvents"])
      if (e["ph"] == "X" && e["cat"] == "op")
        ++n[e["name"].get<std::string>() + " " + e["args"]["phase"].get<std::string>()];
    return n;
  };
  const std::string base = "train --model llama-tiny --seq-len 16 --micro-batch-size 2 --max-steps 1 --threads 1 --quiet ";
  const std::string all = " --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  const std::string trace = testing::TempDir() + "prof_methods.trace.json";
  // LoRA on all 7 projections of 2 layers; q/k/v and gate/up stacked (one z GEMM each); a group of
  // independent products (kernels::gemm_ex_group) is one scope. Forward per layer: qkv z + the
  // group of 3 B, o z + B, gate/up z + the group of 2 B, down z + B = 8. Backward per layer (z kept
  // from forward): per adapter the group of its dB's and dz's, then the group of dA and dx = 8.
  CmdResult r = run(base + "--lora-rank 4" + all + " --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.output;
  std::map<std::string, int> n = ops(read_json(trace));
  EXPECT_EQ(n["lora forward"], 2 * 8);
  EXPECT_EQ(n["lora backward"], 2 * 8);
  // Layer 0's input gradient only feeds the embedding, frozen under LoRA: its input norm has no
  // backward (2 norms per layer and the final one, less that one), as autograd skips it for peft.
  EXPECT_EQ(n["norm backward"], 2 * 2 + 1 - 1);
  // The embedding trains: every norm has its backward. Only the norms' weights train: the same
  // (the input norm's weight gradient needs its input gradient).
  for (const std::string& freeze : {std::string("'layers'"), std::string("'embed|proj'")}) {
    r = run(base + "--freeze " + freeze + " --trace " + trace);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(ops(read_json(trace))["norm backward"], 2 * 2 + 1) << freeze;
  }
  // OPT (pre-LayerNorm, learned positions, both frozen under LoRA): the same for its first layer.
  r = run("train --model opt-tiny --seq-len 16 --micro-batch-size 2 --max-steps 1 --threads 1 --quiet --lora-rank 4 "
          "--lora-targets q_proj,v_proj,fc1 --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(ops(read_json(trace))["norm backward"], 2 * 2 + 1 - 1);
  // QLoRA: each quantized weight is one tile here, one product forward and one backward (input
  // gradient) per weight: 7 per layer, besides the LM head's; none for layer 0's q/k/v, whose
  // input gradient nothing needs (the embedding is frozen).
  r = run(base + "--lora-rank 4 --quantize-base nf4-bnb" + all + " --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.output;
  n = ops(read_json(trace));
  EXPECT_EQ(n["nf4 forward"], 2 * 7);   // each weight's tile dequantized in forward,
  EXPECT_EQ(n["nf4 backward"], 2 * 7 - 3);  // and again in backward for the input gradient
  EXPECT_GE(n["matmul forward"], 2 * 7 + 1);
  EXPECT_GE(n["matmul backward"], 2 * 7 + 1 - 3);
  // QAT: the weight gradient of each fake-quantized module is its own product.
  const std::string plain = testing::TempDir() + "prof_plain.trace.json";
  r = run(base + "--trace " + plain);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(base + "--qat 8da4w --qat-group-size 32 --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(ops(read_json(trace))["matmul backward"] - ops(read_json(plain))["matmul backward"], 2 * 4)
      << "one weight-gradient GEMM per QAT module (q/k/v, o, gate/up, down) and layer";
}

TEST(ProfileCli, SummaryOfEachSourceInEachFormat) {
  for (const std::string& file : std::vector<std::string>{"nsys_stats.csv", "torch_cpu_trace.json", "torch_gpu_trace.json"}) {
    const CmdResult md = run("profile-summary " + kData + file);
    ASSERT_EQ(md.code, 0) << file << "\n" << md.output;
    EXPECT_NE(md.output.find("| Time (%) |"), std::string::npos) << md.output;
    const CmdResult csv = run("profile-summary " + kData + file + " --format csv");
    ASSERT_EQ(csv.code, 0) << csv.output;
    EXPECT_EQ(csv.output.rfind("Table,Unit,Time (%),Total,Instances,Avg,Med,Min,Max,StdDev,Name", 0), 0u);
    const CmdResult j = run("profile-summary " + kData + file + " --format json");
    ASSERT_EQ(j.code, 0) << j.output;
    EXPECT_FALSE(json::parse(j.output)["tables"].empty());
  }
  const CmdResult nsys = run("profile-summary " + kData + "nsys_stats.csv");
  EXPECT_NE(nsys.output.find("| 62.5 | 5,000,000 | 4 | 1,250,000 | 1,100,000 | 900,000 | 2,000,000 | 500,000 | "
                             "cudaStreamSynchronize |"),
            std::string::npos)
      << nsys.output;
}

TEST(ProfileCli, BadInputsExitTwo) {
  for (const std::string& args : {std::string("profile-summary /nonexistent/trace.json"), std::string("profile-summary run.nsys-rep"),
                                 "profile-summary " + kData + "nsys_stats.csv --format xml",
                                 "trace-merge -o /tmp/x.json " + kData + "torch_gpu_trace.json"}) {
    const CmdResult r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  }
}

TEST(ProfileCli, MergeGivesOneProcessPerRank) {
  const std::string a = testing::TempDir() + "merge_r0.json", b = testing::TempDir() + "merge_r1.json",
                    m = testing::TempDir() + "merged.json";
  ASSERT_EQ(run(kTiny + "--max-steps 1 --trace " + a).code, 0);
  // A second "rank": the same file renumbered.
  json t = read_json(a);
  t["otherData"]["rank"] = 1;
  for (auto& e : t["traceEvents"]) e["pid"] = 1;
  std::ofstream(b) << t.dump();
  const CmdResult r = run("trace-merge -o " + m + " " + a + " " + b);
  ASSERT_EQ(r.code, 0) << r.output;
  const json merged = read_json(m);
  std::map<int, int> per_pid;
  for (const auto& e : merged["traceEvents"]) ++per_pid[e["pid"].get<int>()];
  ASSERT_EQ(per_pid.size(), 2u);
  EXPECT_EQ(per_pid[0], per_pid[1]);
  EXPECT_EQ(scalelab::testing_trace::nesting_error(merged), "");
  EXPECT_EQ(run("trace-merge -o " + m + " " + a + " " + a).code, 2);  // the same rank twice
  const CmdResult s = run("profile-summary " + m);
  EXPECT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("every rank"), std::string::npos) << s.output;
}

}  // namespace
