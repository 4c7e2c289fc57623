// NcclApi over the real libnccl and CUDA runtime (SCALELAB_HAVE_NCCL), or the message that this
// build has none.
#include "distributed/nccl_api.h"

#include "core/error.h"

#if SCALELAB_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

namespace scalelab {
namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw RuntimeError(std::string("[nccl] ") + what + " failed: " + cudaGetErrorString(e) +
                       " — check the GPU (nvidia-smi) and CUDA_VISIBLE_DEVICES");
}

ncclDataType_t nccl_type(CommDType t) {
  switch (t) {
    case CommDType::kF32: return ncclFloat32;
    case CommDType::kF64: return ncclFloat64;
    case CommDType::kI32: return ncclInt32;
    case CommDType::kI64: return ncclInt64;
    case CommDType::kU64: return ncclUint64;
    case CommDType::kU8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

NcclApi::Status status(ncclResult_t r) {
  if (r == ncclSuccess) return {};
  if (r == ncclInProgress) return {NcclApi::Result::kInProgress, {}};
  return {NcclApi::Result::kError, std::string(ncclGetErrorString(r)) + " (" + ncclGetLastError(nullptr) + ")"};
}

ncclComm_t C(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t E(void* e) { return static_cast<cudaEvent_t>(e); }

class CudaNcclApi final : public NcclApi {
 public:
  std::string version() const override {
    int v = 0;
    ncclGetVersion(&v);
    return "nccl " + std::to_string(v);
  }
  int device_count() override {
    int n = 0;
    cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    return n;
  }
  void set_device(int device) override { cuda_check(cudaSetDevice(device), "cudaSetDevice"); }
  void* stream_create() override {
    cudaStream_t s = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }
  void stream_destroy(void* s) override { cudaStreamDestroy(S(s)); }
  void* event_create() override {
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreate(&e), "cudaEventCreate");
    return e;
  }
  void event_destroy(void* e) override { cudaEventDestroy(E(e)); }
  void event_record(void* e, void* s) override { cuda_check(cudaEventRecord(E(e), S(s)), "cudaEventRecord"); }
  bool event_query(void* e) override {
    const cudaError_t r = cudaEventQuery(E(e));
    if (r == cudaErrorNotReady) return false;
    cuda_check(r, "cudaEventQuery");
    return true;
  }
  void stream_wait_event(void* s, void* e) override {
    cuda_check(cudaStreamWaitEvent(S(s), E(e), 0), "cudaStreamWaitEvent");
  }
  float event_elapsed_ms(void* a, void* b) override {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, E(a), E(b)), "cudaEventElapsedTime");
    return ms;
  }
  void* device_alloc(std::size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void device_free(void* p) override { cudaFree(p); }

  UniqueId get_unique_id() override {
    ncclUniqueId id;
    const Status s = status(ncclGetUniqueId(&id));
    if (s.result == Result::kError) throw RuntimeError("[nccl] ncclGetUniqueId failed: " + s.message);
    UniqueId out;
    static_assert(sizeof(id) == sizeof(UniqueId), "ncclUniqueId is 128 bytes");
    std::memcpy(out.data(), &id, sizeof(id));
    return out;
  }
  Status comm_init_rank(void** comm, int world, const UniqueId& id, int rank) override {
    ncclUniqueId nid;
    std::memcpy(&nid, id.data(), sizeof(nid));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const Status s = status(ncclCommInitRankConfig(&c, world, nid, rank, &config));
    *comm = c;
    return s;
  }
  Status comm_status(void* comm) override {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(C(comm), &async);
    if (r != ncclSuccess) return status(r);
    return status(async);
  }
  void comm_abort(void* comm) override { ncclCommAbort(C(comm)); }
  void comm_destroy(void* comm) override { ncclCommDestroy(C(comm)); }
  void group_start() override { ncclGroupStart(); }
  Status group_end() override { return status(ncclGroupEnd()); }
  Status all_reduce(const void* send, void* recv, std::int64_t count, CommDType dtype, ReduceOp op, void* comm,
                    void* stream) override {
    return status(ncclAllReduce(send, recv, static_cast<std::size_t>(count), nccl_type(dtype), nccl_op(op), C(comm), S(stream)));
  }
  Status broadcast(const void* send, void* recv, std::int64_t count, CommDType dtype, int root, void* comm,
                   void* stream) override {
    return status(ncclBroadcast(send, recv, static_cast<std::size_t>(count), nccl_type(dtype), root, C(comm), S(stream)));
  }
  Status reduce(const void* send, void* recv, std::int64_t count, CommDType dtype, ReduceOp op, int root, void* comm,
                void* stream) override {
    return status(ncclReduce(send, recv, static_cast<std::size_t>(count), nccl_type(dtype), nccl_op(op), root, C(comm),
                             S(stream)));
  }
  Status all_gather(const void* send, void* recv, std::int64_t send_count, CommDType dtype, void* comm,
                    void* stream) override {
    return status(ncclAllGather(send, recv, static_cast<std::size_t>(send_count), nccl_type(dtype), C(comm), S(stream)));
  }
  Status reduce_scatter(const void* send, void* recv, std::int64_t recv_count, CommDType dtype, ReduceOp op,
                        void* comm, void* stream) override {
    return status(ncclReduceScatter(send, recv, static_cast<std::size_t>(recv_count), nccl_type(dtype), nccl_op(op),
                                    C(comm), S(stream)));
  }
};

}  // namespace

bool cuda_nccl_available() { return true; }
std::unique_ptr<NcclApi> make_cuda_nccl_api() { return std::make_unique<CudaNcclApi>(); }

}  // namespace scalelab

#else  // !SCALELAB_HAVE_NCCL

namespace scalelab {

bool cuda_nccl_available() { return false; }
std::unique_ptr<NcclApi> make_cuda_nccl_api() {
  throw RuntimeError("[nccl] this scalelab was built without NCCL (no CUDA toolkit with libnccl found, or "
                     "SCALELAB_WITH_NCCL=OFF) — rebuild where /usr/local/cuda has nccl.h and libnccl to run "
                     "data-parallel ranks on GPUs");
}

}  // namespace scalelab

#endif
