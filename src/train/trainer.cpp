#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/allocator.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/trace.h"
#include "kernels/adamw.h"
#include "model/model.h"
#include "model/params.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "model/adapter.h"
#include "model/nf4.h"
#include "model/quantize.h"
#include "scalelab/version.h"
#include "distributed/config_check.h"
#include "train/data.h"
#include "train/data_parallel_run.h"
#include "train/device_setup.h"
#include "train/lr_schedule.h"
#include "train/memory_plan.h"
#include "train/step_buffers.h"
#include "train/train_checkpoint.h"
#include "telemetry/session.h"
#include "train/precision.h"
#include "profile/readers.h"

namespace scalelab {

nlohmann::json TrainOptions::to_json() const {
  nlohmann::json j = {{"model", model},
                      {"seq_len", seq_len},
                      {"micro_batch_size", micro_batch_size},
                      {"grad_accum_steps", grad_accum_steps},
                      {"max_steps", max_steps},
                      {"warmup_steps", warmup_steps},
                      {"lr", lr},
                      {"lr_scheduler", lr_scheduler},
                      {"weight_decay", weight_decay},
                      {"adam_beta1", adam_beta1},
                      {"adam_beta2", adam_beta2},
                      {"adam_epsilon", adam_epsilon},
                      {"max_grad_norm", max_grad_norm},
                      {"model_precision", model_precision},
                      {"mixed_precision", mixed_precision},
                      {"optim_state_dtype", optim_state_dtype},
                      {"attn", attn},
                      {"fused_kernels", fused_kernels},
                      {"activation_checkpointing", activation_checkpointing},
                      {"optimizer_in_backward", optimizer_in_backward},
                      {"dropout", dropout >= 0 ? nlohmann::json(dropout) : nlohmann::json(nullptr)},
                      {"device", device},
                      {"device_memory", device_memory},
                      {"allow_tf32", allow_tf32},
                      {"threads", threads},
                      {"seed", seed},
                      {"data", data},
                      {"val_data", val_data},
                      {"eval_every", eval_every},
                      {"eval_batches", eval_batches},
                      {"tokenizer", tokenizer},
                      {"save", save},
                      {"save_every", save_every},
                      {"save_total_limit", save_total_limit},
                      {"resume", resume},
                      {"save_precision", save_precision},
                      {"max_shard_size", max_shard_size},
                      {"bench_warmup_steps", bench_warmup_steps},
                      {"profile", profile},
                      {"trace", trace},
                      {"peak_tflops", peak_tflops},
                      {"telemetry", telemetry || !telemetry_csv.empty()},
                      {"telemetry_interval_ms", telemetry_interval_ms},
                      {"telemetry_csv", telemetry_csv},
                      {"ddp_bucket_mb", dist.ddp_bucket_mb},
                      {"zero", dist.zero},
                      {"comm_timeout", dist.comm_timeout_s},
                      {"comm_backend", dist.comm_backend},
                      {"freeze", freeze},
                      {"lora_rank", lora_rank},
                      {"lora_alpha", lora_alpha},
                      {"lora_dropout", lora_dropout},
                      {"lora_targets", lora_targets},
                      {"rslora", rslora},
                      {"adapter", adapter},
                      {"quantize_base", quantize_base},
                      {"qat", qat},
                      {"qat_group_size", qat_group_size},
                      {"dpo", dpo.enabled},
                      {"pairs", dpo.pairs},
                      {"beta", dpo.beta},
                      {"label_smoothing", dpo.label_smoothing}};
  // Only when set, so that the records (and resume checks) of runs on the default stay as they were.
  if (fused_loss_chunk > 0) j["fused_loss_chunk"] = fused_loss_chunk;
  return j;
}

LoraConfig TrainOptions::lora_config() const {
  LoraConfig c;
  c.rank = lora_rank;
  c.alpha = lora_alpha;
  c.dropout = lora_dropout;
  c.rslora = rslora;
  c.quantize_base = quantize_base;
  std::size_t start = 0;
  while (start <= lora_targets.size() && !lora_targets.empty()) {
    const std::size_t comma = std::min(lora_targets.find(',', start), lora_targets.size());
    std::string t = lora_targets.substr(start, comma - start);
    t.erase(0, t.find_first_not_of(' '));
    t.erase(t.find_last_not_of(' ') + 1);
    if (t.empty()) {
      throw InvalidInput("[--lora-targets] '" + lora_targets + "' has an empty name — give module names separated "
                         "by commas, e.g. q_proj,k_proj,v_proj,o_proj");
    }
    c.targets.push_back(t);
    start = comma + 1;
  }
  return c;
}

const char* run_status_name(RunStatus s) {
  switch (s) {
    case RunStatus::kOk: return "ok";
    case RunStatus::kOom: return "oom";
    case RunStatus::kError: return "error";
  }
  return "error";
}

std::optional<RunStatus> parse_run_status(std::string_view name) {
  for (RunStatus s : {RunStatus::kOk, RunStatus::kOom, RunStatus::kError})
    if (name == run_status_name(s)) return s;
  return std::nullopt;
}

nlohmann::json TrainResult::to_json() const {
  nlohmann::json j;
  j["status"] = run_status_name(status);
  j["config"] = config;
  j["params"] = params;
  j["trainable_params"] = trainable_params;
  j["frozen_params"] = frozen_params;
  j["flops_per_token"] = flops_per_token;
  j["flops_per_token_non_embedding"] = flops_per_token_non_embedding;
  j["tokens_per_s"] = tokens_per_s;
  j["tokens_per_s_per_device"] = tokens_per_s_per_device;
  j["step_time_s"] = step_time_s;
  j["max_allocated_bytes"] = max_allocated_bytes;
  j["max_reserved_bytes"] = max_reserved_bytes;
  nlohmann::json losses = nlohmann::json::array(), lrs = nlohmann::json::array(), times = nlohmann::json::array(),
                 norms = nlohmann::json::array();
  for (const auto& s : steps) {
    losses.push_back(s.loss);
    lrs.push_back(s.lr);
    times.push_back(s.seconds);
    norms.push_back(s.grad_norm);
  }
  j["losses"] = losses;
  if (!steps.empty() && steps.front().dpo) {
    // DPO: the per-step metrics (means over each step's pairs) and the last step's at the top,
    // where the lab reads a run's figures.
    nlohmann::json d = {{"beta", config.value("beta", 0.0)},
                        {"label_smoothing", config.value("label_smoothing", 0.0)},
                        {"reference", config.value("dpo_reference", std::string())}};
    for (const char* k : {"rewards_chosen", "rewards_rejected", "reward_margins", "reward_accuracies"})
      d[k] = nlohmann::json::array();
    for (const auto& s : steps) {
      const DpoStats st = s.dpo.value_or(DpoStats{});
      d["rewards_chosen"].push_back(st.rewards_chosen);
      d["rewards_rejected"].push_back(st.rewards_rejected);
      d["reward_margins"].push_back(st.margin);
      d["reward_accuracies"].push_back(st.accuracy);
    }
    j["dpo"] = d;
    const DpoStats last = steps.back().dpo.value_or(DpoStats{});
    j["final_rewards_chosen"] = last.rewards_chosen;
    j["final_rewards_rejected"] = last.rewards_rejected;
    j["final_reward_margin"] = last.margin;
    j["final_reward_accuracy"] = last.accuracy;
  }
  j["final_loss"] = steps.empty() ? nlohmann::json(nullptr) : nlohmann::json(steps.back().loss);
  j["mfu"] = mfu ? nlohmann::json(*mfu) : nlohmann::json(nullptr);
  j["val_loss"] = evals.empty() ? nlohmann::json(nullptr) : nlohmann::json(evals.back().loss);
  j["val_perplexity"] = evals.empty() || evals.back().dpo ? nlohmann::json(nullptr)
                                                          : nlohmann::json(evals.back().perplexity);
  if (!evals.empty() && evals.back().dpo) {
    // DPO: the last evaluation's held-out metrics at the top, where the lab reads a run's figures
    // (val_loss above is its DPO loss).
    const DpoStats& d = *evals.back().dpo;
    j["val_rewards_chosen"] = d.rewards_chosen;
    j["val_rewards_rejected"] = d.rewards_rejected;
    j["val_reward_margin"] = d.margin;
    j["val_reward_accuracy"] = d.accuracy;
  }
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& e : evals) ev.push_back(e.to_json());
  j["evals"] = ev;
  if (resumed_from_step > 0) j["resumed_from_step"] = resumed_from_step;
  if (!checkpoints.empty()) j["checkpoints"] = checkpoints;
  j["error"] = error.empty() ? nlohmann::json(nullptr) : nlohmann::json(error);
  j["learning_rates"] = lrs;
  j["grad_norms"] = norms;
  j["step_times_s"] = times;
  j["measured_steps"] = measured_steps;
  j["version"] = SCALELAB_VERSION;
  j["git_revision"] = SCALELAB_GIT_REV;
  if (!oom.is_null()) j["oom"] = oom;
  if (!plan.is_null()) j["memory_plan"] = plan;
  if (!profile.is_null()) j["profile"] = profile;
  if (!trace_file.empty()) j["trace_file"] = trace_file;
  if (!precision.is_null()) j["precision"] = precision;
  if (!telemetry.is_null()) j["telemetry"] = telemetry;
  j["skipped_steps"] = skipped_steps;
  if (loss_scale > 0) j["loss_scale"] = loss_scale;
  j["world_size"] = world_size;
  j["launcher"] = launcher;
  if (!data_parallel.is_null()) {
    j["comm_time_s"] = data_parallel.value("comm_time_s", 0.0);
    j["comm_hidden_s"] = data_parallel.value("comm_hidden_s", 0.0);
    j["comm_hidden_fraction"] = data_parallel.value("comm_hidden_fraction", 0.0);
    j["data_parallel"] = data_parallel;
    j["ranks"] = ranks;
  }
  return j;
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) throw RuntimeError("[json] cannot write '" + path + "' — check the directory exists and is writable");
    out << j.dump(2) << "\n";
    if (!out) throw RuntimeError("[json] writing '" + path + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw RuntimeError("[json] cannot move the run record into '" + path + "': " + ec.message());
}

