#pragma once
// Test double for NcclApi: "device memory" is host memory, each rank (a thread, see
// thread_world.h) has its own FakeNccl, and a shared FakeFabric matches the ranks' collectives
// by sequence number and performs them when the last rank has posted (so completion is
// asynchronous, as on a GPU: events complete only once every rank has posted). Non-blocking
// semantics are exercised: init and collectives return kInProgress and settle through
// comm_status(). Faults can be injected: a rank that never posts, an asynchronous error.
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/nccl_api.h"

namespace scalelab::testing {

struct FakeFabric {
  std::mutex mu;
  int unique_ids_made = 0;
  int drop_collectives_of_rank = -1;  // this rank's collectives are never posted
  std::string async_error;            // non-empty: comm_status reports it

  struct Post {
    std::string kind;
    const void* send = nullptr;
    void* recv = nullptr;
    std::int64_t count = 0;
    CommDType dtype = CommDType::kF32;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
  };
  struct Op {
    std::vector<Post> posts;
    int posted = 0;
    bool done = false;
  };
  struct Group {
    int world = 0;
    int joined = 0;
    std::map<std::uint64_t, std::shared_ptr<Op>> ops;
  };
  std::map<std::string, std::shared_ptr<Group>> groups;  // by unique id
};

class FakeNccl final : public NcclApi {
 public:
  FakeNccl(FakeFabric& fabric, int devices) : f_(fabric), devices_(devices) {}
  std::vector<std::string> calls;  // what the communicator called, in order
  int device_set = -1;
  int aborted = 0;
  int init_rank = -1, init_world = -1;
  UniqueId init_id{};

  std::string version() const override { return "fake"; }
  int device_count() override { return devices_; }
  void set_device(int d) override {
    device_set = d;
    calls.push_back("set_device " + std::to_string(d));
  }
  void* stream_create() override {
    streams_.push_back(std::make_unique<Stream>());
    return streams_.back().get();
  }
  void stream_destroy(void*) override { calls.push_back("stream_destroy"); }
  void* event_create() override {
    events_.push_back(std::make_unique<Event>());
    return events_.back().get();
  }
  void event_destroy(void*) override {}
  void event_record(void* e, void* s) override {
    calls.push_back(s == nullptr ? "record compute" : "record comm");
    auto* ev = static_cast<Event*>(e);
    ev->op = s ? static_cast<Stream*>(s)->last : nullptr;
  }
  bool event_query(void* e) override {
    std::lock_guard<std::mutex> lk(f_.mu);
    auto* ev = static_cast<Event*>(e);
    return !ev->op || ev->op->done;
  }
  void stream_wait_event(void* s, void* e) override {
    calls.push_back(std::string("wait ") + (s ? "comm" : "compute") + "<-" +
                    (static_cast<Event*>(e)->op ? "comm" : "compute"));
  }
  float event_elapsed_ms(void*, void*) override { return 0.5f; }
  void* device_alloc(std::size_t bytes) override {
    buffers_.push_back(std::vector<char>(bytes));
    return buffers_.back().data();
  }
  void device_free(void*) override {}

  UniqueId get_unique_id() override {
    std::lock_guard<std::mutex> lk(f_.mu);
    UniqueId id{};
    const std::string s = "fake-id-" + std::to_string(++f_.unique_ids_made);
    std::memcpy(id.data(), s.data(), s.size());
    calls.push_back("get_unique_id");
    return id;
  }
  Status comm_init_rank(void** comm, int world, const UniqueId& id, int rank) override {
    std::lock_guard<std::mutex> lk(f_.mu);
    init_rank = rank;
    init_world = world;
    init_id = id;
    auto& g = f_.groups[std::string(id.data(), id.size())];
    if (!g) g = std::make_shared<FakeFabric::Group>();
    g->world = world;
    ++g->joined;
    comm_.group = g;
    comm_.rank = rank;
    *comm = &comm_;
    calls.push_back("comm_init_rank");
    return {Result::kInProgress, {}};
  }
  Status comm_status(void*) override {
    std::lock_guard<std::mutex> lk(f_.mu);
    if (!f_.async_error.empty()) return {Result::kError, f_.async_error};
    if (comm_.group->joined < comm_.group->world) return {Result::kInProgress, {}};
    return {};
  }
  void comm_abort(void*) override {
    ++aborted;
    calls.push_back("comm_abort");
  }
  void comm_destroy(void*) override { calls.push_back("comm_destroy"); }
  void group_start() override { calls.push_back("group_start"); }
  Status group_end() override {
    calls.push_back("group_end");
    return {};
  }
  Status all_reduce(const void* s, void* r, std::int64_t n, CommDType t, ReduceOp op, void*, void* st) override {
    return post(st, {"all_reduce", s, r, n, t, op, 0});
  }
  Status broadcast(const void* s, void* r, std::int64_t n, CommDType t, int root, void*, void* st) override {
    return post(st, {"broadcast", s, r, n, t, ReduceOp::kSum, root});
  }
  Status reduce(const void* s, void* r, std::int64_t n, CommDType t, ReduceOp op, int root, void*, void* st) override {
    return post(st, {"reduce", s, r, n, t, op, root});
  }
  Status all_gather(const void* s, void* r, std::int64_t n, CommDType t, void*, void* st) override {
    return post(st, {"all_gather", s, r, n, t, ReduceOp::kSum, 0});
  }
  Status reduce_scatter(const void* s, void* r, std::int64_t n, CommDType t, ReduceOp op, void*, void* st) override {
    return post(st, {"reduce_scatter", s, r, n, t, op, 0});
  }

