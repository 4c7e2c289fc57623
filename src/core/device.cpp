#include "core/device.h"

#include <cstring>
#include <limits>

#include "core/allocator.h"
#include "core/error.h"

namespace scalelab {

std::string device_type_name(DeviceType d) {
  switch (d) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return "cuda";
    case DeviceType::kMeta: return "meta";
  }
  return "unknown";
}

DeviceType parse_device_type(const std::string& name, const char* flag) {
  if (name == "cpu") return DeviceType::kCPU;
  if (name == "cuda") return DeviceType::kCUDA;
  if (name == "meta") return DeviceType::kMeta;
  throw InvalidInput(std::string("[") + flag + "] must be cpu, cuda or meta, got '" + name + "'");
}

namespace {

class CpuRuntime final : public DeviceRuntime {
 public:
  DeviceType device() const override { return DeviceType::kCPU; }
  std::unique_ptr<MemoryBackend> make_memory_backend() override { return make_host_backend(); }
  std::size_t total_memory() override { return host_physical_memory(); }
  std::size_t free_memory() override { return host_physical_memory(); }
  std::string describe() override { return "host CPU"; }
  void fill_zero(void* dst, std::size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) override {
    scalelab::convert(src, st, dst, dt, n);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(host_dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }
  void synchronize() override {}
};

// Nothing is stored, so fills and copies do nothing; reading a meta tensor back is a bug.
class MetaRuntime final : public DeviceRuntime {
 public:
  DeviceType device() const override { return DeviceType::kMeta; }
  std::unique_ptr<MemoryBackend> make_memory_backend() override { return make_meta_backend(); }
  std::size_t total_memory() override { return std::numeric_limits<std::size_t>::max() / 2; }
  std::size_t free_memory() override { return total_memory(); }
  std::string describe() override { return "meta (allocations only, no data)"; }
  void fill_zero(void*, std::size_t) override {}
  void convert(const void*, DType, void*, DType, std::size_t) override {}
  void copy_to_host(void*, const void*, std::size_t) override {
    throw RuntimeError("[meta] a meta tensor holds no data to read back — this is a bug in the caller");
  }
  void copy_from_host(void*, const void*, std::size_t) override {}
  void synchronize() override {}
};

}  // namespace

DeviceRuntime& device_runtime(DeviceType d) {
  static CpuRuntime cpu;
  static MetaRuntime meta;
  switch (d) {
    case DeviceType::kCPU: return cpu;
    case DeviceType::kMeta: return meta;
    case DeviceType::kCUDA: {
      std::string why;
      DeviceRuntime* r = cuda_runtime_or_null(&why);
      if (r == nullptr) throw InvalidInput("[device] cuda is not available: " + why);
      return *r;
    }
  }
  throw RuntimeError("[device] unknown device");
}

bool device_available(DeviceType d, std::string* why) {
  if (d != DeviceType::kCUDA) return true;
  std::string w;
  const bool ok = cuda_runtime_or_null(&w) != nullptr;
  if (!ok && why) *why = w;
  return ok;
}

}  // namespace scalelab
