#include "telemetry/cuda_visible.h"

#include <gtest/gtest.h>

namespace scalelab {
namespace {

const std::vector<GpuIdentity> kGpus = {
    {0, "GPU-11111111-aaaa"}, {1, "GPU-22222222-bbbb"}, {2, "GPU-22223333-cccc"}};

std::vector<std::size_t> map(const std::optional<std::string>& v) {
  return map_cuda_visible_devices(v, kGpus).ordinal_to_gpu;
}

TEST(CudaVisibleDevices, UnsetMeansAllInNvmlOrder) {
  EXPECT_EQ(map(std::nullopt), (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_TRUE(map_cuda_visible_devices(std::nullopt, kGpus).note.empty());
}

TEST(CudaVisibleDevices, EmptyHidesEverything) {
  EXPECT_TRUE(map("").empty());
  EXPECT_TRUE(map("  ").empty());
}

TEST(CudaVisibleDevices, IndicesReorder) {
  EXPECT_EQ(map("2,0"), (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(map(" 1 , 2 "), (std::vector<std::size_t>{1, 2}));
}

TEST(CudaVisibleDevices, UuidsAndUniquePrefixes) {
  EXPECT_EQ(map("GPU-22223333-cccc,GPU-1111"), (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(map("1,GPU-11111111-aaaa"), (std::vector<std::size_t>{1, 0}));
}

TEST(CudaVisibleDevices, ListEndsAtTheFirstInvalidEntry) {
  auto m = map_cuda_visible_devices("1,7,0", kGpus);
  EXPECT_EQ(m.ordinal_to_gpu, (std::vector<std::size_t>{1}));
  EXPECT_NE(m.note.find("index 7 names no device"), std::string::npos);

  m = map_cuda_visible_devices("0,GPU-2222", kGpus);  // prefix of two devices
  EXPECT_EQ(m.ordinal_to_gpu, (std::vector<std::size_t>{0}));
  EXPECT_NE(m.note.find("ambiguous"), std::string::npos);

  m = map_cuda_visible_devices("GPU-9999,0", kGpus);
  EXPECT_TRUE(m.ordinal_to_gpu.empty());

  m = map_cuda_visible_devices("0,0", kGpus);
  EXPECT_EQ(m.ordinal_to_gpu, (std::vector<std::size_t>{0}));
  EXPECT_NE(m.note.find("twice"), std::string::npos);

  m = map_cuda_visible_devices("MIG-abc", kGpus);
  EXPECT_TRUE(m.ordinal_to_gpu.empty());
  EXPECT_NE(m.note.find("MIG"), std::string::npos);

  m = map_cuda_visible_devices("-1", kGpus);
  EXPECT_TRUE(m.ordinal_to_gpu.empty());
}

TEST(CudaVisibleDevices, IndexMeansNvmlIndexNotPosition) {
  // Devices as NVML reports them need not be listed in index order.
  const std::vector<GpuIdentity> gpus = {{3, "GPU-d"}, {1, "GPU-b"}};
  EXPECT_EQ(map_cuda_visible_devices("1,3", gpus).ordinal_to_gpu, (std::vector<std::size_t>{1, 0}));
}

TEST(CudaVisibleDevices, DeviceNames) { EXPECT_EQ(cuda_device_name(3), "cuda:3"); }

}  // namespace
}  // namespace scalelab
