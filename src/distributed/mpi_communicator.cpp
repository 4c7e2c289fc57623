#include "distributed/mpi_communicator.h"

#include "core/error.h"

#if SCALELAB_HAVE_MPI

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <thread>

namespace scalelab {
namespace {

// MPI 3 counts are int: larger buffers go in chunks of this many elements.
constexpr std::int64_t kMaxChunk = std::int64_t{1} << 30;

// Process-wide MPI lifetime: initialized by the first communicator, finalized with the last one
// unless any failed.
std::mutex g_mpi_mu;
int g_live = 0;
bool g_we_initialized = false;
bool g_all_healthy = true;
// Communicators that failed: their communication threads keep serving the peers (failure notices,
// status queries) until linger_after_failure() or exit. Never freed: MPI may still use them.
std::vector<MpiCommunicator::Impl*>* g_zombies = nullptr;
bool g_atexit_registered = false;
void stop_zombies();

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}

MPI_Datatype mpi_type(CommDType t) {
  switch (t) {
    case CommDType::kF32: return MPI_FLOAT;
    case CommDType::kF64: return MPI_DOUBLE;
    case CommDType::kI32: return MPI_INT32_T;
    case CommDType::kI64: return MPI_INT64_T;
    case CommDType::kU64: return MPI_UINT64_T;
    case CommDType::kU8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;  // kAvg: sum, then divided by the world size
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

void scale_in_place(void* buf, std::int64_t count, CommDType dtype, double factor) {
  if (dtype == CommDType::kF32) {
    float* p = static_cast<float*>(buf);
    const float f = static_cast<float>(factor);
    for (std::int64_t i = 0; i < count; ++i) p[i] *= f;
  } else if (dtype == CommDType::kF64) {
    double* p = static_cast<double*>(buf);
    for (std::int64_t i = 0; i < count; ++i) p[i] *= factor;
  }
}

bool fits_int(std::span<const std::int64_t> counts) {
  std::int64_t total = 0;
  for (std::int64_t c : counts) {
    if (c > INT_MAX) return false;
    total += c;
  }
  return total <= INT_MAX;
}

// One collective: a sequence of non-blocking MPI calls run one after the other.
struct Op {
  std::string name;
  std::uint64_t seq = 0;  // 1-based, per communicator
  std::vector<std::function<int(MPI_Request*)>> steps;
  std::function<void()> finish;  // after the last step (the division of kAvg)

  std::mutex mu;
  std::condition_variable cv;
  enum class State { kQueued, kRunning, kDone, kFailed } state = State::kQueued;
  std::string error;
  CommClock::time_point started{}, finished{};
};

// Messages of the control channel.
enum CtrlType : std::int32_t { kFailure = 1, kQuery = 2, kReply = 3 };
struct CtrlMsg {
  std::int32_t type = 0;
  std::int32_t from = -1;
  std::uint64_t ops_started = 0;
  std::uint64_t ops_completed = 0;
  char text[1000] = {};
  void set_text(const std::string& s) {
    const std::size_t n = std::min(s.size(), sizeof(text) - 1);
    std::memcpy(text, s.data(), n);
    text[n] = '\0';
  }
};

class MpiWork final : public CommWork {
 public:
  explicit MpiWork(std::shared_ptr<Op> op) : op_(std::move(op)) {}
  bool done() override {
    std::lock_guard<std::mutex> lk(op_->mu);
    if (op_->state == Op::State::kFailed) throw RuntimeError(op_->error);
    return op_->state == Op::State::kDone;
  }
  void wait() override {
    std::unique_lock<std::mutex> lk(op_->mu);
    // The communication thread resolves every op within its timeout (or fails it), so this wait
    // is bounded.
    op_->cv.wait(lk, [&] { return op_->state == Op::State::kDone || op_->state == Op::State::kFailed; });
    if (op_->state == Op::State::kFailed) throw RuntimeError(op_->error);
  }
  CommClock::time_point started() const override { return op_->started; }
  CommClock::time_point finished() const override { return op_->finished; }

 private:
  std::shared_ptr<Op> op_;
};

}  // namespace

struct MpiCommunicator::Impl {
  CommOptions options;
  MPI_Comm comm = MPI_COMM_NULL;  // collectives
  MPI_Comm ctrl = MPI_COMM_NULL;  // control channel: failure notices, status queries
  int rank = 0, world = 1, local_rank = 0;
  int uncaught_at_creation = 0;

  std::thread worker;
  std::mutex mu;  // guards the fields below it
  std::condition_variable cv;
  std::deque<std::shared_ptr<Op>> queue;
  bool stopping = false;
  std::uint64_t next_seq = 1;
  std::optional<std::string> outgoing_failure;  // this rank's notice, to be sent by the worker
  bool outgoing_sent = false;
  std::optional<std::string> peer_failure;      // a notice received from a peer
  std::string broken;                           // non-empty: every later collective fails with it
  std::condition_variable sent_cv;

  std::atomic<std::uint64_t> ops_started{0}, ops_completed{0};

  // Worker-only state.
  MPI_Request ctrl_recv = MPI_REQUEST_NULL;
  CtrlMsg ctrl_in;
  std::list<std::pair<MPI_Request, std::unique_ptr<CtrlMsg>>> ctrl_sends;
  std::map<int, CtrlMsg> replies;
  std::string current = "idle";
  std::vector<std::shared_ptr<Op>> abandoned;  // failed ops whose requests MPI may still touch

  std::string me() const { return "rank " + std::to_string(rank); }

  void post_ctrl_recv() {
    MPI_Irecv(&ctrl_in, sizeof(CtrlMsg), MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, ctrl, &ctrl_recv);
  }

  void send_ctrl(int to, const CtrlMsg& msg) {
    auto copy = std::make_unique<CtrlMsg>(msg);
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(copy.get(), sizeof(CtrlMsg), MPI_BYTE, to, msg.type, ctrl, &req) == MPI_SUCCESS)
      ctrl_sends.emplace_back(req, std::move(copy));
  }

  CtrlMsg status_msg(CtrlType type) const {
    CtrlMsg m;
    m.type = type;
    m.from = rank;
    m.ops_started = ops_started.load();
    m.ops_completed = ops_completed.load();
    m.set_text(current);
    return m;
  }

  // Serves the control channel: receives notices, queries and replies, sends this rank's failure
  // notice when one is pending, and reaps finished sends. Worker thread only.
  void service_control() {
    for (int guard = 0; guard < 64 && ctrl_recv != MPI_REQUEST_NULL; ++guard) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Test(&ctrl_recv, &flag, &st) != MPI_SUCCESS || !flag) break;
      const CtrlMsg msg = ctrl_in;
      post_ctrl_recv();
      if (msg.type == kFailure) {
        std::lock_guard<std::mutex> lk(mu);
        if (!peer_failure) {
          peer_failure = std::string(msg.text);
          if (broken.empty()) broken = "[dist] " + std::string(msg.text) + " — " + me() + " stops too";
        }
      } else if (msg.type == kQuery) {
        send_ctrl(msg.from, status_msg(kReply));
      } else if (msg.type == kReply) {
        replies[msg.from] = msg;
      }
    }
    std::optional<std::string> to_send;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (outgoing_failure && !outgoing_sent) to_send = outgoing_failure;
    }
    if (to_send) {
      CtrlMsg m = status_msg(kFailure);
      m.set_text(*to_send);
      for (int r = 0; r < world; ++r)
        if (r != rank) send_ctrl(r, m);
      std::lock_guard<std::mutex> lk(mu);
      outgoing_sent = true;
      sent_cv.notify_all();
    }
    for (auto it = ctrl_sends.begin(); it != ctrl_sends.end();) {
      int flag = 0;
      if (MPI_Test(&it->first, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) it = ctrl_sends.erase(it);
      else ++it;
    }
  }

  std::string broken_reason() {
    std::lock_guard<std::mutex> lk(mu);
    return broken;
  }

  void break_with(const std::string& why) {
    std::lock_guard<std::mutex> lk(mu);
    if (broken.empty()) broken = why;
  }

  // Asks every peer how far it got and names the ones holding `op` up ("rank 0: all_reduce ...
  // did not complete ...: rank 1 has started only ..."). Worker thread only.
  std::string diagnose_timeout(const Op& op, double waited_s) {
    replies.clear();
    const CtrlMsg q = status_msg(kQuery);
    for (int r = 0; r < world; ++r)
      if (r != rank) send_ctrl(r, q);
    const auto until = CommClock::now() + std::chrono::milliseconds(
        static_cast<int>(1000 * std::clamp(options.timeout_s / 4, 0.5, 3.0)));
    while (static_cast<int>(replies.size()) < world - 1 && CommClock::now() < until) {
      service_control();
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    std::string culprits, others;
    for (int r = 0; r < world; ++r) {
      if (r == rank) continue;
      const std::string name = "rank " + std::to_string(r);
      auto it = replies.find(r);
      if (it == replies.end()) {
        culprits += (culprits.empty() ? "" : "; ") + name + " did not answer (dead, exited, or hung inside MPI)";
      } else if (it->second.ops_started < op.seq) {
        culprits += (culprits.empty() ? "" : "; ") + name + " has started only " +
                    std::to_string(it->second.ops_started) + " collectives (it is behind: stalled, "
                    "or its step takes longer than the timeout; it is " + std::string(it->second.text) + ")";
      } else {
        others += (others.empty() ? "" : ", ") + name;
      }
    }
    char waited[32];
    std::snprintf(waited, sizeof(waited), "%.1f", waited_s);
    std::string msg = me() + ": " + op.name + " (collective #" + std::to_string(op.seq) +
                      ") did not complete within " + waited + " s: ";
    msg += culprits.empty() ? "every peer answered and reached it (a network or MPI problem)" : culprits;
    if (!others.empty()) msg += "; waiting in it too: " + others;
    msg += " — check that rank's output, or raise --comm-timeout if steps legitimately take longer";
    return msg;
  }

  void resolve(Op& op, Op::State state, std::string error = {}) {
    std::lock_guard<std::mutex> lk(op.mu);
    op.finished = CommClock::now();
    op.error = std::move(error);
    op.state = state;
    op.cv.notify_all();
  }

  void fail_op(const std::shared_ptr<Op>& op, const std::string& why, bool abandon) {
    if (abandon) abandoned.push_back(op);
    resolve(*op, Op::State::kFailed, why);
  }

  // Runs one collective to completion, failure or timeout. Worker thread only.
  void run_op(const std::shared_ptr<Op>& op) {
    if (std::string b = broken_reason(); !b.empty()) {
      fail_op(op, b, false);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(op->mu);
      op->started = CommClock::now();
      op->state = Op::State::kRunning;
    }
    ops_started.fetch_add(1);
    current = "in " + op->name + " (collective #" + std::to_string(op->seq) + ")";
    const auto deadline = op->started + std::chrono::microseconds(static_cast<std::int64_t>(options.timeout_s * 1e6));
    for (auto& step : op->steps) {
      MPI_Request req = MPI_REQUEST_NULL;
      if (int rc = step(&req); rc != MPI_SUCCESS) {
        const std::string why = "[dist] " + me() + ": " + op->name + " failed in MPI: " + mpi_error_string(rc);
        break_with(why);
        fail_op(op, why, true);
        return;
      }
      const auto step_start = CommClock::now();
      for (;;) {
        int flag = 0;
        if (int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
          const std::string why = "[dist] " + me() + ": " + op->name + " failed in MPI: " + mpi_error_string(rc);
          break_with(why);
          fail_op(op, why, true);
          return;
        }
        if (flag) break;
        service_control();
        if (std::string b = broken_reason(); !b.empty()) {  // a peer failed, or this rank did
          fail_op(op, b, true);
          return;
        }
        const auto now = CommClock::now();
        if (now > deadline) {
          const std::string core = diagnose_timeout(*op, std::chrono::duration<double>(now - op->started).count());
          const std::string why = "[dist] " + core;
          break_with(why);
          {
            std::lock_guard<std::mutex> lk(mu);
            if (!outgoing_failure) outgoing_failure = core;  // the peers stop too, naming this rank
          }
          service_control();
          fail_op(op, why, true);
          return;
        }
        if (now - step_start > std::chrono::microseconds(options.poll_spin_us) && options.poll_sleep_us > 0)
          std::this_thread::sleep_for(std::chrono::microseconds(options.poll_sleep_us));
      }
    }
    if (op->finish) op->finish();
    ops_completed.fetch_add(1);
    current = "idle after collective #" + std::to_string(op->seq);
    resolve(*op, Op::State::kDone);
  }

  void worker_main() {
    for (;;) {
      std::shared_ptr<Op> op;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait_for(lk, std::chrono::milliseconds(20), [&] {
          return stopping || !queue.empty() || (outgoing_failure && !outgoing_sent);
        });
        if (!queue.empty()) {
          op = queue.front();
          queue.pop_front();
        } else if (stopping) {
          break;
        }
      }
      service_control();
      if (op) run_op(op);
    }
    service_control();
  }

  std::unique_ptr<CommWork> submit(std::string name, std::vector<std::function<int(MPI_Request*)>> steps,
                                   std::function<void()> finish = {}) {
    auto op = std::make_shared<Op>();
    op->name = std::move(name);
    op->steps = std::move(steps);
    op->finish = std::move(finish);
    {
      std::lock_guard<std::mutex> lk(mu);
      SCALELAB_CHECK(!stopping, "[dist] " + op->name + " issued on a communicator that is being destroyed");
      op->seq = next_seq++;
      queue.push_back(op);
    }
    cv.notify_all();
    return std::make_unique<MpiWork>(op);
  }

  static std::vector<int> to_int(std::span<const std::int64_t> v) {
    std::vector<int> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<int>(v[i]);
    return out;
  }
};