namespace {

[[noreturn]] void refuse_qat_over_nf4() {
  throw InvalidInput("[--qat] QAT fake-quantizes a dense base to int4; with --quantize-base the base is stored in "
                     "NF4 instead — use --qat with --lora-rank (QAT + LoRA) or --quantize-base (QLoRA), not both");
}

}  // namespace

void validate_train_options(const TrainOptions& o) {
  auto positive = [](std::int64_t v, const char* flag) {
    if (v <= 0) throw InvalidInput(std::string("[") + flag + "] must be positive, got " + std::to_string(v));
  };
  positive(o.seq_len, "--seq-len");
  positive(o.micro_batch_size, "--micro-batch-size");
  positive(o.grad_accum_steps, "--grad-accum-steps");
  positive(o.max_steps, "--max-steps");
  if (o.warmup_steps < 0) throw InvalidInput("[--warmup-steps] must be >= 0, got " + std::to_string(o.warmup_steps));
  if (o.bench_warmup_steps < 0) throw InvalidInput("[--bench-warmup-steps] must be >= 0");
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) throw InvalidInput("[--lr] must be a finite number >= 0");
  if (!(o.weight_decay >= 0)) throw InvalidInput("[--weight-decay] must be >= 0");
  if (!(o.adam_beta1 >= 0 && o.adam_beta1 < 1)) throw InvalidInput("[--adam-beta1] must be in [0, 1)");
  if (!(o.adam_beta2 >= 0 && o.adam_beta2 < 1)) throw InvalidInput("[--adam-beta2] must be in [0, 1)");
  if (!(o.adam_epsilon > 0)) throw InvalidInput("[--adam-epsilon] must be positive");
  if (std::isnan(o.max_grad_norm)) throw InvalidInput("[--max-grad-norm] must be a number (<= 0 disables clipping)");
  if (o.threads < 0) throw InvalidInput("[--threads] must be >= 0 (0 = all cores)");
  if (!o.save_precision.empty()) parse_dtype(o.save_precision, "--save-precision");
  if (o.telemetry_interval_ms <= 0) throw InvalidInput("[--telemetry-interval] must be a positive number of ms");
  if (!o.max_shard_size.empty()) parse_bytes(o.max_shard_size, "--max-shard-size");
  if (o.save_every < 0) throw InvalidInput("[--save-every] must be >= 0 (0: no checkpoints during training)");
  if (o.save_total_limit < 0) throw InvalidInput("[--save-total-limit] must be >= 0 (0: keep every checkpoint)");
  if (o.save_every > 0 && o.save.empty()) {
    throw InvalidInput("[--save-every] needs --save DIR (checkpoints go to DIR/checkpoint-STEP)");
  }
  if (o.eval_every < 0) throw InvalidInput("[--eval-every] must be >= 0 (0: evaluate at the end only)");
  if (o.eval_batches < 0) throw InvalidInput("[--eval-batches] must be >= 0 (0: the whole validation set)");
  if (o.val_data.empty() && (o.eval_every > 0 || o.eval_batches > 0)) {
    throw InvalidInput("[--eval-every/--eval-batches] need validation data — add --val-data PATH");
  }
  parse_lr_schedule(o.lr_scheduler);
  if (o.lora_rank < 0) throw InvalidInput("[--lora-rank] must be >= 1 (0: no LoRA), got " + std::to_string(o.lora_rank));
  if (o.lora_rank == 0 && (!o.lora_targets.empty() || o.rslora || o.lora_dropout != 0 || !o.adapter.empty())) {
    throw InvalidInput("[--lora-targets/--rslora/--lora-dropout/--adapter] are LoRA settings — add --lora-rank R");
  }
  if (!o.quantize_base.empty()) {
    parse_quantize_base(o.quantize_base);  // InvalidInput naming the accepted values
    if (o.lora_rank == 0) {
      throw InvalidInput("[--quantize-base] QLoRA quantizes the frozen base under LoRA adapters — add --lora-rank R "
                         "(e.g. --lora-rank 16), or drop --quantize-base to train every weight");
    }
  }
  if (!(o.lora_dropout >= 0 && o.lora_dropout < 1)) throw InvalidInput("[--lora-dropout] must be in [0, 1)");

  if (!o.qat.empty() && o.qat != "8da4w") {
    throw InvalidInput("[--qat] unknown scheme '" + o.qat + "' — the one implemented is 8da4w (int8 dynamic per-token "
                       "activations, int4 grouped weights, as torchao's Int8DynActInt4WeightQATQuantizer)");
  }
  if (o.qat_group_size <= 1) {
    throw InvalidInput("[--qat-group-size] must be > 1, got " + std::to_string(o.qat_group_size));
  }
  // QAT with LoRA is torchtune's QAT + LoRA: the frozen base fake-quantized, the adapters in full
  // precision on top. QAT over a QLoRA base is not: the NF4 base is already quantized (another
  // format), and nothing would turn it into int4.
  if (!o.qat.empty() && !o.quantize_base.empty()) refuse_qat_over_nf4();

  resolve_precision(o.model_precision, o.mixed_precision, o.optim_state_dtype);
  if (o.fused_loss_chunk < 0) {
    throw InvalidInput("[--fused-loss-chunk] must be a positive number of tokens (0: the default), got " +
                       std::to_string(o.fused_loss_chunk));
  }
  if (o.fused_loss_chunk > 0 && !o.fused_kernels) {
    throw InvalidInput("[--fused-loss-chunk] sizes the chunks of the fused linear + cross-entropy, which runs only "
                       "with --fused-kernels — add --fused-kernels, or drop --fused-loss-chunk");
  }
  if (o.optimizer_in_backward) {
    // Each layer is updated as soon as its backward is done: nothing that needs every gradient of
    // the step first can run (torchtune's optimizer_in_bwd refuses the same).
    if (o.grad_accum_steps > 1) {
      throw InvalidInput("[--optimizer-in-backward] updates each layer as soon as its gradients are final, which with "
                         "--grad-accum-steps " + std::to_string(o.grad_accum_steps) +
                         " they are only after the last micro-batch — use --grad-accum-steps 1 (a larger "
                         "--micro-batch-size), or drop --optimizer-in-backward");
    }
    if (o.max_grad_norm > 0) {
      char norm[32];
      std::snprintf(norm, sizeof norm, "%g", o.max_grad_norm);
      throw InvalidInput(std::string("[--optimizer-in-backward] clipping by the global gradient norm (--max-grad-norm ") +
                         norm + (o.max_grad_norm == 1.0 ? ", the default" : "") + ") needs every gradient before the first "
                         "update — pass --max-grad-norm 0 (no clipping; the norm is still reported), or drop "
                         "--optimizer-in-backward");
    }
    if (o.mixed_precision == "fp16") {
      throw InvalidInput("[--optimizer-in-backward] fp16 loss scaling skips a step whose gradients hold inf/NaN, which "
                         "is known only after the whole backward — use --mixed-precision bf16 (no loss scaling), "
                         "or drop --optimizer-in-backward");
    }
  }
  if (o.attn != "eager" && o.attn != "flash") throw InvalidInput("[--attn] must be eager or flash, got '" + o.attn + "'");
  // cpu, cuda or meta (the memory plan's device; train refuses it: parse_train_device).
  parse_device_type(o.device, "--device");
  if (!(o.dropout < 1.0) || std::isnan(o.dropout)) {
    throw InvalidInput("[--dropout] must be in [0, 1) (or omitted for the model config's), got " +
                       std::to_string(o.dropout));
  }
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json profile_json(const Profiler& prof, double total_s) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : prof.rows()) {
    rows.push_back({{"family", r.family},
                    {"phase", phase_name(r.phase)},
                    {"seconds", r.entry.seconds},
                    {"calls", r.entry.calls},
                    {"percent", total_s > 0 ? 100.0 * r.entry.seconds / total_s : 0.0}});
  }
  return {{"total_step_seconds", total_s}, {"rows", rows}};
}

