// The nsys-shaped summaries: statistics, interval arithmetic, and each reader on a committed
// fixture (a hand-written nsys stats CSV in its documented columns, a PyTorch profiler trace made
// by data/make_torch_trace.py, a hand-written GPU-shaped PyTorch trace, a synthetic scalelab trace).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "profile/readers.h"
#include "profile/summary.h"

namespace scalelab::profile {
namespace {

const std::string kData = std::string(SCALELAB_SOURCE_DIR) + "/tests/profile/data/";

TEST(Summary, StatRowAsNsys) {
  const StatRow r = stat_row("x", {4, 1, 3, 2});
  EXPECT_EQ(r.instances, 4);
  EXPECT_DOUBLE_EQ(r.total, 10);
  EXPECT_DOUBLE_EQ(r.avg, 2.5);
  EXPECT_DOUBLE_EQ(r.med, 2.5);  // mean of the middle two
  EXPECT_DOUBLE_EQ(r.min, 1);
  EXPECT_DOUBLE_EQ(r.max, 4);
  EXPECT_NEAR(r.stddev, std::sqrt(5.0 / 3.0), 1e-12);  // sample standard deviation
  const StatRow one = stat_row("y", {7});
  EXPECT_DOUBLE_EQ(one.med, 7);
  EXPECT_DOUBLE_EQ(one.stddev, 0);
  EXPECT_DOUBLE_EQ(stat_row("z", {1, 9, 5}).med, 5);
}

TEST(Summary, TableSortsByTotalAndComputesPercent) {
  const Table t = table_from_samples("t", "T", {{"a", {1, 1}}, {"b", {6}}, {"c", {2}}});
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[0].name, "b");
  EXPECT_EQ(t.rows[1].name, "a");  // tie with c at 2: by name
  EXPECT_DOUBLE_EQ(t.rows[0].percent, 60);
  EXPECT_DOUBLE_EQ(t.total(), 10);
}

TEST(Summary, IntervalsMergeAndOverlap) {
  const auto a = merge_intervals({{5, 7}, {0, 2}, {1, 3}, {6, 8}});
  ASSERT_EQ(a.size(), 2u);
  EXPECT_DOUBLE_EQ(covered(a), 3 + 3);
  const auto b = merge_intervals({{2.5, 6.5}});
  EXPECT_DOUBLE_EQ(overlap(a, b), 0.5 + 1.5);
}

TEST(Summary, NsysCsvFixtureGivesItsTablesAndTheStudysFigures) {
  const Report r = summarize_file(kData + "nsys_stats.csv");
  EXPECT_EQ(r.source, "nsys");
  ASSERT_EQ(r.tables.size(), 4u);
  const Table* api = r.find("cuda_api_sum");
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->title, "CUDA API Summary");
  ASSERT_EQ(api->rows.size(), 4u);
  EXPECT_EQ(api->rows[0].name, "cudaStreamSynchronize");
  EXPECT_DOUBLE_EQ(api->rows[0].percent, 62.5);
  EXPECT_DOUBLE_EQ(api->rows[0].total, 5000000);
  EXPECT_EQ(api->rows[1].instances, 1000);  // "Num Calls"
  EXPECT_DOUBLE_EQ(api->rows[1].med, 1800);
  EXPECT_DOUBLE_EQ(api->rows[1].stddev, 600);
  const Table* kern = r.find("cuda_gpu_kern_sum");
  ASSERT_NE(kern, nullptr);
  EXPECT_EQ(kern->rows[0].name, "void gemm_kernel<float, 128, 64>(Params)");  // quoted, with commas
  const Table* size = r.find("cuda_gpu_mem_size_sum");
  ASSERT_NE(size, nullptr);
  EXPECT_EQ(size->unit, "MB");
  EXPECT_NEAR(size->rows[0].total, 83.886, 1e-9);
  EXPECT_EQ(size->rows[0].name, "[CUDA memcpy Host-to-Device]");
  EXPECT_NEAR(r.derived["launch_api_s"].get<double>(), 0.002, 1e-12);
  EXPECT_NEAR(r.derived["sync_api_s"].get<double>(), 0.0052, 1e-12);  // stream + event synchronize
  EXPECT_NEAR(r.derived["memcpy_htod_s"].get<double>(), 0.0004, 1e-12);
  EXPECT_NEAR(r.derived["nccl_kernel_s"].get<double>(), 0.002, 1e-12);
}