bool MpiCommunicator::available() { return true; }

MpiCommunicator::MpiCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<MpiCommunicator> MpiCommunicator::create(const CommOptions& options) {
  SCALELAB_CHECK(options.timeout_s > 0, "[dist] --comm-timeout must be positive (got " +
                                            std::to_string(options.timeout_s) + ")");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  {
    std::lock_guard<std::mutex> lk(g_mpi_mu);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    SCALELAB_CHECK(!finalized, "[dist] MPI was already finalized in this process — create one MPI "
                               "communicator per process and keep it until the end");
    int provided = 0;
    if (!initialized) {
      // OpenMPI runs non-blocking all-reduces (all DDP buckets) through libnbc, whose default for
      // a few ranks is recursive doubling: every rank sends and reduces the whole buffer. The ring
      // (a reduce-scatter, then an all-gather) moves and reduces 1/n of it per step and measured
      // 2-4x faster for 4-64 MiB buckets on two ranks (bench_allreduce_busbw with
      // --mca coll_libnbc_iallreduce_algorithm 1). Every rank ends with the same bits either way
      // (each segment is reduced once). A value the user set (mpirun --mca, environment) wins.
      ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      SCALELAB_CHECK(rc == MPI_SUCCESS, "[dist] MPI_Init_thread failed: " + mpi_error_string(rc) +
                                            " — launch with mpirun or srun --mpi=pmix");
      g_we_initialized = true;
    } else {
      MPI_Query_thread(&provided);
    }
    SCALELAB_CHECK(provided >= MPI_THREAD_SERIALIZED,
                   "[dist] this MPI provides thread level " + std::to_string(provided) +
                       " but scalelab's communication thread needs MPI_THREAD_SERIALIZED — use an MPI "
                       "built with thread support (Debian's OpenMPI is)");
    MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &impl->ctrl);
    MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(impl->ctrl, MPI_ERRORS_RETURN);
    MPI_Comm_rank(impl->comm, &impl->rank);
    MPI_Comm_size(impl->comm, &impl->world);
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(impl->comm, MPI_COMM_TYPE_SHARED, impl->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &impl->local_rank);
    MPI_Comm_free(&node);
    ++g_live;
  }
  impl->uncaught_at_creation = std::uncaught_exceptions();
  impl->post_ctrl_recv();
  Impl* raw = impl.get();
  impl->worker = std::thread([raw] { raw->worker_main(); });
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(impl)));
}

