#pragma once
// The device allocation schedule of a Hugging Face Trainer training step: every cudaMalloc-level
// request (through PyTorch's caching allocator) and free that one step makes, in order, with its
// size and purpose, generated from the model config and the Trainer arguments. Replayed through
// the allocator replica (predict/caching_allocator.h) it gives torch.cuda.max_memory_allocated
// and max_memory_reserved (predict/hf_predict.h).
//
// What is modelled (docs/predict.md has the list and the sources): the versions in
// kModelledVersions; Llama and Qwen2 (transformers' LlamaForCausalLM / Qwen2ForCausalLM: the
// q/k/v biases), OPT, torchrun DDP per rank (hf_schedule_ddp.cpp); Llama (eager / sdpa attention, fp32 weights
// with or without bf16/fp16 autocast, full bf16), the Trainer step (model moved to the GPU,
// forward under autocast with the weight-cast cache, ForCausalLMLoss with the fp32 upcast of
// logits, accelerate's convert_outputs_to_fp32 under mixed precision, backward in reverse layer
// order with per-op gradient temporaries, clip_grad_norm_ with foreach norms, AdamW foreach with
// states created lazily on step 1 and the sqrt temporaries, zero_grad(set_to_none=True)), and the
// cuBLAS workspaces (one per thread that runs GEMMs: the main thread and autograd's device thread).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "predict/caching_allocator.h"