// The AdamW ranges over the trainable parameters (offsets in the trainable buffer), adjacent
// parameters with the same decay merged.
std::vector<kernels::ElementRange> optimizer_ranges(const ParamLayout& layout) {
  std::vector<kernels::ElementRange> ranges;
  for (const auto& p : layout.params()) {
    if (!p.trainable) continue;
    if (!ranges.empty() && ranges.back().decay == p.decay && ranges.back().end == p.offset) {
      ranges.back().end = p.offset + p.numel;
    } else {
      ranges.push_back({p.offset, p.offset + p.numel, p.decay});
    }
  }
  return ranges;
}

}  // namespace

PlanInput make_plan_input(const TrainOptions& o) {
  PlanInput in;
  in.config = resolve_model(o.model);
  if (o.seq_len > in.config.max_position_embeddings) {
    throw InvalidInput("[--seq-len] " + std::to_string(o.seq_len) + " is above the model's max_position_embeddings " +
                       std::to_string(in.config.max_position_embeddings) + " — use a shorter sequence");
  }
  in.precision = resolve_precision(o.model_precision, o.mixed_precision, o.optim_state_dtype);
  in.options.activation_dtype = in.precision.activation;
  in.options.attention = o.attn == "flash" ? AttentionImpl::kFlash : AttentionImpl::kEager;
  in.options.fused_kernels = o.fused_kernels;
  in.options.fused_loss_chunk = o.fused_loss_chunk;
  in.options.activation_checkpointing = o.activation_checkpointing;
  in.optimizer_in_backward = o.optimizer_in_backward;
  in.options.seed = o.seed;
  in.options.dropout = resolve_dropout(in.config, o.dropout);
  check_model_options(in.config, in.options);  // the family's switches (model/family.h)
  in.micro_batch = o.micro_batch_size;
  in.seq_len = o.seq_len;
  set_num_threads(o.threads);
  in.threads = num_threads();
  in.capacity = o.device_memory.empty() ? host_physical_memory() : parse_bytes(o.device_memory, "--device-memory");
  in.freeze = o.freeze;
  in.lora = o.lora_config();
  if (!in.lora.quantize_base.empty() && !in.lora.enabled()) {
    parse_quantize_base(in.lora.quantize_base);
    throw InvalidInput("[--quantize-base] QLoRA quantizes the frozen base under LoRA adapters — add --lora-rank R "
                       "(e.g. --lora-rank 16), or drop --quantize-base to train every weight");
  }
  in.qat = o.qat_config();
  if (in.qat.enabled() && !in.lora.quantize_base.empty()) refuse_qat_over_nf4();
  in.device = o.device == "cuda" ? DeviceType::kCUDA : DeviceType::kCPU;  // meta plans as the CPU
  in.dpo = o.dpo.enabled;
  if (o.dpo.enabled) {
    validate_dpo_options(o.dpo);
    if (o.fused_kernels) {
      throw InvalidInput("[--fused-kernels] DPO needs each token's log-probability, which the fused linear + "
                         "cross-entropy never materializes — run dpo without --fused-kernels");
    }
  }
  build_layout(in);  // checks --freeze (InvalidInput: a bad regex, nothing or everything frozen)
  return in;
}

namespace {

// A step on the timeline (category "step", args.index the step): ended by end(), or by the
// destructor when the step is left early (a skipped fp16 step, an out-of-memory).
class StepSpan {
 public:
  StepSpan(Tracer* t, std::int64_t step, Tracer::Clock::time_point start) : t_(t), step_(step), start_(start) {}
  void end(Tracer::Clock::time_point at) {
    if (!t_) return;
    t_->complete("step " + std::to_string(step_), "step", start_, at, nullptr, step_);
    t_ = nullptr;
  }
  ~StepSpan() {
    try {
      end(Tracer::Clock::now());
    } catch (...) {
    }
  }
  StepSpan(const StepSpan&) = delete;
  StepSpan& operator=(const StepSpan&) = delete;

 private:
  Tracer* t_;
  std::int64_t step_;
  Tracer::Clock::time_point start_;
};


// One rank's training in three parts that stand apart: the constructor sets the run up (checks,
// resolved configuration, device, plan, telemetry), build() allocates the step buffers and builds
// the model and the data source, step() runs one optimizer step, finish() fills the result.
// dist is null for a single process (the arithmetic is then exactly the single-process
// trainer's) and otherwise has more than one rank. build() and step() throw OutOfMemory as any
// allocation does; train() turns it into a result with status kOom.
class TrainSession {
 public:
  TrainSession(const TrainOptions& requested, DistContext* dist);
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;
  // A data-parallel run that did not end cleanly (an exception, or out of memory) may leave
  // collectives in flight: the communicator abandons them, but MPI can still read or write their
  // buffers (the gradients, ZeRO's shards, the parameters) until the process exits, and a freed
  // buffer is then a crash in the communication thread. So their memory is never returned: the
  // device allocator is leaked with every block in it (the process ends right after such a run).
  // Only once the buffers were handed to the communicator (attach): a run refused before that (a
  // bad --resume, bad data) has nothing in flight and frees normally.
  ~TrainSession() {
    if (dp_attached_ && (std::uncaught_exceptions() > 0 || res_.status != RunStatus::kOk)) (void)dev_.alloc.release();
  }

  // Buffers, weights (loaded or initialized), model, data source, batch; prints the start line.
  void build();
  // Optimizer step `step` (0-based): its micro-steps, gradient sync, clipping, AdamW; returns its
  // record (grad_norm NaN when fp16 loss scaling skipped it). Throws RuntimeError when the loss
  // becomes non-finite without loss scaling.
  StepRecord step(std::int64_t step);
  // After the last step: throughput, profile, --save; status kOk.
  void finish_ok();
  // A run out of device memory: status kOom with the request and the usage.
  void finish_oom(const OutOfMemory& e);
  // Always last: telemetry summary, memory peaks, the data-parallel figures; returns the result.
  TrainResult finish();

  std::int64_t max_steps() const { return o_.max_steps; }
  std::int64_t start_step() const { return start_step_; }
  // --save-every: writes <save>/checkpoint-<steps_done> when due (and rotates).
  void maybe_checkpoint(std::int64_t steps_done);
  void record(const StepRecord& r) { res_.steps.push_back(r); }
  // --val-data: evaluates after `steps_done` optimizer steps when --eval-every says so (or at the
  // end, last = true, unless that step was just evaluated), records it and prints its line.
  void maybe_evaluate(std::int64_t steps_done, bool last);