MpiCommunicator::~MpiCommunicator() {
  Impl& s = *impl_;
  const bool unwinding = std::uncaught_exceptions() > s.uncaught_at_creation;
  bool healthy;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    healthy = s.broken.empty() && !s.outgoing_failure && !s.peer_failure;
  }
  if (healthy && unwinding) {
    notify_failure("an exception ended its run (see rank " + std::to_string(s.rank) + "'s output)");
    healthy = false;
  }
  if (!healthy) {
    // Requests may still be pending: keep the communicators and never finalize (a finalize would
    // wait for peers that are gone); the launcher ends the job when this process exits. The
    // communication thread keeps serving the peers until linger_after_failure() or exit.
    {
      std::lock_guard<std::mutex> lk(s.mu);
      for (auto& op : s.queue)
        s.resolve(*op, Op::State::kFailed, s.broken.empty() ? "[dist] communicator destroyed" : s.broken);
      s.queue.clear();
    }
    std::lock_guard<std::mutex> lk(g_mpi_mu);
    --g_live;
    g_all_healthy = false;
    if (!g_zombies) g_zombies = new std::vector<Impl*>();
    g_zombies->push_back(impl_.release());
    if (!g_atexit_registered) {
      g_atexit_registered = true;
      std::atexit(stop_zombies);
    }
    return;
  }
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.stopping = true;
  }
  s.cv.notify_all();
  if (s.worker.joinable()) s.worker.join();

  std::lock_guard<std::mutex> lk(g_mpi_mu);
  --g_live;
  if (s.ctrl_recv != MPI_REQUEST_NULL) {
    MPI_Cancel(&s.ctrl_recv);
    MPI_Wait(&s.ctrl_recv, MPI_STATUS_IGNORE);
  }
  for (auto& [req, msg] : s.ctrl_sends) MPI_Wait(&req, MPI_STATUS_IGNORE);
  MPI_Comm_free(&s.ctrl);
  MPI_Comm_free(&s.comm);
  if (g_live == 0 && g_all_healthy && g_we_initialized) MPI_Finalize();
}

