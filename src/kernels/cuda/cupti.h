#pragma once
// CUPTI activity on the CUDA backend: kernels, memcpy / memset and runtime-API calls as the GPU and
// the CUDA runtime recorded them, written into scalelab's timeline (core/trace.h) so that
// `--trace` shows them and `--profile` / `profile-summary` build nsys-shaped tables from them
// (kernels, CUDA API, GPU memory operations, NCCL kernels, the device-idle / launch-bound fraction).
//
// libcupti is loaded at run time (dlopen "libcupti.so.13", then "libcupti.so"; SCALELAB_CUPTI_LIB
// names another file): the binary runs where it is absent, and profiling then says so. Records are
// read with libcupti's own cuptiActivityGetNextRecord, so the record layouts are the ones of the
// cupti_activity.h the build used (CUDA 13: CUpti_ActivityKernel10, Memcpy6, Memset4, API); a
// libcupti older than those headers is refused with its version.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"

namespace scalelab {
class Tracer;
}

namespace scalelab::kernels::cuda {

struct ActivityRecord {
  enum class Kind : std::uint8_t { kKernel, kMemcpy, kMemset, kRuntime };
  Kind kind = Kind::kKernel;
  std::string name;  // kernel (demangled), "[CUDA memcpy Host-to-Device]", "[CUDA memset]", "cudaLaunchKernel"
  std::uint64_t start_ns = 0, end_ns = 0;  // CUPTI's clock
  std::uint32_t stream = 0;                // kernels and memory operations
  std::uint32_t thread = 0;                // runtime calls: the calling thread (CUPTI's id)
  std::uint32_t correlation = 0;           // links a launch to its kernel
  std::int64_t bytes = -1;                 // memcpy / memset
  const char* copy_kind = nullptr;         // memcpy: "HtoD", "DtoH", "DtoD", ... (a literal)
};

// The records of one activity buffer (the `valid` bytes CUPTI filled), in buffer order. Runtime
// call names come from cuptiGetCallbackName without the "_v7000"-style version suffix, kernel
// names are demangled. Throws RuntimeError when libcupti cannot be loaded or a record is malformed;
// kinds other than the four are skipped.
std::vector<ActivityRecord> parse_activity_buffer(std::uint8_t* buffer, std::size_t valid);

// Writes records into `tracer` as complete events: kernels (cat "kernel", args.index = the
// correlation id), memory operations (cat "gpu_memcpy" / "gpu_memset", args.bytes, args.phase =
// the copy kind) on a track per stream ("CUDA stream N (CUPTI)"), runtime calls (cat
// "cuda_runtime", args.index = correlation id) on a track per calling thread ("CUDA API, host
// thread K (CUPTI)"). Times: ns / 1000 + offset_us on the tracer's time base.
void write_activity(Tracer& tracer, const std::vector<ActivityRecord>& records, double offset_us);

// Whether libcupti can be loaded here; when not, `why` says what was tried.
bool cupti_available(std::string* why);

// The CUDA runtime's ActivityProfiler (core/device.h).
std::unique_ptr<ActivityProfiler> make_cupti_profiler();

}  // namespace scalelab::kernels::cuda