TEST(Summary, NsysCsvWithoutSectionLinesNamesTheReportFromTheFileName) {
  const std::string csv =
      "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range\n"
      "100.0,300,3,100.0,100.0,90,110,10.0,PushPop,layer 0\n";
  const Report r = summarize_nsys_csv(csv, "report_nvtx_sum.csv");
  ASSERT_EQ(r.tables.size(), 1u);
  EXPECT_EQ(r.tables[0].id, "nvtx_sum");
  EXPECT_EQ(r.tables[0].rows[0].name, "layer 0");
  EXPECT_THROW(summarize_nsys_csv("hello,world\n1,2\n", "x.csv"), InvalidInput);
}

TEST(Summary, TorchGpuFixtureGivesKernelsApiMemopsAndDerivedFigures) {
  const Report r = summarize_file(kData + "torch_gpu_trace.json");
  EXPECT_EQ(r.source, "pytorch");
  const Table* k = r.find("kernels");
  ASSERT_NE(k, nullptr);
  const StatRow* gemm = k->find("gemm_kernel");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->instances, 2);
  EXPECT_DOUBLE_EQ(gemm->total, 50000);
  EXPECT_DOUBLE_EQ(gemm->med, 25000);
  EXPECT_NEAR(gemm->stddev, std::sqrt(2 * 5000.0 * 5000.0), 1e-6);
  EXPECT_NEAR(gemm->percent, 100.0 * 50 / 90, 1e-9);
  ASSERT_NE(r.find("communication"), nullptr);
  EXPECT_EQ(r.find("communication")->rows.size(), 1u);
  const StatRow* steps = r.find("user_annotations")->find("ProfilerStep#*");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ(steps->instances, 2);
  EXPECT_EQ(r.find("cuda_api")->find("cudaLaunchKernel")->instances, 2);
  EXPECT_EQ(r.find("gpu_memory_ops")->rows.size(), 2u);
  // Device 0 busy 95 us of the 130 us from its first to its last activity.
  EXPECT_NEAR(r.derived["device_idle_fraction"].get<double>(), 35.0 / 130.0, 1e-12);
  EXPECT_NEAR(r.derived["launch_api_s"].get<double>(), 10e-6, 1e-15);
  EXPECT_NEAR(r.derived["sync_api_s"].get<double>(), 40e-6, 1e-15);
  // NCCL [1070, 1110] overlaps the GEMM [1060, 1080] for 10 us: hidden 10, exposed 30.
  EXPECT_NEAR(r.derived["comm_hidden_s"].get<double>(), 10e-6, 1e-15);
  EXPECT_NEAR(r.derived["comm_exposed_s"].get<double>(), 30e-6, 1e-15);
  EXPECT_NEAR(r.derived["bytes Memcpy HtoD (Pageable -> Device)"].get<double>(), 4096, 0);
}

TEST(Summary, TorchCpuTraceFromTheGeneratorMatchesItsOwnEvents) {
  const std::string path = kData + "torch_cpu_trace.json";
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  // Independent sums straight from the file.
  std::map<std::string, std::pair<double, int>> expect;
  int steps = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    if (e.value("cat", "") == "cpu_op") {
      auto& x = expect[e["name"].get<std::string>()];
      x.first += e["dur"].get<double>() * 1e3;
      x.second += 1;
    }
    if (e.value("cat", "") == "user_annotation" && e["name"].get<std::string>().rfind("ProfilerStep#", 0) == 0) ++steps;
  }
  ASSERT_FALSE(expect.empty());
  const Report r = summarize_file(path);
  const Table* cpu = r.find("cpu_ops");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->rows.size(), expect.size());
  for (const char* op : {"aten::addmm", "aten::relu", "aten::mean"}) {
    const StatRow* row = cpu->find(op);
    ASSERT_NE(row, nullptr) << op;
    EXPECT_NEAR(row->total, expect[op].first, 1e-6 * expect[op].first) << op;
    EXPECT_EQ(row->instances, expect[op].second) << op;
    EXPECT_EQ(row->instances % 3, 0) << op << ": three profiled steps";
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(r.find("user_annotations")->find("ProfilerStep#*")->instances, 3);
  EXPECT_EQ(r.find("user_annotations")->find("train_step")->instances, 3);
  EXPECT_EQ(r.find("kernels"), nullptr);
}

