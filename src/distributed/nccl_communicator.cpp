#include "distributed/nccl_communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace scalelab {
namespace {

std::chrono::microseconds to_us(double s) { return std::chrono::microseconds(static_cast<std::int64_t>(s * 1e6)); }

// A collective on the communication stream, between two events.
class NcclWork final : public CommWork {
 public:
  NcclWork(NcclCommunicator& owner, NcclApi& api, std::string what, void* start, void* done, double timeout_s)
      : owner_(owner), api_(api), what_(std::move(what)), start_(start), done_(done),
        issued_(CommClock::now()), deadline_(issued_ + to_us(timeout_s)), timeout_s_(timeout_s) {}
  ~NcclWork() override {
    // Events of a collective that never completed stay alive: the (aborted) stream may hold them.
    if (complete_) {
      api_.event_destroy(start_);
      api_.event_destroy(done_);
    }
  }
  bool done() override {
    if (complete_) return true;
    owner_.check_health(what_);
    if (!api_.event_query(done_)) return false;
    complete_ = true;
    finished_ = CommClock::now();
    // The host saw completion at finished_; the GPU ran it for the time between the events.
    const double ms = api_.event_elapsed_ms(start_, done_);
    started_ = finished_ - std::chrono::duration_cast<CommClock::duration>(std::chrono::duration<double, std::milli>(ms));
    if (started_ < issued_) started_ = issued_;
    return true;
  }
  void wait() override {
    int spins = 0;
    while (!done()) {
      if (CommClock::now() > deadline_) {
        char s[32];
        std::snprintf(s, sizeof(s), "%.1f", timeout_s_);
        const std::string why = "[nccl] rank " + std::to_string(owner_.rank()) + ": " + what_ +
                                " did not complete within " + s + " s (a peer rank died, hung, or issued "
                                "different collectives); the NCCL communicator was aborted — check the other "
                                "ranks' output, or raise --comm-timeout if steps legitimately take longer";
        owner_.fail(why);
        throw RuntimeError(why);
      }
      if (++spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  CommClock::time_point started() const override { return started_; }
  CommClock::time_point finished() const override { return finished_; }

 private:
  NcclCommunicator& owner_;
  NcclApi& api_;
  std::string what_;
  void* start_;
  void* done_;
  CommClock::time_point issued_, deadline_, started_{}, finished_{};
  double timeout_s_;
  bool complete_ = false;
};

bool all_equal(std::span<const std::int64_t> counts) {
  return std::all_of(counts.begin(), counts.end(), [&](std::int64_t c) { return c == counts[0]; });
}

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, std::unique_ptr<NcclApi> api)
    : bootstrap_(bootstrap), api_(std::move(api)) {}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& bootstrap, std::unique_ptr<NcclApi> api) {
  SCALELAB_CHECK(!bootstrap.device_memory(), "[nccl] the bootstrap communicator must be a host one (MPI)");
  if (!api) api = make_cuda_nccl_api();
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(bootstrap, std::move(api)));
  NcclApi& a = *c->api_;
  const int devices = a.device_count();
  SCALELAB_CHECK(devices > 0, "[nccl] rank " + std::to_string(bootstrap.rank()) +
                                  " sees no CUDA device — run on a GPU node or use --device cpu");
  c->device_ = bootstrap.local_rank() % devices;
  a.set_device(c->device_);

  // Rank 0's unique id reaches every rank over the host communicator (MPI broadcast).
  NcclApi::UniqueId id{};
  if (bootstrap.rank() == 0) id = a.get_unique_id();
  bootstrap.broadcast(id.data(), static_cast<std::int64_t>(id.size()), CommDType::kU8, 0);