 private:
  const TrainOptions requested_;
  TrainOptions o_;
  DistContext* dist_;
  int world_ = 1;
  TrainResult res_;
  PlanInput pin_;
  TrainDevice dev_;
  LrSchedule schedule_{};
  PrecisionPlan prec_;
  ParamLayout layout_;
  std::unique_ptr<DataParallelRun> dp_;
  Profiler profiler_;
  std::unique_ptr<Tracer> tracer_;  // --trace or --profile
  // On CUDA with --trace/--profile: op scopes timed with CUDA events, and CUPTI's activity.
  std::unique_ptr<DeviceTiming> timing_;
  std::unique_ptr<ActivityProfiler> activity_;
  void stop_device_profiling();
  std::unique_ptr<ExecContext> ctx_;
  std::int64_t tokens_per_step_ = 0, bench_warmup_ = 0, tokens_done_ = 0;
  std::optional<TelemetrySession> tel_;
  double measured_time_ = 0;
  std::vector<double> measured_;
  // Built by build().
  StepBuffers bufs_;
  std::unique_ptr<Model> model_;
  // DPO without LoRA: the frozen reference copy of the initial (compute) weights and its model.
  Tensor ref_params_;
  std::unique_ptr<Model> ref_model_;
  std::unique_ptr<DataSource> data_;
  DataOptions val_options_;  // --val-data: a fresh source per evaluation starts at sample 0
  TextSourceOptions val_text_;  // its tokenizer, for text:/jsonl: specs
  std::optional<PreferenceData> val_pairs_;  // DPO with --val-data: the held-out pairs
  std::optional<StagedBatch> batch_;
  std::vector<kernels::ElementRange> ranges_;
  // --optimizer-in-backward: the update the model's grad-ready hook applies to each range as its
  // gradients become final (update_in_backward), with this step's hyperparameters; what the
  // step's ranges added to the gradient norm and how many parameters they covered.
  kernels::AdamWHyper in_backward_hp_;
  bool dp_attached_ = false;  // the data-parallel run holds the step buffers (set just before attach)
  double in_backward_sum_sq_ = 0;
  std::int64_t in_backward_covered_ = 0;
  void update_in_backward(std::int64_t begin, std::int64_t end);
  kernels::AdamWHyper hyper(double lr, std::int64_t step, double grad_scale) const;
  double loss_scale_ = 1.0;
  std::int64_t good_steps_ = 0;
  std::int64_t start_step_ = 0;          // --resume: the checkpoint's step
  std::int64_t micro_batches_read_ = 0;  // the data position (this rank's micro-batches)
  nlohmann::json rebuilt_;               // TrainCheckpointState::rebuilt (with --save-every / --resume)
};

TrainSession::TrainSession(const TrainOptions& requested, DistContext* dist)
    : requested_(requested), o_(requested), dist_(dist) {
  validate_train_options(requested);
  parse_train_device(requested.device);  // meta: the plan's device, refused here (exit 2)
  if (dist && requested.device != "cpu") {
    throw InvalidInput("[--device] data-parallel training (" + std::to_string(dist->world_size()) +
                       " ranks) runs on the CPU only for now: the gradient collectives read host memory — "
                       "use --device cpu, or one rank with --device " + requested.device);
  }
  if (dist && requested.optimizer_in_backward) {
    throw InvalidInput("[--optimizer-in-backward] runs in one process for now: with " +
                       std::to_string(dist->world_size()) + " ranks each layer's gradients would have to be "
                       "all-reduced before its update — drop --optimizer-in-backward, or run one rank");
  }
  if (dist) {
    o_.threads = threads_for_rank(requested.threads, dist->env());  // --threads 0: this rank's share
    o_.quiet = requested.quiet || dist->rank() != 0;                 // progress from rank 0 only
  }
  const TrainOptions& o = o_;
  world_ = dist ? dist->world_size() : 1;
  res_.world_size = world_;
  pin_ = make_plan_input(o);
  if (dist) {
    pin_.world_size = world_;
    pin_.rank = dist->rank();
    pin_.zero_stage = o.dist.zero;
  }
  // The device and its allocator (capacity: --device-memory, else the device's memory); throws
  // InvalidInput (exit 2) with the reason when the device is not available (no GPU, no driver,
  // a driver older than this build's CUDA).
  dev_ = make_train_device(o.device, o.device_memory);
  pin_.capacity = dev_.capacity;
  const ModelConfig& cfg = pin_.config;
  schedule_ = parse_lr_schedule(o.lr_scheduler);
  prec_ = resolve_precision(o.model_precision, o.mixed_precision, o.optim_state_dtype);
  res_.precision = prec_.compute_dtypes();
  res_.precision["mode"] = prec_.name;

  layout_ = build_layout(pin_);
  res_.params = layout_.total_numel();
  res_.trainable_params = layout_.trainable_numel();
  res_.frozen_params = layout_.frozen_numel();
  const double attn_flops = 12.0 * static_cast<double>(cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim) *
                            static_cast<double>(o.seq_len);
  // N counts every weight that takes part in a matmul, the LM head included whether tied or not:
  // that GEMM is real work (a third of llama-small's). Kaplan's non-embedding N is recorded too.
  res_.flops_per_token = 6.0 * static_cast<double>(layout_.matmul_numel()) + attn_flops;
  res_.flops_per_token_non_embedding = 6.0 * static_cast<double>(layout_.non_embedding_numel()) + attn_flops;
  res_.config = o.to_json();
  res_.config["device_memory_bytes"] = pin_.capacity;
  res_.config["device_description"] = dev_.description;
  res_.config["threads_resolved"] = num_threads();
  res_.config["model_config"] = cfg.to_hf_json();
  res_.config["model_family"] = family_name(cfg.family);
  if (layout_.lora().enabled()) {
    const LoraConfig& l = layout_.lora();
    res_.config["lora"] = {{"r", l.rank}, {"alpha", l.alpha}, {"rslora", l.rslora}, {"targets", l.resolved_targets()},
                           {"scale", l.scale()}};
    if (!l.quantize_base.empty()) {  // QLoRA: which NF4 flavour, and what it reproduces
      const Nf4Flavor f = *parse_quantize_base(l.quantize_base);
      res_.config["lora"]["quantize_base"] = {{"flavor", nf4_flavor_name(f)},
                                              {"reference", nf4_flavor_reference(f)},
                                              {"quantized_params", layout_.quantized_numel()},
                                              {"block_size", kernels::kNf4BlockSize},
                                              {"scaler_block_size", kernels::kNf4ScalerBlockSize}};
    }
  }
  if (o.dpo.enabled) {
    res_.config["dpo_reference"] = layout_.lora().enabled() ? "the policy with its LoRA adapters off"
                                                            : "a frozen copy of the initial weights";
  }
  res_.config["dropout_resolved"] = pin_.options.dropout;
  res_.config["threads"] = requested.threads;
  res_.config["world_size"] = world_;
  if (dist) {
    // Every rank must run the same configuration; the paths only rank 0 writes and what differs
    // legitimately between machines are left out.
    check_same_config(dist->host(), res_.config,
                      {"json", "save", "telemetry_csv", "device_memory_bytes", "device_description", "threads_resolved"});
    // Gradients, buckets and ZeRO shards cover the trainable parameters only.
    dp_ = std::make_unique<DataParallelRun>(*dist, o.dist, prec_, layout_.trainable_numel());
  }

  res_.plan = plan_memory(pin_).to_json();

  DeviceAllocator& alloc = *dev_.alloc;
  ctx_ = std::make_unique<ExecContext>(ExecContext{&alloc, o.profile ? &profiler_ : nullptr});
  ctx_->options.allow_tf32 = o.allow_tf32;
  // NVTX ranges on CUDA for nsys users, whether or not scalelab profiles itself.
  if (dev_.type == DeviceType::kCUDA) ctx_->ranges = &device_runtime(DeviceType::kCUDA);
  if (!o.trace.empty() || o.profile) {
    TraceMeta meta;
    meta.rank = dist ? dist->rank() : 0;
    meta.world_size = world_;
    meta.device = dev_.name;
    meta.description = dev_.description;
    meta.extra = {{"model", cfg.name},
                  {"micro_batch_size", o.micro_batch_size},
                  {"seq_len", o.seq_len},
                  {"grad_accum_steps", o.grad_accum_steps},
                  {"tokens_per_step", o.micro_batch_size * o.seq_len * o.grad_accum_steps},
                  {"config", res_.config}};
    tracer_ = std::make_unique<Tracer>(std::move(meta));
    ctx_->tracer = tracer_.get();
    alloc.set_usage_observer(
        [](void* user, std::size_t allocated, std::size_t reserved) {
          auto* t = static_cast<Tracer*>(user);
          const auto now = Tracer::Clock::now();
          t->counter("allocated memory", now, "bytes", static_cast<double>(allocated));
          t->counter("reserved memory", now, "bytes", static_cast<double>(reserved));
        },
        tracer_.get());
    if (dev_.type != DeviceType::kCPU && dev_.type != DeviceType::kMeta) {
      DeviceRuntime& rt = device_runtime(dev_.type);
      // SCALELAB_PROFILE_SYNC=1: the old way (synchronize around every op scope), for comparison.
      const char* sync_env = std::getenv("SCALELAB_PROFILE_SYNC");
      const bool sync_scopes = sync_env && std::string(sync_env) == "1";
      if (DeviceTimer* timer = rt.timer(); timer && !sync_scopes) {
        timing_ = std::make_unique<DeviceTiming>(*timer, o.profile ? &profiler_ : nullptr, tracer_.get());
        ctx_->device_timing = timing_.get();
      }
      tracer_->set_other("op_timing", timing_ ? "device queue (CUDA events)" : "host clock, synchronized per scope");
      // The device's own activity (CUDA: CUPTI) unless SCALELAB_CUPTI=0.
      const char* cupti_env = std::getenv("SCALELAB_CUPTI");
      std::string why = "off (SCALELAB_CUPTI=0)";
      if (!(cupti_env && std::string(cupti_env) == "0")) {
        activity_ = rt.activity_profiler();
        why = "none for this device";
        if (activity_ && !activity_->start(tracer_.get(), &why)) activity_.reset();
      }
      tracer_->set_other("gpu_activity", activity_ ? activity_->describe() : why);
      if (!activity_ && !o.quiet) std::fprintf(stderr, "scalelab train: GPU activity profiling: %s\n", why.c_str());
    }
  }
  // DPO: each pair is two sequences (chosen and rejected) through the policy.
  tokens_per_step_ = (o.dpo.enabled ? 2 : 1) * o.micro_batch_size * o.seq_len * o.grad_accum_steps;
  // Telemetry samples from before the first step to after the last; a run that throws still
  // stops the sampler (the session's destructor).
  // With several ranks, one per node samples (its node's devices; the energy is summed over nodes).
  if ((o.telemetry || !o.telemetry_csv.empty()) && (!dist || dist->env().local_rank == 0)) {
    TelemetryOptions topt;
    topt.interval = std::chrono::milliseconds(o.telemetry_interval_ms);
    topt.engine = {{dev_.telemetry_name, [&alloc] { return alloc.stats(); }}};
    tel_.emplace(topt);
    tel_->start();
  }
  bench_warmup_ = std::min(o.bench_warmup_steps, std::max<std::int64_t>(0, o.max_steps - 1));
}

void TrainSession::build() {
  const TrainOptions& o = o_;
  const ModelConfig& cfg = pin_.config;
  DeviceAllocator& alloc = *dev_.alloc;
  // QLoRA: the quantized weights are not in the flat buffer (ParamLayout::dense_numel).
  const std::int64_t P = layout_.dense_numel(), Pt = layout_.trainable_numel();
  const std::int64_t S = dp_ ? dp_->state_numel() : Pt;  // ZeRO-1: this rank's shard
  // --optimizer-in-backward: the gradient buffer is the compact layout's (one layer's slot).
  bufs_ = allocate_step_buffers(alloc, prec_, P, Pt, S, dp_ && dp_->zero(), layout_.grad_numel());
  std::shared_ptr<Nf4Store> nf4;
  if (layout_.quantized_numel() > 0) {
    nf4 = std::make_shared<Nf4Store>(layout_, *parse_quantize_base(layout_.lora().quantize_base), alloc);
  }
  // Initial weights are written on the host (and copied to the device when it is not the host).
  // QLoRA: into a host staging buffer of the whole layout (host memory outside the device
  // allocator, freed before the first step), from which each quantized weight is quantized into
  // the NF4 store and the dense prefix copied to the parameter buffer.
  auto fill_params = [&](const std::function<void(const Tensor&)>& fill) {
    if (!nf4) {
      fill_through_host(bufs_.params, dev_, fill);
      return;
    }
    DeviceAllocator staging_alloc(make_host_backend(), std::numeric_limits<std::size_t>::max() / 4);
    Tensor staging = Tensor::empty({layout_.total_numel()}, bufs_.params.dtype(), staging_alloc, "host staging");
    fill(staging);
    std::vector<float> values;
    for (const ParamInfo& p : layout_.params()) {
      if (!p.quantized) continue;
      const float* src = staging.data<float>() + p.offset;
      if (staging.dtype() != DType::kF32) {  // a bf16 model: its values, quantized in fp32 arithmetic
        values.resize(static_cast<std::size_t>(p.numel));
        const bf16* h = static_cast<const bf16*>(staging.raw()) + p.offset;
        for (std::int64_t i = 0; i < p.numel; ++i) values[i] = bf16_to_float(h[i]);
        src = values.data();
      }
      nf4->quantize(p.name, src);
    }
    fill_through_host(bufs_.params, dev_, [&](const Tensor& host) {
      Tensor dst = host;
      dst.copy_from(staging.slice(0, P));
    });
  };
  if (!is_preset(o.model) && has_weights(o.model)) {
    LoadSummary ls;
    fill_params([&](const Tensor& host) {
      ls = load_weights(o.model, cfg, layout_, host);  // the base; adapters are not in it
      if (layout_.lora().enabled()) init_adapters(host, layout_, o.seed);
      if (!o.adapter.empty()) load_adapter(o.adapter, layout_, host);
    });
    if (!o.quiet) {
      std::fprintf(stderr, "scalelab train: loaded %lld tensors from %s\n", static_cast<long long>(ls.tensors),
                   o.model.c_str());
    }
  } else {
    fill_params([&](const Tensor& host) {
      init_params(host, layout_, cfg, o.seed);
      if (!o.adapter.empty()) load_adapter(o.adapter, layout_, host);
    });
  }
  if (nf4) {
    layout_.attach_nf4(nf4);
    if (!o.quiet) {
      std::fprintf(stderr, "scalelab train: QLoRA base in %s: %lld parameters in %s (%.3f bytes each)\n",
                   nf4_flavor_name(nf4->flavor()), static_cast<long long>(layout_.quantized_numel()),
                   format_bytes(nf4->bytes()).c_str(),
                   static_cast<double>(nf4->bytes()) / static_cast<double>(layout_.quantized_numel()));
    }
  }
  std::optional<TrainCheckpointState> resumed;
  if (!o.resume.empty()) {
    resumed = read_train_state(o.resume);  // every rank reads the same checkpoint
    check_resume_config(o.resume, resumed->config, res_.config);
    if (resumed->global_step >= o.max_steps) {
      throw InvalidInput("[--resume] " + o.resume + " is at step " + std::to_string(resumed->global_step) +
                         ", not before --max-steps " + std::to_string(o.max_steps) + " — nothing left to run");
    }
  }
  if (prec_.weight_copy) bufs_.compute_weights.copy_from(bufs_.params);
  model_ = make_model(cfg, layout_, bufs_.compute_weights, bufs_.grads, pin_.options);
  if (o.dpo.enabled && !layout_.lora().enabled()) {
    // The reference: the initial weights, frozen (the plan's "reference model"; its model never
    // runs backward, so the gradient buffer it is bound to is never written). Copied before a
    // resumed run loads its checkpoint: the initial weights come from --model (or the seed) again.
    ref_params_ = Tensor::empty({P}, prec_.compute_weights, alloc, "reference model");
    ref_params_.copy_from(bufs_.compute_weights);
    ref_model_ = make_model(cfg, layout_, ref_params_, bufs_.grads, pin_.options);
  }
  // What a checkpoint does not hold but a resumed run rebuilds from --model: recorded (and on
  // --resume checked) by CRC-32 (train/train_checkpoint.h).
  if (o.save_every > 0 || resumed) {
    auto source = [&] { return is_preset(o.model) ? "preset " + o.model + " (seed " + std::to_string(o.seed) + ")" : o.model; };
    if (ref_model_) {
      const Tensor h = host_view_of(ref_params_, dev_);
      const std::size_t n = static_cast<std::size_t>(h.numel()) * dtype_size(h.dtype());
      rebuilt_["dpo_reference"] = {{"crc32", crc32_hex(crc32_bytes(h.raw(), n))},
                                   {"bytes", n},
                                   {"source", source()},
                                   {"what", "the DPO reference model (the initial weights)"}};
    }
    if (nf4) {
      std::uint32_t crc = 0;
      std::size_t n = 0;
      nf4->visit_state([&](const std::string&, const void* bytes, std::size_t k) {
        crc = crc32_bytes(bytes, k, crc);
        n += k;
      });
      rebuilt_["nf4_base"] = {{"crc32", crc32_hex(crc)},
                              {"bytes", n},
                              {"source", source()},
                              {"what", std::string("the QLoRA base in ") + nf4_flavor_name(nf4->flavor()) +
                                           " (codes, scalers, factors, means)"}};
    }
  }
  if (resumed) {
    check_rebuilt(o.resume, resumed->rebuilt, rebuilt_);
    // QLoRA: the buffer holds the dense parameters; the NF4 base was quantized from --model above.
    fill_through_host(bufs_.params, dev_, [&](const Tensor& host) { load_weights(o.resume, cfg, layout_, host); });
    // The checkpoint holds the whole flat state; a ZeRO-1 rank keeps its shard of it.
    const std::int64_t begin = dp_ && dp_->zero() ? dp_->state_begin() : 0;
    const std::int64_t total = layout_.trainable_numel();
    fill_through_host(bufs_.m, dev_, [&](const Tensor& host) { load_optimizer_state(o.resume, "exp_avg", host, begin, total); });
    fill_through_host(bufs_.v, dev_, [&](const Tensor& host) { load_optimizer_state(o.resume, "exp_avg_sq", host, begin, total); });
    if (!o.quiet) {
      std::fprintf(stderr, "scalelab train: resuming from %s at step %lld\n", o.resume.c_str(),
                   static_cast<long long>(resumed->global_step));
    }
    if (prec_.weight_copy) bufs_.compute_weights.copy_from(bufs_.params);
  }
  if (dp_) {
    dp_attached_ = true;  // from here MPI may hold these buffers (~TrainSession)
    dp_->attach(bufs_.trainable, bufs_.grads, bufs_.m, bufs_.v, bufs_.zero_recv.defined() ? &bufs_.zero_recv : nullptr,
                *model_);
    dp_->set_tracer(tracer_.get());
  }
  loss_scale_ = prec_.loss_scaling ? 65536.0 : 1.0;  // torch.cuda.amp.GradScaler defaults
  DataOptions dopt{o.data, o.seq_len, o.micro_batch_size, cfg.vocab_size, o.seed, dp_ ? dp_->rank() : 0, world_};
  if (o.dpo.enabled) {
    data_ = with_injected_data_fault(
        make_preference_source(read_preference_pairs(o.dpo.pairs, o.seq_len, cfg.vocab_size,
                                                     TextSourceOptions{o.tokenizer, o.model, "--pairs"}),
                               o.micro_batch_size, o.seq_len, dopt.rank, world_),
        dopt.rank);
  } else {
    data_ = with_injected_data_fault(make_data_source(dopt, TextSourceOptions{o.tokenizer, o.model, "--data"}), dopt.rank);
  }
  if (!o.val_data.empty() && o.dpo.enabled) {
    // DPO: held-out preference pairs, read (and checked: exit 2 naming --val-data) before the first step.
    val_options_ = dopt;
    val_pairs_ = read_preference_pairs(o.val_data, o.seq_len, cfg.vocab_size,
                                       TextSourceOptions{o.tokenizer, o.model, "--val-data"});
  } else if (!o.val_data.empty()) {
    val_options_ = dopt;
    val_options_.spec = o.val_data;
    val_text_ = TextSourceOptions{o.tokenizer, o.model, "--val-data"};
    // Opened once here so that a bad --val-data stops the run before the first step (exit 2).
    try {
      auto probe = make_data_source(val_options_, val_text_);
      if (o.eval_batches == 0 && probe->num_samples() <= 0) {
        throw InvalidInput("[--eval-batches] the validation data " + probe->describe() +
                           " has no known size, so 'the whole set' (--eval-batches 0) is undefined — give "
                           "--eval-batches N");
      }
    } catch (const InvalidInput& e) {
      const std::string what = e.what();
      throw InvalidInput(what.rfind("[--", 0) == 0 ? what : "[--val-data] " + what);
    }
  }
  // The data source writes host memory; on a device the batch is copied up each micro-step.
  batch_.emplace(make_staged_batch((o.dpo.enabled ? 2 : 1) * o.micro_batch_size, o.seq_len, dev_));
  ranges_ = optimizer_ranges(layout_);
  if (o.optimizer_in_backward) {
    model_->set_grad_ready_hook([this](std::int64_t begin, std::int64_t end) { update_in_backward(begin, end); });
  }
  if (resumed) {
    start_step_ = resumed->global_step;
    res_.resumed_from_step = start_step_;
    loss_scale_ = resumed->loss_scale;
    good_steps_ = resumed->good_steps;
    res_.skipped_steps = resumed->skipped_steps;
    // The data position: move past what the checkpointed run consumed (the built-in sources seek;
    // any other reads and drops it).
    data_->skip(resumed->micro_batches_read, batch_->host);
    micro_batches_read_ = resumed->micro_batches_read;
    bench_warmup_ = start_step_ + std::min(o.bench_warmup_steps, std::max<std::int64_t>(0, o.max_steps - start_step_ - 1));
  }

  if (!o.quiet) {
    std::fprintf(stderr, "scalelab train: %s (%s, %lld parameters: %lld trainable, %lld frozen), data %s, micro-batch %lld x seq %lld x accum %lld, %d threads, device %s: %s%s\n",
                 cfg.name.c_str(), family_name(cfg.family), static_cast<long long>(res_.params),
                 static_cast<long long>(res_.trainable_params), static_cast<long long>(res_.frozen_params),
                 data_->describe().c_str(), static_cast<long long>(o.micro_batch_size),
                 static_cast<long long>(o.seq_len), static_cast<long long>(o.grad_accum_steps), num_threads(),
                 dev_.name.c_str(), dev_.description.c_str(),
                 dev_.type == DeviceType::kCUDA ? (o.allow_tf32 ? ", TF32 on" : ", TF32 off") : "");
  }
}

StepRecord TrainSession::step(std::int64_t step) {
  const TrainOptions& o = o_;
  ExecContext& ctx = *ctx_;
  if (step == bench_warmup_) profiler_.clear();
  const auto t0 = std::chrono::steady_clock::now();
  if (tracer_ && step == bench_warmup_) tracer_->set_other("measured_from_us", tracer_->us(t0));
  StepSpan span(tracer_.get(), step, t0);
  // --optimizer-in-backward zeroes each range right after its update (update_in_backward), and
  // every step covers every range: the buffer is already zero here.
  if (!o.optimizer_in_backward) bufs_.grads.zero_();
  const double lr = o.lr * lr_factor(schedule_, step, o.warmup_steps, o.max_steps);
  if (o.optimizer_in_backward) {
    // No clipping and no loss scaling (validate_train_options): the update needs nothing but lr.
    in_backward_hp_ = hyper(lr, step, 1.0);
    in_backward_sum_sq_ = 0;
    in_backward_covered_ = 0;
  }
  double loss = 0;
  std::optional<DpoStats> dpo;
  for (std::int64_t micro = 0; micro < o.grad_accum_steps; ++micro) {
    if (dp_) dp_->begin_micro_step(micro == o.grad_accum_steps - 1);
    {
      ProfileScope p(ctx, "data", Phase::kData);
      data_->next(batch_->host);
      ++micro_batches_read_;
      batch_->upload();
    }
    model_->set_step(step * o.grad_accum_steps + micro);
    ctx.train_step = step * o.grad_accum_steps + micro;  // LoRA dropout's masks (ExecContext)
    ctx.train_seed = o.seed;
    // The loss gradient's seed carries the loss scale and the division by the micro-steps and,
    // data-parallel, by the ranks: the reduction over ranks then only sums.
    const auto seed = static_cast<float>(loss_scale_ / (static_cast<double>(o.grad_accum_steps) * (dp_ ? world_ : 1)));
    if (o.dpo.enabled) {
      const DpoStats st = dpo_micro_step(*model_, ref_model_.get(), batch_->device, o.dpo.beta, o.dpo.label_smoothing,
                                         seed, ctx);
      if (!dpo) dpo.emplace();
      dpo->add(st);
      loss += st.loss;
    } else {
      loss += model_->forward_backward(batch_->device, seed, ctx);
    }
    ctx.train_step = -1;  // evaluation and anything else: no dropout
  }
  loss /= static_cast<double>(o.grad_accum_steps);
  // The loss (above) and the gradient norm (below) come back to the host as doubles: on CUDA each
  // is a synchronization point per micro-step / step. Acceptable for now (the step's other work
  // queues behind it anyway); reading them a step late would let the host run ahead.
  // One pass over the gradients: their norm (and, with fp16 loss scaling, whether any is
  // inf/NaN); the clipping coefficient and the loss-scale inverse fold into the update.
  double sum_sq = 0;
  if (o.optimizer_in_backward) {
    // Every trainable parameter was updated in backward, exactly once.
    if (in_backward_covered_ != layout_.trainable_numel()) {
      throw RuntimeError("[train] --optimizer-in-backward: the backward reported " +
                         std::to_string(in_backward_covered_) + " of " + std::to_string(layout_.trainable_numel()) +
                         " trainable parameters final (a bug in the model's grad-ready ranges)");
    }
    sum_sq = in_backward_sum_sq_;
  } else {
    RegionScope r(ctx, "gradient sync", Phase::kComm);
    sum_sq = dp_ ? dp_->sync_gradients() : kernels::sum_of_squares(bufs_.grads, ctx);
  }
  if (dp_) loss = dp_->mean(loss);
  if (dp_ && dpo) {
    dpo->rewards_chosen = dp_->mean(dpo->rewards_chosen);
    dpo->rewards_rejected = dp_->mean(dpo->rewards_rejected);
    dpo->margin = dp_->mean(dpo->margin);
    dpo->accuracy = dp_->mean(dpo->accuracy);
    dpo->loss = loss;
  }
  if (prec_.loss_scaling && !std::isfinite(sum_sq)) {
    // Dynamic loss scaling (as GradScaler): skip the step on inf/NaN and halve the scale;
    // double it after 2000 good steps.
    loss_scale_ *= 0.5;
    good_steps_ = 0;
    ++res_.skipped_steps;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dp_) dp_->end_step(false);
    if (!o.quiet) {
      std::fprintf(stderr, "step %lld/%lld | skipped: inf/NaN gradients in fp16, loss scale now %.0f\n",
                   static_cast<long long>(step + 1), static_cast<long long>(o.max_steps), loss_scale_);
    }
    return {loss, lr, std::nan(""), dt, dpo};
  }
  const double norm = std::sqrt(sum_sq) / loss_scale_;
  const double coef = kernels::clip_coefficient(norm, o.max_grad_norm);
  const kernels::AdamWHyper hp = hyper(lr, step, coef / loss_scale_);
  if (!o.optimizer_in_backward) {
    RegionScope r(ctx, "optimizer", Phase::kOptimizer);
    if (dp_) dp_->update(ranges_, hp, ctx);
    else kernels::adamw_update(bufs_.trainable, bufs_.m, bufs_.v, bufs_.grads, ranges_, hp, ctx);
    if (prec_.weight_copy) {
      // Only the trainable parameters changed: the frozen part of the compute copy stays as made.
      ProfileScope p(ctx, "adamw", Phase::kOptimizer);
      bufs_.compute_trainable.copy_from(bufs_.trainable);
    }
  }
  if (prec_.loss_scaling && ++good_steps_ % 2000 == 0) loss_scale_ *= 2.0;
  dev_.synchronize();  // an asynchronous device: the step ends when its kernels have run
  if (timing_) timing_->flush();
  const auto t_end = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(t_end - t0).count();
  if (tracer_) {
    span.end(t_end);
    tokens_done_ += tokens_per_step_;
    tracer_->counter("tokens", t_end, "total", static_cast<double>(tokens_done_), "per_s",
                     static_cast<double>(tokens_per_step_) / dt);
  }
  if (step >= bench_warmup_) {
    measured_time_ += dt;
    measured_.push_back(dt);
  }
  if (dp_) dp_->end_step(step >= bench_warmup_);
  if (!o.quiet) {
    const auto st = dev_.alloc->stats();
    char extra[160] = "";
    if (dpo) {
      std::snprintf(extra, sizeof extra, " | rewards chosen %.4f rejected %.4f | margin %.4f | accuracy %.3f",
                    dpo->rewards_chosen, dpo->rewards_rejected, dpo->margin, dpo->accuracy);
    }
    std::fprintf(stderr, "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.1f tokens/s | %.3f s | mem %s reserved%s\n",
                 static_cast<long long>(step + 1), static_cast<long long>(o.max_steps), loss, lr, norm,
                 static_cast<double>(tokens_per_step_ * world_) / dt, dt, format_bytes(st.reserved).c_str(), extra);
  }
  if (!std::isfinite(loss) && !prec_.loss_scaling) {
    throw RuntimeError("[train] the loss became " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                       " — lower --lr or enable clipping (--max-grad-norm)");
  }
  return {loss, lr, norm, dt, dpo};
}