// A synthetic two-step scalelab trace: step 0 is warm-up, step 1 measured.
nlohmann::json synthetic_trace() {
  using nlohmann::json;
  auto x = [](const char* name, const char* cat, double ts, double dur, int tid, const char* phase = nullptr) {
    json e = {{"ph", "X"}, {"name", name}, {"cat", cat}, {"pid", 0}, {"tid", tid}, {"ts", ts}, {"dur", dur}};
    if (phase) e["args"] = {{"phase", phase}};
    return e;
  };
  json ev = json::array({x("step 0", "step", 0, 100, 0), x("matmul", "op", 10, 50, 0, "forward"),
                         x("step 1", "step", 100, 100, 0), x("matmul", "op", 110, 20, 0, "forward"),
                         x("matmul", "op", 130, 40, 0, "backward"), x("norm", "op", 170, 10, 0, "forward"),
                         x("layer 0", "layer", 110, 70, 0, "forward"),
                         // all-reduce 140..190 on the comm track; the wait 180..195 exposes 10 us of it
                         x("all_reduce", "comm", 140, 50, 1, "comm"), x("ddp wait", "comm", 180, 15, 0, "comm")});
  return {{"traceEvents", ev},
          {"otherData", {{"generator", "scalelab"}, {"rank", 0}, {"world_size", 1}, {"measured_from_us", 100.0}}}};
}

TEST(Summary, ScalelabTraceMeasuredStepsOpsAndCommunication) {
  const Report r = summarize_scalelab_trace(synthetic_trace());
  const Table* ops = r.find("op_families");
  ASSERT_NE(ops, nullptr);
  ASSERT_EQ(ops->rows.size(), 2u);
  EXPECT_EQ(ops->rows[0].name, "matmul");
  EXPECT_EQ(ops->rows[0].instances, 2);  // the warm-up step's matmul is left out
  EXPECT_DOUBLE_EQ(ops->rows[0].total, 60000);
  EXPECT_DOUBLE_EQ(ops->rows[0].percent, 100.0 * 60 / 70);
  EXPECT_NE(r.find("op_phases")->find("matmul (backward)"), nullptr);
  EXPECT_EQ(r.find("layers")->find("layer 0 (forward)")->instances, 1);
  EXPECT_EQ(r.derived["steps"], 1);
  EXPECT_NEAR(r.derived["comm_time_s"].get<double>(), 50e-6, 1e-15);
  EXPECT_NEAR(r.derived["comm_exposed_s"].get<double>(), 10e-6, 1e-15);
  EXPECT_NEAR(r.derived["comm_hidden_fraction"].get<double>(), 0.8, 1e-12);
  EXPECT_NEAR(r.derived["op_time_fraction_of_steps"].get<double>(), 0.7, 1e-12);
  const Report all = summarize_scalelab_trace(synthetic_trace(), /*all_steps=*/true);
  EXPECT_EQ(all.find("op_families")->rows[0].instances, 3);
  EXPECT_EQ(all.derived["steps"], 2);
}

TEST(Summary, RenderingsCarryTheNsysColumns) {
  Report r = summarize_scalelab_trace(synthetic_trace());
  r.file = "t.json";
  const std::string md = render(r, Format::kMarkdown);
  for (const char* col : {"Time (%)", "Total (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                          "StdDev (ns)", "Name", "| 85.7 | 60,000 | 2 | 30,000 |"})
    EXPECT_NE(md.find(col), std::string::npos) << col << "\n" << md;
  const std::string csv = render(r, Format::kCsv);
  EXPECT_EQ(csv.rfind("Table,Unit,Time (%),Total,Instances,Avg,Med,Min,Max,StdDev,Name\n", 0), 0u) << csv;
  EXPECT_NE(csv.find("op_families,ns,85.7,60000,2,30000,30000,20000,40000,14142,matmul\n"), std::string::npos) << csv;
  const nlohmann::json j = nlohmann::json::parse(render(r, Format::kJson));
  EXPECT_EQ(j["tables"][0]["rows"][0]["instances"], 2);
  const Report back = report_from_json(j);
  EXPECT_EQ(render(back, Format::kCsv), csv);
  EXPECT_THROW(parse_format("xml"), InvalidInput);
}

TEST(Summary, NsysReportFileAsksForTheCsv) {
  try {
    summarize_file("/tmp/x.nsys-rep");
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("nsys stats --format csv"), std::string::npos);
  }
}

}  // namespace
}  // namespace scalelab::profile
