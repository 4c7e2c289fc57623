#include "cli/train_flags.h"

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/dist_flags.h"

namespace scalelab::cli {

void add_train_flags(CLI::App* app, TrainOptions& o) {
  // A flag given twice takes its last value (so a wrapper can append overrides).
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("--model", o.model, "Preset name (llama-small, llama-3.2-1b, ...), a Hugging Face model directory, or a Llama GGUF file")
      ->capture_default_str();
  app->add_option("--seq-len", o.seq_len, "Tokens per sample")->capture_default_str();
  app->add_option("--micro-batch-size", o.micro_batch_size, "Samples per micro-batch per device")->capture_default_str();
  app->add_option("--grad-accum-steps", o.grad_accum_steps, "Micro-batches per optimizer step")->capture_default_str();
  app->add_option("--max-steps", o.max_steps, "Optimizer steps to run")->capture_default_str();
  app->add_option("--warmup-steps", o.warmup_steps, "Linear LR warmup steps")->capture_default_str();
  app->add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
  app->add_option("--lr-scheduler", o.lr_scheduler, "linear | cosine | constant | constant_with_warmup")
      ->capture_default_str();
  app->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (not on biases and norms)")
      ->capture_default_str();
  app->add_option("--adam-beta1", o.adam_beta1, "AdamW beta1")->capture_default_str();
  app->add_option("--adam-beta2", o.adam_beta2, "AdamW beta2")->capture_default_str();
  app->add_option("--adam-epsilon", o.adam_epsilon, "AdamW epsilon")->capture_default_str();
  app->add_option("--max-grad-norm", o.max_grad_norm, "Global gradient-norm clipping (<= 0 disables)")
      ->capture_default_str();
  app->add_option("--model-precision", o.model_precision, "Storage of weights, gradients, activations: fp32 | bf16")
      ->capture_default_str();
  app->add_option("--mixed-precision", o.mixed_precision, "no | bf16 | fp16 (fp32 master weights)")
      ->capture_default_str();
  app->add_option("--optim-state-dtype", o.optim_state_dtype,
                  "AdamW state dtype: auto (the parameter dtype, as PyTorch) or fp32")
      ->capture_default_str();
  app->add_option("--attn", o.attn, "Attention implementation: eager | flash")->capture_default_str();
  app->add_flag("--fused-kernels", o.fused_kernels, "Fused norm+residual, RoPE, MLP activation, linear+cross-entropy");
  app->add_option("--fused-loss-chunk", o.fused_loss_chunk,
                  "Tokens per chunk of the fused linear + cross-entropy: its [chunk, vocab] fp32 logits are live at "
                  "the step's peak; smaller saves memory, below ~256 costs time (default 0: 512 tokens, halved "
                  "down to 256 while they exceed 64 MiB; on CUDA 4096, halved while above 1 GiB; docs/memory.md)");
  app->add_option("--dropout", o.dropout,
                  "OPT residual dropout probability in [0, 1) (default: the model config's \"dropout\")")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--freeze", o.freeze,
                  "Freeze the parameters whose Hugging Face name matches this regex (ECMAScript, searched), "
                  "e.g. 'embed_tokens|layers\\.[0-5]\\.': no gradients or optimizer states for them");
  app->add_option("--lora-rank", o.lora_rank,
                  "LoRA: adapters of rank R on --lora-targets, every base weight frozen (0: off; docs/finetuning.md)")
      ->capture_default_str();
  app->add_option("--lora-alpha", o.lora_alpha, "LoRA scaling numerator: the update is (alpha/r)·B·A")
      ->capture_default_str();
  app->add_option("--lora-dropout", o.lora_dropout,
                  "LoRA dropout probability in [0, 1) on the adapter input while training (peft's lora_dropout)")
      ->capture_default_str();
  app->add_option("--lora-targets", o.lora_targets,
                  "Comma-separated module names to adapt, e.g. q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                  "down_proj (default: q_proj,v_proj, as peft)");
  app->add_flag("--rslora", o.rslora, "Rank-stabilized LoRA: scale alpha/sqrt(r) instead of alpha/r");
  app->add_option("--adapter", o.adapter,
                  "Start LoRA from this PEFT adapter directory (adapter_model.safetensors) instead of peft's init");
  app->add_option("--quantize-base", o.quantize_base,
                  "QLoRA: store the frozen base's linear weights in NF4 — nf4 (torchao's to_nf4, torchtune) or "
                  "nf4-bnb (bitsandbytes' quantize_4bit, peft); needs --lora-rank (docs/finetuning.md)");
  app->add_option("--qat", o.qat,
                  "Quantization-aware training: 8da4w = int8 dynamic per-token activations and int4 grouped "
                  "weights fake-quantized in every decoder linear module (torchao's Int8DynActInt4WeightQATQuantizer; "
                  "then scalelab quantize DIR --to int4)");
  app->add_option("--qat-group-size", o.qat_group_size, "QAT: input columns per int4 weight scale (must divide them)")
      ->capture_default_str();
  app->add_flag("--activation-checkpointing", o.activation_checkpointing, "Keep only layer inputs; recompute in backward");
  app->add_flag("--optimizer-in-backward", o.optimizer_in_backward,
                "Apply each layer's AdamW update in backward as soon as its gradients are final: gradient memory "
                "for one layer instead of the whole model (needs --max-grad-norm 0 and --grad-accum-steps 1; "
                "docs/memory.md)");
  app->add_option("--device", o.device, "cpu | cuda (plan: also meta)")->capture_default_str();
  app->add_flag("--allow-tf32", o.allow_tf32,
                "CUDA: let fp32 matmuls use TF32 tensor cores (faster, 10-bit mantissa inputs); off by default");
  app->add_option("--device-memory", o.device_memory,
                  "Device memory capacity to enforce, e.g. 80GiB, 4GiB (default: the device's physical memory)");
  app->add_option("--threads", o.threads, "CPU threads (0 = all cores)")->capture_default_str();
  app->add_option("--seed", o.seed, "Seed for initialization, data and dropout")->capture_default_str();
  app->add_option("--data", o.data,
                  "synthetic; a file of little-endian uint32 token ids (scalelab tokenize); text:FILE, "
                  "jsonl:FILE[:FIELD] or parquet:FILE[:COLUMN], with options ,pad ,shuffle ,split=train|val ,val-fraction=F ,no-eos (docs/data.md)")
      ->capture_default_str();
  app->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json for text:/jsonl: data (default: the one in the --model directory)");
  app->add_option("--val-data", o.val_data,
                  "Validation data (the same forms as --data, text:/jsonl: included): loss and perplexity every --eval-every steps and at the end; "
                  "with DPO a JSONL file of held-out {prompt, chosen, rejected} pairs: DPO loss, rewards, margin and accuracy");
  app->add_option("--eval-every", o.eval_every, "Evaluate every N optimizer steps (0: only at the end)")
      ->capture_default_str();
  app->add_option("--eval-batches", o.eval_batches,
                  "Micro-batches per evaluation and rank (0: the whole validation set once)")
      ->capture_default_str();
  app->add_option("--save", o.save, "Save the trained model as a Hugging Face directory");
  app->add_option("--save-every", o.save_every,
                  "Write a resumable checkpoint every N optimizer steps into --save DIR/checkpoint-STEP (0: none)")
      ->capture_default_str();
  app->add_option("--save-total-limit", o.save_total_limit, "Keep only the last K checkpoints (0: all)")
      ->capture_default_str();
  app->add_option("--resume", o.resume,
                  "Continue the run that wrote this checkpoint directory (DIR/checkpoint-STEP), bit for bit");
  app->add_option("--save-precision", o.save_precision, "dtype of saved weights: fp32, bf16, fp16 (default: the model's)");
  app->add_option("--max-shard-size", o.max_shard_size,
                  "Shard saved weights above this size (e.g. 5GB), with model.safetensors.index.json");
  app->add_option("--json", o.json, "Write the run record (JSON) to this file");
  app->add_option("--bench-warmup-steps", o.bench_warmup_steps,
                  "Steps excluded from throughput (fewer if the run is shorter)")
      ->capture_default_str();
  app->add_flag("--profile", o.profile,
                "Print nsys-style summaries (time by op family, phase, layer, communication) of the measured steps");
  app->add_option("--trace", o.trace,
                  "Write the run's timeline (Chrome trace-event JSON for Perfetto / chrome://tracing) to this file; "
                  "under mpirun one file per rank (FILE.rankN.json)");
  app->add_option("--peak-tflops", o.peak_tflops, "Device peak TFLOP/s for MFU (unknown on CPU unless given)");
  app->add_flag("--quiet", o.quiet, "No per-step progress lines");
  app->add_flag("--telemetry", o.telemetry,
                "Sample GPUs (NVML, nvidia-smi), the process and the engine's memory; summary in the run record");
  app->add_option("--telemetry-interval", o.telemetry_interval_ms, "Telemetry sampling interval in ms")
      ->capture_default_str();
  app->add_option("--telemetry-csv", o.telemetry_csv, "Write the telemetry time series to this CSV (implies --telemetry)");
  add_dist_flags(*app, o.dist);
}

void add_dpo_flags(CLI::App* app, TrainOptions& o) {
  app->add_option("--pairs", o.dpo.pairs,
                  "Preference pairs: a JSONL file with one {\"prompt\", \"chosen\", \"rejected\"} object per line, "
                  "tokenized with the model's tokenizer (or --tokenizer)");
  app->add_option("--beta", o.dpo.beta, "DPO temperature: the loss is -log sigmoid(beta * margin of log-ratios)")
      ->capture_default_str();
  app->add_option("--label-smoothing", o.dpo.label_smoothing,
                  "Conservative DPO: the probability in [0, 0.5) that a pair's preference is flipped (trl's label_smoothing)")
      ->capture_default_str();
}

TrainResult run_and_record(const TrainOptions& o, DistContext& dist) {
  // Rank 0 writes the run record (with every rank's figures).
  const bool leader = dist.rank() == 0;
  TrainResult r;
  try {
    r = with_failure_notice(dist.host(), [&] { return run_training(o, dist); });
  } catch (const Error& e) {
    if (leader && !o.json.empty()) {
      r.status = RunStatus::kError;
      r.error = e.what();
      r.config = o.to_json();
      r.world_size = dist.world_size();
      r.launcher = launcher_name(dist.env().launcher);
      write_json_file(o.json, r.to_json());
    }
    throw;
  }
  if (leader && !o.json.empty()) write_json_file(o.json, r.to_json());
  return r;
}

}  // namespace scalelab::cli
