#include "train/data_parallel_run.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#include "distributed/zero.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

class FaultyData final : public DataSource {
 public:
  FaultyData(std::unique_ptr<DataSource> inner, int rank, std::int64_t at) : inner_(std::move(inner)), rank_(rank), at_(at) {}
  void next(Batch& b) override {
    if (count_++ == at_) {
      throw InvalidInput("[data] cannot read micro-batch " + std::to_string(at_) + " of " + inner_->describe() +
                         " on rank " + std::to_string(rank_) +
                         " (injected by SCALELAB_INJECT_DATA_FAULT) — check that every rank can read the data");
    }
    inner_->next(b);
  }
  void skip(std::int64_t micro_batches, Batch& scratch) override {
    for (std::int64_t i = 0; i < micro_batches; ++i) next(scratch);  // the fault fires as it would when read
  }
  std::string describe() const override { return inner_->describe(); }
  std::int64_t num_samples() const override { return inner_->num_samples(); }

 private:
  std::unique_ptr<DataSource> inner_;
  int rank_;
  std::int64_t at_;
  std::int64_t count_ = 0;
};

}  // namespace

int threads_for_rank(int requested, const LaunchEnv& env) {
  if (requested != 0) return requested;
  const int machine = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  int allowed = machine;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) allowed = std::max(1, CPU_COUNT(&set));
  // A launcher that bound this rank to some cores (mpirun --bind-to core, srun --cpu-bind) has
  // already divided the machine.
  if (allowed < machine) return allowed;
  return std::max(1, machine / std::max(1, env.local_world_size));
}

std::unique_ptr<DataSource> with_injected_data_fault(std::unique_ptr<DataSource> source, int rank) {
  const char* spec = std::getenv("SCALELAB_INJECT_DATA_FAULT");
  if (spec == nullptr || *spec == '\0') return source;
  const std::string s(spec);
  const auto colon = s.find(':');
  char* end = nullptr;
  const long r = std::strtol(s.c_str(), &end, 10);
  const long at = colon == std::string::npos ? -1 : std::strtol(s.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || r < 0 || at < 0 || *end != '\0') {
    throw InvalidInput("[data] SCALELAB_INJECT_DATA_FAULT='" + s + "' is not RANK:MICRO_STEP (e.g. 1:3) — unset it");
  }
  if (r != rank) return source;
  return std::make_unique<FaultyData>(std::move(source), rank, at);
}

DataParallelRun::DataParallelRun(DistContext& dist, const DistFlags& flags, const PrecisionPlan& precision,
                                 std::int64_t numel)
    : dist_(dist), flags_(flags), rank_(dist.rank()), world_(dist.world_size()), numel_(numel) {
  const DataParallelOptions opt = flags.data_parallel_options();  // checks the flags
  SCALELAB_CHECK_INPUT(precision.grad == DType::kF32 && precision.param == DType::kF32,
                       "[dist] data-parallel training reduces fp32 gradients and updates fp32 master weights; "
                       "--model-precision bf16 keeps both in bf16 — use --mixed-precision bf16 (fp32 master "
                       "weights, bf16 compute) for a run over " + std::to_string(world_) + " ranks");
  SCALELAB_CHECK_INPUT(!dist.has_device_comm(),
                       "[dist] NCCL data parallelism needs the CUDA trainer, which this build does not have — "
                       "use --device cpu (MPI)");
  zero_ = opt.zero_stage == 1;
  if (zero_) {
    const std::vector<std::int64_t> counts = ZeroOptimizer::shard_counts(numel, world_);
    state_begin_ = segment_offset(counts, rank_);
    state_numel_ = counts[static_cast<std::size_t>(rank_)];
  } else {
    state_begin_ = 0;
    state_numel_ = numel;
  }
}

DataParallelRun::~DataParallelRun() = default;