kernels::AdamWHyper TrainSession::hyper(double lr, std::int64_t step, double grad_scale) const {
  kernels::AdamWHyper hp;
  hp.rounding_seed = o_.seed;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = static_cast<float>(o_.adam_beta1);
  hp.beta2 = static_cast<float>(o_.adam_beta2);
  hp.eps = static_cast<float>(o_.adam_epsilon);
  hp.weight_decay = static_cast<float>(o_.weight_decay);
  hp.step = step + 1;
  hp.grad_scale = static_cast<float>(grad_scale);
  return hp;
}

// --optimizer-in-backward: the model's hook says [begin, end) of the trainable buffer has its final
// gradients. The step-end update restricted to that range (the same per-element arithmetic and
// stochastic-rounding bits: index_base), its contribution to the gradient norm, the compute copy
// refreshed, and the gradients zeroed: a layer's sit in the slot the next layer's backward writes.
void TrainSession::update_in_backward(std::int64_t begin, std::int64_t end) {
  ExecContext& ctx = *ctx_;
  RegionScope region(ctx, "optimizer", Phase::kOptimizer);
  for (const auto& seg : layout_.grad_segments(begin, end)) {
    const std::int64_t n = seg.end - seg.begin;
    Tensor g = bufs_.grads.slice(seg.grad_begin, seg.grad_begin + n);
    in_backward_sum_sq_ += kernels::sum_of_squares(g, ctx);
    Tensor p = bufs_.trainable.slice(seg.begin, seg.end);
    Tensor m = bufs_.m.slice(seg.begin, seg.end), v = bufs_.v.slice(seg.begin, seg.end);
    kernels::AdamWHyper hp = in_backward_hp_;
    hp.index_base = seg.begin;
    kernels::adamw_update(p, m, v, g, kernels::ranges_within(ranges_, seg.begin, seg.end), hp, ctx);
    if (prec_.weight_copy) {
      Tensor c = bufs_.compute_trainable.slice(seg.begin, seg.end);
      c.copy_from(p);
    }
    g.zero_();
    in_backward_covered_ += n;
  }
}

