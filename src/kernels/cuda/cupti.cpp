#include "kernels/cuda/cupti.h"

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "core/trace.h"

namespace scalelab::kernels::cuda {
namespace {

// The libcupti entry points scalelab uses, resolved once with dlsym (libcupti is a run-time
// option, not a link dependency: a machine without it still runs scalelab; only the GPU activity
// tables are then missing, and the run says so).
struct Cupti {
  void* handle = nullptr;
  std::string error;
  std::string file;
  CUptiResult (*activity_enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*activity_disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*dropped_records)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*get_timestamp)(uint64_t*) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
  CUptiResult (*callback_name)(CUpti_CallbackDomain, uint32_t, const char**) = nullptr;
  CUptiResult (*get_version)(uint32_t*) = nullptr;
  uint32_t version = 0;
};

template <class F>
bool resolve(Cupti& c, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(c.handle, name));
  if (fn == nullptr) c.error = c.file + " has no " + name;
  return fn != nullptr;
}

Cupti& lib() {
  static Cupti c = [] {
    Cupti c;
    std::vector<std::string> names;
    if (const char* env = std::getenv("SCALELAB_CUPTI_LIB"); env && *env) names.emplace_back(env);
    names.emplace_back("libcupti.so.13");
    names.emplace_back("libcupti.so");
    std::string tried;
    for (const auto& n : names) {
      c.handle = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (c.handle) {
        c.file = n;
        break;
      }
      tried += (tried.empty() ? "" : ", ") + n;
    }
    if (!c.handle) {
      c.error = "libcupti not found (tried " + tried +
                "; it ships with the CUDA toolkit and with PyTorch's nvidia-cuda-cupti wheel — add its folder to "
                "LD_LIBRARY_PATH or name the file in SCALELAB_CUPTI_LIB)";
      return c;
    }
    const bool ok = resolve(c, c.activity_enable, "cuptiActivityEnable") &&
                    resolve(c, c.activity_disable, "cuptiActivityDisable") &&
                    resolve(c, c.register_callbacks, "cuptiActivityRegisterCallbacks") &&
                    resolve(c, c.flush_all, "cuptiActivityFlushAll") &&
                    resolve(c, c.next_record, "cuptiActivityGetNextRecord") &&
                    resolve(c, c.dropped_records, "cuptiActivityGetNumDroppedRecords") &&
                    resolve(c, c.get_timestamp, "cuptiGetTimestamp") &&
                    resolve(c, c.result_string, "cuptiGetResultString") &&
                    resolve(c, c.callback_name, "cuptiGetCallbackName") &&
                    resolve(c, c.get_version, "cuptiGetVersion");
    if (!ok) return c;
    c.get_version(&c.version);
    // Records are read with the layouts of the CUDA 13 headers this was built with; a CUPTI of an
    // older major release writes older (shorter) layouts.
    if (c.version < 130000) {
      c.error = c.file + " is CUPTI API version " + std::to_string(c.version) + ", older than the " +
                std::to_string(CUPTI_API_VERSION) + " scalelab was built with";
    }
    return c;
  }();
  return c;
}

Cupti& usable(const char* where) {
  Cupti& c = lib();
  if (!c.error.empty()) throw RuntimeError(std::string("[") + where + "] " + c.error);
  return c;
}

std::string cupti_error(Cupti& c, CUptiResult r) {
  const char* s = nullptr;
  if (c.result_string) c.result_string(r, &s);
  return s ? s : "CUPTI error " + std::to_string(static_cast<int>(r));
}

void check_cupti(Cupti& c, CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) throw RuntimeError(std::string("[profile] ") + what + ": " + cupti_error(c, r));
}

std::string demangle(const char* name) {
  if (name == nullptr) return "(unnamed kernel)";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return name;
  std::string out(d);
  std::free(d);
  return out;
}

// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel", as nsys names them.
std::string runtime_name(Cupti& c, CUpti_CallbackId cbid) {
  static std::mutex mu;
  static std::map<CUpti_CallbackId, std::string> cache;
  std::lock_guard<std::mutex> lk(mu);
  auto it = cache.find(cbid);
  if (it != cache.end()) return it->second;
  const char* raw = nullptr;
  std::string name;
  if (c.callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &raw) == CUPTI_SUCCESS && raw) {
    name = raw;
    const auto v = name.rfind("_v");
    if (v != std::string::npos && v + 2 < name.size() &&
        std::all_of(name.begin() + static_cast<std::ptrdiff_t>(v) + 2, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      name.resize(v);
    }
  } else {
    name = "cuda runtime call " + std::to_string(cbid);
  }
  cache.emplace(cbid, name);
  return name;
}