namespace {
void stop_zombies() {
  std::vector<MpiCommunicator::Impl*> zombies;
  {
    std::lock_guard<std::mutex> lk(g_mpi_mu);
    if (g_zombies) zombies.swap(*g_zombies);
  }
  for (MpiCommunicator::Impl* z : zombies) {
    {
      std::lock_guard<std::mutex> lk(z->mu);
      z->stopping = true;
    }
    z->cv.notify_all();
    if (z->worker.joinable()) z->worker.join();
  }
}
}  // namespace

void linger_after_failure() {
  double linger = 0;
  {
    std::lock_guard<std::mutex> lk(g_mpi_mu);
    if (g_zombies)
      for (MpiCommunicator::Impl* z : *g_zombies) {
        std::lock_guard<std::mutex> zl(z->mu);
        if (z->outgoing_failure && !z->peer_failure) linger = std::max(linger, z->options.failure_linger_s);
      }
  }
  if (linger > 0) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<std::int64_t>(linger * 1e6)));
  stop_zombies();
}

int MpiCommunicator::rank() const { return impl_->rank; }
int MpiCommunicator::world_size() const { return impl_->world; }
int MpiCommunicator::local_rank() const { return impl_->local_rank; }
const CommOptions& MpiCommunicator::options() const { return impl_->options; }
std::uint64_t MpiCommunicator::ops_started() const { return impl_->ops_started.load(); }
std::uint64_t MpiCommunicator::ops_completed() const { return impl_->ops_completed.load(); }