void DataParallelRun::attach(Tensor& params, Tensor& grads, Tensor& m, Tensor& v, Tensor* zero_recv, Model& model) {
  SCALELAB_CHECK(params.numel() == numel_ && grads.numel() == numel_ && m.numel() == state_numel_ &&
                     v.numel() == state_numel_,
                 "[dist] DataParallelRun::attach: buffer sizes do not match the layout and the shard");
  SCALELAB_CHECK(!zero_ || (zero_recv != nullptr && zero_recv->numel() == state_numel_ &&
                            zero_recv->dtype() == DType::kF32),
                 "[dist] DataParallelRun::attach: ZeRO-1 needs an fp32 reduce-scatter buffer of the shard's size");
  params_ = &params;
  grads_ = &grads;
  m_ = &m;
  v_ = &v;
  auto update = [this](std::int64_t begin, std::int64_t end) {
    if (!zero_) {
      // DDP: every rank updates everything, exactly as one process does.
      kernels::adamw_update(*params_, *m_, *v_, *grads_, *ranges_, *hyper_, *ctx_);
      return;
    }
    // ZeRO-1: this rank's shard; the states are indexed from the shard's start.
    Tensor p = params_->slice(begin, end), g = grads_->slice(begin, end);
    kernels::adamw_update(p, *m_, *v_, g, kernels::ranges_within(*ranges_, begin, end), *hyper_, *ctx_);
  };
  float* recv = zero_ && zero_recv ? zero_recv->f32() : nullptr;
  // train() seeds each rank's backward with 1/world (with the loss scale and 1/micro-steps), so the ranks'
  // gradients only need summing: no division pass over the buffer after each collective.
  DataParallelOptions options = flags_.data_parallel_options();
  options.average = false;
  dp_ = std::make_unique<DataParallel>(dist_.grads(), params.f32(), grads.f32(), numel_, options, update, recv);
  SCALELAB_CHECK(dp_->optimizer_begin() == state_begin_ && dp_->optimizer_end() - dp_->optimizer_begin() == state_numel_,
                 "[dist] the ZeRO-1 shard differs from the one the states were sized for (a bug)");
  DataParallel* dp = dp_.get();
  model.set_grad_ready_hook([dp](std::int64_t b, std::int64_t e) { dp->mark_ready(b, e); });
}

void DataParallelRun::begin_micro_step(bool last) { dp_->begin_micro_step(last); }

void DataParallelRun::set_tracer(Tracer* tracer) { dp_->set_tracer(tracer); }

double DataParallelRun::sync_gradients() {
  const double norm = dp_->end_backward();
  return norm * norm;
}

double DataParallelRun::mean(double value) { return dist_.host().all_reduce_value(value, ReduceOp::kAvg); }

void DataParallelRun::update(const std::vector<kernels::ElementRange>& ranges, const kernels::AdamWHyper& hyper,
                             ExecContext& ctx) {
  ranges_ = &ranges;
  hyper_ = &hyper;
  ctx_ = &ctx;
  dp_->optimizer_step();
  ranges_ = nullptr;
  hyper_ = nullptr;
  ctx_ = nullptr;
}

CommTimes DataParallelRun::cumulative() const {
  CommTimes t;
  const nlohmann::json s = dp_->summary();
  if (zero_) {
    t.comm_s = s.value("comm_s", 0.0);
    t.exposed_s = t.comm_s;  // ZeRO-1's collectives are not overlapped (distributed/zero.h)
    t.blocked_s = t.comm_s;
  } else {
    const DdpStats& d = dp_->ddp_stats();
    t.comm_s = d.comm_s;
    t.hidden_s = d.hidden_s;
    t.exposed_s = d.exposed_s;
    t.blocked_s = d.blocked_s;
  }
  return t;
}

void DataParallelRun::end_step(bool measured) {
  const CommTimes now = cumulative();
  if (measured) {
    measured_.comm_s += now.comm_s - last_cumulative_.comm_s;
    measured_.hidden_s += now.hidden_s - last_cumulative_.hidden_s;
    measured_.exposed_s += now.exposed_s - last_cumulative_.exposed_s;
    measured_.blocked_s += now.blocked_s - last_cumulative_.blocked_s;
    ++measured_steps_;
  }
  last_cumulative_ = now;
}