const char* copy_kind_short(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DtoA";
    default: return "unknown";
  }
}

// nsys's operation names in cuda_gpu_mem_time_sum.
std::string copy_name(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[CUDA memcpy Host-to-Device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[CUDA memcpy Device-to-Host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[CUDA memcpy Device-to-Device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "[CUDA memcpy Host-to-Host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[CUDA memcpy Peer-to-Peer]";
    default: return std::string("[CUDA memcpy ") + copy_kind_short(k) + "]";
  }
}

// The fields kernels, copies and memsets share (each record struct has them under these names).
template <class R>
void device_fields(ActivityRecord& a, const R& r) {
  a.start_ns = r.start;
  a.end_ns = r.end;
  a.stream = r.streamId;
  a.correlation = r.correlationId;
}

}  // namespace

bool cupti_available(std::string* why) {
  Cupti& c = lib();
  if (!c.error.empty() && why) *why = c.error;
  return c.error.empty();
}

std::vector<ActivityRecord> parse_activity_buffer(std::uint8_t* buffer, std::size_t valid) {
  Cupti& c = usable("profile");
  std::vector<ActivityRecord> out;
  CUpti_Activity* rec = nullptr;
  for (;;) {
    const CUptiResult r = c.next_record(buffer, valid, &rec);
    if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // the end of the buffer
    check_cupti(c, r, "reading a CUPTI activity record");
    ActivityRecord a;
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        a.kind = ActivityRecord::Kind::kKernel;
        a.name = demangle(k->name);
        device_fields(a, *k);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        a.kind = ActivityRecord::Kind::kMemcpy;
        a.name = copy_name(m->copyKind);
        a.copy_kind = copy_kind_short(m->copyKind);
        a.bytes = static_cast<std::int64_t>(m->bytes);
        device_fields(a, *m);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        a.kind = ActivityRecord::Kind::kMemset;
        a.name = "[CUDA memset]";
        a.bytes = static_cast<std::int64_t>(m->bytes);
        device_fields(a, *m);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* api = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        a.kind = ActivityRecord::Kind::kRuntime;
        a.name = runtime_name(c, api->cbid);
        a.start_ns = api->start;
        a.end_ns = api->end;
        a.thread = api->threadId;
        a.correlation = api->correlationId;
        break;
      }
      default: continue;
    }
    if (a.end_ns < a.start_ns) {
      throw RuntimeError("[profile] a CUPTI record of '" + a.name + "' ends before it starts (" +
                         std::to_string(a.start_ns) + " > " + std::to_string(a.end_ns) + ")");
    }
    out.push_back(std::move(a));
  }
  return out;
}

void write_activity(Tracer& tracer, const std::vector<ActivityRecord>& records, double offset_us) {
  // Track ids per stream and per calling thread, named in order of first appearance.
  std::map<std::uint32_t, int> streams, threads;
  for (const ActivityRecord& a : records) {
    const double ts = static_cast<double>(a.start_ns) * 1e-3 + offset_us;
    const double dur = static_cast<double>(a.end_ns - a.start_ns) * 1e-3;
    int tid = 0;
    if (a.kind == ActivityRecord::Kind::kRuntime) {
      auto it = threads.find(a.thread);
      if (it == threads.end()) {
        // The tracer keeps names stable across calls: one track per CUPTI thread id.
        it = threads.emplace(a.thread, tracer.track("CUDA API, host thread " + std::to_string(a.thread) + " (CUPTI)")).first;
      }
      tid = it->second;
    } else {
      auto it = streams.find(a.stream);
      if (it == streams.end()) it = streams.emplace(a.stream, tracer.track("CUDA stream " + std::to_string(a.stream) + " (CUPTI)")).first;
      tid = it->second;
    }
    switch (a.kind) {
      case ActivityRecord::Kind::kKernel:
        tracer.complete_us(a.name, "kernel", ts, dur, tid, nullptr, a.correlation);
        break;
      case ActivityRecord::Kind::kMemcpy:
        tracer.complete_us(a.name, "gpu_memcpy", ts, dur, tid, a.copy_kind, -1, a.bytes);
        break;
      case ActivityRecord::Kind::kMemset:
        tracer.complete_us(a.name, "gpu_memset", ts, dur, tid, nullptr, -1, a.bytes);
        break;
      case ActivityRecord::Kind::kRuntime:
        tracer.complete_us(a.name, "cuda_runtime", ts, dur, tid, nullptr, a.correlation);
        break;
    }
  }
}

