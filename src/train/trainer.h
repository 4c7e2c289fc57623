#pragma once
// The trainer: resolves a run's options, builds the model over flat buffers, runs the training
// loop (gradient accumulation, clipping, AdamW, LR schedule) and measures it.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/context.h"
#include "distributed/dist_flags.h"
#include "train/dpo.h"
#include "train/evaluate.h"

namespace scalelab {

// Every flag of `scalelab train` (names as the Hugging Face Trainer's, in kebab case on the CLI).
struct TrainOptions {
  std::string model = "llama-small";
  std::int64_t seq_len = 256;
  std::int64_t micro_batch_size = 8;
  std::int64_t grad_accum_steps = 1;
  std::int64_t max_steps = 20;
  std::int64_t warmup_steps = 0;
  double lr = 5e-5;
  std::string lr_scheduler = "linear";
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  std::string model_precision = "fp32";
  std::string mixed_precision = "no";
  std::string optim_state_dtype = "auto";  // auto: the parameter dtype (as PyTorch); or fp32
  std::string attn = "eager";
  bool fused_kernels = false;
  // --fused-loss-chunk: tokens per chunk of the fused linear + cross-entropy (its [chunk, vocab]
  // fp32 logits are at the step's peak); 0: the device's default (kernels/fused.h). Needs
  // --fused-kernels. In the run record only when set.
  std::int64_t fused_loss_chunk = 0;
  bool activation_checkpointing = false;
  // --optimizer-in-backward (torchtune's optimizer_in_bwd): each decoder layer's AdamW update runs
  // in backward as soon as its gradients are final, so the gradient buffer holds one layer's
  // gradients (plus the embeddings', final norm's and an untied head's) instead of all of them
  // (ParamLayout::share_layer_gradients). The same arithmetic as the step-end update; it needs
  // every gradient of a parameter in one backward and no global quantity: no gradient
  // accumulation, no clipping by the global norm (--max-grad-norm 0), no fp16 loss scaling, one
  // process (no mpirun).
  bool optimizer_in_backward = false;
  double dropout = -1.0;  // OPT residual dropout; < 0: the model config's
  std::string device = "cpu";
  std::string device_memory;  // empty: the device's physical memory
  bool allow_tf32 = false;    // CUDA fp32 GEMMs may use TF32 (ExecContext::options.allow_tf32)
  int threads = 0;            // 0: all cores
  std::uint64_t seed = 42;
  std::string data = "synthetic";
  // Validation (train/evaluate.h): --val-data SPEC (the same forms as --data), evaluated every
  // --eval-every optimizer steps (0: only at the end) over --eval-batches micro-batches per rank
  // (0: the whole set once). Empty val_data: no evaluation.
  std::string val_data;
  std::int64_t eval_every = 0;
  std::int64_t eval_batches = 0;
  std::string tokenizer;  // text:/jsonl: data: a tokenizer.json (default: the --model directory's)
  std::string save;
  // Checkpoints during training (train/train_checkpoint.h): every --save-every optimizer steps into
  // <save>/checkpoint-STEP (0: none), keeping the last --save-total-limit (0: all); --resume
  // <dir>/checkpoint-K continues that run bit for bit from step K.
  std::int64_t save_every = 0;
  std::int64_t save_total_limit = 0;
  std::string resume;
  std::string save_precision;  // empty: the parameter dtype
  std::string max_shard_size;  // empty: one model.safetensors file
  std::string json;
  std::int64_t bench_warmup_steps = 2;
  bool profile = false;
  // --trace FILE: the run's timeline as Chrome trace-event JSON (core/trace.h); with several
  // ranks each writes FILE with its rank before the extension (trace_path_for_rank).
  std::string trace;
  double peak_tflops = 0;  // for MFU; 0: unknown on this device (mfu is null)
  bool quiet = false;      // no per-step progress lines
  bool telemetry = false;             // sample devices and the process during the run
  int telemetry_interval_ms = 200;
  std::string telemetry_csv;          // time series file (implies telemetry)
  DistFlags dist;                     // --ddp-bucket-mb, --zero, --comm-timeout, --comm-backend
  // --freeze REGEX: parameters whose Hugging Face name matches (std::regex ECMAScript,
  // regex_search) are frozen: no gradient, no optimizer state (ParamLayout::freeze). Empty: none.
  std::string freeze;
  // LoRA (docs/finetuning.md): --lora-rank R (0: off), --lora-alpha, --lora-dropout P (in [0, 1)),
  // --lora-targets "q_proj,v_proj" (empty: peft's default q_proj,v_proj), --rslora;
  // --adapter DIR: start from a PEFT adapter (adapter_model.safetensors) instead of peft's init.
  std::int64_t lora_rank = 0;
  double lora_alpha = 8.0;
  double lora_dropout = 0.0;
  std::string lora_targets;
  bool rslora = false;
  std::string adapter;
  // QLoRA: --quantize-base nf4 (torchao's to_nf4) | nf4-bnb (bitsandbytes'): every linear weight
  // of the decoder layers stored in NF4 (model/nf4.h); needs --lora-rank. Empty: off.
  std::string quantize_base;
  LoraConfig lora_config() const;
  // DPO (`scalelab dpo`, train/dpo.h): preference pairs instead of --data, the DPO loss instead
  // of the cross-entropy, a reference model (adapters off under LoRA, else a frozen copy).
  DpoOptions dpo;
  // QAT (docs/finetuning.md): --qat 8da4w (empty: off), --qat-group-size G (torchao's 256).
  std::string qat;
  std::int64_t qat_group_size = 256;
  QatConfig qat_config() const { return QatConfig{qat, qat_group_size}; }