void TrainSession::maybe_evaluate(std::int64_t steps_done, bool last) {
  const TrainOptions& o = o_;
  if (o.val_data.empty()) return;
  const bool periodic = o.eval_every > 0 && steps_done % o.eval_every == 0;
  if (!periodic && !(last && (res_.evals.empty() || res_.evals.back().step != steps_done))) return;
  // Not profiled nor traced: the profile and the timeline describe the training steps.
  ExecContext ctx = *ctx_;
  ctx.profiler = nullptr;
  ctx.tracer = nullptr;
  if (o.dpo.enabled) {
    // Held-out preference pairs: the DPO loss and trl's reward metrics (train/dpo.h).
    const auto t0 = std::chrono::steady_clock::now();
    DpoEvalOptions eo;
    eo.batches = o.eval_batches;
    eo.rank = val_options_.rank;
    eo.world = world_;
    if (dp_) eo.sum_over_ranks = [this](double v) { return dp_->mean(v) * static_cast<double>(world_); };
    const DpoStats st =
        evaluate_dpo(*model_, ref_model_.get(), *val_pairs_, *batch_, o.dpo.beta, o.dpo.label_smoothing, eo, ctx);
    EvalRecord e;
    e.step = steps_done;
    e.loss = st.loss;
    e.dpo = st;
    const std::int64_t per_batch = o.micro_batch_size * world_, n = static_cast<std::int64_t>(val_pairs_->pairs.size());
    e.batches = o.eval_batches > 0 ? o.eval_batches : (n + per_batch - 1) / per_batch;
    e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    res_.evals.push_back(e);
    if (!o.quiet) {
      std::fprintf(stderr,
                   "eval step %lld/%lld | val loss %.4f | rewards chosen %.4f rejected %.4f | margin %.4f | "
                   "accuracy %.3f | %lld pairs | %.3f s\n",
                   static_cast<long long>(steps_done), static_cast<long long>(o.max_steps), st.loss, st.rewards_chosen,
                   st.rewards_rejected, st.margin, st.accuracy, static_cast<long long>(st.pairs), e.seconds);
    }
    return;
  }
  auto data = make_data_source(val_options_, val_text_);
  EvalOptions eo;
  eo.batches = o.eval_batches;
  eo.rank = val_options_.rank;
  eo.world = world_;
  // The mean over ranks times the ranks: a sum (every rank contributes its tokens and loss sum).
  if (dp_) eo.sum_over_ranks = [this](double v) { return dp_->mean(v) * static_cast<double>(world_); };
  EvalRecord e = evaluate_loss(*model_, *data, *batch_, eo, ctx);
  e.step = steps_done;
  res_.evals.push_back(e);
  if (!o.quiet) {
    std::fprintf(stderr, "eval step %lld/%lld | val loss %.4f | perplexity %.3f | %lld tokens | %.3f s\n",
                 static_cast<long long>(steps_done), static_cast<long long>(o.max_steps), e.loss, e.perplexity,
                 static_cast<long long>(e.tokens), e.seconds);
  }
}

