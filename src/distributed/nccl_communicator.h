#pragma once
// The NCCL communicator: collectives over device (GPU) memory.
//
// Created collectively over a host communicator (MPI) that bootstraps it: rank 0 makes the
// ncclUniqueId and broadcasts it; every rank selects GPU local_rank % device_count and joins. Its
// collectives run on its own CUDA stream, after the work already queued on the trainer's compute
// stream (set_compute_stream: an event recorded there, waited on by the communication stream), so
// a gradient bucket's all-reduce overlaps the rest of backward. CommWork::wait() polls the
// completion event and NCCL's asynchronous error with the communicator's deadline and the host
// communicator's failure notices: a timeout or a failed peer aborts the NCCL communicator
// (ncclCommAbort) and throws, naming the rank when a peer reported its failure.
//
// This machine has no GPU: the logic is tested with a fake NcclApi (tests/distributed/nccl_test.cpp);
// the real API compiles and links against the toolkit's libnccl where present.
#include <cstdint>
#include <memory>

#include "distributed/communicator.h"
#include "distributed/nccl_api.h"

namespace scalelab {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`, which must outlive this communicator. api: the NCCL/CUDA calls
  // (null: the real ones, make_cuda_nccl_api()). Throws RuntimeError when there is no GPU, the
  // build has no NCCL, or the ranks do not all join within the timeout.
  static std::unique_ptr<NcclCommunicator> create(Communicator& bootstrap, std::unique_ptr<NcclApi> api = nullptr);
  ~NcclCommunicator() override;

  const char* backend() const override { return "nccl"; }
  int rank() const override { return bootstrap_.rank(); }
  int world_size() const override { return bootstrap_.world_size(); }
  int local_rank() const override { return bootstrap_.local_rank(); }
  bool device_memory() const override { return true; }
  const CommOptions& options() const override { return bootstrap_.options(); }
  int device() const { return device_; }

  // The stream the trainer's kernels run on (nullptr: the legacy default stream).
  void set_compute_stream(void* stream) { compute_stream_ = stream; }
  void* comm_stream() const { return comm_stream_; }

  std::unique_ptr<CommWork> all_reduce_async(void* buf, std::int64_t count, CommDType dtype,
                                             ReduceOp op) override;
  std::unique_ptr<CommWork> broadcast_async(void* buf, std::int64_t count, CommDType dtype,
                                            int root) override;
  std::unique_ptr<CommWork> all_gather_async(void* buf, std::span<const std::int64_t> counts,
                                             CommDType dtype) override;
  std::unique_ptr<CommWork> reduce_scatter_async(const void* send, void* recv,
                                                 std::span<const std::int64_t> counts,
                                                 CommDType dtype, ReduceOp op) override;
  std::unique_ptr<CommWork> barrier_async() override;

  // Delegated to the bootstrap communicator (the host channel between the ranks).
  void notify_failure(const std::string& what) override { bootstrap_.notify_failure(what); }
  std::optional<std::string> peer_failure() const override { return bootstrap_.peer_failure(); }

  // Used by the works: throws RuntimeError if the communicator failed, a peer reported failure or
  // NCCL reports an asynchronous error (aborting the NCCL communicator).
  void check_health(const std::string& what);
  // Aborts the NCCL communicator (after a timeout); later collectives fail with `why`.
  void fail(const std::string& why);

 private:
  NcclCommunicator(Communicator& bootstrap, std::unique_ptr<NcclApi> api);
  // Waits until a non-blocking NCCL call has taken effect (kInProgress -> poll comm_status).
  void settle(const NcclApi::Status& s, const std::string& what);
  // Orders a collective after the compute stream and wraps it in events.
  template <class Enqueue>
  std::unique_ptr<CommWork> launch(const std::string& what, Enqueue&& enqueue);

  Communicator& bootstrap_;
  std::unique_ptr<NcclApi> api_;
  void* comm_ = nullptr;
  void* comm_stream_ = nullptr;
  void* compute_stream_ = nullptr;
  void* scratch_ = nullptr;  // one float on the device, for barrier()
  int device_ = 0;
  std::uint64_t seq_ = 0;
  std::string broken_;
};

}  // namespace scalelab
