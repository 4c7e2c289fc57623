#pragma once
// Test double: N ranks as N threads of one process, with a Communicator per rank whose collectives
// meet in shared memory. Used to test logic built on the Communicator interface (DDP, ZeRO, the
// config check, the NCCL bootstrap) without mpirun; the MPI implementation itself is tested under
// mpirun (tests/distributed/mpi/). Collectives complete synchronously; a rank that does not arrive makes
// the others fail after the timeout, and notify_failure() reaches the others at once.
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "distributed/communicator.h"

namespace scalelab::testing {

class ThreadWorld {
 public:
  explicit ThreadWorld(int n, double timeout_s = 10.0) : n_(n), slots_(static_cast<std::size_t>(n)) {
    options_.timeout_s = timeout_s;
    options_.failure_linger_s = 0;
    for (int r = 0; r < n; ++r) comms_.push_back(std::make_unique<Comm>(*this, r));
  }
  int size() const { return n_; }
  Communicator& comm(int r) { return *comms_[static_cast<std::size_t>(r)]; }
  std::int64_t collectives(int r) const { return comms_[static_cast<std::size_t>(r)]->count; }

  // Runs fn(rank, comm) on one thread per rank; rethrows the first exception (by rank).
  void run(const std::function<void(int, Communicator&)>& fn) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n_));
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r)
      threads.emplace_back([&, r] {
        try {
          fn(r, comm(r));
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  struct Slot {
    std::string what;
    const void* in = nullptr;
    void* out = nullptr;
    std::int64_t count = 0;
    std::vector<std::int64_t> counts;
    CommDType dtype = CommDType::kU8;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
  };

  template <class T>
  static void reduce_into(T* out, const std::vector<const T*>& ins, std::int64_t n, ReduceOp op) {
    for (std::int64_t i = 0; i < n; ++i) {
      T acc = ins[0][i];
      for (std::size_t r = 1; r < ins.size(); ++r) {
        const T v = ins[r][i];
        if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc = static_cast<T>(acc + v);
        else if (op == ReduceOp::kMax) acc = v > acc ? v : acc;
        else acc = v < acc ? v : acc;
      }
      if (op == ReduceOp::kAvg) acc = static_cast<T>(acc / static_cast<T>(ins.size()));
      out[i] = acc;
    }
  }
  static void reduce_bytes(void* out, const std::vector<const void*>& ins, std::int64_t n, CommDType t, ReduceOp op) {
    auto go = [&](auto tag) {
      using T = decltype(tag);
      std::vector<const T*> p;
      for (const void* i : ins) p.push_back(static_cast<const T*>(i));
      reduce_into(static_cast<T*>(out), p, n, op);
    };
    switch (t) {
      case CommDType::kF32: go(float{}); break;
      case CommDType::kF64: go(double{}); break;
      case CommDType::kI32: go(std::int32_t{}); break;
      case CommDType::kI64: go(std::int64_t{}); break;
      case CommDType::kU64: go(std::uint64_t{}); break;
      case CommDType::kU8: go(std::uint8_t{}); break;
    }
  }

  // Waits until every rank reached this barrier; throws on timeout or a peer's failure notice.
  void barrier(int rank) {
    std::unique_lock<std::mutex> lk(mu_);
    const std::uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const bool ok = cv_.wait_for(lk, std::chrono::duration<double>(options_.timeout_s),
                                 [&] { return generation_ != gen || (!failure_.empty() && failed_rank_ != rank); });
    if (generation_ != gen) return;
    if (!failure_.empty() && failed_rank_ != rank)
      throw RuntimeError("[thread-world] " + failure_ + " — rank " + std::to_string(rank) + " stops too");
    if (!ok) throw RuntimeError("[thread-world] rank " + std::to_string(rank) + ": a collective timed out");
  }

  // One collective: publish the slot, meet, compute this rank's result from everyone's inputs,
  // meet again (nobody reads the inputs any more), then write it.
  void collective(int rank, Slot s) {
    const std::size_t me = static_cast<std::size_t>(rank);
    slots_[me] = s;
    barrier(rank);
    for (const Slot& o : slots_)
      if (o.what != s.what || o.dtype != s.dtype)
        throw RuntimeError("[thread-world] rank " + std::to_string(rank) + " issued " + s.what +
                           " while a peer issued " + o.what);
    const std::size_t es = comm_dtype_size(s.dtype);
    std::vector<char> result;
    std::int64_t out_count = 0;
    if (s.what == "all_reduce") {
      out_count = s.count;
      result.resize(static_cast<std::size_t>(out_count) * es);
      std::vector<const void*> ins;
      for (const Slot& o : slots_) ins.push_back(o.in);
      reduce_bytes(result.data(), ins, out_count, s.dtype, s.op);
    } else if (s.what == "broadcast") {
      out_count = s.count;
      const char* src = static_cast<const char*>(slots_[static_cast<std::size_t>(s.root)].in);
      result.assign(src, src + out_count * static_cast<std::int64_t>(es));
    } else if (s.what == "all_gather") {
      for (std::int64_t c : s.counts) out_count += c;
      result.resize(static_cast<std::size_t>(out_count) * es);
      std::int64_t off = 0;
      for (std::size_t r = 0; r < slots_.size(); ++r) {
        const std::size_t bytes = static_cast<std::size_t>(s.counts[r]) * es;
        std::memcpy(result.data() + off * static_cast<std::int64_t>(es),
                    static_cast<const char*>(slots_[r].in) + off * static_cast<std::int64_t>(es), bytes);
        off += s.counts[r];
      }
    } else if (s.what == "reduce_scatter") {
      out_count = s.counts[me];
      const std::int64_t off = segment_offset(s.counts, rank);
      result.resize(static_cast<std::size_t>(out_count) * es);
      std::vector<const void*> ins;
      for (const Slot& o : slots_) ins.push_back(static_cast<const char*>(o.in) + off * static_cast<std::int64_t>(es));
      reduce_bytes(result.data(), ins, out_count, s.dtype, s.op);
    }
    barrier(rank);
    if (out_count > 0) std::memcpy(s.out, result.data(), result.size());
  }

  class Comm final : public Communicator {
   public:
    Comm(ThreadWorld& w, int r) : w_(w), r_(r) {}
    const char* backend() const override { return "thread-world"; }
    int rank() const override { return r_; }
    int world_size() const override { return w_.n_; }
    int local_rank() const override { return r_; }
    const CommOptions& options() const override { return w_.options_; }
    std::unique_ptr<CommWork> all_reduce_async(void* buf, std::int64_t count, CommDType dtype, ReduceOp op) override {
      check_reduce("all_reduce", dtype, op);
      return run({"all_reduce", buf, buf, count, {}, dtype, op, 0});
    }
    std::unique_ptr<CommWork> broadcast_async(void* buf, std::int64_t count, CommDType dtype, int root) override {
      return run({"broadcast", buf, buf, count, {}, dtype, ReduceOp::kSum, root});
    }
    std::unique_ptr<CommWork> all_gather_async(void* buf, std::span<const std::int64_t> counts, CommDType dtype) override {
      check_counts("all_gather", counts, w_.n_);
      return run({"all_gather", buf, buf, 0, {counts.begin(), counts.end()}, dtype, ReduceOp::kSum, 0});
    }
    std::unique_ptr<CommWork> reduce_scatter_async(const void* send, void* recv, std::span<const std::int64_t> counts,
                                                   CommDType dtype, ReduceOp op) override {
      check_counts("reduce_scatter", counts, w_.n_);
      check_reduce("reduce_scatter", dtype, op);
      return run({"reduce_scatter", send, recv, 0, {counts.begin(), counts.end()}, dtype, op, 0});
    }
    std::unique_ptr<CommWork> barrier_async() override { return run({"barrier", nullptr, nullptr, 0, {}, CommDType::kU8, ReduceOp::kSum, 0}); }
    void notify_failure(const std::string& what) override {
      std::lock_guard<std::mutex> lk(w_.mu_);
      if (w_.failure_.empty()) {
        w_.failure_ = "rank " + std::to_string(r_) + " failed: " + what;
        w_.failed_rank_ = r_;
      }
      w_.cv_.notify_all();
    }
    std::optional<std::string> peer_failure() const override {
      std::lock_guard<std::mutex> lk(w_.mu_);
      if (w_.failure_.empty() || w_.failed_rank_ == r_) return std::nullopt;
      return w_.failure_;
    }
    std::int64_t count = 0;

   private:
    std::unique_ptr<CommWork> run(Slot s) {
      ++count;
      w_.collective(r_, std::move(s));
      return std::make_unique<CompletedWork>();
    }
    ThreadWorld& w_;
    int r_;
  };

  int n_;
  CommOptions options_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Comm>> comms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  std::string failure_;
  int failed_rank_ = -1;
};

}  // namespace scalelab::testing