void TrainSession::maybe_checkpoint(std::int64_t steps_done) {
  const TrainOptions& o = o_;
  if (o.save_every <= 0 || steps_done % o.save_every != 0) return;
  TrainCheckpointState st;
  st.global_step = steps_done;
  st.micro_batches_read = micro_batches_read_;
  st.loss_scale = loss_scale_;
  st.good_steps = good_steps_;
  st.skipped_steps = res_.skipped_steps;
  st.seed = o.seed;
  st.config = res_.config;
  st.rebuilt = rebuilt_;
  for (const auto& r : res_.steps) st.losses.push_back(r.loss);
  Tensor m = host_view_of(bufs_.m, dev_), v = host_view_of(bufs_.v, dev_);
  // ZeRO-1: each rank holds a shard of the optimizer states; they are gathered (on the host, every
  // rank) so the checkpoint holds the whole flat state as a one-process run's does.
  std::vector<std::uint8_t> whole_m, whole_v;
  if (dp_ && dp_->zero()) {
    const std::size_t es = dtype_size(m.dtype());
    const std::int64_t total = layout_.trainable_numel();
    std::vector<std::int64_t> bytes;
    for (std::int64_t n : dist_->host().all_gather_value<std::int64_t>(dp_->state_numel()))
      bytes.push_back(n * static_cast<std::int64_t>(es));
    auto gather = [&](const Tensor& shard, std::vector<std::uint8_t>& whole) {
      whole.assign(static_cast<std::size_t>(total) * es, 0);
      std::memcpy(whole.data() + static_cast<std::size_t>(dp_->state_begin()) * es, shard.raw(),
                  static_cast<std::size_t>(shard.numel()) * es);
      dist_->host().all_gather(whole.data(), bytes, CommDType::kU8);
      return Tensor::from_external(whole.data(), {total}, shard.dtype());
    };
    m = gather(m, whole_m);
    v = gather(v, whole_v);
  }
  // Data-parallel: the ranks hold the same weights (and states, or now their gathered whole), so
  // rank 0 writes; the others wait for it, so that no rank runs ahead of a checkpoint it names.
  const std::string dir = checkpoint_dir_name(o.save, steps_done);
  std::vector<std::string> removed;
  if (!dp_ || dp_->rank() == 0) {
    save_train_checkpoint(o.save, pin_.config, layout_, host_view_of(bufs_.params, dev_), prec_.param, m, v, st,
                          o.model);
    removed = rotate_checkpoints(o.save, o.save_total_limit, steps_done);
  }
  if (dp_) dist_->host().barrier();
  res_.checkpoints.push_back(dir);
  if (!o.quiet && (!dp_ || dp_->rank() == 0)) {
    std::fprintf(stderr, "scalelab train: checkpoint %s%s\n", dir.c_str(),
                 removed.empty() ? "" : (" (removed " + std::to_string(removed.size()) + " older)").c_str());
  }
}

