// Every op check of kernels/selftest.h as a GoogleTest case, parameterized over
// check x dtype x device:
//   cpu   the CPU against itself: the relative error must be exactly 0 (this exercises the check
//         code — inputs, poisoning, comparison — on any machine)
//   cuda  when a CUDA device is available: the error must be within the check's tolerance
// Without CUDA, one test says why it is skipped (DeviceOpsCuda.Available). The registry's lists
// are filled family by family; while they are empty the suite still builds and runs.
//
// The cases depend on the machine (cuda appears only where a GPU is), so CMake discovers them
// when ctest runs (DISCOVERY_MODE PRE_TEST), not when the binary is built:
//   on a GPU machine: ctest -R DeviceOps   (or build/tests/scalelab_device_ops_tests directly)
#include <gtest/gtest.h>

#include <cstddef>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "kernels/selftest.h"
#if SCALELAB_TEST_CUDA
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cublaslt_dynload.h"
#endif

namespace scalelab {
namespace {

namespace st = kernels::selftest;

struct DeviceOpCase {
  std::size_t check = 0;  // index into all_op_checks()
  DType dtype = DType::kF32;
  DeviceType device = DeviceType::kCPU;
};

std::vector<DeviceType> devices_under_test() {
  std::vector<DeviceType> d = {DeviceType::kCPU};
  if (device_available(DeviceType::kCUDA)) d.push_back(DeviceType::kCUDA);
  return d;
}

std::vector<DeviceOpCase> all_cases() {
  std::vector<DeviceOpCase> out;
  const auto& checks = st::all_op_checks();
  for (DeviceType dev : devices_under_test())
    for (std::size_t i = 0; i < checks.size(); ++i)
      for (DType t : checks[i].dtypes) out.push_back({i, t, dev});
  return out;
}

std::string case_name(const ::testing::TestParamInfo<DeviceOpCase>& info) {
  const st::OpCheck& c = st::all_op_checks()[info.param.check];
  std::string name = device_type_name(info.param.device) + "_" + c.family + "_" + c.name + "_" +
                     std::string(dtype_name(info.param.dtype));
  for (char& ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    if (!ok) ch = '_';
  }
  return name + "_" + std::to_string(info.index);  // unique even if two names sanitize alike
}

DeviceAllocator& host_allocator() {
  static DeviceAllocator a(make_host_backend(), std::size_t{16} << 30);
  return a;
}

DeviceAllocator& device_allocator(DeviceType d) {
  if (d == DeviceType::kCPU) {
    // A second CPU allocator: the "device" side is separate memory from the reference's.
    static DeviceAllocator cpu(make_host_backend(), std::size_t{16} << 30);
    return cpu;
  }
  DeviceRuntime& rt = device_runtime(d);
  static DeviceAllocator dev(rt.make_memory_backend(), rt.total_memory());
  return dev;
}

class DeviceOps : public ::testing::TestWithParam<DeviceOpCase> {};

TEST_P(DeviceOps, MatchesTheCpuReference) {
  const DeviceOpCase& p = GetParam();
  const st::OpCheck& c = st::all_op_checks()[p.check];
  st::CheckEnv env{&host_allocator(), &device_allocator(p.device), 1};
  std::vector<st::CheckResult> results;
  try {
    results = c.run(env, p.dtype);
  } catch (const std::exception& e) {
    FAIL() << c.family << "/" << c.name << " threw: " << e.what();
  }
  ASSERT_FALSE(results.empty()) << c.family << "/" << c.name << " compared no output";
  for (const auto& r : results) {
    if (p.device == DeviceType::kCPU) {
      EXPECT_EQ(r.rel_error, 0.0) << c.family << "/" << c.name << " " << r.output
                                  << ": the CPU against itself must agree bit for bit";
    } else {
      EXPECT_LE(r.rel_error, r.tolerance) << c.family << "/" << c.name << " " << r.output << " ("
                                          << dtype_name(p.dtype) << " on " << device_type_name(p.device) << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, DeviceOps, ::testing::ValuesIn(all_cases()), case_name);
// The registry may hold no checks yet (each family's helper fills its list).
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceOps);

TEST(DeviceOpsCuda, Available) {
  std::string why;
  if (!device_available(DeviceType::kCUDA, &why)) GTEST_SKIP() << "no CUDA device: " << why;
  EXPECT_FALSE(device_runtime(DeviceType::kCUDA).describe().empty());
}

// The CUDA libraries that are opened on first use (kernels/cuda/cublaslt_dynload.h,
// attention_cudnn.cpp), as mapped when this process started: read before main(), so that a GPU
// test run earlier in the same process cannot hide a library that the binary links.
std::vector<std::string> lazy_libraries_mapped() {
  std::vector<std::string> found;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    for (const char* lib : {"libcublasLt.so", "libcudnn.so", "libcudnn_", "libnvrtc.so"}) {
      if (line.find(lib) != std::string::npos) found.push_back(line.substr(line.rfind(' ') + 1));
    }
  }
  return found;
}
const std::vector<std::string> kMappedAtStart = lazy_libraries_mapped();

TEST(LazyCudaLibraries, NotMappedWhenAProcessStarts) {
  // cuBLASLt alone added 147 MB to the resident memory of every CPU run when it was linked.
  EXPECT_TRUE(kMappedAtStart.empty()) << "mapped at start: " << kMappedAtStart.front();
}

#if SCALELAB_TEST_CUDA
TEST(LazyCudaLibraries, CublasLtOpensWithEverySymbol) {
  // The toolkit that built this is on the machine (CI's too), so the library must load whole.
  std::string why;
  EXPECT_TRUE(kernels::cuda::lt::available(&why)) << kernels::cuda::lt::library_name() << ": " << why;
  EXPECT_TRUE(why.empty());
}

TEST(LazyCudaLibraries, CudnnOpensThroughTheFrontend) {
  const std::string status = kernels::cuda::cudnn_flash_status();
  if (status.find("this build has no cuDNN") != std::string::npos) GTEST_SKIP() << status;
  // Without a GPU cudnnCreate itself fails, which still proves libcudnn was opened and its
  // symbols resolved through the frontend's shims.
  EXPECT_EQ(status.find("could not be loaded"), std::string::npos) << status;
  EXPECT_EQ(status.find("Unable to find symbol"), std::string::npos) << status;
}
#endif

TEST(DeviceOpsRegistry, ChecksAreNamedUniquelyWithFloatDtypes) {
  std::set<std::string> seen;
  for (const auto& c : st::all_op_checks()) {
    EXPECT_FALSE(c.family.empty());
    EXPECT_FALSE(c.name.empty()) << c.family;
    EXPECT_TRUE(static_cast<bool>(c.run)) << c.family << "/" << c.name;
    EXPECT_FALSE(c.dtypes.empty()) << c.family << "/" << c.name;
    for (DType t : c.dtypes) EXPECT_NE(t, DType::kI32) << c.family << "/" << c.name;
    EXPECT_TRUE(seen.insert(c.family + "/" + c.name).second) << "duplicate check " << c.family << "/" << c.name;
  }
}

}  // namespace
}  // namespace scalelab
