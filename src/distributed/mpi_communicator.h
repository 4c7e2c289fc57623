#pragma once
// The MPI communicator (OpenMPI): collectives over host memory between the ranks of an
// `mpirun -np N` or `srun --mpi=pmix` launch.
//
// How it works: one communication thread per communicator runs every collective, in the order
// they were issued, as a non-blocking MPI call (MPI_Iallreduce, ...) polled with MPI_Test. So a
// collective overlaps whatever the calling thread does next (the DDP reducer relies on this), and
// a collective never blocks for longer than the timeout (options().timeout_s): when it expires,
// the thread asks every peer over a separate control channel (a duplicate of MPI_COMM_WORLD) how
// many collectives it has started, and the error names the ranks that are behind ("rank 1 has
// started only 11 collectives: stalled, or its step takes longer than --comm-timeout") or do not
// answer (dead or hung). A rank's notify_failure() reaches the others over the same channel, so
// their collectives fail at once with a message naming it. Only the communication thread calls
// MPI between construction and destruction, so MPI_THREAD_SERIALIZED suffices (MULTIPLE is asked
// for).
//
// MPI is initialized by the first communicator of a process and finalized when the last one is
// destroyed, unless one of them failed: after a failure a rank must not wait in MPI_Finalize for
// peers that are gone, so it exits without finalizing and the launcher ends the job. MPI cannot
// be initialized twice, so create one communicator per process and keep it until the end.
//
// A build without MPI (SCALELAB_WITH_MPI=OFF) compiles create() to throw "built without MPI".
#include <cstdint>
#include <memory>

#include "distributed/communicator.h"

namespace scalelab {

class MpiCommunicator final : public Communicator {
 public:
  // True when this build has MPI.
  static bool available();
  // Initializes MPI if needed and duplicates MPI_COMM_WORLD. Throws RuntimeError when MPI is not
  // built in, was already finalized, or lacks thread support.
  static std::unique_ptr<MpiCommunicator> create(const CommOptions& options = {});
  ~MpiCommunicator() override;

  const char* backend() const override { return "mpi"; }
  int rank() const override;
  int world_size() const override;
  int local_rank() const override;
  const CommOptions& options() const override;

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

  void notify_failure(const std::string& what) override;
  std::optional<std::string> peer_failure() const override;

  // Collectives this rank's communication thread has started / completed (diagnostics, tests).
  std::uint64_t ops_started() const;
  std::uint64_t ops_completed() const;

  // Ends every rank of the job now (MPI_Abort) with this exit code. Only for src/cli, after the
  // error was reported: library code never ends the process.
  [[noreturn]] void abort_job(int exit_code);

  struct Impl;

 private:
  explicit MpiCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace scalelab