void TrainSession::finish_ok() {
  const TrainOptions& o = o_;
  res_.measured_steps = static_cast<std::int64_t>(measured_.size());
  res_.tokens_per_s =
      measured_time_ > 0 ? static_cast<double>(tokens_per_step_) * res_.measured_steps / measured_time_ : 0;
  res_.tokens_per_s_per_device = res_.tokens_per_s;
  res_.step_time_s = median(measured_);
  if (o.peak_tflops > 0) res_.mfu = res_.flops_per_token * res_.tokens_per_s_per_device / (o.peak_tflops * 1e12);
  stop_device_profiling();
  if (o.profile) {
    res_.profile = profile_json(profiler_, measured_time_);
    // The nsys-shaped tables, from the timeline of the same (measured) steps.
    res_.profile["summary"] = profile::to_json(profile::summarize_scalelab_trace(tracer_->to_json()));
  }
  if (!o.save.empty() && (!dist_ || dist_->rank() == 0)) {
    SaveOptions so;
    so.dtype = o.save_precision.empty() ? prec_.param : parse_dtype(o.save_precision, "--save-precision");
    so.max_shard_bytes = o.max_shard_size.empty() ? 0 : parse_bytes(o.max_shard_size, "--max-shard-size");
    if (layout_.lora().enabled()) {
      // LoRA: only the adapters, in PEFT's format (the base is unchanged).
      // base_model_name_or_path: an absolute directory (merge / generate find it from anywhere), or the preset.
      std::error_code ec;
      const std::string base = std::filesystem::is_directory(o.model, ec) ? std::filesystem::absolute(o.model).string()
                                                                          : o.model;
      save_adapter(o.save, layout_, host_view_of(bufs_.params, dev_), so.dtype, base);
      if (!o.quiet) std::fprintf(stderr, "scalelab train: saved the LoRA adapter to %s\n", o.save.c_str());
    } else {
      save_checkpoint(o.save, pin_.config, layout_, host_view_of(bufs_.params, dev_), so);
      copy_model_side_files(o.model, o.save);  // generation_config.json (EOS), tokenizer files
      if (!o.quiet) std::fprintf(stderr, "scalelab train: saved the model to %s\n", o.save.c_str());
    }
    // The QAT scheme beside the weights, for scalelab quantize (QAT + LoRA: merge carries it); a
    // record an earlier --qat run left there goes, as save_checkpoint's stale weight files do.
    const std::string record = (std::filesystem::path(o.save) / kQatRecordFile).string();
    if (!o.qat.empty()) {
      write_json_file(record, {{"scheme", o.qat}, {"group_size", o.qat_group_size}});
    } else {
      std::error_code ec;
      std::filesystem::remove(record, ec);
    }
  }
  res_.loss_scale = prec_.loss_scaling ? loss_scale_ : 0.0;
  res_.status = RunStatus::kOk;
}

void TrainSession::finish_oom(const OutOfMemory& e) {
  // The other ranks wait in a collective: tell them, so that they stop naming this rank.
  if (dist_) dist_->host().notify_failure(std::string("out of device memory: ") + e.what());
  res_.status = RunStatus::kOom;
  res_.error = e.what();
  res_.oom = {{"requested_bytes", e.requested()},
              {"allocated_bytes", e.allocated()},
              {"reserved_bytes", e.reserved()},
              {"capacity_bytes", e.capacity()}};
}

void TrainSession::stop_device_profiling() {
  if (timing_) {
    timing_->flush();
    ctx_->device_timing = nullptr;
    timing_.reset();
  }
  if (activity_) {
    activity_->stop();
    if (activity_->dropped() > 0) tracer_->set_other("gpu_activity_dropped_records", activity_->dropped());
    activity_.reset();
  }
}

TrainResult TrainSession::finish() {
  try {
    stop_device_profiling();  // after a failure too: the trace holds what ran
  } catch (const std::exception& e) {
    if (tracer_) tracer_->set_other("gpu_activity_error", e.what());
  }
  if (tracer_ && !o_.trace.empty()) {
    // Also after an out-of-memory: the timeline up to it is what explains it.
    const std::string path = trace_path_for_rank(o_.trace, dist_ ? dist_->rank() : 0, world_);
    tracer_->set_other("status", run_status_name(res_.status));
    tracer_->write(path);
    res_.trace_file = path;
  }
  if (tracer_) dev_.alloc->set_usage_observer(nullptr, nullptr);
  if (tel_) {
    tel_->stop();
    res_.telemetry =
        tel_->summary(static_cast<double>(tokens_per_step_) * static_cast<double>(res_.steps.size()));
    if (!o_.telemetry_csv.empty()) tel_->write_csv(o_.telemetry_csv);
  }
  const MemoryStats st = dev_.alloc->stats();
  res_.max_allocated_bytes = st.peak_allocated;
  res_.max_reserved_bytes = st.peak_reserved;
  if (dp_ && res_.status == RunStatus::kOk) {
    dp_->finish(res_, tokens_per_step_, measured_time_, res_.step_time_s);
    if (o_.peak_tflops > 0) res_.mfu = res_.flops_per_token * res_.tokens_per_s_per_device / (o_.peak_tflops * 1e12);
  }
  return std::move(res_);
}

TrainResult train(const TrainOptions& requested, DistContext* dist) {
  TrainSession s(requested, dist);
  try {
    s.build();
    for (std::int64_t step = s.start_step(); step < s.max_steps(); ++step) {
      s.record(s.step(step));
      s.maybe_checkpoint(step + 1);
      s.maybe_evaluate(step + 1, step + 1 == s.max_steps());
    }
    s.finish_ok();
  } catch (const OutOfMemory& e) {
    s.finish_oom(e);
  }
  return s.finish();
}

}  // namespace

TrainResult run_training(const TrainOptions& o) { return train(o, nullptr); }

TrainResult run_training(const TrainOptions& o, DistContext& dist) {
  TrainResult r = train(o, dist.world_size() > 1 ? &dist : nullptr);
  r.launcher = launcher_name(dist.env().launcher);
  return r;
}

}  // namespace scalelab
