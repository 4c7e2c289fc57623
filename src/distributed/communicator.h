#pragma once
// The communicator: collectives between the ranks of a data-parallel job.
//
// Implementations: SingleCommunicator (one process, every collective is the identity),
// MpiCommunicator (host memory, OpenMPI) and NcclCommunicator (device memory, bootstrapped over
// an MPI communicator). make_communicator() in distributed/dist_context.h picks one from the launcher's
// environment.
//
// Every collective exists as `<name>_async`, which returns a CommWork, and as a blocking `<name>`
// that waits for it. All ranks must issue the same collectives in the same order (as with MPI and
// NCCL), each rank from one thread. A collective that does not complete within the communicator's timeout (--comm-timeout)
// fails with a RuntimeError that says which peer ranks are missing or failed; a peer that called
// notify_failure() makes the collectives of every other rank fail with a message naming it. After
// a failure the communicator is unusable and the process should stop (the CLI reports and exits;
// the launcher ends the other ranks). Nothing waits forever.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace scalelab {

enum class CommDType : std::uint8_t { kF32, kF64, kI32, kI64, kU64, kU8 };
std::size_t comm_dtype_size(CommDType t);
const char* comm_dtype_name(CommDType t);

// kAvg is the sum divided by the world size (floating-point types only).
enum class ReduceOp : std::uint8_t { kSum, kAvg, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

template <class T>
constexpr CommDType comm_dtype_of() {
  if constexpr (std::is_same_v<T, float>) return CommDType::kF32;
  else if constexpr (std::is_same_v<T, double>) return CommDType::kF64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return CommDType::kI32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return CommDType::kI64;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return CommDType::kU64;
  else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, char>) return CommDType::kU8;
  else static_assert(sizeof(T) == 0, "no CommDType for this element type");
}

struct CommOptions {
  // A collective that has not completed this many seconds after it started fails (--comm-timeout).
  double timeout_s = 300.0;
  // After notify_failure(), how long linger_after_failure() keeps serving the peers (so that they
  // receive the notice and report it); the launcher usually ends the job sooner.
  double failure_linger_s = 2.0;
  // MPI progress polling of the communication thread: it spins on MPI_Test for poll_spin_us, then
  // sleeps poll_sleep_us between tests (so that it does not take a core from compute threads).
  int poll_spin_us = 50;
  int poll_sleep_us = 20;
};

using CommClock = std::chrono::steady_clock;

// One collective in flight. Destroying it does not cancel it: keep its buffers alive until
// wait() returned (or the communicator failed).
class CommWork {
 public:
  virtual ~CommWork() = default;
  // True when the collective has completed; throws RuntimeError when it failed.
  virtual bool done() = 0;
  // Blocks until completion (throws RuntimeError on failure, timeout or a failed peer).
  virtual void wait() = 0;
  // When this rank's communication engine started / finished the collective (valid once done).
  virtual CommClock::time_point started() const = 0;
  virtual CommClock::time_point finished() const = 0;
  double seconds() const { return std::chrono::duration<double>(finished() - started()).count(); }
};

// A CommWork that completed when it was created (single process; zero-size collectives).
class CompletedWork final : public CommWork {
 public:
  CompletedWork() : at_(CommClock::now()) {}
  bool done() override { return true; }
  void wait() override {}
  CommClock::time_point started() const override { return at_; }
  CommClock::time_point finished() const override { return at_; }

 private:
  CommClock::time_point at_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const char* backend() const = 0;  // "single", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;        // rank among the ranks of this node
  // True when buffers are device (GPU) pointers (NCCL); false for host memory.
  virtual bool device_memory() const { return false; }
  virtual const CommOptions& options() const = 0;

  // In place: buf holds count elements on every rank and receives the reduction.
  virtual std::unique_ptr<CommWork> all_reduce_async(void* buf, std::int64_t count, CommDType dtype,
                                                     ReduceOp op) = 0;
  // In place: root's count elements are copied to every rank's buf.
  virtual std::unique_ptr<CommWork> broadcast_async(void* buf, std::int64_t count, CommDType dtype,
                                                    int root) = 0;
  // In place: buf holds sum(counts) elements; rank r's input is its segment (counts[r] elements at
  // offset counts[0] + ... + counts[r-1]); afterwards every rank holds every segment.
  virtual std::unique_ptr<CommWork> all_gather_async(void* buf, std::span<const std::int64_t> counts,
                                                     CommDType dtype) = 0;
  // send holds sum(counts) elements on every rank; recv (counts[rank] elements, not overlapping
  // send) receives the reduction of everyone's segment `rank`.
  virtual std::unique_ptr<CommWork> reduce_scatter_async(const void* send, void* recv,
                                                         std::span<const std::int64_t> counts,
                                                         CommDType dtype, ReduceOp op) = 0;
  virtual std::unique_ptr<CommWork> barrier_async() = 0;