std::unique_ptr<CommWork> MpiCommunicator::all_reduce_async(void* buf, std::int64_t count, CommDType dtype,
                                                            ReduceOp op) {
  SCALELAB_CHECK(count >= 0, "[dist] all_reduce: negative count " + std::to_string(count));
  check_reduce("all_reduce", dtype, op);
  MPI_Comm comm = impl_->comm;
  const std::size_t esize = comm_dtype_size(dtype);
  std::vector<std::function<int(MPI_Request*)>> steps;
  for (std::int64_t off = 0; off == 0 || off < count; off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, count - off));
    char* p = static_cast<char*>(buf) + off * static_cast<std::int64_t>(esize);
    steps.push_back([=](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, p, n, mpi_type(dtype), mpi_op(op), comm, r);
    });
  }
  std::function<void()> finish;
  if (op == ReduceOp::kAvg) {
    const double f = 1.0 / impl_->world;
    finish = [=] { scale_in_place(buf, count, dtype, f); };
  }
  return impl_->submit("all_reduce", std::move(steps), std::move(finish));
}

std::unique_ptr<CommWork> MpiCommunicator::broadcast_async(void* buf, std::int64_t count, CommDType dtype,
                                                           int root) {
  SCALELAB_CHECK(count >= 0, "[dist] broadcast: negative count " + std::to_string(count));
  SCALELAB_CHECK(root >= 0 && root < impl_->world, "[dist] broadcast: root " + std::to_string(root) +
                                                       " outside a world of " + std::to_string(impl_->world));
  MPI_Comm comm = impl_->comm;
  const std::size_t esize = comm_dtype_size(dtype);
  std::vector<std::function<int(MPI_Request*)>> steps;
  for (std::int64_t off = 0; off == 0 || off < count; off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, count - off));
    char* p = static_cast<char*>(buf) + off * static_cast<std::int64_t>(esize);
    steps.push_back([=](MPI_Request* r) { return MPI_Ibcast(p, n, mpi_type(dtype), root, comm, r); });
  }
  return impl_->submit("broadcast", std::move(steps));
}

