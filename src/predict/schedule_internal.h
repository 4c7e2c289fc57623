#pragma once
// Internals shared by the hf-trainer schedule's files (hf_schedule.cpp: the step around the model,
// the loss, the optimizer; hf_schedule_llama.cpp, hf_schedule_opt.cpp: the families). Not an API.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "predict/hf_schedule.h"

namespace scalelab::predict::detail {

using u64 = std::uint64_t;
constexpr u64 kCublasWorkspace = u64{32} << 20;  // sm90: CUBLAS_WORKSPACE_CONFIG :4096:8 (torch 2.11)

class Tape {
 public:
  explicit Tape(std::vector<ScheduleEvent>& ev) : ev_(ev) {}
  std::uint32_t alloc(u64 bytes, Category c, const char* label) {
    ScheduleEvent e;
    e.kind = ScheduleEvent::kAlloc;
    e.tensor = next_++;
    e.bytes = bytes;
    e.category = c;
    e.label = label;
    ev_.push_back(e);
    return e.tensor;
  }
  void free(std::uint32_t& t) {
    if (t == 0) return;
    ScheduleEvent e;
    e.kind = ScheduleEvent::kFree;
    e.tensor = t;
    ev_.push_back(e);
    t = 0;
  }
  void phase(const char* name) {
    ScheduleEvent e;
    e.kind = ScheduleEvent::kPhase;
    e.label = name;
    ev_.push_back(e);
  }

 private:
  std::vector<ScheduleEvent>& ev_;
  std::uint32_t next_ = 1;