namespace scalelab::predict {

// The versions whose code the schedule follows.
struct StackVersions {
  std::string torch = "2.11";
  std::string transformers = "5.17";
};
inline const char* kSupportedStacks = "hf-trainer";
inline const char* kSupportedTorch = "2.11";  // the default
// The torch releases modelled, 2.4 to 2.11, in two groups by their CPU traces of the real Trainer
// (tools/predict/trace_hf.py; docs/predict.md "torch releases"): 2.4 to 2.8 record a SliceBackward
// node for every full slice `[:]` of a tensor that needs a gradient, whose backward copies the
// gradient into a new zero-filled tensor; 2.9 to 2.11 record none (or an alias). Within a group the
// traces are the same, event for event above 4 KiB (CPU kernels' scratch aside).
inline const char* kSupportedTorchList = "2.4 to 2.11";
inline const char* kOlderTorch = "2.4";  // the older group's first, traced most (the published point's)
// 2.4 -> 4, ..., 2.11 -> 11; -1 for anything else
inline int torch_minor(const std::string& v) {
  if (v.size() < 3 || v.compare(0, 2, "2.") != 0) return -1;
  int n = 0;
  for (std::size_t i = 2; i < v.size(); ++i) {
    if (v[i] < '0' || v[i] > '9' || i > 3) return -1;
    n = n * 10 + (v[i] - '0');
  }
  return n >= 4 && n <= 11 ? n : -1;
}
inline bool records_full_slices(const std::string& torch) { return torch_minor(torch) >= 4 && torch_minor(torch) <= 8; }
inline const char* kSupportedTransformers = "5.17";
// Older releases, modelled for Llama with eager attention (the published point's era; docs/predict.md):
// 4.43 to 4.48 copy the shifted logits; 4.45 to 4.48 also fill a DynamicCache in training; 4.48 has
// 5.17's attention code. One schedule for the six (their CPU traces agree with it alike), with each
// one's differences.
inline const char* kOlderTransformers = "4.45";
inline const char* kOlderTransformersList = "4.43, 4.44, 4.45, 4.46, 4.47, 4.48";
// The release a version string names, as the schedule follows it: its major.minor ("4.45.2" →
// "4.45", "2.11.0+cu130" → "2.11", "2.4.0a0+3bcc3cd" → "2.4"); a string that does not start with
// two numbers comes back unchanged (and is then refused by validate_job, naming the supported ones).
std::string release_of(const std::string& version);
inline bool is_older_transformers(const std::string& v) {
  return v == "4.43" || v == "4.44" || v == "4.45" || v == "4.46" || v == "4.47" || v == "4.48";
}
// The 5.x releases that take 5.17's schedule as they are: their CPU traces of the real Trainer
// (tools/predict/trace_hf.py, every configuration traced for 5.17) equal 5.17's event for event
// above 4 KiB (5.0, 5.1, 5.2, 5.5, 5.8, 5.12, 5.16, 5.18, 5.22 and 5.24 traced whole; 5.3, 5.4, 5.6
// and 5.7 for Llama and OPT), except OPT under 5.0 and 5.1, which build its 4-D mask with more
// temporaries (refused). 5.24 is the newest on PyPI as of 2026-11-27.
inline const char* kCurrentTransformersList = "5.0 to 5.24";
// 5.0 -> 0, ..., 5.24 -> 24; -1 for anything else
inline int transformers5_minor(const std::string& v) {
  if (v.size() < 3 || v.compare(0, 2, "5.") != 0 || v.size() > 4) return -1;
  int n = 0;
  for (std::size_t i = 2; i < v.size(); ++i) {
    if (v[i] < '0' || v[i] > '9') return -1;
    n = n * 10 + (v[i] - '0');
  }
  return n <= 24 ? n : -1;
}
inline bool is_current_transformers(const std::string& v) { return transformers5_minor(v) >= 0; }
// 4.49 to 4.55, Llama and Qwen2 (OPT with fp32 weights) with eager attention (no checkpointing, no Liger): 5.17's schedule
// with what their CPU traces add (docs/predict.md "Versions modelled"): the training forward fills
// a DynamicCache with every layer's rotated key and value, held until compute_loss returns (freed
// after the logits: to 4.53 keys then values, as 4.48's; from 4.54 layer by layer), and 4.49 to 4.52
// build the 4.4x [T, T+1] mask. 4.56 and 4.57 update the cache by torch.cat, so it holds copies
// of the rotated key and the value (fp32 under autocast over fp32 weights; Llama and Qwen2), and
// their sdpa makes no copies.
inline const char* kLate4TransformersList = "4.49 to 4.57";
inline int late4_minor(const std::string& v) {
  if (v.size() != 4 || v.compare(0, 2, "4.") != 0 || v[2] < '0' || v[2] > '9' || v[3] < '0' || v[3] > '9') return -1;
  const int n = (v[2] - '0') * 10 + (v[3] - '0');
  return n >= 49 && n <= 57 ? n : -1;
}
inline bool is_late4_transformers(const std::string& v) { return late4_minor(v) >= 0; }

enum class Category : int {
  kWeights = 0,
  kGradients,
  kOptimizerStates,
  kAutocastCache,
  kActivations,    // saved for backward
  kLogitsLoss,     // logits, their fp32 copies, log-softmax and its gradients
  kTemporaries,    // per-op forward/backward temporaries and activation gradients
  kOptimizerTemporaries,  // foreach norms, AdamW's sqrt buffers
  kWorkspace,      // cuBLAS workspaces
  kInputs,         // the batch, masks, rotary tables
  kDdp,            // DDP: gradient buckets, the broadcast flat buffers, the used-parameter map
  kCount
};
const char* category_name(Category c);
inline constexpr int kNumCategories = static_cast<int>(Category::kCount);

struct ScheduleEvent {
  enum Kind : std::uint8_t { kAlloc, kFree, kPhase } kind = kAlloc;
  std::uint32_t tensor = 0;  // alloc/free: the tensor's id
  std::size_t bytes = 0;     // alloc: requested bytes
  Category category = Category::kTemporaries;
  const char* label = "";    // alloc: what it is; phase: the phase's name
};

// The Trainer arguments and switches the prediction depends on.
struct HfJob {
  ModelConfig model;
  std::int64_t seq_len = 1024;
  std::int64_t micro_batch = 1;
  std::string model_precision = "fp32";  // fp32 | bf16 (torch_dtype the model is loaded in)
  std::string mixed_precision = "no";    // no | bf16 | fp16 (Trainer bf16= / fp16=)
  std::string attn = "eager";            // eager | sdpa
  bool fused_kernels = false;            // Liger 0.8.5 (Llama, Qwen2; not OPT)
  bool activation_checkpointing = false;
  std::int64_t grad_accum_steps = 1;
  std::string optimizer = "adamw_torch";  // adamw_torch (foreach) | adamw_torch_fused
  double max_grad_norm = 1.0;             // > 0: clip_grad_norm_ runs
  std::int64_t steps = 3;                 // optimizer steps replayed (the peak is over them)
  std::int64_t ranks = 1;                 // torchrun DDP ranks (one GPU each); > 1: DDP's memory per rank
  // How the job is started: "python" (one process) or "torchrun". Under torchrun accelerate sees
  // LOCAL_RANK and wraps the model in DistributedDataParallel even for one process (accelerate's
  // PartialState._prepare_backend: MULTI_GPU whenever LOCAL_RANK is set), so a single-GPU torchrun
  // job carries DDP's buckets like one rank of many. --ranks > 1 implies torchrun.
  std::string launcher = "python";
  bool ddp() const { return ranks > 1 || launcher == "torchrun"; }
  std::int64_t ddp_bucket_cap_mb = 0;     // TrainingArguments.ddp_bucket_cap_mb; 0: DDP's default (25, first 1 MiB)
  StackVersions versions;
  // Model the CPU kernels where they allocate otherwise than CUDA's, for the tests that compare the
  // schedule with CPU traces of the real Trainer (tests/predict/cpu_trace_test.cpp); never set by
  // `plan`. So far OPT under transformers 4.43 to 4.47: CPU autocast casts cross_entropy's input to
  // fp32 before log_softmax (CUDA runs log_softmax in the compute dtype and nll_loss casts its
  // output), and the CPU softmax backward makes no grad*out transient.
  bool cpu_kernels = false;
};

// Checks what the schedule models; throws InvalidInput naming the flag and what is supported.
void validate_job(const HfJob& job);

// The events of model load (the Trainer's move to the GPU) and `job.steps` optimizer steps.
std::vector<ScheduleEvent> hf_trainer_schedule(const HfJob& job);

}  // namespace scalelab::predict