void DataParallelRun::finish(TrainResult& res, std::int64_t tokens_per_step, double measured_time_s,
                             double step_time_s) {
  const double steps = static_cast<double>(measured_steps_);
  const double per_step = steps > 0 ? 1.0 / steps : 0.0;
  nlohmann::json mine{{"rank", rank_},
                      {"local_rank", dist_.env().local_rank},
                      {"host", this_host()},
                      {"tokens_per_s", measured_time_s > 0 ? static_cast<double>(tokens_per_step) * steps / measured_time_s : 0.0},
                      {"measured_time_s", measured_time_s},
                      {"step_time_s", step_time_s},
                      {"comm_time_s", measured_.comm_s * per_step},
                      {"comm_hidden_s", measured_.hidden_s * per_step},
                      {"comm_exposed_s", measured_.exposed_s * per_step},
                      {"comm_blocked_s", measured_.blocked_s * per_step},
                      {"max_allocated_bytes", res.max_allocated_bytes},
                      {"max_reserved_bytes", res.max_reserved_bytes},
                      {"optimizer_state_elements", state_numel_}};
  if (res.telemetry.is_object() && res.telemetry.contains("energy_j") && res.telemetry["energy_j"].is_number())
    mine["energy_j"] = res.telemetry["energy_j"];
  const std::vector<std::string> all = dist_.host().all_gather_strings(mine.dump());

  nlohmann::json ranks = nlohmann::json::array();
  double slowest = 0, comm = 0, hidden = 0, exposed = 0, blocked = 0, energy = 0;
  int energy_ranks = 0;
  std::size_t max_alloc = 0, max_reserved = 0;
  for (const std::string& s : all) {
    nlohmann::json r = nlohmann::json::parse(s);
    slowest = std::max(slowest, r.value("measured_time_s", 0.0));
    comm += r.value("comm_time_s", 0.0);
    hidden += r.value("comm_hidden_s", 0.0);
    exposed += r.value("comm_exposed_s", 0.0);
    blocked += r.value("comm_blocked_s", 0.0);
    max_alloc = std::max<std::size_t>(max_alloc, r.value("max_allocated_bytes", std::size_t{0}));
    max_reserved = std::max<std::size_t>(max_reserved, r.value("max_reserved_bytes", std::size_t{0}));
    if (r.contains("energy_j")) {
      energy += r["energy_j"].get<double>();
      ++energy_ranks;
    }
    ranks.push_back(std::move(r));
  }
  const double w = static_cast<double>(world_);
  // The job advances at the pace of its slowest rank: every rank's tokens over that time.
  res.tokens_per_s = slowest > 0 ? w * static_cast<double>(tokens_per_step) * steps / slowest : 0.0;
  res.tokens_per_s_per_device = res.tokens_per_s / w;
  res.max_allocated_bytes = max_alloc;
  res.max_reserved_bytes = max_reserved;
  res.ranks = ranks;

  nlohmann::json d = dp_->summary();
  d["mode"] = zero_ ? "zero1" : "ddp";
  d["launcher"] = launcher_name(dist_.env().launcher);
  d["measured_steps"] = measured_steps_;
  // Per measured step, mean over the ranks.
  d["comm_time_s"] = comm / w;
  d["comm_hidden_s"] = hidden / w;
  d["comm_exposed_s"] = exposed / w;
  d["comm_blocked_s"] = blocked / w;
  d["comm_hidden_fraction"] = comm > 0 ? hidden / comm : 0.0;
  res.data_parallel = d;

  if (energy_ranks > 0 && res.telemetry.is_object()) {
    // One rank per node samples (its node's devices); the job's energy is their sum, and the
    // tokens are every rank's (all steps, as the single-process summary counts them).
    const double tokens = w * static_cast<double>(tokens_per_step) * static_cast<double>(res.steps.size());
    res.telemetry["energy_j_this_node"] = res.telemetry["energy_j"];
    res.telemetry["energy_j"] = energy;
    res.telemetry["energy_ranks_sampled"] = energy_ranks;
    res.telemetry["j_per_token"] = tokens > 0 ? nlohmann::json(energy / tokens) : nlohmann::json(nullptr);
  }
}

}  // namespace scalelab
