#pragma once
// The NCCL and CUDA-runtime calls NcclCommunicator makes, behind an interface: the real one
// (make_cuda_nccl_api(), libnccl + cudart) and, in tests, fakes. So the communicator's logic —
// bootstrap of the unique id, device selection, stream ordering, polling with a deadline, abort
// on timeout or a peer's failure — is tested on machines without a GPU. Handles (communicator,
// stream, event, device memory) are opaque pointers.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "distributed/communicator.h"

namespace scalelab {

class NcclApi {
 public:
  enum class Result { kSuccess, kInProgress, kError };
  struct Status {
    Result result = Result::kSuccess;
    std::string message;  // for kError
  };
  using UniqueId = std::array<char, 128>;  // ncclUniqueId

  virtual ~NcclApi() = default;
  virtual std::string version() const = 0;

  // CUDA runtime. Throw RuntimeError on a CUDA error.
  virtual int device_count() = 0;
  virtual void set_device(int device) = 0;
  virtual void* stream_create() = 0;
  virtual void stream_destroy(void* stream) = 0;
  virtual void* event_create() = 0;  // with timing
  virtual void event_destroy(void* event) = 0;
  virtual void event_record(void* event, void* stream) = 0;
  virtual bool event_query(void* event) = 0;  // true when the work before the record completed
  virtual void stream_wait_event(void* stream, void* event) = 0;
  virtual float event_elapsed_ms(void* start, void* end) = 0;
  virtual void* device_alloc(std::size_t bytes) = 0;
  virtual void device_free(void* p) = 0;

  // NCCL. The communicator is non-blocking (ncclConfig_t::blocking = 0): calls may return
  // kInProgress, and comm_status() (ncclCommGetAsyncError) is then polled until it is not.
  virtual UniqueId get_unique_id() = 0;
  virtual Status comm_init_rank(void** comm, int world, const UniqueId& id, int rank) = 0;
  virtual Status comm_status(void* comm) = 0;
  virtual void comm_abort(void* comm) = 0;
  virtual void comm_destroy(void* comm) = 0;
  virtual void group_start() = 0;
  virtual Status group_end() = 0;
  virtual Status all_reduce(const void* send, void* recv, std::int64_t count, CommDType dtype, ReduceOp op,
                            void* comm, void* stream) = 0;
  virtual Status broadcast(const void* send, void* recv, std::int64_t count, CommDType dtype, int root,
                           void* comm, void* stream) = 0;
  virtual Status reduce(const void* send, void* recv, std::int64_t count, CommDType dtype, ReduceOp op, int root,
                        void* comm, void* stream) = 0;
  virtual Status all_gather(const void* send, void* recv, std::int64_t send_count, CommDType dtype, void* comm,
                            void* stream) = 0;
  virtual Status reduce_scatter(const void* send, void* recv, std::int64_t recv_count, CommDType dtype,
                                ReduceOp op, void* comm, void* stream) = 0;
};

// The real API. Throws RuntimeError "built without NCCL" in a build without the CUDA toolkit.
bool cuda_nccl_available();
std::unique_ptr<NcclApi> make_cuda_nccl_api();

}  // namespace scalelab
