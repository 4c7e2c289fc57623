// The CUDA device runtime: which GPU this process drives, its stream and library handles, device
// memory for the caching allocator (cudaMalloc segments), fills, copies and dtype conversion.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include <nvtx3/nvToolsExt.h>

#include "core/allocator.h"
#include "core/device.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cupti.h"

namespace scalelab {
namespace kernels::cuda {

void check(cudaError_t e, const char* where) {
  if (e == cudaSuccess) return;
  throw RuntimeError(std::string("[") + where + "] CUDA error " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

void check_cublas(cublasStatus_t s, const char* where) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw RuntimeError(std::string("[") + where + "] cuBLASLt error " + std::to_string(static_cast<int>(s)) +
                     " — shapes or dtypes the library does not support here");
}

unsigned pack_grid(std::int64_t n, unsigned threads) {
  const auto cap = static_cast<unsigned>(std::max(1, device_props().multiProcessorCount) * 32);
  return std::min(grid_for(n, threads), cap);
}

bool cuda_kernels_v1() {
  static const bool v1 = [] {
    const char* e = std::getenv("SCALELAB_CUDA_KERNELS");
    return e != nullptr && std::string(e) == "v1";
  }();
  return v1;
}

namespace {

struct State {
  int device = 0;
  cudaDeviceProp props{};
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_ws = nullptr;
  std::size_t lt_ws_bytes = 0;
  std::string error;  // why CUDA is unusable, empty when it is
};

// The launcher's local rank picks the GPU (one GPU per rank), as torchrun's LOCAL_RANK does.
int local_rank_from_env() {
  for (const char* v : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 0;
}

State& state() {
  static State st;
  static std::once_flag once;
  std::call_once(once, [] {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver) {
      int drv = 0, rt = 0;
      cudaDriverGetVersion(&drv);
      cudaRuntimeGetVersion(&rt);
      if (drv == 0) {
        st.error = "no NVIDIA driver is installed (libcuda was not found) — install the driver, or use --device cpu";
        return;
      }
      st.error = "the NVIDIA driver supports CUDA " + std::to_string(drv / 1000) + "." + std::to_string(drv % 1000 / 10) +
                 " but this scalelab was built with CUDA " + std::to_string(rt / 1000) + "." +
                 std::to_string(rt % 1000 / 10) + " — update the driver or rebuild with an older toolkit";
      return;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
      st.error = "no CUDA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
      return;
    }
    if (e != cudaSuccess) {
      st.error = std::string("the CUDA driver could not be initialized: ") + cudaGetErrorName(e) + " (" +
                 cudaGetErrorString(e) + ")";
      return;
    }
    st.device = local_rank_from_env() % n;
    try {
      check(cudaSetDevice(st.device), "cuda");
      check(cudaGetDeviceProperties(&st.props, st.device), "cuda");
      check(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking), "cuda");
      check_cublas(lt::Create(&st.lt), "cuda");
      st.lt_ws_bytes = std::size_t{32} << 20;  // cuBLASLt's recommended workspace on Hopper
      check(cudaMalloc(&st.lt_ws, st.lt_ws_bytes), "cuda");
    } catch (const std::exception& ex) {
      st.error = ex.what();
    }
  });
  return st;
}

State& ready(const char* where) {
  State& st = state();
  if (!st.error.empty()) throw RuntimeError(std::string("[") + where + "] cuda is not available: " + st.error);
  return st;
}

class CudaMemory final : public MemoryBackend {
 public:
  void* raw_alloc(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error so the allocator can flush and retry
      return nullptr;
    }
    check(e, "cudaMalloc");
    return p;
  }
  void raw_free(void* p, std::size_t) override {
    // Blocks may still be read by queued kernels; cudaFree synchronizes the device.
    check(cudaFree(p), "cudaFree");
  }
  DeviceType device() const override { return DeviceType::kCUDA; }
};

template <class S, class D>
__global__ void convert_kernel(const S* __restrict__ src, D* __restrict__ dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_f32<D>(to_f32<S>(src[i]));
  }
}

// DeviceTimer over CUDA events on the process's stream. Events are created once and reused
// window after window (cudaEventCreate is not free); a window holds as many marks as its scopes
// need.
class CudaTimer final : public DeviceTimer {
 public:
  ~CudaTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  int mark() override {
    cudaStream_t s = ready("profile").stream;
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "profile (cudaEventCreate)");
      events_.push_back(e);
    }
    check(cudaEventRecord(events_[used_], s), "profile (cudaEventRecord)");
    return static_cast<int>(used_++);
  }
  std::vector<double> collect() override {
    std::vector<double> at(used_, 0.0);
    if (used_ > 0) {
      check(cudaEventSynchronize(events_[used_ - 1]), "profile (cudaEventSynchronize)");
      for (std::size_t i = 1; i < used_; ++i) {
        float ms = 0;
        check(cudaEventElapsedTime(&ms, events_[0], events_[i]), "profile (cudaEventElapsedTime)");
        at[i] = static_cast<double>(ms) * 1e3;
      }
    }
    check(cudaStreamSynchronize(ready("profile").stream), "profile (synchronize)");
    used_ = 0;
    return at;
  }

 private:
  std::vector<cudaEvent_t> events_;
  std::size_t used_ = 0;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  DeviceTimer* timer() override {
    ready("profile");
    return &timer_;
  }
  std::unique_ptr<ActivityProfiler> activity_profiler() override { return make_cupti_profiler(); }
  DeviceType device() const override { return DeviceType::kCUDA; }
  std::unique_ptr<MemoryBackend> make_memory_backend() override {
    ready("cuda");
    return std::make_unique<CudaMemory>();
  }
  std::size_t total_memory() override {
    ready("cuda");
    std::size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return total_b;
  }
  std::size_t free_memory() override {
    ready("cuda");
    std::size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return free_b;
  }
  std::string describe() override {
    State& st = ready("cuda");
    int drv = 0;
    cudaDriverGetVersion(&drv);
    char buf[1024];
    std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %.1f GiB, driver CUDA %d.%d, device %d)", st.props.name,
                  st.props.major, st.props.minor, st.props.multiProcessorCount,
                  static_cast<double>(st.props.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), drv / 1000,
                  drv % 1000 / 10, st.device);
    return std::string(buf) + "; flash attention: " + cudnn_flash_status();
  }
  void fill_zero(void* dst, std::size_t bytes) override {
    if (bytes) check(cudaMemsetAsync(dst, 0, bytes, ready("fill_zero").stream), "fill_zero");
  }
  void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) override {
    if (n == 0) return;
    cudaStream_t s = ready("convert").stream;
    if (st == dt) {
      check(cudaMemcpyAsync(dst, src, n * dtype_size(st), cudaMemcpyDeviceToDevice, s), "convert");
      return;
    }
    dispatch_float(st, "convert", [&]<class S>() {
      dispatch_float(dt, "convert", [&]<class D>() {
        convert_kernel<S, D><<<grid_for(static_cast<std::int64_t>(n)), 256, 0, s>>>(
            static_cast<const S*>(src), static_cast<D*>(dst), static_cast<std::int64_t>(n));
      });
    });
    check_launch("convert");
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (!bytes) return;
    cudaStream_t s = ready("copy_to_host").stream;
    check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s), "copy_to_host");
    check(cudaStreamSynchronize(s), "copy_to_host");
  }
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    if (!bytes) return;
    cudaStream_t s = ready("copy_from_host").stream;
    check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, s), "copy_from_host");
    // The host buffer may be reused as soon as we return.
    check(cudaStreamSynchronize(s), "copy_from_host");
  }
  void synchronize() override { check(cudaStreamSynchronize(ready("synchronize").stream), "synchronize"); }
  // NVTX (header-only nvtx3 from the toolkit): a no-op branch unless a tool such as nsys injected
  // itself into the process; then each range shows on this thread's timeline.
  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }

 private:
  CudaTimer timer_;
};

}  // namespace

cudaStream_t stream() { return ready("cuda").stream; }
cublasLtHandle_t cublaslt() { return ready("cuda").lt; }
void* cublaslt_workspace(std::size_t* bytes) {
  State& st = ready("cuda");
  *bytes = st.lt_ws_bytes;
  return st.lt_ws;
}
const cudaDeviceProp& device_props() { return ready("cuda").props; }

}  // namespace kernels::cuda

DeviceRuntime* cuda_runtime_or_null(std::string* why) {
  static kernels::cuda::CudaRuntime rt;
  const std::string& err = kernels::cuda::state().error;
  if (!err.empty()) {
    if (why) *why = err;
    return nullptr;
  }
  return &rt;
}

}  // namespace scalelab