std::unique_ptr<CommWork> MpiCommunicator::all_gather_async(void* buf, std::span<const std::int64_t> counts,
                                                            CommDType dtype) {
  check_counts("all_gather", counts, impl_->world);
  MPI_Comm comm = impl_->comm;
  const std::size_t esize = comm_dtype_size(dtype);
  std::vector<std::function<int(MPI_Request*)>> steps;
  if (fits_int(counts)) {
    std::vector<int> cnt = Impl::to_int(counts), displs(cnt.size());
    for (std::size_t i = 1; i < cnt.size(); ++i) displs[i] = displs[i - 1] + cnt[i - 1];
    steps.push_back([=](MPI_Request* r) {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt.data(), displs.data(),
                             mpi_type(dtype), comm, r);
    });
  } else {
    // Segments too large for int counts: each rank broadcasts its segment in chunks.
    std::int64_t seg = 0;
    for (int root = 0; root < impl_->world; ++root) {
      const std::int64_t c = counts[static_cast<std::size_t>(root)];
      for (std::int64_t off = 0; off < c; off += kMaxChunk) {
        const int n = static_cast<int>(std::min(kMaxChunk, c - off));
        char* p = static_cast<char*>(buf) + (seg + off) * static_cast<std::int64_t>(esize);
        steps.push_back([=](MPI_Request* r) { return MPI_Ibcast(p, n, mpi_type(dtype), root, comm, r); });
      }
      seg += c;
    }
  }
  return impl_->submit("all_gather", std::move(steps));
}

std::unique_ptr<CommWork> MpiCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                                std::span<const std::int64_t> counts,
                                                                CommDType dtype, ReduceOp op) {
  check_counts("reduce_scatter", counts, impl_->world);
  check_reduce("reduce_scatter", dtype, op);
  MPI_Comm comm = impl_->comm;
  const int me = impl_->rank;
  const std::size_t esize = comm_dtype_size(dtype);
  std::vector<std::function<int(MPI_Request*)>> steps;
  if (fits_int(counts)) {
    std::vector<int> cnt = Impl::to_int(counts);
    steps.push_back([=](MPI_Request* r) {
      return MPI_Ireduce_scatter(send, recv, cnt.data(), mpi_type(dtype), mpi_op(op), comm, r);
    });
  } else {
    // Too large for int counts: one reduction per rank's segment, in chunks.
    std::int64_t seg = 0;
    for (int root = 0; root < impl_->world; ++root) {
      const std::int64_t c = counts[static_cast<std::size_t>(root)];
      for (std::int64_t off = 0; off < c; off += kMaxChunk) {
        const int n = static_cast<int>(std::min(kMaxChunk, c - off));
        const char* s = static_cast<const char*>(send) + (seg + off) * static_cast<std::int64_t>(esize);
        char* d = root == me ? static_cast<char*>(recv) + off * static_cast<std::int64_t>(esize) : nullptr;
        steps.push_back([=](MPI_Request* r) {
          return MPI_Ireduce(s, d, n, mpi_type(dtype), mpi_op(op), root, comm, r);
        });
      }
      seg += c;
    }
  }
  std::function<void()> finish;
  if (op == ReduceOp::kAvg) {
    const double f = 1.0 / impl_->world;
    const std::int64_t mine = counts[static_cast<std::size_t>(me)];
    finish = [=] { scale_in_place(recv, mine, dtype, f); };
  }
  return impl_->submit("reduce_scatter", std::move(steps), std::move(finish));
}

