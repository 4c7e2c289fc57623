#pragma once
// Helpers shared by the tests of src/model: a scratch directory, a host allocator, file I/O.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/device.h"
#include "core/tensor.h"
#include "model/model.h"

namespace scalelab::testing {

// A fresh directory under the system temp dir, removed when the object dies.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("scalelab_") + (info ? info->test_suite_name() + std::string("_") + info->name() : "t");
    for (auto& ch : name)
      if (ch == '/') ch = '_';
    path_ = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& f) const { return (path_ / f).string(); }

 private:
  std::filesystem::path path_;
};

inline DeviceAllocator& host_alloc() {
  static DeviceAllocator alloc(make_host_backend(), std::size_t{8} << 30);
  return alloc;
}

// --- the device the model tests run on
// SCALELAB_TEST_DEVICE=cuda runs the golden and switch tests with the model on the GPU (inputs
// copied up, outputs and gradients copied back for the same assertions); default cpu. A device
// that is not available fails the tests that use it (with the reason), it does not skip them.
inline DeviceType test_device() {
  const char* e = std::getenv("SCALELAB_TEST_DEVICE");
  return (e && *e) ? parse_device_type(e, "SCALELAB_TEST_DEVICE") : DeviceType::kCPU;
}
inline std::string test_device_name() { return device_type_name(test_device()); }

// The allocator of the test device (host_alloc() itself when it is the CPU).
inline DeviceAllocator& device_alloc() {
  const DeviceType d = test_device();
  if (d == DeviceType::kCPU) return host_alloc();
  static DeviceAllocator alloc(device_runtime(d).make_memory_backend(), device_runtime(d).total_memory());
  return alloc;
}

// A copy of a host tensor on the test device.
inline Tensor on_test_device(const Tensor& host) { return host.to(device_alloc(), "test input"); }

// The values of a float tensor on any device, as fp32 on the host.
inline std::vector<float> host_f32(const Tensor& t) {
  Tensor f = Tensor::empty(t.shape(), DType::kF32, host_alloc());
  f.copy_from(t);
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}

// Copies a batch the data source filled on the host into one on the test device (same sizes).
inline void upload_batch(Batch& device, const Batch& host) {
  device.batch = host.batch;
  device.seq = host.seq;
  device.inputs.copy_from(host.inputs);
  device.targets.copy_from(host.targets);
}

inline std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::vector<std::uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The source tree (golden data): the build's, or SCALELAB_SOURCE_DIR from the environment when the
// test binary runs elsewhere (scripts/package-device.sh's env.sh sets it on a GPU machine).
inline std::string source_dir() {
  const char* e = std::getenv("SCALELAB_SOURCE_DIR");
  return (e && *e) ? std::string(e) : std::string(SCALELAB_SOURCE_DIR);
}

inline std::string golden_dir(const std::string& name) { return source_dir() + "/tests/golden/data/" + name; }

}  // namespace scalelab::testing
