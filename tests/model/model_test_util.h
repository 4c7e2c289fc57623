#pragma once
// Helpers shared by the tests of src/model: a scratch directory, a host allocator, file I/O.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/allocator.h"

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

inline std::string golden_dir(const std::string& name) {
  return std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/" + name;
}

}  // namespace scalelab::testing
