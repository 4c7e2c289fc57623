#pragma once
// Helpers shared by the telemetry tests: temporary directories, files, fake NVML scripts.
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/time_series.h"

namespace scalelab::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "scalelab_telemetry_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path);
  f << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Polls `pred` every few milliseconds until it holds or `limit` passes; returns pred().
// (A bound on waiting for something that must happen, not a timing assertion.)
inline bool wait_until(const std::function<bool()>& pred,
                       std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// The values of one series, in time order.
inline std::vector<double> values_of(const std::vector<Sample>& samples, const std::string& source,
                                     const std::string& device, const std::string& metric) {
  std::vector<double> out;
  for (const auto& s : samples)
    if (s.source == source && s.device == device && s.metric == metric) out.push_back(s.value);
  return out;
}

inline bool any_note_contains(const std::vector<std::string>& notes, const std::string& text) {
  for (const auto& n : notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

inline int count_notes_containing(const std::vector<std::string>& notes, const std::string& text) {
  int c = 0;
  for (const auto& n : notes)
    if (n.find(text) != std::string::npos) ++c;
  return c;
}

}  // namespace scalelab::test
