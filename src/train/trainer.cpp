#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/adamw.h"
#include "model/model.h"
#include "model/params.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "scalelab/version.h"
#include "dist/config_check.h"
#include "train/data.h"
#include "train/data_parallel_run.h"
#include "train/device_setup.h"
#include "train/lr_schedule.h"
#include "train/memory_plan.h"
#include "train/step_buffers.h"
#include "telemetry/session.h"
#include "train/precision.h"

namespace scalelab {

nlohmann::json TrainOptions::to_json() const {
  return {{"model", model},
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
          {"dropout", dropout >= 0 ? nlohmann::json(dropout) : nlohmann::json(nullptr)},
          {"device", device},
          {"device_memory", device_memory},
          {"allow_tf32", allow_tf32},
          {"threads", threads},
          {"seed", seed},
          {"data", data},
          {"save", save},
          {"save_precision", save_precision},
          {"max_shard_size", max_shard_size},
          {"bench_warmup_steps", bench_warmup_steps},
          {"profile", profile},
          {"peak_tflops", peak_tflops},
          {"telemetry", telemetry || !telemetry_csv.empty()},
          {"telemetry_interval_ms", telemetry_interval_ms},
          {"telemetry_csv", telemetry_csv},
          {"ddp_bucket_mb", dist.ddp_bucket_mb},
          {"zero", dist.zero},
          {"comm_timeout", dist.comm_timeout_s},
          {"comm_backend", dist.comm_backend}};
}

nlohmann::json TrainResult::to_json() const {
  nlohmann::json j;
  j["status"] = status;
  j["config"] = config;
  j["params"] = params;
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
  j["final_loss"] = steps.empty() ? nlohmann::json(nullptr) : nlohmann::json(steps.back().loss);
  j["mfu"] = mfu ? nlohmann::json(*mfu) : nlohmann::json(nullptr);
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
  parse_lr_schedule(o.lr_scheduler);
  resolve_precision(o.model_precision, o.mixed_precision, o.optim_state_dtype);
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
  in.options.activation_checkpointing = o.activation_checkpointing;
  in.options.seed = o.seed;
  in.options.dropout = resolve_dropout(in.config, o.dropout);
  check_model_options(in.config, in.options);  // the family's switches (model/family.h)
  in.micro_batch = o.micro_batch_size;
  in.seq_len = o.seq_len;
  set_num_threads(o.threads);
  in.threads = num_threads();
  in.capacity = o.device_memory.empty() ? host_physical_memory() : parse_bytes(o.device_memory, "--device-memory");
  return in;
}

namespace {

// One rank's training; dist is null for a single process (the arithmetic is then exactly the
// single-process trainer's) and otherwise has more than one rank.
TrainResult train(const TrainOptions& requested, DistContext* dist) {
  validate_train_options(requested);
  parse_train_device(requested.device);  // meta: the plan's device, refused here (exit 2)
  if (dist && requested.device != "cpu") {
    throw InvalidInput("[--device] data-parallel training (" + std::to_string(dist->world_size()) +
                       " ranks) runs on the CPU only for now: the gradient collectives read host memory — "
                       "use --device cpu, or one rank with --device " + requested.device);
  }
  TrainOptions o = requested;
  if (dist) {
    o.threads = threads_for_rank(requested.threads, dist->env());  // --threads 0: this rank's share
    o.quiet = requested.quiet || dist->rank() != 0;                 // progress from rank 0 only
  }
  const int world = dist ? dist->world_size() : 1;
  TrainResult res;
  res.world_size = world;
  PlanInput pin = make_plan_input(o);
  if (dist) {
    pin.world_size = world;
    pin.rank = dist->rank();
    pin.zero_stage = o.dist.zero;
  }
  // The device and its allocator (capacity: --device-memory, else the device's memory); throws
  // RuntimeError (exit 1) with the reason when the device is not available.
  TrainDevice dev = make_train_device(o.device, o.device_memory);
  pin.capacity = dev.capacity;
  const ModelConfig& cfg = pin.config;
  const std::size_t capacity = pin.capacity;
  const LrSchedule schedule = parse_lr_schedule(o.lr_scheduler);
  const ModelOptions& mopt = pin.options;
  const PrecisionPlan prec = resolve_precision(o.model_precision, o.mixed_precision, o.optim_state_dtype);
  res.precision = prec.compute_dtypes();
  res.precision["mode"] = prec.name;

  const ParamLayout layout = ParamLayout::build(cfg);
  res.params = layout.total_numel();
  const double attn_flops = 12.0 * static_cast<double>(cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim) *
                            static_cast<double>(o.seq_len);
  // N counts every weight that takes part in a matmul, the LM head included whether tied or not:
  // that GEMM is real work (a third of llama-small's). Kaplan's non-embedding N is recorded too.
  res.flops_per_token = 6.0 * static_cast<double>(layout.matmul_numel()) + attn_flops;
  res.flops_per_token_non_embedding = 6.0 * static_cast<double>(layout.non_embedding_numel()) + attn_flops;
  res.config = o.to_json();
  res.config["device_memory_bytes"] = capacity;
  res.config["device_description"] = dev.description;
  res.config["threads_resolved"] = num_threads();
  res.config["model_config"] = cfg.to_hf_json();
  res.config["model_family"] = family_name(cfg.family);
  res.config["dropout_resolved"] = mopt.dropout;
  res.config["threads"] = requested.threads;
  res.config["world_size"] = world;
  std::unique_ptr<DataParallelRun> dp;
  if (dist) {
    // Every rank must run the same configuration; the paths only rank 0 writes and what differs
    // legitimately between machines are left out.
    check_same_config(dist->host(), res.config,
                      {"json", "save", "telemetry_csv", "device_memory_bytes", "device_description", "threads_resolved"});
    dp = std::make_unique<DataParallelRun>(*dist, o.dist, prec, layout.total_numel());
  }

  const MemoryPlan plan = plan_memory(pin);
  res.plan = plan.to_json();

  DeviceAllocator& alloc = *dev.alloc;
  Profiler profiler;
  ExecContext ctx{&alloc, o.profile ? &profiler : nullptr};
  ctx.options.allow_tf32 = o.allow_tf32;
  const std::int64_t tokens_per_step = o.micro_batch_size * o.seq_len * o.grad_accum_steps;
  // Telemetry samples from before the first step to after the last; a run that throws still
  // stops the sampler (the session's destructor).
  std::optional<TelemetrySession> tel;
  // With several ranks, one per node samples (its node's devices; the energy is summed over nodes).
  if ((o.telemetry || !o.telemetry_csv.empty()) && (!dist || dist->env().local_rank == 0)) {
    TelemetryOptions topt;
    topt.interval = std::chrono::milliseconds(o.telemetry_interval_ms);
    topt.engine = {{dev.telemetry_name, [&alloc] { return alloc.stats(); }}};
    tel.emplace(topt);
    tel->start();
  }
  auto finish_telemetry = [&] {
    if (!tel) return;
    tel->stop();
    res.telemetry = tel->summary(static_cast<double>(tokens_per_step) * static_cast<double>(res.steps.size()));
    if (!o.telemetry_csv.empty()) tel->write_csv(o.telemetry_csv);
  };
  const std::int64_t bench_warmup = std::min(o.bench_warmup_steps, std::max<std::int64_t>(0, o.max_steps - 1));
  double measured_time = 0;
  try {
    const std::int64_t P = layout.total_numel();
    const std::int64_t S = dp ? dp->state_numel() : P;  // ZeRO-1: this rank's shard
    StepBuffers bufs = allocate_step_buffers(alloc, prec, P, S, dp && dp->zero());
    Tensor &params = bufs.params, &compute_weights = bufs.compute_weights, &grads = bufs.grads, &m = bufs.m,
           &v = bufs.v, &zero_recv = bufs.zero_recv;
    // Initial weights are written on the host (and copied to the device when it is not the host).
    if (!is_preset(o.model) && has_weights(o.model)) {
      LoadSummary ls;
      fill_through_host(params, dev, [&](const Tensor& host) { ls = load_weights(o.model, cfg, layout, host); });
      if (!o.quiet) {
        std::fprintf(stderr, "scalelab train: loaded %lld tensors from %s\n", static_cast<long long>(ls.tensors),
                     o.model.c_str());
      }
    } else {
      fill_through_host(params, dev, [&](const Tensor& host) { init_params(host, layout, cfg, o.seed); });
    }
    if (prec.weight_copy) compute_weights.copy_from(params);
    std::unique_ptr<Model> model = make_model(cfg, layout, compute_weights, grads, mopt);
    if (dp) dp->attach(params, grads, m, v, zero_recv.defined() ? &zero_recv : nullptr, *model);
    double loss_scale = prec.loss_scaling ? 65536.0 : 1.0;  // torch.cuda.amp.GradScaler defaults
    std::int64_t good_steps = 0;
    DataOptions dopt{o.data, o.seq_len, o.micro_batch_size, cfg.vocab_size, o.seed, dp ? dp->rank() : 0, world};
    std::unique_ptr<DataSource> data = with_injected_data_fault(make_data_source(dopt), dopt.rank);
    // The data source writes host memory; on a device the batch is copied up each micro-step.
    StagedBatch batch = make_staged_batch(o.micro_batch_size, o.seq_len, dev);

    std::vector<kernels::ElementRange> ranges;
    for (const auto& p : layout.params()) {
      if (!ranges.empty() && ranges.back().decay == p.decay && ranges.back().end == p.offset) {
        ranges.back().end = p.offset + p.numel;
      } else {
        ranges.push_back({p.offset, p.offset + p.numel, p.decay});
      }
    }

    if (!o.quiet) {
      std::fprintf(stderr, "scalelab train: %s (%s, %lld parameters), data %s, micro-batch %lld x seq %lld x accum %lld, %d threads, device %s: %s%s\n",
                   cfg.name.c_str(), family_name(cfg.family), static_cast<long long>(res.params),
                   data->describe().c_str(), static_cast<long long>(o.micro_batch_size),
                   static_cast<long long>(o.seq_len), static_cast<long long>(o.grad_accum_steps), num_threads(),
                   dev.name.c_str(), dev.description.c_str(),
                   dev.type == DeviceType::kCUDA ? (o.allow_tf32 ? ", TF32 on" : ", TF32 off") : "");
    }
    std::vector<double> measured;
    for (std::int64_t step = 0; step < o.max_steps; ++step) {
      if (step == bench_warmup) profiler.clear();
      const auto t0 = std::chrono::steady_clock::now();
      grads.zero_();
      double loss = 0;
      for (std::int64_t micro = 0; micro < o.grad_accum_steps; ++micro) {
        if (dp) dp->begin_micro_step(micro == o.grad_accum_steps - 1);
        {
          ProfileScope p(ctx, "data", Phase::kData);
          data->next(batch.host);
          batch.upload();
        }
        model->set_step(step * o.grad_accum_steps + micro);
        // The loss gradient's seed carries the loss scale and the division by the micro-steps and,
        // data-parallel, by the ranks: the reduction over ranks then only sums.
        loss += model->forward_backward(
            batch.device, static_cast<float>(loss_scale / (static_cast<double>(o.grad_accum_steps) * (dp ? world : 1))), ctx);
      }
      loss /= static_cast<double>(o.grad_accum_steps);
      const double lr = o.lr * lr_factor(schedule, step, o.warmup_steps, o.max_steps);
      // The loss (above) and the gradient norm (below) come back to the host as doubles: on CUDA each
      // is a synchronization point per micro-step / step. Acceptable for now (the step's other work
      // queues behind it anyway); reading them a step late would let the host run ahead.
      // One pass over the gradients: their norm (and, with fp16 loss scaling, whether any is
      // inf/NaN); the clipping coefficient and the loss-scale inverse fold into the update.
      const double sum_sq = dp ? dp->sync_gradients() : kernels::sum_of_squares(grads, ctx);
      if (dp) loss = dp->mean(loss);
      if (prec.loss_scaling && !std::isfinite(sum_sq)) {
        // Dynamic loss scaling (as GradScaler): skip the step on inf/NaN and halve the scale;
        // double it after 2000 good steps.
        loss_scale *= 0.5;
        good_steps = 0;
        ++res.skipped_steps;
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        res.steps.push_back({loss, lr, std::nan(""), dt});
        if (dp) dp->end_step(false);
        if (!o.quiet) {
          std::fprintf(stderr, "step %lld/%lld | skipped: inf/NaN gradients in fp16, loss scale now %.0f\n",
                       static_cast<long long>(step + 1), static_cast<long long>(o.max_steps), loss_scale);
        }
        continue;
      }
      const double norm = std::sqrt(sum_sq) / loss_scale;
      const double coef = kernels::clip_coefficient(norm, o.max_grad_norm);
      kernels::AdamWHyper hp;
      hp.rounding_seed = o.seed;
      hp.lr = static_cast<float>(lr);
      hp.beta1 = static_cast<float>(o.adam_beta1);
      hp.beta2 = static_cast<float>(o.adam_beta2);
      hp.eps = static_cast<float>(o.adam_epsilon);
      hp.weight_decay = static_cast<float>(o.weight_decay);
      hp.step = step + 1;
      hp.grad_scale = static_cast<float>(coef / loss_scale);
      if (dp) dp->update(ranges, hp, ctx);
      else kernels::adamw_update(params, m, v, grads, ranges, hp, ctx);
      if (prec.loss_scaling && ++good_steps % 2000 == 0) loss_scale *= 2.0;
      if (prec.weight_copy) {
        ProfileScope p(ctx, "adamw", Phase::kOptimizer);
        compute_weights.copy_from(params);
      }
      dev.synchronize();  // an asynchronous device: the step ends when its kernels have run
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      res.steps.push_back({loss, lr, norm, dt});
      if (step >= bench_warmup) {
        measured_time += dt;
        measured.push_back(dt);
      }
      if (dp) dp->end_step(step >= bench_warmup);
      if (!o.quiet) {
        const auto st = alloc.stats();
        std::fprintf(stderr, "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.1f tokens/s | %.3f s | mem %s reserved\n",
                     static_cast<long long>(step + 1), static_cast<long long>(o.max_steps), loss, lr, norm,
                     static_cast<double>(tokens_per_step * world) / dt, dt, format_bytes(st.reserved).c_str());
      }
      if (!std::isfinite(loss) && !prec.loss_scaling) {
        throw RuntimeError("[train] the loss became " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                           " — lower --lr or enable clipping (--max-grad-norm)");
      }
    }
    res.measured_steps = static_cast<std::int64_t>(measured.size());
    res.tokens_per_s = measured_time > 0 ? static_cast<double>(tokens_per_step) * res.measured_steps / measured_time : 0;
    res.tokens_per_s_per_device = res.tokens_per_s;
    res.step_time_s = median(measured);
    if (o.peak_tflops > 0) res.mfu = res.flops_per_token * res.tokens_per_s_per_device / (o.peak_tflops * 1e12);
    if (o.profile) res.profile = profile_json(profiler, measured_time);
    if (!o.save.empty() && (!dist || dist->rank() == 0)) {
      SaveOptions so;
      so.dtype = o.save_precision.empty() ? prec.param : parse_dtype(o.save_precision, "--save-precision");
      so.max_shard_bytes = o.max_shard_size.empty() ? 0 : parse_bytes(o.max_shard_size, "--max-shard-size");
      save_checkpoint(o.save, cfg, layout, host_view_of(params, dev), so);
      if (!o.quiet) std::fprintf(stderr, "scalelab train: saved the model to %s\n", o.save.c_str());
    }
    res.loss_scale = prec.loss_scaling ? loss_scale : 0.0;
    res.status = "ok";
  } catch (const OutOfMemory& e) {
    // The other ranks wait in a collective: tell them, so that they stop naming this rank.
    if (dist) dist->host().notify_failure(std::string("out of device memory: ") + e.what());
    res.status = "oom";
    res.error = e.what();
    res.oom = {{"requested_bytes", e.requested()},
               {"allocated_bytes", e.allocated()},
               {"reserved_bytes", e.reserved()},
               {"capacity_bytes", e.capacity()}};
  }
  finish_telemetry();
  const MemoryStats st = alloc.stats();
  res.max_allocated_bytes = st.peak_allocated;
  res.max_reserved_bytes = st.peak_reserved;
  if (dp && res.status == "ok") {
    dp->finish(res, tokens_per_step, measured_time, res.step_time_s);
    if (o.peak_tflops > 0) res.mfu = res.flops_per_token * res.tokens_per_s_per_device / (o.peak_tflops * 1e12);
  }
  return res;
}

}  // namespace

TrainResult run_training(const TrainOptions& o) { return train(o, nullptr); }

TrainResult run_training(const TrainOptions& o, DistContext& dist) {
  TrainResult r = train(o, dist.world_size() > 1 ? &dist : nullptr);
  r.launcher = launcher_name(dist.env().launcher);
  return r;
}

}  // namespace scalelab