  c->comm_stream_ = a.stream_create();
  c->settle(a.comm_init_rank(&c->comm_, bootstrap.world_size(), id, bootstrap.rank()), "ncclCommInitRank");
  c->scratch_ = a.device_alloc(sizeof(float));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (!api_) return;
  if (comm_) {
    if (broken_.empty()) api_->comm_destroy(comm_);
    else api_->comm_abort(comm_);
  }
  if (scratch_) api_->device_free(scratch_);
  if (comm_stream_ && broken_.empty()) api_->stream_destroy(comm_stream_);
}

void NcclCommunicator::fail(const std::string& why) {
  if (!broken_.empty()) return;
  broken_ = why;
  if (comm_) api_->comm_abort(comm_);
}

void NcclCommunicator::check_health(const std::string& what) {
  if (!broken_.empty()) throw RuntimeError(broken_);
  if (std::optional<std::string> peer = bootstrap_.peer_failure()) {
    fail("[nccl] " + *peer + " — rank " + std::to_string(rank()) + " stops too (" + what + " aborted)");
    throw RuntimeError(broken_);
  }
  if (comm_) {
    const NcclApi::Status s = api_->comm_status(comm_);
    if (s.result == NcclApi::Result::kError) {
      fail("[nccl] rank " + std::to_string(rank()) + ": " + what + " failed: " + s.message +
           " — a peer rank may have died; check the other ranks' output");
      throw RuntimeError(broken_);
    }
  }
}

void NcclCommunicator::settle(const NcclApi::Status& first, const std::string& what) {
  NcclApi::Status s = first;
  const auto deadline = CommClock::now() + to_us(options().timeout_s);
  int spins = 0;
  while (s.result == NcclApi::Result::kInProgress) {
    if (std::optional<std::string> peer = bootstrap_.peer_failure()) {
      fail("[nccl] " + *peer + " — rank " + std::to_string(rank()) + " stops too (" + what + " aborted)");
      throw RuntimeError(broken_);
    }
    if (CommClock::now() > deadline) {
      fail("[nccl] rank " + std::to_string(rank()) + ": " + what + " did not complete within " +
           std::to_string(static_cast<int>(options().timeout_s)) +
           " s (a peer rank did not join) — check the other ranks' output");
      throw RuntimeError(broken_);
    }
    if (++spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
    s = api_->comm_status(comm_);
  }
  if (s.result == NcclApi::Result::kError) {
    fail("[nccl] rank " + std::to_string(rank()) + ": " + what + " failed: " + s.message);
    throw RuntimeError(broken_);
  }
}

template <class Enqueue>
std::unique_ptr<CommWork> NcclCommunicator::launch(const std::string& what, Enqueue&& enqueue) {
  const std::string label = what + " (collective #" + std::to_string(++seq_) + ")";
  check_health(label);
  NcclApi& a = *api_;
  // After everything already queued on the compute stream (the gradients being final).
  void* ready = a.event_create();
  a.event_record(ready, compute_stream_);
  a.stream_wait_event(comm_stream_, ready);
  a.event_destroy(ready);  // CUDA keeps a recorded event alive until the wait is satisfied
  void* start = a.event_create();
  void* done = a.event_create();
  a.event_record(start, comm_stream_);
  settle(enqueue(), label);
  a.event_record(done, comm_stream_);
  return std::make_unique<NcclWork>(*this, a, label, start, done, options().timeout_s);
}

std::unique_ptr<CommWork> NcclCommunicator::all_reduce_async(void* buf, std::int64_t count, CommDType dtype,
                                                             ReduceOp op) {
  SCALELAB_CHECK(count >= 0, "[nccl] all_reduce: negative count " + std::to_string(count));
  check_reduce("all_reduce", dtype, op);
  return launch("all_reduce", [&] { return api_->all_reduce(buf, buf, count, dtype, op, comm_, comm_stream_); });
}

std::unique_ptr<CommWork> NcclCommunicator::broadcast_async(void* buf, std::int64_t count, CommDType dtype, int root) {
  SCALELAB_CHECK(count >= 0, "[nccl] broadcast: negative count " + std::to_string(count));
  SCALELAB_CHECK(root >= 0 && root < world_size(), "[nccl] broadcast: root " + std::to_string(root) +
                                                       " outside a world of " + std::to_string(world_size()));
  return launch("broadcast", [&] { return api_->broadcast(buf, buf, count, dtype, root, comm_, comm_stream_); });
}

std::unique_ptr<CommWork> NcclCommunicator::all_gather_async(void* buf, std::span<const std::int64_t> counts,
                                                             CommDType dtype) {
  check_counts("all_gather", counts, world_size());
  const std::size_t esize = comm_dtype_size(dtype);
  char* base = static_cast<char*>(buf);
  if (all_equal(counts)) {
    // In place: this rank's input is where its segment lands.
    const std::int64_t c = counts[0];
    return launch("all_gather", [&] {
      return api_->all_gather(base + static_cast<std::size_t>(c * rank()) * esize, buf, c, dtype, comm_, comm_stream_);
    });
  }
  // Uneven segments: one in-place broadcast per rank, in one NCCL group.
  return launch("all_gather", [&] {
    api_->group_start();
    std::int64_t off = 0;
    for (int r = 0; r < world_size(); ++r) {
      const std::int64_t c = counts[static_cast<std::size_t>(r)];
      char* p = base + static_cast<std::size_t>(off) * esize;
      const NcclApi::Status s = api_->broadcast(p, p, c, dtype, r, comm_, comm_stream_);
      if (s.result == NcclApi::Result::kError) {
        api_->group_end();
        return s;
      }
      off += c;
    }
    return api_->group_end();
  });
}

std::unique_ptr<CommWork> NcclCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                                 std::span<const std::int64_t> counts,
                                                                 CommDType dtype, ReduceOp op) {
  check_counts("reduce_scatter", counts, world_size());
  check_reduce("reduce_scatter", dtype, op);
  const std::size_t esize = comm_dtype_size(dtype);
  if (all_equal(counts)) {
    return launch("reduce_scatter", [&] {
      return api_->reduce_scatter(send, recv, counts[0], dtype, op, comm_, comm_stream_);
    });
  }
  // Uneven segments: one reduction to each segment's owner, in one NCCL group.
  return launch("reduce_scatter", [&] {
    api_->group_start();
    std::int64_t off = 0;
    for (int r = 0; r < world_size(); ++r) {
      const std::int64_t c = counts[static_cast<std::size_t>(r)];
      const char* s = static_cast<const char*>(send) + static_cast<std::size_t>(off) * esize;
      const NcclApi::Status st = api_->reduce(s, r == rank() ? recv : nullptr, c, dtype, op, r, comm_, comm_stream_);
      if (st.result == NcclApi::Result::kError) {
        api_->group_end();
        return st;
      }
      off += c;
    }
    return api_->group_end();
  });
}

std::unique_ptr<CommWork> NcclCommunicator::barrier_async() {
  return launch("barrier", [&] {
    return api_->all_reduce(scratch_, scratch_, 1, CommDType::kF32, ReduceOp::kSum, comm_, comm_stream_);
  });
}

}  // namespace scalelab
