// CUPTI activity records (kernels/cuda/cupti.h) through libcupti's own record reader into the
// timeline and the nsys-shaped tables: buffers laid out as CUPTI writes them (the CUDA 13 record
// structs, back to back), so the parsing, the names, the tracks and the derived figures are checked
// without a GPU. Built with the CUDA backend; skipped with a message where libcupti cannot be loaded.
#include <gtest/gtest.h>

#if SCALELAB_TEST_CUDA
#include <cupti.h>

#include <cstring>

#include "core/error.h"
#include "core/trace.h"
#include "kernels/cuda/cupti.h"
#include "profile/readers.h"
#include "trace_check.h"

namespace scalelab {
namespace {

using kernels::cuda::ActivityRecord;
using nlohmann::json;

struct Buffer {
  alignas(8) std::uint8_t bytes[4096] = {};
  std::size_t used = 0;
  template <class R>
  void add(const R& r) {
    static_assert(sizeof(R) % 8 == 0);
    std::memcpy(bytes + used, &r, sizeof r);
    used += sizeof r;
  }
};

CUpti_ActivityKernel10 kernel(const char* name, std::uint64_t start, std::uint64_t end, std::uint32_t stream,
                              std::uint32_t corr) {
  CUpti_ActivityKernel10 k{};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.name = name;
  k.start = start;
  k.end = end;
  k.streamId = stream;
  k.correlationId = corr;
  return k;
}

CUpti_ActivityAPI api(CUpti_CallbackId cbid, std::uint64_t start, std::uint64_t end, std::uint32_t thread,
                      std::uint32_t corr) {
  CUpti_ActivityAPI a{};
  a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  a.cbid = cbid;
  a.start = start;
  a.end = end;
  a.threadId = thread;
  a.correlationId = corr;
  return a;
}

// One step's worth of activity, times in ns: a compute kernel on stream 7 [1000, 3000], an NCCL
// kernel on stream 9 [2500, 4000] (500 ns of it under the compute kernel), a 4096-byte
// host-to-device copy [5000, 6000], a 256-byte memset [7000, 7500]; on host thread 42 a launch
// [500, 900] and a stream synchronization [4000, 7600].
Buffer step_buffer() {
  Buffer b;
  b.add(api(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, 500, 900, 42, 11));
  b.add(kernel("_Z6kernelPfi", 1000, 3000, 7, 11));
  b.add(kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2500, 4000, 9, 12));
  CUpti_ActivityMemcpy6 m{};
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  m.bytes = 4096;
  m.start = 5000;
  m.end = 6000;
  m.streamId = 7;
  b.add(m);
  CUpti_ActivityMemset4 s{};
  s.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  s.bytes = 256;
  s.start = 7000;
  s.end = 7500;
  s.streamId = 7;
  b.add(s);
  b.add(api(CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020, 4000, 7600, 42, 13));
  return b;
}

class Cupti : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!kernels::cuda::cupti_available(&why)) GTEST_SKIP() << why;
  }
};

TEST_F(Cupti, RecordsAreReadWithNamesAsNsysShowsThem) {
  Buffer b = step_buffer();
  const auto recs = kernels::cuda::parse_activity_buffer(b.bytes, b.used);
  ASSERT_EQ(recs.size(), 6u);
  EXPECT_EQ(recs[0].kind, ActivityRecord::Kind::kRuntime);
  EXPECT_EQ(recs[0].name, "cudaLaunchKernel");  // without "_v7000"
  EXPECT_EQ(recs[0].thread, 42u);
  EXPECT_EQ(recs[1].kind, ActivityRecord::Kind::kKernel);
  EXPECT_EQ(recs[1].name, "kernel(float*, int)");  // demangled
  EXPECT_EQ(recs[1].stream, 7u);
  EXPECT_EQ(recs[1].correlation, 11u);
  EXPECT_EQ(recs[2].name, "ncclDevKernel_AllReduce_Sum_f32_RING_LL");  // a C name stays
  EXPECT_EQ(recs[3].name, "[CUDA memcpy Host-to-Device]");
  EXPECT_STREQ(recs[3].copy_kind, "HtoD");
  EXPECT_EQ(recs[3].bytes, 4096);
  EXPECT_EQ(recs[4].name, "[CUDA memset]");
  EXPECT_EQ(recs[4].bytes, 256);
  EXPECT_EQ(recs[5].name, "cudaStreamSynchronize");
  EXPECT_EQ(recs[5].end_ns, 7600u);
}

