// `scalelab plan`: the memory plan of a training configuration, without running it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <utility>

#include "cli/command.h"
#include "cli/train_flags.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/subprocess.h"
#include "model/config.h"
#include "predict/hf_predict.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace scalelab::cli {

namespace {

struct HfStackFlags {
  std::string stack = "scalelab";
  std::string torch_version = predict::kSupportedTorch;
  std::string transformers_version = predict::kSupportedTransformers;
  std::string optim = "adamw_torch";
  std::string cuda_context;
  std::string alloc_conf;
  std::int64_t steps = 3;
  std::string schedule_out;
  int ranks = 1;
  std::string launcher = "python";
  std::int64_t ddp_bucket_cap_mb = 0;
  std::string nccl_memory;
};

// --torch-version / --transformers-version auto: the releases of the Python that runs the
// training (PYTHON, default python3), as `import torch, transformers` reports them.
std::pair<std::string, std::string> installed_versions() {
  const char* env = std::getenv("PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "python3";
  SubprocessSpec spec;
  // One marked line: the child's stderr (import warnings) shares the pipe with its stdout.
  spec.argv = {python, "-c",
               "import torch, transformers; print('scalelab-versions', torch.__version__, transformers.__version__)"};
  spec.timeout_s = 120;
  const SubprocessResult r = run_subprocess(spec);
  std::istringstream out(r.output);
  std::string line, torch, transformers;
  while (std::getline(out, line)) {
    std::istringstream words(line);
    std::string mark;
    if (words >> mark && mark == "scalelab-versions") words >> torch >> transformers;
  }
  if (!r.ok() || torch.empty() || transformers.empty()) {
    std::string tail = r.output.size() > 300 ? r.output.substr(r.output.size() - 300) : r.output;
    throw InvalidInput("[plan --stack hf-trainer] --torch-version / --transformers-version auto: " + python +
                       " could not report torch and transformers (" + r.describe() + "): " + tail +
                       " — set PYTHON to the interpreter of the training, or give the versions");
  }
  return {torch, transformers};
}

// `plan --stack hf-trainer`: the predicted peak memory of the same job under PyTorch and the
// Hugging Face Trainer (src/predict/), and the largest micro-batch that fits --device-memory.
int run_hf_plan(const TrainOptions& o, const HfStackFlags& f, int world, const CLI::App& app) {
  auto refuse = [](const std::string& m) { throw InvalidInput("[plan --stack hf-trainer] " + m); };
  if (app.count("--zero") > 0)
    refuse("--zero: ZeRO-1 under the Trainer (DeepSpeed stage 1 or FSDP's SHARD_GRAD_OP) is not modelled — "
           "drop --zero to predict plain torchrun DDP (--ranks N: each rank holds the full optimizer states)");
  for (const char* flag : {"--dpo", "--freeze", "--lora-rank", "--save", "--trace", "--data", "--optim-state-dtype",
                           "--rank", "--profile", "--telemetry", "--pairs", "--beta", "--label-smoothing"}) {
    if (app.count(flag) > 0)
      refuse(std::string(flag) + " has no meaning for the hf-trainer stack — drop it");
  }
  if (world != 1)
    refuse("--world-size is the scalelab engine's flag — for the hf-trainer stack give torchrun's ranks as --ranks " +
           std::to_string(world));
  if (f.ranks < 1) refuse("--ranks must be at least 1 (got " + std::to_string(f.ranks) + ")");
  if (f.ranks > 1 && f.launcher == "python" && app.count("--launcher") > 0)
    refuse("--ranks " + std::to_string(f.ranks) + " runs under torchrun — drop --launcher python");
  if (f.ranks == 1 && f.launcher != "torchrun" && (app.count("--ddp-bucket-cap-mb") > 0 || app.count("--nccl-memory") > 0))
    refuse("--ddp-bucket-cap-mb / --nccl-memory apply to DDP — add --ranks N (N > 1) or --launcher torchrun");
  if (o.device_memory.empty())
    refuse("--device-memory is required: the GPU's total memory as torch reports it (e.g. 80GiB, 64GiB, 141GB)");
  predict::HfJob job;
  job.model = resolve_model(o.model);
  if (app.count("--dropout") > 0) {
    if (job.model.family != ModelFamily::kOPT) refuse("--dropout applies to OPT only (Llama has no dropout)");
    if (o.dropout < 0 || o.dropout >= 1) refuse("--dropout must be in [0, 1)");
    job.model.dropout = o.dropout;  // OPT's config "dropout": saved masks when > 0
  }
  job.seq_len = o.seq_len;
  job.micro_batch = o.micro_batch_size;
  job.model_precision = o.model_precision;
  job.mixed_precision = o.mixed_precision;
  job.attn = o.attn == "flash" ? "sdpa" : o.attn;
  job.fused_kernels = o.fused_kernels;
  job.activation_checkpointing = o.activation_checkpointing;
  job.grad_accum_steps = o.grad_accum_steps;
  job.optimizer = f.optim;
  job.max_grad_norm = o.max_grad_norm;
  job.steps = f.steps;
  job.versions.torch = f.torch_version;
  job.versions.transformers = f.transformers_version;
  if (job.versions.torch == "auto" || job.versions.transformers == "auto") {
    const auto [torch, transformers] = installed_versions();
    if (job.versions.torch == "auto") job.versions.torch = torch;
    if (job.versions.transformers == "auto") job.versions.transformers = transformers;
  }
  job.versions.torch = predict::release_of(job.versions.torch);
  job.versions.transformers = predict::release_of(job.versions.transformers);
  job.ranks = f.ranks;
  job.launcher = f.ranks > 1 ? "torchrun" : f.launcher;
  job.ddp_bucket_cap_mb = f.ddp_bucket_cap_mb;
  if (app.count("--ddp-bucket-cap-mb") > 0 && f.ddp_bucket_cap_mb < 1)
    refuse("--ddp-bucket-cap-mb must be at least 1 (TrainingArguments.ddp_bucket_cap_mb)");
  predict::validate_job(job);
  predict::HfPredictOptions po;
  po.device_memory = parse_bytes(o.device_memory, "--device-memory");
  if (!f.cuda_context.empty()) po.cuda_context = parse_bytes(f.cuda_context, "--cuda-context");
  if (!f.nccl_memory.empty()) po.nccl_memory = parse_bytes(f.nccl_memory, "--nccl-memory");
  if (!f.alloc_conf.empty()) po.allocator = predict::parse_alloc_conf(f.alloc_conf);
  const predict::HfPrediction p = predict::predict_hf(job, po);
  if (!f.schedule_out.empty()) {
    const std::string tmp = f.schedule_out + ".tmp";
    std::FILE* out = std::fopen(tmp.c_str(), "w");
    if (out == nullptr) refuse("--schedule-out " + f.schedule_out + ": cannot write — check the directory");
    const std::string text = predict::schedule_text(predict::hf_trainer_schedule(job));
    std::fwrite(text.data(), 1, text.size(), out);
    std::fclose(out);
    std::rename(tmp.c_str(), f.schedule_out.c_str());
  }
  const std::int64_t largest = predict::largest_micro_batch(job, po);
  std::printf("%s", predict::prediction_table(job, po, p, largest).c_str());
  if (!o.json.empty()) {
    write_json_file(o.json, predict::prediction_json(job, po, p, largest));
    std::printf("Prediction: %s\n", o.json.c_str());
  }
  return 0;
}

}  // namespace

Subcommand add_plan_command(CLI::App& root) {
  auto opts = std::make_shared<TrainOptions>();
  auto* app = root.add_subcommand("plan", "Print the device-memory plan of a train configuration without running it");
  add_train_flags(app, *opts);
  // train's DPO flags, accepted so that a DPO trial's flags plan as they run (an OOM search plans
  // each trial with `plan --dpo` and the trial's own flags); the pairs file and beta do not change
  // the plan (the batch is [chosen; rejected] rows of --seq-len either way).
  add_dpo_flags(app, *opts);
  app->add_flag("--dpo", opts->dpo.enabled,
                "Plan a `scalelab dpo` step: [chosen; rejected] batches of 2 x micro-batch rows, the reference "
                "forward, and without LoRA the frozen reference copy of the weights");
  auto world = std::make_shared<int>(1);
  auto rank = std::make_shared<int>(0);
  app->add_option("--world-size", *world, "Data-parallel ranks (with --zero 1 the optimizer states are sharded)")
      ->capture_default_str();
  app->add_option("--rank", *rank, "The rank whose plan to show (ZeRO-1 shards differ by a few elements)")
      ->capture_default_str();
  auto hf = std::make_shared<HfStackFlags>();
  app->add_option("--stack", hf->stack,
                  "Whose training step to plan: scalelab (this engine) | hf-trainer (PyTorch + transformers' Trainer, "
                  "predicted: docs/predict.md)")
      ->capture_default_str();
  app->add_option("--torch-version", hf->torch_version,
                  "hf-trainer: the torch release modelled: 2.4 to 2.11 (2.4 to 2.8 checked against CPU traces "
                  "only; with transformers 5.17 2.5 to 2.8 for eager attention); a full version such as 2.11.0+cu130 is read as its "
                  "major.minor; auto: the one PYTHON, default python3, imports")
      ->capture_default_str();
  app->add_option("--transformers-version", hf->transformers_version,
                  "hf-trainer: the transformers release modelled: 5.17 (5.0 to 5.24 take its schedule), 4.49 to 4.57 (Llama, Qwen2, OPT with fp32 weights; eager, sdpa in bf16 for Llama and Qwen2, and in fp32 from 4.54; checkpointing with eager), or 4.43 to 4.48 (Llama, Qwen2 from 4.45, OPT with fp32 weights; eager attention; "
                  "checked against CPU traces; 4.45 and 4.55 also measured on an H200); a full version such as 4.45.2 is read as its major.minor; "
                  "auto: the one PYTHON, default python3, imports")
      ->capture_default_str();
  app->add_option("--optim", hf->optim, "hf-trainer: adamw_torch (foreach) | adamw_torch_fused")->capture_default_str();
  app->add_option("--cuda-context", hf->cuda_context,
                  "hf-trainer: device memory outside PyTorch's allocator (CUDA context, kernels), subtracted from "
                  "--device-memory (default: 518 MiB, measured with torch 2.11+cu130 on an H200)");
  app->add_option("--alloc-conf", hf->alloc_conf,
                  "hf-trainer: PYTORCH_CUDA_ALLOC_CONF (expandable_segments, max_split_size_mb, ...)");
  app->add_option("--schedule-out", hf->schedule_out,
                  "hf-trainer: write the predicted allocation schedule (one line per request and free) to this file");
  app->add_option("--ranks", hf->ranks,
                  "hf-trainer: torchrun DDP ranks, one GPU each (> 1: the per-rank prediction with DDP's buckets)")
      ->capture_default_str();
  app->add_option("--launcher", hf->launcher,
                  "hf-trainer: how the training starts: python (one process) | torchrun (accelerate then wraps the "
                  "model in DDP even for one process: its gradient buckets count; --ranks > 1 implies it)")
      ->capture_default_str();
  app->add_option("--ddp-bucket-cap-mb", hf->ddp_bucket_cap_mb,
                  "hf-trainer with --ranks: TrainingArguments.ddp_bucket_cap_mb (default: DDP's 25 MiB, first "
                  "bucket 1 MiB)");
  app->add_option("--nccl-memory", hf->nccl_memory,
                  "hf-trainer with --ranks or --launcher torchrun: device memory NCCL takes outside PyTorch's allocator, subtracted from "
                  "--device-memory like the CUDA context (default 0: not known here; measure it)");
  app->add_option("--steps", hf->steps, "hf-trainer: optimizer steps replayed (the peak is over them)")
      ->capture_default_str();
  return {app, [opts, world, rank, hf, app] {
            const TrainOptions& o = *opts;
            if (hf->stack == "hf-trainer") return run_hf_plan(o, *hf, *world, *app);
            if (hf->stack != "scalelab")
              throw InvalidInput("[plan] --stack " + hf->stack + " is not supported — supported: scalelab, hf-trainer");
            for (const char* flag : {"--torch-version", "--transformers-version", "--optim", "--cuda-context",
                                     "--alloc-conf", "--steps", "--schedule-out", "--ranks", "--launcher"}) {
              if (app->count(flag) > 0)
                throw InvalidInput(std::string("[plan] ") + flag +
                                   " belongs to --stack hf-trainer — add it, or drop the flag for this engine's plan");
            }
            validate_train_options(o);
            if (*world < 1 || *rank < 0 || *rank >= *world)
              throw InvalidInput("[plan] --rank " + std::to_string(*rank) + " is not in [0, --world-size " +
                                 std::to_string(*world) + ")");
            o.dist.data_parallel_options();  // checks --zero
            PlanInput in = make_plan_input(o);
            in.world_size = *world;
            in.rank = *rank;
            in.zero_stage = o.dist.zero;
            const MemoryPlan plan = plan_memory(in);
            std::printf("Memory plan: %s, micro-batch %lld, seq-len %lld%s\n", in.config.name.c_str(),
                        static_cast<long long>(o.micro_batch_size), static_cast<long long>(o.seq_len),
                        o.dpo.enabled ? (in.lora.enabled() ? ", DPO (reference: the adapters off)"
                                                           : ", DPO (reference: a frozen copy)")
                                      : "");
            if (plan.frozen_params > 0) {
              const std::string why = o.lora_rank > 0 ? "the LoRA base (--lora-rank " + std::to_string(o.lora_rank) + ")"
                                                      : "--freeze '" + o.freeze + "'";
              std::printf("Parameters: %lld (%lld trainable, %lld frozen by %s)\n", static_cast<long long>(plan.params),
                          static_cast<long long>(plan.trainable_params), static_cast<long long>(plan.frozen_params),
                          why.c_str());
            }
            std::printf("%s", plan.to_table().c_str());
            if (!o.json.empty()) {
              write_json_file(o.json, plan.to_json());
              std::printf("Plan: %s\n", o.json.c_str());
            }
            return 0;
          }};
}

}  // namespace scalelab::cli