  // Tells the other ranks that this rank failed (what: the error), so that their collectives stop
  // with a message naming this rank instead of waiting for the timeout. Returns once the notice is
  // sent (within about 2 s); never throws. with_failure_notice() calls it; after printing the
  // error, the CLI calls linger_after_failure() so that the peers report it before the launcher
  // ends the job.
  virtual void notify_failure(const std::string& what) = 0;
  // The failure a peer reported (its message names the rank), if any. Non-blocking.
  virtual std::optional<std::string> peer_failure() const = 0;

  // Blocking forms.
  void all_reduce(void* buf, std::int64_t count, CommDType dtype, ReduceOp op) {
    all_reduce_async(buf, count, dtype, op)->wait();
  }
  void broadcast(void* buf, std::int64_t count, CommDType dtype, int root) {
    broadcast_async(buf, count, dtype, root)->wait();
  }
  void all_gather(void* buf, std::span<const std::int64_t> counts, CommDType dtype) {
    all_gather_async(buf, counts, dtype)->wait();
  }
  void reduce_scatter(const void* send, void* recv, std::span<const std::int64_t> counts,
                      CommDType dtype, ReduceOp op) {
    reduce_scatter_async(send, recv, counts, dtype, op)->wait();
  }
  void barrier() { barrier_async()->wait(); }

  // Typed conveniences (host memory).
  template <class T>
  void all_reduce(std::span<T> buf, ReduceOp op) {
    all_reduce(buf.data(), static_cast<std::int64_t>(buf.size()), comm_dtype_of<T>(), op);
  }
  template <class T>
  T all_reduce_value(T value, ReduceOp op) {
    all_reduce(std::span<T>(&value, 1), op);
    return value;
  }
  // Every rank's `value`, indexed by rank.
  template <class T>
  std::vector<T> all_gather_value(T value) {
    std::vector<T> out(static_cast<std::size_t>(world_size()));
    out[static_cast<std::size_t>(rank())] = value;
    const std::vector<std::int64_t> counts(out.size(), 1);
    all_gather(out.data(), counts, comm_dtype_of<T>());
    return out;
  }
  // Every rank's byte string, indexed by rank (two collectives: the sizes, then the bytes).
  std::vector<std::string> all_gather_strings(const std::string& mine);
  // Root's string on every rank.
  std::string broadcast_string(const std::string& s, int root);
};

// Splits n elements into world_size contiguous segments of equal size rounded up to a multiple
// of `align` elements (the last segments are shorter or empty): the counts for all_gather /
// reduce_scatter and the ZeRO shards.
std::vector<std::int64_t> even_counts(std::int64_t n, int world_size, std::int64_t align = 1);
// Offset of segment r: counts[0] + ... + counts[r-1].
std::int64_t segment_offset(std::span<const std::int64_t> counts, int r);

// Checks the arguments shared by every implementation (counts match the world, no negative sizes,
// kAvg only on floating types); throws RuntimeError naming the collective (a caller bug).
void check_counts(const char* what, std::span<const std::int64_t> counts, int world_size);
void check_reduce(const char* what, CommDType dtype, ReduceOp op);

// For src/cli, after it printed an error: when a communicator of this process notified a
// failure, keeps serving the peers for failure_linger_s (they receive the notice and report which
// rank failed, and the launcher ends the job), then stops the communication threads of failed
// communicators. A no-op when nothing failed. Defined with the MPI communicator.
void linger_after_failure();

// Runs body(); when it throws, tells the peers (comm.notify_failure, naming this rank and the
// error) and rethrows, so that they stop at once with a message naming the failing rank.
template <class F>
decltype(auto) with_failure_notice(Communicator& comm, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    comm.notify_failure(e.what());
    throw;
  } catch (...) {
    comm.notify_failure("unknown exception");
    throw;
  }
}

}  // namespace scalelab