namespace {

// CUPTI's activity API is process-wide: one profiler records at a time.
class CuptiProfiler final : public ActivityProfiler {
 public:
  ~CuptiProfiler() override {
    try {
      stop();
    } catch (...) {
    }
  }

  bool start(Tracer* tracer, std::string* why) override {
    Cupti& c = lib();
    if (!c.error.empty()) {
      if (why) *why = c.error;
      return false;
    }
    CuptiProfiler* expected = nullptr;
    if (!active().compare_exchange_strong(expected, this)) {
      if (why) *why = "another CUPTI activity profiler is running in this process";
      return false;
    }
    tracer_ = tracer;
    offset_us_ = clock_offset(c);
    CUptiResult r = c.register_callbacks(&CuptiProfiler::buffer_requested, &CuptiProfiler::buffer_completed);
    const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};
    for (CUpti_ActivityKind k : kinds) {
      if (r != CUPTI_SUCCESS) break;
      r = c.activity_enable(k);
      if (r == CUPTI_SUCCESS) enabled_.push_back(k);
    }
    if (r != CUPTI_SUCCESS) {
      // CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED and friends: nsys or another tool holds CUPTI.
      if (why) *why = "CUPTI refused activity recording: " + cupti_error(c, r) + " (is nsys or another profiler attached?)";
      for (CUpti_ActivityKind k : enabled_) c.activity_disable(k);
      enabled_.clear();
      active().store(nullptr);
      return false;
    }
    running_ = true;
    return true;
  }

  void flush() override {
    if (!running_) return;
    Cupti& c = lib();
    check_cupti(c, c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flushing CUPTI activity buffers");
  }

  void stop() override {
    if (!running_) return;
    flush();
    Cupti& c = lib();
    for (CUpti_ActivityKind k : enabled_) c.activity_disable(k);
    enabled_.clear();
    std::size_t dropped = 0;
    if (c.dropped_records(nullptr, 0, &dropped) == CUPTI_SUCCESS) dropped_ += dropped;
    running_ = false;
    active().store(nullptr);
  }

  std::uint64_t dropped() const override { return dropped_ + parse_failures_; }

  std::string describe() const override {
    Cupti& c = lib();
    return "CUPTI activity (API version " + std::to_string(c.version) + ", " + c.file +
           "): kernels, memcpy, memset, CUDA runtime calls";
  }

 private:
  static std::atomic<CuptiProfiler*>& active() {
    static std::atomic<CuptiProfiler*> a{nullptr};
    return a;
  }

  // CUPTI's clock to the tracer's: the closest of a few paired readings.
  double clock_offset(Cupti& c) const {
    double best_gap = 1e30, offset = 0;
    for (int i = 0; i < 5; ++i) {
      const double h0 = tracer_->now_us();
      uint64_t ns = 0;
      c.get_timestamp(&ns);
      const double h1 = tracer_->now_us();
      if (h1 - h0 < best_gap) {
        best_gap = h1 - h0;
        offset = 0.5 * (h0 + h1) - static_cast<double>(ns) * 1e-3;
      }
    }
    return offset;
  }

  static constexpr std::size_t kBufferBytes = 8u << 20;
  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
  }
  static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CuptiProfiler* self = active().load();
    if (self && self->tracer_ && valid > 0) {
      try {
        write_activity(*self->tracer_, parse_activity_buffer(buffer, valid), self->offset_us_);
      } catch (...) {
        // Called on CUPTI's thread: nothing may escape; the loss is counted and reported.
        ++self->parse_failures_;
      }
    }
    std::free(buffer);
  }

  Tracer* tracer_ = nullptr;
  double offset_us_ = 0;
  bool running_ = false;
  std::vector<CUpti_ActivityKind> enabled_;
  std::uint64_t dropped_ = 0;
  std::atomic<std::uint64_t> parse_failures_{0};
};

}  // namespace

std::unique_ptr<ActivityProfiler> make_cupti_profiler() { return std::make_unique<CuptiProfiler>(); }

}  // namespace scalelab::kernels::cuda