  nlohmann::json to_json() const;
};

struct StepRecord {
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  std::optional<DpoStats> dpo;  // DPO: rewards, margin, accuracy of the step (means over its pairs)
};

// How a run ended; the run record writes it as "ok", "oom", "error".
enum class RunStatus { kOk, kOom, kError };
const char* run_status_name(RunStatus s);
// The status named by a run record's "status" text; nullopt for any other text.
std::optional<RunStatus> parse_run_status(std::string_view name);

struct TrainResult {
  RunStatus status = RunStatus::kError;
  std::string error;
  nlohmann::json config;        // resolved options and model config
  std::int64_t params = 0;
  std::int64_t trainable_params = 0, frozen_params = 0;  // params = trainable + frozen (--freeze)
  double flops_per_token = 0;  // 6·N + 12·L·H·Q·T with N = parameters in matmuls (LM head included)
  double flops_per_token_non_embedding = 0;  // the same with Kaplan's non-embedding N (for comparison)
  double tokens_per_s = 0;             // all devices
  double tokens_per_s_per_device = 0;
  double step_time_s = 0;              // median over measured steps
  std::size_t max_allocated_bytes = 0, max_reserved_bytes = 0;
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  std::int64_t resumed_from_step = 0;     // --resume: the checkpoint's step (steps holds the later ones)
  std::vector<std::string> checkpoints;   // --save-every: the checkpoint directories written  // --val-data: each evaluation, in order (the last is val_loss)
  std::int64_t measured_steps = 0;
  std::optional<double> mfu;
  nlohmann::json oom;      // request and usage when status is "oom"
  nlohmann::json plan;     // the memory plan (always computed; shown on oom)
  nlohmann::json profile;  // time by op family and phase when --profile; .summary: nsys-shaped tables
  std::string trace_file;  // this rank's --trace file, once written
  nlohmann::json precision;  // storage and compute dtypes per op family
  nlohmann::json telemetry;  // summary per device and for the process, when sampled
  std::int64_t skipped_steps = 0;  // fp16 loss scaling: steps skipped for inf/NaN gradients
  double loss_scale = 0;           // final fp16 loss scale (0 when not scaling)
  int world_size = 1;              // data-parallel ranks
  std::string launcher = "none";   // "none", "openmpi", "slurm"
  nlohmann::json data_parallel;    // world_size > 1: mode, buckets, communication per step
  nlohmann::json ranks;            // world_size > 1: each rank's throughput, communication, memory
  nlohmann::json to_json() const;
};

// Checks flags that need no model (sizes, enums); throws InvalidInput naming the flag.
void validate_train_options(const TrainOptions& o);

// Runs training. Invalid input throws InvalidInput; running out of device memory returns a result
// with status "oom" (never throws OutOfMemory); progress goes to stderr unless quiet.
TrainResult run_training(const TrainOptions& o);
// The same as one rank of a data-parallel job (train/data_parallel_run.h) when dist has more than
// one rank: the ranks check they run the same configuration, read disjoint samples, average their
// gradients, and rank 0's result holds the job's figures (the others' hold their own); only rank 0
// prints progress and saves (--save). With one rank it is run_training(o).
TrainResult run_training(const TrainOptions& o, DistContext& dist);

// The memory-plan input of a run (model resolved, capacity parsed, threads resolved).
struct PlanInput;
PlanInput make_plan_input(const TrainOptions& o);

// Writes a JSON file atomically (temporary file + rename); throws RuntimeError on failure.
void write_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace scalelab