 public:
  std::uint32_t now() const { return next_; }  // a clock: the id the next allocation gets
};

using Id = std::uint32_t;
constexpr auto A = Category::kActivations;
constexpr auto Tmp = Category::kTemporaries;

struct Dims {
  u64 B, T, H, I, nh, nkv, hd, qd, kvd, V, L, BT;
  u64 e_w;      // parameter bytes (4 fp32, 2 bf16)
  u64 e_c;      // matmul compute bytes (2 under autocast or bf16 weights)
  u64 e_r;      // residual stream bytes (fp32 weights: 4, also under autocast)
  u64 e_rope;   // q*cos result: the promotion of q's and cos's dtypes
  bool autocast;  // fp32 weights with bf16/fp16 autocast: weight-cast cache, input casts
  // bf16 weights under autocast (Trainer bf16=True over model.to(bfloat16)): nn.LayerNorm is on
  // autocast's fp32 list, so OPT's layer norms cast their bf16 input, weight and bias to fp32 (saved)
  // and return fp32, which each following linear casts back to bf16 (saved): see hf_schedule_opt.cpp
  bool ln_upcast = false;
  bool head_in_fp32 = false;  // the LM head's input is fp32 (OPT's final LayerNorm under ln_upcast)
  bool mixed;     // Trainer bf16=/fp16= (accelerate's convert_outputs_to_fp32)
  bool grad_scaler = false;  // fp16=: accelerate's torch.amp.GradScaler (see begin_backward)
  bool eager;
  bool dropout = false;  // OPT residual dropout (config "dropout" > 0)
  bool liger = false;    // --fused-kernels: Liger's RMSNorm, RoPE, SwiGLU, fused linear cross-entropy
  bool qkv_bias = false; // Qwen2: q_proj, k_proj, v_proj have biases (addmm; their gradients)
  bool qwen2 = false;    // the Qwen2 family (where its code's order differs from Llama's)
  bool opt = false;      // the OPT family (its 4.4x loss: see head_forward_tf4x)
  // DDP (--ranks > 1): see hf_schedule_ddp.cpp
  bool ddp = false;
  bool ddp_find_unused = false;  // the Trainer: not gradient checkpointing
  bool ckpt = false;             // gradient checkpointing (saved tensors come back unpacked)
  bool ddp_first_bucket = true;  // a 1 MiB first bucket (bucket_cap_mb left at DDP's default)
  u64 ddp_bucket_cap = u64{25} << 20;
  // transformers 4.43 to 4.48 (--transformers-version; Llama, eager, no checkpointing): the causal
  // mask is a [T, T+1] float expanded over the batch, the loss copies the shifted logits, and from
  // 4.45 the forward fills a DynamicCache with every layer's rotated key and value (held until
  // compute_loss returns; hf_schedule.cpp head_forward_tf4x).
  bool tf4x = false;
  bool cpu_kernels = false;  // HfJob::cpu_kernels
  bool cache_cat = false;    // transformers 4.56, 4.57: the training cache holds torch.cat copies of k and v
                             // (under autocast over fp32 weights an fp32 value: layer_forward)
  u64 tf4_minor = 0;  // 43 to 48 under tf4x (the cache from 45, the loss's scalars and upcast from 46)
  // 4.43 to 4.47 (not 4.48): the eager attention inline in LlamaAttention.forward, q/k/v viewed
  // only after all three projections, and every LlamaAttention with its own rotary embedding.
  // 4.48 has 5.17's attention (eager_attention_forward, each projection viewed as it is made).
  bool inline_attn = false;
  // torch 2.4 to 2.8 (records_full_slices): each full slice `[:]` of a tensor that needs a gradient
  // is a node whose backward makes a zero-filled copy of the gradient (2.9 to 2.11 record none). The
  // model's full slices: `logits[..., :-1, :]`'s last `:` (4.4x), the final norm's output before the
  // lm_head (4.45 to 4.48's num_logits_to_keep, 5.17's logits_to_keep) and repeat_kv's
  // `[:, :, None, :, :]` (eager).
  bool slice_copies = false;
  // transformers 4.45 to 4.55: the training forward's DynamicCache holds each layer's rotated key
  // and value until compute_loss returns (4.45-4.48: head_forward_tf4x; 4.49-4.55: head_forward)
  bool train_cache = false;
  u64 late4_minor = 0;        // 49 to 55 for transformers 4.49 to 4.55 (else 0)
  // the rotary embedding computes cos() and sin() both, then each times attention_scaling (4.43 to
  // 4.50; from 4.51 each is scaled as it is made, as in 5.x)
  bool rope_both_first = false;
  // OPT under transformers 4.49 to 4.55, 5.0 and 5.1: its 4-D mask made as Llama's 4.4x one, a
  // [T, T] triu expanded and cloned over the batch, then the padding's masked_fill (hf_schedule_opt.cpp)
  bool opt_mask_4x = false;
  // OPT under 4.49 to 4.51: its attention is inline again, without eager_attention_forward's
  // `* scaling` (1.0) of the scores (their CPU traces)
  bool opt_unscaled = false;
  // OPT under 4.49 to 4.53: the forward returns its cache as a legacy tuple (accelerate's fp32
  // conversion enters it under mixed precision: head_forward)
  bool opt_cache_tuple = false;
  // 4.54 and 4.55 with sdpa: query/key/value .contiguous() copies for the kernel, the output's copy
  // for o_proj (hf_schedule_llama.cpp)
  bool sdpa_copies = false;
  // 4.49 to 4.53 with sdpa: k and v repeated for the kernel (repeat_kv), q made contiguous, the
  // output's copy for o_proj; in backward the repeat sums and v's gradient made contiguous
  bool sdpa_repeat = false;
  bool cache_layers = false;  // 4.54 and 4.55: a DynamicLayer per layer, freed last layer first, key then value
  // the 4.4x causal mask, [T, T+1] in the embeddings' dtype (4.43 to 4.52)
  bool mask_t1 = false;
  // the rotary embedding's original_inv_freq is an attribute aliasing inv_freq, not a buffer of its
  // own (up to 4.57; 5.x registers a buffer)
  bool inv_freq_alias = false;
};

// One parameter: its tensor ids across steps.
struct Param {
  u64 bytes = 0;
  Id weight = 0, grad = 0, exp_avg = 0, exp_avg_sq = 0;
  const char* name = "";
  std::uint32_t ready = 0;  // when its gradient was last accumulated (DDP's bucket rebuild order)
  // A tied embedding: the LM head's gradient, waiting in AccumulateGrad's InputBuffer for the
  // lookup's (head_gradient, accumulate_tied), and whether the buffer may add into it in place.
  Id tied_first = 0;
  bool tied_first_inplace = false;
};

struct LayerParams {
  Param q, k, v, o, gate, up, down, ln1, ln2;
  Param qb, kb, vb;  // Qwen2's q/k/v biases (bytes 0 for Llama)
};

struct Model {
  Param embed;
  std::vector<LayerParams> layers;
  Param norm;
  Param lm_head;  // untied only
  bool tied = true;
  Id inv_freq = 0, inv_freq_orig = 0;
  Id ws_main = 0, ws_autograd = 0;
  Id ws_lt = 0;  // cuBLASLt's workspace for addmm with a bias (see lt_workspace)
  Id ws_lt_autograd = 0;  // the autograd thread's (a checkpoint recompute's addmm with a bias)
  // A checkpoint recompute runs the layer's forward on the autograd thread: its GEMMs take that
  // thread's cuBLAS (and cuBLASLt) workspaces, which its first addmm makes after its output (the
  // H200 trace of Qwen2 + Liger + checkpointing). Swaps the two threads' workspaces in and out.
  void swap_thread_workspaces() {
    std::swap(ws_main, ws_autograd);
    std::swap(ws_lt, ws_lt_autograd);
  }
  // Autocast's casts of the q/k/v biases: cached, not saved by addmm, so they go when autocast's
  // cache is cleared (the forward's autocast exits; a checkpoint recompute's exits).
  std::vector<Id> bias_casts;
  // transformers 4.45: the DynamicCache's tensors, each layer's rotated key then its value, with
  // their element sizes (Dims::tf4x)
  std::vector<std::pair<Id, u64>> kv_cache;
  u64 buffer_bytes = 0;  // the module's buffers (Llama/Qwen2: rotary inv_freq, original_inv_freq)
  u64 buffer_count = 0;  // how many tensors they are (DDP broadcasts a single one in place)
  std::vector<Id> ddp_buckets;
  Id ddp_used_map = 0;
  bool ddp_rebuild = false;  // rebuild the buckets before the next forward
  // Gradient accumulation: the Trainer runs every micro-step but a step's last under no_sync
  // (require_backward_grad_sync False). ddp_sync: this micro-step synchronizes;
  // ddp_forward_param_sync: DDP's require_forward_param_sync, which the last forward left (its
  // buffers are broadcast before a forward only when the one before synchronized).
  bool ddp_sync = true;
  bool ddp_forward_param_sync = true;
  std::vector<Param*> order;  // module order: the optimizer's and zero_grad's
  // OPT
  struct OptLayer {
    Param k, kb, v, vb, q, qb, o, ob, ln1w, ln1b, fc1, fc1b, fc2, fc2b, ln2w, ln2b;
  };
  std::vector<OptLayer> opt_layers;
  Param pos, flnw, flnb;
  bool opt = false;
  bool final_ln = true;
  // fp16 autocast's GradScaler (torch/amp/grad_scaler.py): its 0-d fp32 scale and int32 growth
  // tracker (made at the first scale(), kept), the scaled loss backward runs on (until backward
  // returns), found_inf (unscale_ to update()).
  Id scaler_scale = 0, scaler_growth = 0, scaled_loss = 0, found_inf = 0;
  Id backward_seed = 0;  // 4.50 to 4.56: a 0-d tensor the backward makes at its start and keeps to its end
  // The Trainer's training loop keeps the last micro-step's loss (tr_loss_step, a 0-d tensor) until
  // the next training_step returns, and the last clip's total norm (grad_norm, for logging) until
  // the next clipping starts (the H200 traces): handed from the head / clip_grad_norm to the driver.
  Id kept_loss = 0, kept_grad_norm = 0;
};

// The cuBLAS workspace of the calling thread, allocated through the caching allocator at its
// first GEMM and kept for the process's life.
inline void gemm_workspace(Tape& t, Id& ws) {
  if (ws == 0) ws = t.alloc(kCublasWorkspace, Category::kWorkspace, "cuBLAS workspace");
}

// A Linear with a bias runs as addmm with the bias in cuBLASLt's epilogue (at::cuda::blas::
// gemm_and_bias), whose workspace the caching allocator hands out at the first such call and the
// process keeps: CUBLASLT_WORKSPACE_SIZE, 1 MiB by default (getCUDABlasLtWorkspace, keyed by the
// handle and stream: the forward's thread only, the backward's matmuls are plain mm).
inline void lt_workspace(Tape& t, Id& ws) {
  if (ws == 0) ws = t.alloc(u64{1} << 20, Category::kWorkspace, "cuBLASLt workspace (addmm with bias)");
}

// The global-memory buffers of PyTorch's CUDA reduction (ATen/native/cuda/Reduce.cuh,
// setReduceConfig) for a sum over the rows of a contiguous [rows, cols] tensor into [cols] with a
// 4-byte accumulator: a bias's gradient (sum_to after addmm's backward), a norm weight's
// (sum over batch and time of g*h). The rows are not the fastest-moving dimension, so block.x
// runs along the outputs, 4 outputs per thread (output_vec_size: cols a multiple of 4, aligned)
// and at most 512 / 4 threads per block; when each thread would still sum >= 256 values after the
// warps split the rows, the rows are split over ctas_per_output blocks too, which exchange partial
// sums through a staging buffer of 4 * cols * ctas * block.x * 4 bytes and one int semaphore per
// block column. Both are taken from the caching allocator and given back right after the kernel.
// `sms`: the multiprocessor count (132 on the H100 SXM and the H200; the grid targets 2048
// threads per SM). Read off the source of torch 2.11 and checked against the H200 traces of OPT's
// bias gradients (fc2: 64 MiB, fc1: 132 MiB at 4096 rows) and Llama's norm weights.
struct ReduceBuffers {
  u64 staging = 0;
  u64 semaphores = 0;
};
inline ReduceBuffers row_sum_buffers(u64 rows, u64 cols, u64 sms = 132) {
  ReduceBuffers r;
  if (rows == 0 || cols == 0) return r;
  u64 vec = 4;
  while (vec > 1 && cols % vec != 0) vec /= 2;
  const u64 max_threads = 512 / vec;
  auto last_pow2 = [](u64 n) {
    u64 p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
  };
  auto cap = [&](u64 n) { return n < max_threads ? last_pow2(n) : max_threads; };
  const u64 d0 = cap(cols / vec), d1 = cap(rows);
  u64 bw = std::min<u64>(d0, 32);
  const u64 bh = std::min<u64>(d1, max_threads / bw);
  bw = std::min<u64>(d0, max_threads / bh);
  const u64 threads = bw * bh;
  u64 step_out = bw, step_in = 1;
  const bool split_rows = rows >= std::min<u64>(bh * 16, 256);
  if (split_rows) {
    step_in = bh;
  } else {
    step_out *= bh;
  }
  const u64 per_thread = (rows + step_in - 1) / step_in;
  const u64 grid_x = (cols / vec + step_out - 1) / step_out;
  const u64 target = sms * (2048 / threads);
  if (!split_rows || per_thread < 256 || grid_x > target) return r;
  const u64 c1 = (target + grid_x - 1) / grid_x, c2 = (per_thread + 15) / 16, c3 = (per_thread + 255) / 256;
  const u64 ctas = std::max(std::min(c1, c2), c3);
  if (ctas <= 1) return r;
  r.staging = 4 * cols * ctas * bw * vec;
  r.semaphores = 4 * grid_x;
  return r;
}

// That reduction's buffers through the allocator: taken and given back (the staging first, the
// semaphores after it, freed in reverse).
inline void row_sum_scratch(Tape& t, u64 rows, u64 cols, const char* label) {
  const ReduceBuffers r = row_sum_buffers(rows, cols);
  if (r.staging == 0) return;
  Id st = t.alloc(r.staging, Category::kTemporaries, label);
  Id se = t.alloc(r.semaphores, Category::kTemporaries, "reduction semaphores");
  t.free(se);
  t.free(st);
}

// AccumulateGrad: the first gradient of a parameter becomes its .grad (stolen, no copy); a later
// one is added in place and freed.
inline void accumulate(Tape& t, Param& p, Id& g) {
  p.ready = t.now();
  if (p.grad == 0) {
    p.grad = g;
    g = 0;
  } else {
    t.free(g);
  }
}

// The LM head's weight gradient. Untied, it goes to AccumulateGrad at once. Tied, the weight is
// the embedding's, whose AccumulateGrad runs only when the lookup's gradient has come too (the end
// of backward): until then the head's gradient waits in the node's InputBuffer, which then sums
// the two (torch/csrc/autograd/input_buffer.cpp accumulate: in place into the first when nothing
// else references it and it is dense, else `old + new` out of place). `inplace`: the gradient is a
// tensor of its own (autocast's cast back to fp32, Liger's fused loss returning the grad_weight it
// computed in the forward); linear's own weight gradient (no cast in between) is summed out of
// place: the H200 traces show it (fp32 micro-batch 1, bf16 micro-batch 6: a new [V, H] gradient
// after the lookup's, then both inputs freed; bf16 autocast micro-batch 6: none).
inline void head_gradient(Tape& t, const Model& m, Param& head, Id& g, bool inplace) {
  if (!m.tied) return accumulate(t, head, g);
  head.tied_first = g;
  head.tied_first_inplace = inplace;
  g = 0;
}

// The embedding lookup's gradient: summed with the LM head's waiting one (head_gradient), then
// AccumulateGrad.
inline void accumulate_tied(Tape& t, Param& p, Id& g) {
  if (p.tied_first != 0) {
    if (p.tied_first_inplace) {
      t.free(g);  // added into the head's gradient
      g = p.tied_first;
    } else {
      Id sum = t.alloc(p.bytes, Category::kGradients, "tied embedding grad: the LM head's + the lookup's");
      t.free(p.tied_first);
      t.free(g);
      g = sum;
    }
    p.tied_first = 0;
  }
  accumulate(t, p, g);
}

// CUDA's embedding_dense_backward (aten/src/ATen/native/cuda/Embedding.cu): up to 3072 indices
// (and no scale_grad_by_freq) a direct kernel writes the zeroed [V, H] gradient with no other
// buffer; above that the sort-based path sorts the int64 indices with their positions first. The
// H200 traces show both: none at B·T = 1024 (fp32 micro-batch 1), the two sort buffers at 6144.
inline void embedding_backward_sort_buffers(Tape& t, u64 indices, Id& sorted, Id& orig) {
  if (indices <= 3072) return;
  sorted = t.alloc(indices * 8, Tmp, "embedding backward sorted indices");
  orig = t.alloc(indices * 8, Tmp, "embedding backward original indices");
}

Dims dims_of(const HfJob& j);
void add_param(Model& m, Param& p, u64 bytes, const char* name);

// The LM head and ForCausalLMLoss, shared by the families: lm_head on the last hidden states
// (logits_to_keep = 0: all positions); the loss: logits.float() (a copy unless fp32), labels
// padded and shifted (no logits copy), cross_entropy = log_softmax (saved, fp32) + nll_loss; the
// autocast cache goes when the forward returns; accelerate's convert_outputs_to_fp32 under mixed
// precision; compute_loss returns and the outputs go. Ends at the backward marker.
struct Head {
  Id wl = 0, inl = 0, shift = 0, ls = 0;
  Id ls32 = 0;  // OPT under transformers 4.4x and CUDA autocast: nll_loss's fp32 cast of the log-probs (saved)
  Id scalars[5] = {};
};
Head head_forward(Tape& t, const Dims& d, Model& m, std::vector<Id>& cached_casts, Id& final_out);
// The backward marker; under fp16 the GradScaler's scale() and the scaled loss's first backward node
// (accelerate: `scaler.scale(loss).backward()`).
void begin_backward(Tape& t, const Dims& d, Model& m);
// Its backward down to the gradient of the final norm's output.
Id head_backward(Tape& t, const Dims& d, Model& m, Param& head, Head& h, Id& final_out);
// torch 2.4 to 2.8 (d.slice_copies): the backward of `slices` chained full slices of a tensor of `bytes`, from
// the last: each a zero-filled copy of the gradient `g`, which then goes (alloc before free, as the
// CPU traces show). `g` becomes the last copy.
void full_slices_backward(Tape& t, Id& g, u64 bytes, int slices, const char* label);
// eager_attention_forward from the scores to the fp32 softmax (Llama, Qwen2, OPT): `* scaling`
// (`scale_label`; none when `unscaled`: OPT under 4.49 to 4.51), + the causal mask, softmax in fp32
// (saved: `probs32`). Returns the masked scores, which go when attn_weights is rebound.
Id eager_scores_to_softmax(Tape& t, const Dims& d, Id scores, Id& probs32, const char* scale_label,
                           bool unscaled = false);

// The families (hf_schedule_llama.cpp, hf_schedule_opt.cpp): the model's move to the GPU, and
// one micro-step's forward and backward.
// Llama and Qwen2 (d.qkv_bias: the q/k/v biases).
void load_llama(Tape& t, Model& m, const Dims& d, bool tied);
void llama_forward_backward(Tape& t, const Dims& d, const HfJob& j, Model& m);
void load_opt(Tape& t, Model& m, const Dims& d, const ModelConfig& c);
void opt_forward_backward(Tape& t, const Dims& d, const HfJob& j, Model& m);

// DDP (hf_schedule_ddp.cpp): what DistributedDataParallel allocates when the Trainer wraps the
// model, and before each forward (bucket rebuild, buffer broadcast).
void ddp_construct(Tape& t, Model& m, const Dims& d);
void ddp_pre_forward(Tape& t, Model& m, const Dims& d);

}  // namespace scalelab::predict::detail