std::unique_ptr<CommWork> MpiCommunicator::barrier_async() {
  MPI_Comm comm = impl_->comm;
  return impl_->submit("barrier", {[=](MPI_Request* r) { return MPI_Ibarrier(comm, r); }});
}

void MpiCommunicator::notify_failure(const std::string& what) {
  Impl& s = *impl_;
  {
    std::unique_lock<std::mutex> lk(s.mu);
    if (s.outgoing_failure || s.peer_failure) {
      // Already notified, or a peer failed first (it is the one to name; this rank only echoes).
      return;
    }
    s.outgoing_failure = s.me() + " failed: " + what;
    if (s.broken.empty()) s.broken = "[dist] " + s.me() + " failed: " + what;
    s.cv.notify_all();
    s.sent_cv.wait_for(lk, std::chrono::seconds(2), [&] { return s.outgoing_sent; });
  }
}

std::optional<std::string> MpiCommunicator::peer_failure() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->peer_failure;
}

void MpiCommunicator::abort_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();  // MPI_Abort does not return; this satisfies [[noreturn]] should it ever do so.
}

}  // namespace scalelab

#else  // !SCALELAB_HAVE_MPI

namespace scalelab {

struct MpiCommunicator::Impl {};

namespace {
[[noreturn]] void no_mpi() {
  throw RuntimeError("[dist] this scalelab was built without MPI (SCALELAB_WITH_MPI=OFF or MPI not "
                     "found) — install libopenmpi-dev and rebuild to run data-parallel ranks");
}
}  // namespace

bool MpiCommunicator::available() { return false; }
MpiCommunicator::MpiCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
std::unique_ptr<MpiCommunicator> MpiCommunicator::create(const CommOptions&) { no_mpi(); }
MpiCommunicator::~MpiCommunicator() = default;
int MpiCommunicator::rank() const { no_mpi(); }
int MpiCommunicator::world_size() const { no_mpi(); }
int MpiCommunicator::local_rank() const { no_mpi(); }
const CommOptions& MpiCommunicator::options() const { no_mpi(); }
std::uint64_t MpiCommunicator::ops_started() const { no_mpi(); }
std::uint64_t MpiCommunicator::ops_completed() const { no_mpi(); }
std::unique_ptr<CommWork> MpiCommunicator::all_reduce_async(void*, std::int64_t, CommDType, ReduceOp) { no_mpi(); }
std::unique_ptr<CommWork> MpiCommunicator::broadcast_async(void*, std::int64_t, CommDType, int) { no_mpi(); }
std::unique_ptr<CommWork> MpiCommunicator::all_gather_async(void*, std::span<const std::int64_t>, CommDType) { no_mpi(); }
std::unique_ptr<CommWork> MpiCommunicator::reduce_scatter_async(const void*, void*, std::span<const std::int64_t>,
                                                                CommDType, ReduceOp) { no_mpi(); }
std::unique_ptr<CommWork> MpiCommunicator::barrier_async() { no_mpi(); }
void MpiCommunicator::notify_failure(const std::string&) {}
void linger_after_failure() {}
std::optional<std::string> MpiCommunicator::peer_failure() const { return std::nullopt; }
void MpiCommunicator::abort_job(int) { no_mpi(); }

}  // namespace scalelab

#endif
