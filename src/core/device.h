#pragma once
// Devices: the kinds this build knows and the runtime of each (memory, fills, copies, sync).
//
//   cpu   host memory; the reference backend
//   cuda  an NVIDIA GPU through the CUDA runtime; present when CMake found the toolkit
//         (src/kernels/cuda/), else src/kernels/no_cuda/ says why it is absent
//   meta  no memory at all: distinct fake addresses through the real caching allocator, so the
//         memory plan can run the real model and measure what it would allocate
//
// Tensor::zero_, copy_from and the host transfers go through DeviceRuntime, so no code outside a
// backend writes through a device pointer.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace scalelab {

enum class DeviceType : std::uint8_t { kCPU, kCUDA, kMeta };
std::string device_type_name(DeviceType d);  // "cpu", "cuda", "meta"
// Parses "cpu" / "cuda" / "meta"; throws InvalidInput naming `flag` otherwise.
DeviceType parse_device_type(const std::string& name, const char* flag = "--device");

class MemoryBackend;
class Tracer;

// Times work on an asynchronous device's queue without stalling the host (CUDA: events recorded
// on the stream). The profiler marks the start and end of each op scope; after the device has
// been synchronized, collect() says when each mark was reached, relative to the first mark of the
// window, and starts the next window.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  // Queues a mark behind the work queued so far; returns its index in the current window.
  virtual int mark() = 0;
  // Waits for the device; microseconds from mark 0 to each mark of the window; starts a new window.
  virtual std::vector<double> collect() = 0;
};

// What a device's own activity profiler records (CUDA: CUPTI), written into a Tracer as events:
// cat "kernel", "gpu_memcpy", "gpu_memset" on one track per stream, "cuda_runtime" on one track per
// host thread that called the runtime. start() returns false and says why when unavailable (no
// libcupti, another profiler holds it); flush() moves what was recorded so far into the tracer.
class ActivityProfiler {
 public:
  virtual ~ActivityProfiler() = default;
  virtual bool start(Tracer* tracer, std::string* why) = 0;
  virtual void flush() = 0;
  virtual void stop() = 0;  // flushes, then disables recording
  // Records lost because the profiler's buffers were full (0 when none).
  virtual std::uint64_t dropped() const = 0;
  // One line naming the source ("CUPTI 13.0 activity: kernels, memcpy, memset, runtime API").
  virtual std::string describe() const = 0;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceType device() const = 0;
  // Where the caching allocator of this device gets its segments.
  virtual std::unique_ptr<MemoryBackend> make_memory_backend() = 0;
  // The device's memory in bytes (the allocator's default capacity).
  virtual std::size_t total_memory() = 0;
  // Bytes the device has free right now (cpu: physical memory; meta: unlimited).
  virtual std::size_t free_memory() = 0;
  // One line naming the device: "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB, driver 13.0)".
  virtual std::string describe() = 0;

  virtual void fill_zero(void* dst, std::size_t bytes) = 0;
  // Converting copy of n elements within this device (same dtype: a plain copy).
  virtual void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n) = 0;
  // Plain byte copies between this device and host memory (synchronous for the host side).
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  // Waits until all work queued on this device is done (throws when a kernel failed).
  virtual void synchronize() = 0;
  // Named ranges for external profilers (CUDA: NVTX push/pop, which Nsight Systems shows on the
  // thread's timeline); nested as the calls nest on each thread. Default: nothing.
  virtual void range_push(const char* name) { (void)name; }
  virtual void range_pop() {}
  // The device's queue timer (nullptr: the device runs synchronously with the host, or has none).
  virtual DeviceTimer* timer() { return nullptr; }
  // A new activity profiler for this device (nullptr: none).
  virtual std::unique_ptr<ActivityProfiler> activity_profiler() { return nullptr; }
};

// The runtime of a device; throws RuntimeError (exit 1) naming what is missing when the device is
// not built in, or InvalidInput-free RuntimeError when no usable GPU / driver is present.
DeviceRuntime& device_runtime(DeviceType d);
// Whether device_runtime(d) would succeed; when not, `why` (if given) says why.
bool device_available(DeviceType d, std::string* why = nullptr);

// Defined by src/kernels/cuda/ (CUDA builds) or src/kernels/no_cuda/ (others): the CUDA runtime,
// or nullptr with the reason (not built, no driver, no GPU, driver older than the toolkit).
DeviceRuntime* cuda_runtime_or_null(std::string* why);

}  // namespace scalelab