TEST_F(Cupti, ARecordEndingBeforeItStartsIsRefused) {
  Buffer b;
  b.add(kernel("_Z1kv", 2000, 1000, 7, 1));
  EXPECT_THROW(kernels::cuda::parse_activity_buffer(b.bytes, b.used), RuntimeError);
}

TEST_F(Cupti, TimelineTracksAndTheSummaryFigures) {
  Buffer b = step_buffer();
  Tracer tracer({0, 1, "cuda", "scripted"});
  tracer.set_other("gpu_activity", "CUPTI (test buffer)");
  kernels::cuda::write_activity(tracer, kernels::cuda::parse_activity_buffer(b.bytes, b.used), 100.0);
  const json t = tracer.to_json();
  EXPECT_EQ(testing_trace::nesting_error(t), "");
  std::map<int, std::string> names;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"].get<int>()] = e["args"]["name"];
  int kernels_seen = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string track = names[e["tid"].get<int>()];
    if (e["cat"] == "kernel") {
      ++kernels_seen;
      if (e["name"] == "kernel(float*, int)") {
        EXPECT_EQ(track, "CUDA stream 7 (CUPTI)");
        EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 101.0);  // 1000 ns + the 100 us offset
        EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2.0);
        EXPECT_EQ(e["args"]["index"], 11);
      } else {
        EXPECT_EQ(track, "CUDA stream 9 (CUPTI)");
      }
    } else if (e["cat"] == "cuda_runtime") {
      EXPECT_EQ(track, "CUDA API, host thread 42 (CUPTI)");
    } else if (e["cat"] == "gpu_memcpy") {
      EXPECT_EQ(e["args"]["bytes"], 4096);
      EXPECT_EQ(e["args"]["phase"], "HtoD");
    }
  }
  EXPECT_EQ(kernels_seen, 2);

  const profile::Report r = profile::summarize_scalelab_trace(t, true);
  ASSERT_NE(r.find("kernels"), nullptr);
  EXPECT_EQ(r.find("kernels")->rows.size(), 2u);
  ASSERT_NE(r.find("cuda_api"), nullptr);
  EXPECT_DOUBLE_EQ(r.find("cuda_api")->find("cudaStreamSynchronize")->total, 3600.0);
  ASSERT_NE(r.find("gpu_memory_ops"), nullptr);
  ASSERT_NE(r.find("nccl_kernels"), nullptr);
  // Busy: [1, 4] us (two kernels), [5, 6] (copy), [7, 7.5] (memset) = 4.5 us of the 6.5 us span.
  EXPECT_NEAR(r.derived["device_busy_s"].get<double>(), 4.5e-6, 1e-15);
  EXPECT_NEAR(r.derived["device_idle_fraction"].get<double>(), 2.0 / 6.5, 1e-12);
  EXPECT_NEAR(r.derived["launch_api_s"].get<double>(), 0.4e-6, 1e-15);
  EXPECT_NEAR(r.derived["sync_api_s"].get<double>(), 3.6e-6, 1e-15);
  // NCCL [2.5, 4] us, of which [2.5, 3] under the compute kernel.
  EXPECT_NEAR(r.derived["nccl_comm_time_s"].get<double>(), 1.5e-6, 1e-15);
  EXPECT_NEAR(r.derived["nccl_comm_hidden_s"].get<double>(), 0.5e-6, 1e-15);
  EXPECT_DOUBLE_EQ(r.derived["bytes [CUDA memcpy Host-to-Device]"].get<double>(), 4096.0);
}

}  // namespace
}  // namespace scalelab
#else
TEST(Cupti, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend: no CUPTI"; }
#endif
