#include "telemetry/cuda_visible.h"

#include <cctype>
#include <cstdlib>

namespace scalelab {
namespace {

std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

VisibleMapping map_cuda_visible_devices(const std::optional<std::string>& visible,
                                        const std::vector<GpuIdentity>& gpus) {
  VisibleMapping m;
  if (!visible) {
    for (std::size_t i = 0; i < gpus.size(); ++i) m.ordinal_to_gpu.push_back(i);
    return m;
  }
  std::vector<std::string> entries;
  {
    std::string cur;
    for (char c : *visible) {
      if (c == ',') {
        entries.push_back(trim(cur));
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!trim(cur).empty() || !entries.empty()) entries.push_back(trim(cur));
  }
  auto stop = [&](const std::string& why) {
    m.note = "CUDA_VISIBLE_DEVICES='" + *visible + "': " + why +
             "; the devices listed before it are visible, the rest are not";
  };
  std::vector<bool> used(gpus.size(), false);
  for (const auto& e : entries) {
    std::optional<std::size_t> found;
    if (all_digits(e)) {
      const unsigned long idx = std::strtoul(e.c_str(), nullptr, 10);
      for (std::size_t i = 0; i < gpus.size(); ++i)
        if (gpus[i].index == idx) found = i;
      if (!found) {
        stop("index " + e + " names no device (" + std::to_string(gpus.size()) + " present)");
        break;
      }
    } else if (e.rfind("MIG-", 0) == 0) {
      stop("MIG device " + e + " is not resolved by scalelab telemetry");
      break;
    } else if (e.rfind("GPU-", 0) == 0) {
      int matches = 0;
      for (std::size_t i = 0; i < gpus.size(); ++i) {
        if (gpus[i].uuid.rfind(e, 0) == 0) {
          found = i;
          ++matches;
        }
      }
      if (matches != 1) {
        stop("UUID " + e + (matches == 0 ? " names no device" : " is ambiguous"));
        break;
      }
    } else {
      stop("entry '" + e + "' is neither an index nor a GPU- UUID");
      break;
    }
    if (used[*found]) {
      stop("device " + e + " is listed twice");
      break;
    }
    used[*found] = true;
    m.ordinal_to_gpu.push_back(*found);
  }
  return m;
}

std::optional<std::string> cuda_visible_devices_from_env() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!v) return std::nullopt;
  return std::string(v);
}

std::string cuda_device_name(int ordinal) { return "cuda:" + std::to_string(ordinal); }

}  // namespace scalelab