 private:
  struct Stream {
    std::shared_ptr<FakeFabric::Op> last;
  };
  struct Event {
    std::shared_ptr<FakeFabric::Op> op;
  };
  struct Comm {
    std::shared_ptr<FakeFabric::Group> group;
    int rank = 0;
    std::uint64_t seq = 0;
  };

  Status post(void* stream, FakeFabric::Post p) {
    calls.push_back(p.kind);
    std::lock_guard<std::mutex> lk(f_.mu);
    auto& g = *comm_.group;
    auto& op = g.ops[comm_.seq++];
    if (!op) {
      op = std::make_shared<FakeFabric::Op>();
      op->posts.resize(static_cast<std::size_t>(g.world));
    }
    static_cast<Stream*>(stream)->last = op;
    if (comm_.rank == f_.drop_collectives_of_rank) return {Result::kInProgress, {}};
    op->posts[static_cast<std::size_t>(comm_.rank)] = p;
    if (++op->posted == g.world) execute(*op);
    return {Result::kInProgress, {}};
  }

  // Float collectives only (what the tests use).
  static void execute(FakeFabric::Op& op) {
    const auto& p0 = op.posts[0];
    const std::size_t w = op.posts.size();
    auto fl = [](const void* p) { return static_cast<const float*>(p); };
    std::vector<std::vector<float>> out(w);
    if (p0.kind == "all_reduce" || p0.kind == "reduce") {
      std::vector<float> acc(static_cast<std::size_t>(p0.count), 0.0f);
      for (const auto& p : op.posts)
        for (std::int64_t i = 0; i < p0.count; ++i) acc[static_cast<std::size_t>(i)] += fl(p.send)[i];
      if (p0.op == ReduceOp::kAvg)
        for (float& a : acc) a /= static_cast<float>(w);
      for (std::size_t r = 0; r < w; ++r)
        if (p0.kind == "all_reduce" || static_cast<int>(r) == p0.root) out[r] = acc;
    } else if (p0.kind == "broadcast") {
      const float* src = fl(op.posts[static_cast<std::size_t>(p0.root)].send);
      for (std::size_t r = 0; r < w; ++r) out[r].assign(src, src + p0.count);
    } else if (p0.kind == "all_gather") {
      std::vector<float> all;
      for (const auto& p : op.posts) all.insert(all.end(), fl(p.send), fl(p.send) + p.count);
      for (std::size_t r = 0; r < w; ++r) out[r] = all;
    } else if (p0.kind == "reduce_scatter") {
      for (std::size_t r = 0; r < w; ++r) {
        out[r].assign(static_cast<std::size_t>(p0.count), 0.0f);
        for (const auto& p : op.posts)
          for (std::int64_t i = 0; i < p0.count; ++i)
            out[r][static_cast<std::size_t>(i)] += fl(p.send)[static_cast<std::int64_t>(r) * p0.count + i];
        if (p0.op == ReduceOp::kAvg)
          for (float& a : out[r]) a /= static_cast<float>(w);
      }
    }
    for (std::size_t r = 0; r < w; ++r)
      if (!out[r].empty()) std::memcpy(op.posts[r].recv, out[r].data(), out[r].size() * sizeof(float));
    op.done = true;
  }

  FakeFabric& f_;
  int devices_;
  Comm comm_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<std::unique_ptr<Event>> events_;
  std::vector<std::vector<char>> buffers_;
};

}  // namespace scalelab::testing
