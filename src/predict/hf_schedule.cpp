// The HF Trainer step schedule around the model (torch 2.11, transformers 5.17, accelerate): the
// versions checked, the LM head and loss, gradient clipping, AdamW, zero_grad; the families are in
// hf_schedule_llama.cpp and hf_schedule_opt.cpp.
//
// Written op by op after transformers' modeling_llama.py / masking_utils.py / loss_utils.py,
// torch.optim.adamw's foreach path and torch.nn.utils.clip_grad_norm_, and checked against the
// caching allocator's event history of the real job on an H200 (bench/gpu/hf_memory.py --trace;
// the committed traces in bench/gpu/results/2026-11-26-h200-hf-memory/). Each comment names the
// Python expression an allocation comes from. Sizes are the requests (before the allocator's
// rounding). "Saved" tensors are those autograd keeps for backward; everything else is freed when
// the Python name holding it is rebound or goes out of scope, which the order below follows.
#include "predict/hf_schedule.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "predict/schedule_internal.h"

namespace scalelab::predict {

const char* category_name(Category c) {
  switch (c) {
    case Category::kWeights: return "weights";
    case Category::kGradients: return "gradients";
    case Category::kOptimizerStates: return "optimizer_states";
    case Category::kAutocastCache: return "autocast_weight_cache";
    case Category::kActivations: return "saved_activations";
    case Category::kLogitsLoss: return "logits_loss";
    case Category::kTemporaries: return "temporaries";
    case Category::kOptimizerTemporaries: return "optimizer_temporaries";
    case Category::kWorkspace: return "cublas_workspace";
    case Category::kInputs: return "inputs_masks_rope";
    case Category::kDdp: return "ddp";
    case Category::kCount: break;
  }
  return "?";
}

std::string release_of(const std::string& version) {
  std::size_t i = 0;
  auto digits = [&] {
    const std::size_t start = i;
    while (i < version.size() && version[i] >= '0' && version[i] <= '9') ++i;
    return i > start;
  };
  if (!digits() || i >= version.size() || version[i] != '.') return version;
  ++i;
  if (!digits()) return version;
  return version.substr(0, i);
}

void validate_job(const HfJob& j) {
  auto bad = [](const std::string& m) { throw InvalidInput("[plan --stack hf-trainer] " + m); };
  if (torch_minor(j.versions.torch) < 0)
    bad("--torch-version " + j.versions.torch + " is not modelled — supported: " + kSupportedTorchList + " (default " +
        kSupportedTorch + ")");
  if (records_full_slices(j.versions.torch) && !is_older_transformers(j.versions.transformers)) {
    // torch 2.4 to 2.8 with transformers 5.17 (which needs torch 2.5 or later): traced for eager
    // attention (Llama, Qwen2, OPT); sdpa's CPU path differs beyond the full-slice copies there
    const std::string why = "--torch-version " + j.versions.torch + " with transformers " + j.versions.transformers;
    if (j.versions.torch == "2.4") bad(why + ": transformers 5.17 needs torch 2.5 or later");
    if (j.attn != "eager") bad(why + " is modelled for eager attention only: use --attn eager");
    if (j.fused_kernels) bad(why + " is modelled without --fused-kernels (Liger) only");
  }
  if (!is_current_transformers(j.versions.transformers) && !is_older_transformers(j.versions.transformers) &&
      !is_late4_transformers(j.versions.transformers))
    bad("--transformers-version " + j.versions.transformers + " is not modelled — supported: " +
        kSupportedTransformers + " (the default; " + kCurrentTransformersList + " take its schedule), " +
        kLate4TransformersList + " (Llama, Qwen2, OPT with fp32 weights; eager attention), " + kOlderTransformersList +
        " (Llama, Qwen2 from 4.45, OPT; eager attention)");
  if (is_late4_transformers(j.versions.transformers)) {
    // traced on the CPU under torch 2.11 (4.49.0 to 4.57.6); measured on an
    // H200 under 4.55.4 (Llama fp32 eager and bf16 sdpa, OPT fp32 eager: tests/golden/predict/*.tf4.55.events)
    const std::string why = "--transformers-version " + j.versions.transformers + " models ";
    if (j.model.family == ModelFamily::kOPT && late4_minor(j.versions.transformers) <= 53 && j.model_precision != "fp32")
      bad(why + "OPT under 4.49 to 4.53 with fp32 weights (with or without bf16 autocast) only (bf16 weights were "
                "not traced) — use --model-precision fp32");
    // fp32 sdpa: CUDA runs PyTorch's math path (no fp32 flash kernel; the memory-efficient one takes
    // no grouped heads, enable_gqa from 4.54 on), which allocates as eager (measured under 5.17 on
    // the H200; the CPU traces with the math path forced, tools/predict/trace_hf.py "-math", show the
    // same saved tensors under 5.17 and 4.54 to 4.57; 4.54's and 4.55's .contiguous() copies of q, k
    // and v are forward transients, gone as the attention returns, not modelled). 4.49 to 4.53
    // repeat k and v instead (no enable_gqa), which the memory-efficient kernel takes in fp32:
    // neither traceable on the CPU nor measured.
    if (j.attn != "eager" && j.model.family == ModelFamily::kOPT)
      bad(why + "sdpa for Llama and Qwen2 only (OPT's sdpa path was not traced) — use --attn eager");
    if (j.attn != "eager" && j.model_precision == "fp32" && j.mixed_precision == "no" &&
        late4_minor(j.versions.transformers) <= 53)
      bad(why + "sdpa in fp32 from 4.54 only: under 4.49 to 4.53 sdpa_attention_forward repeats k and v, and "
                "CUDA then runs its memory-efficient kernel in fp32, which is not modelled — use --attn eager, "
                "bf16, or --transformers-version 4.54 or later");
    if (j.activation_checkpointing && (j.attn != "eager" || j.model.family == ModelFamily::kOPT))
      bad(why + "runs --activation-checkpointing with eager attention, for Llama and Qwen2, only (sdpa's copies "
                "and OPT's mask under the recompute were not traced)");
    if (j.fused_kernels) bad(why + "runs without --fused-kernels (Liger) only");
    if (late4_minor(j.versions.transformers) >= 56) {
      // traced on the CPU under 4.56.2 and 4.57.6: Llama and Qwen2 in fp32, bf16 autocast and full bf16, eager;
      // Qwen2 with checkpointing (no cache then: 4.55's schedule) and with sdpa in bf16 (no copies: 5.17's path);
      // OPT eager in fp32 and bf16 autocast
      if (j.model_precision == "fp32" && j.mixed_precision != "no" && j.model.family != ModelFamily::kOPT &&
          j.model.num_attention_heads == j.model.num_key_value_heads)
        bad(why + "autocast over fp32 weights under 4.56 and 4.57 for grouped-query attention only (the "
                  "cache's fp32 value was traced through repeat_kv; this model has as many key/value heads as "
                  "query heads) — use --mixed-precision no, --model-precision bf16, or --transformers-version 4.55");
    }
    if (records_full_slices(j.versions.torch))
      bad(why + "torch 2.9 to 2.11 only (traced under 2.11; 2.4 to 2.8 record the full slices)");
  }
  if (is_current_transformers(j.versions.transformers) && j.versions.transformers != kSupportedTransformers &&
      records_full_slices(j.versions.torch))
    bad("--transformers-version " + j.versions.transformers + " with --torch-version " + j.versions.torch +
        ": the 5.x releases other than 5.17 were traced under torch 2.11 only, and torch 2.4 to 2.8 record "
        "the full slices — use --torch-version 2.9 or later, or --transformers-version 5.17");
  if (j.model.family == ModelFamily::kOPT && transformers5_minor(j.versions.transformers) >= 0 &&
      transformers5_minor(j.versions.transformers) < 2 && (j.attn != "eager" || j.activation_checkpointing))
    bad("--transformers-version " + j.versions.transformers + " with OPT is modelled for eager attention without "
        "--activation-checkpointing only (5.0 and 5.1 build OPT's 4-D mask their own way; traced that way)");
  if (is_older_transformers(j.versions.transformers)) {
    // traced on the CPU (tools/predict/trace_hf.py under transformers 4.43.4 to 4.48.3); measured on an H200
    // under 4.45.2 (Llama fp32 eager by python and torchrun, OPT fp32 and bf16 autocast: *.tf4.45.events)
    const std::string why = "--transformers-version " + j.versions.transformers + " models ";
    // OPT: 4.43 to 4.48 share OPTAttention's eager code as far as memory goes (hf_schedule_opt.cpp,
    // opt_attention_forward_tf4x; 4.48's rewrite allocates and saves the same, its CPU traces);
    // 4.48's OPTForCausalLM takes ForCausalLMLoss (head_forward_tf4x). bf16 weights were not traced,
    // nor 4.48 under torch 2.4 to 2.8 (whose full slices 4.48's logits_to_keep would add)
    if (j.model.family == ModelFamily::kOPT && j.versions.transformers == "4.48" && records_full_slices(j.versions.torch))
      bad(why + "OPT under 4.48 with torch 2.9 or later only (traced under 2.11) — use --torch-version 2.11");
    if (j.model.family == ModelFamily::kOPT && j.model_precision != "fp32")
      bad(why + "OPT with fp32 weights only (--model-precision fp32, with or without --mixed-precision bf16): "
                "its bf16-weight path cannot be checked on the CPU, whose autocast keeps layer_norm and softmax "
                "in bf16 where CUDA's runs them in fp32");
    // Qwen2 before 4.45 still computes its rotary tables in every layer, in the values' dtype
    // (bf16 under autocast), which the schedule does not model; its CPU traces show it
    if (j.model.family == ModelFamily::kQwen2 && j.versions.transformers < "4.45")
      bad(why + "Qwen2 from 4.45 only (4.43 and 4.44 compute the rotary tables in every layer)");
    if (j.attn != "eager") bad(why + "eager attention only (its sdpa path is not modelled): use --attn eager");
    if (j.activation_checkpointing) bad(why + "runs without --activation-checkpointing only");
    if (j.fused_kernels) bad(why + "runs without --fused-kernels (Liger) only");
    if (j.seq_len < 2) bad(why + "--seq-len 2 or more (its loss shifts the logits by one token)");
  }
  if (j.model.family != ModelFamily::kLlama && j.model.family != ModelFamily::kOPT &&
      j.model.family != ModelFamily::kQwen2)
    bad(std::string("model family '") + family_name(j.model.family) +
        "' has no hf-trainer schedule yet — supported: llama, opt, qwen2");
  if (j.model.family == ModelFamily::kOPT) {
    if (j.model.word_embed_proj_dim != j.model.hidden_size)
      bad("OPT with word_embed_proj_dim != hidden_size (project_in/out, opt-350m) is not modelled");
    if (!j.model.do_layer_norm_before) bad("OPT with do_layer_norm_before = false is not modelled");
    if (j.model.activation_function != "relu") bad("OPT with activation " + j.model.activation_function + " is not modelled");
    if (j.model_precision == "bf16" && j.mixed_precision != "no" && j.activation_checkpointing)
      bad("OPT with bf16 weights under autocast (--mixed-precision " + j.mixed_precision +
          ") and gradient checkpointing is not modelled: the layer norms' fp32 casts are not traced through the "
          "recompute; predict it without --activation-checkpointing, or with --model-precision fp32 (autocast "
          "over fp32 weights is modelled with checkpointing)");
  }
  if (j.micro_batch < 1) bad("--micro-batch-size must be at least 1 (got " + std::to_string(j.micro_batch) + ")");
  if (j.seq_len < 1) bad("--seq-len must be at least 1 (got " + std::to_string(j.seq_len) + ")");
  if (j.seq_len > j.model.max_position_embeddings)
    bad("--seq-len " + std::to_string(j.seq_len) + " exceeds the model's max_position_embeddings " +
        std::to_string(j.model.max_position_embeddings));
  // Every size below is a product of at most B·T·V·4 or B·heads·T·T·4: keep each under 2^62.
  const long double bt = static_cast<long double>(j.micro_batch) * static_cast<long double>(j.seq_len);
  const long double worst = std::max(bt * static_cast<long double>(j.model.vocab_size) * 8,
                                     bt * static_cast<long double>(j.seq_len) *
                                         static_cast<long double>(j.model.num_attention_heads) * 8);
  if (worst > 4.0e18L)
    bad("--micro-batch-size x --seq-len (" + std::to_string(j.micro_batch) + " x " + std::to_string(j.seq_len) +
        ") makes tensors beyond 2^62 bytes — lower them");
  if (j.model_precision != "fp32" && j.model_precision != "bf16")
    bad("--model-precision " + j.model_precision + " — use fp32 or bf16");
  if (j.mixed_precision != "no" && j.mixed_precision != "bf16" && j.mixed_precision != "fp16")
    bad("--mixed-precision " + j.mixed_precision + " — use no, bf16 or fp16");
  if (j.model_precision == "bf16" && j.mixed_precision == "fp16")
    bad("--mixed-precision fp16 over bf16 weights is refused by the Trainer (fp16 grad scaling needs fp32 "
        "master weights) — use --mixed-precision bf16 or no");
  if (j.attn != "eager" && j.attn != "sdpa" && j.attn != "flash")
    bad("--attn " + j.attn + " — use eager, or flash (attn_implementation sdpa)");
  if (j.fused_kernels && j.model.family == ModelFamily::kOPT)
    bad("--fused-kernels (Liger) has no OPT patch (no apply_liger_kernel_to_opt) — drop the flag");
  // Liger on Qwen2, under --activation-checkpointing and under autocast over fp32 weights is
  // modelled from Liger 0.8.5's source, not measured (hf_schedule_llama.cpp, docs/predict.md).
  if (j.grad_accum_steps < 1) bad("--grad-accum-steps must be at least 1");
  if (j.optimizer != "adamw_torch" && j.optimizer != "adamw_torch_fused")
    bad("optimizer " + j.optimizer + " — supported: adamw_torch, adamw_torch_fused");
  if (j.steps < 1 || j.steps > 100) bad("steps must be in [1, 100]");
  if (j.ranks < 1 || j.ranks > 65536) bad("--ranks must be in [1, 65536] (got " + std::to_string(j.ranks) + ")");
  if (j.launcher != "python" && j.launcher != "torchrun")
    bad("--launcher " + j.launcher + " — supported: python (one process), torchrun (DDP, even for one process)");
  if (j.ddp_bucket_cap_mb < 0 || j.ddp_bucket_cap_mb > (std::int64_t{1} << 20))
    bad("--ddp-bucket-cap-mb must be in [1, 1048576] MiB (0: DDP's default 25)");
}

namespace detail {

Dims dims_of(const HfJob& j) {
  const ModelConfig& c = j.model;
  Dims d{};
  d.B = static_cast<u64>(j.micro_batch);
  d.T = static_cast<u64>(j.seq_len);
  d.H = static_cast<u64>(c.hidden_size);
  d.I = static_cast<u64>(c.intermediate_size);
  d.nh = static_cast<u64>(c.num_attention_heads);
  d.nkv = static_cast<u64>(c.num_key_value_heads);
  d.hd = static_cast<u64>(c.head_dim);
  d.qd = d.nh * d.hd;
  d.kvd = d.nkv * d.hd;
  d.V = static_cast<u64>(c.vocab_size);
  d.L = static_cast<u64>(c.num_hidden_layers);
  d.BT = d.B * d.T;
  d.e_w = j.model_precision == "bf16" ? 2 : 4;
  d.mixed = j.mixed_precision != "no";
  d.autocast = d.mixed && d.e_w == 4;
  d.grad_scaler = j.mixed_precision == "fp16";
  d.e_c = (d.autocast || d.e_w == 2) ? 2 : 4;
  d.ln_upcast = d.mixed && d.e_w == 2;
  d.e_r = d.e_w;
  d.e_rope = d.e_w;  // cos/sin come in the residual dtype: q (compute dtype) * cos promotes to it
  // Liger's RoPE (a Triton kernel writing into q and k, liger_kernel/ops/rope.py rope_forward) keeps
  // their dtype: under autocast over fp32 weights they stay the projections' bf16.
  if (j.fused_kernels) d.e_rope = d.e_c;
  d.eager = j.attn == "eager";
  d.dropout = j.model.family == ModelFamily::kOPT && j.model.dropout > 0;
  d.liger = j.fused_kernels;
  d.qkv_bias = j.model.qkv_bias;
  d.qwen2 = j.model.family == ModelFamily::kQwen2;
  d.opt = j.model.family == ModelFamily::kOPT;
  d.ddp = j.ddp();
  d.ddp_find_unused = !j.activation_checkpointing;
  d.ckpt = j.activation_checkpointing;
  d.ddp_first_bucket = j.ddp_bucket_cap_mb == 0;
  d.ddp_bucket_cap = (j.ddp_bucket_cap_mb == 0 ? u64{25} : static_cast<u64>(j.ddp_bucket_cap_mb)) << 20;
  d.tf4x = is_older_transformers(j.versions.transformers);
  d.tf4_minor = d.tf4x ? static_cast<u64>(std::stoi(j.versions.transformers.substr(2))) : 0;
  d.inline_attn = d.tf4x && d.tf4_minor <= 47;
  // (gradient checkpointing turns the cache off: use_cache=False)
  d.train_cache = (d.tf4x && d.tf4_minor >= 45) || (is_late4_transformers(j.versions.transformers) && !j.activation_checkpointing);
  d.inv_freq_alias = d.tf4x || is_late4_transformers(j.versions.transformers);
  d.cache_layers = late4_minor(j.versions.transformers) >= 54;
  // (4.56 dropped sdpa_attention_forward's .contiguous() copies: their CPU traces)
  d.sdpa_copies = late4_minor(j.versions.transformers) >= 54 && late4_minor(j.versions.transformers) <= 55 && !d.eager;
  d.sdpa_repeat = is_late4_transformers(j.versions.transformers) && late4_minor(j.versions.transformers) <= 53 && !d.eager;
  d.opt_mask_4x = d.opt && (late4_minor(j.versions.transformers) >= 49 ||
                            (transformers5_minor(j.versions.transformers) >= 0 && transformers5_minor(j.versions.transformers) < 2));
  d.rope_both_first = d.tf4x || (is_late4_transformers(j.versions.transformers) && late4_minor(j.versions.transformers) <= 50);
  d.late4_minor = late4_minor(j.versions.transformers) >= 0 ? static_cast<u64>(late4_minor(j.versions.transformers)) : 0;
  d.mask_t1 = d.tf4x || (is_late4_transformers(j.versions.transformers) && late4_minor(j.versions.transformers) <= 52);
  d.slice_copies = records_full_slices(j.versions.torch);
  d.cpu_kernels = j.cpu_kernels;
  d.cache_cat = late4_minor(j.versions.transformers) >= 56;
  d.opt_unscaled = d.opt && is_late4_transformers(j.versions.transformers) && late4_minor(j.versions.transformers) <= 51;
  d.opt_cache_tuple = d.opt && is_late4_transformers(j.versions.transformers) && late4_minor(j.versions.transformers) <= 53;
  return d;
}

void add_param(Model& m, Param& p, u64 bytes, const char* name) {
  p.bytes = bytes;
  p.name = name;
  m.order.push_back(&p);
}

namespace {

// transformers 4.43 to 4.48's LlamaForCausalLM.forward with labels, from the lm_head's output
// `logits` on: the logits upcast to fp32 (below: where differs by release), `shift_logits =
// logits[..., :-1, :].contiguous()` (an fp32 copy of B·(T−1) rows), `shift_labels =
// labels[..., 1:].contiguous()`, the cross-entropy: log_softmax (saved) and nll_loss. The copy goes
// as the forward returns; the logits and the DynamicCache's keys and values go when compute_loss
// returns and drops the outputs (logits first, then, from 4.45, the legacy cache tuple, which
// CPython releases last item first: layer L−1's value, its key, ...). The CPU traces of
// transformers 4.43.4 to 4.48.3 (tools/predict/trace_hf.py) show each of these; 4.48 returns the
// DynamicCache object instead of the legacy tuple, which goes keys first, then values.
Head head_forward_tf4x(Tape& t, const Dims& d, Model& m, std::vector<Id>& cached_casts, Id& final_out, Head& h,
                      Id logits) {
  // the fp32 logits the loss reads: up to 4.45 the model upcasts its output itself (the 16-bit
  // output, a temporary of the expression, goes at once); 4.46 to 4.48 leave the output in the
  // model's dtype and the loss function upcasts a local copy, which goes as it returns
  // (OPTForCausalLM 4.43 to 4.47 upcasts nothing: its shifted copy is in the compute dtype, and
  // under autocast cross_entropy's log_softmax casts it to fp32, a copy that goes at once)
  Id lf = 0;
  const bool opt_ce = d.opt && d.tf4_minor <= 47;  // OPTForCausalLM's own CrossEntropyLoss (4.48: ForCausalLMLoss)
  if (d.e_c != 4 && !opt_ce) {
    lf = t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "logits .float()");
    if (d.tf4_minor <= 45) {
      t.free(logits);
      logits = lf;
      lf = 0;
    }
  }
  const u64 rows = d.B * (d.T - 1);
  const u64 shifted_e = opt_ce ? d.e_c : 4;
  Id shifted = t.alloc(rows * d.V * shifted_e, Category::kLogitsLoss, "shift_logits (contiguous copy)");
  h.shift = t.alloc(rows * 8, Category::kInputs, "shift_labels (saved by nll_loss)");
  if (shifted_e != 4 && d.cpu_kernels) {
    // (the CPU's autocast: cross_entropy's input cast to fp32 first, log_softmax in fp32, the cast
    // gone at once: the CPU traces of 4.43 to 4.47)
    Id up = t.alloc(rows * d.V * 4, Category::kLogitsLoss, "cross_entropy: autocast .to(fp32) (CPU)");
    h.ls = t.alloc(rows * d.V * 4, Category::kLogitsLoss, "log_softmax (saved)");
    t.free(up);
  } else if (shifted_e != 4) {
    // OPT under CUDA autocast: cross_entropy calls log_softmax with the input's own dtype, so
    // autocast's fp32_set_opt_dtype leaves it in the compute dtype (saved: its output); nll_loss,
    // on autocast's fp32 list, casts those log-probs to fp32 and saves the cast (the H200 trace of
    // 4.45.2 under bf16 autocast; the CPU's autocast casts the input first and runs log_softmax in fp32)
    h.ls = t.alloc(rows * d.V * shifted_e, Category::kLogitsLoss, "log_softmax (compute dtype, saved)");
    h.ls32 = t.alloc(rows * d.V * 4, Category::kLogitsLoss, "nll_loss: autocast .to(fp32) (saved)");
  } else {
    h.ls = t.alloc(rows * d.V * 4, Category::kLogitsLoss, "log_softmax (saved)");
  }
  h.scalars[0] = t.alloc(4, Category::kLogitsLoss, "nll_loss total_weight");
  h.scalars[1] = t.alloc(4, Category::kLogitsLoss, "loss");
  if (d.tf4_minor >= 46 && !opt_ce) {  // (OPTForCausalLM keeps CrossEntropyLoss's mean up to 4.47)
    // 4.46 to 4.48: ForCausalLMLoss's fixed_cross_entropy (reduction "sum", then / num_items);
    // from 4.47 the Trainer also moves num_items_in_batch to the device (alive until backward is
    // done), as 5.17 does
    if (d.tf4_minor >= 47) h.scalars[2] = t.alloc(8, Category::kInputs, "num_items_in_batch (device)");
    Id quotient = t.alloc(4, Category::kLogitsLoss, "loss / num_items_in_batch");
    Id t2 = t.alloc(4, Category::kLogitsLoss, "loss temporary");
    t.free(t2);
    t.free(h.scalars[0]);  // the sum's total weight goes with the expression
    h.scalars[0] = quotient;
  }
  t.free(lf);  // 4.46+: the loss function returns
  // LlamaForCausalLM.forward returns: its locals go, the shifted copy before the final norm's
  // output (which under autocast only its cast was saved for); Qwen2ForCausalLM 4.45 orders its
  // locals the other way (its CPU trace), 4.46+ keep the copy inside the loss function
  const bool frees_output = d.autocast || d.head_in_fp32, output_first = (d.qwen2 && d.tf4_minor == 45) || opt_ce;
  if (frees_output && output_first) t.free(final_out);
  t.free(shifted);
  if (frees_output && !output_first) t.free(final_out);
  for (Id& c : cached_casts) t.free(c);  // autocast exits: its cache goes
  if (d.mixed) {
    // accelerate's convert_outputs_to_fp32 rebuilds the outputs with every bf16/fp16 tensor cast
    // to fp32, in order: the logits when the model left them 16-bit (4.46+), then the cache's
    // 16-bit keys and values (all of them with bf16 weights; under autocast over fp32 weights the
    // values, the projections' outputs, while the rotated keys are fp32); the original
    // outputs then go with their 16-bit tensors, the logits first, the cache last entry first
    // (the CPU traces of 4.45.2, 4.46.3 and 4.47.1, full bf16 and autocast).
    Id out32 = d.e_c != 4 && (d.tf4_minor >= 46 || d.opt)
                   ? t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "outputs to fp32 (accelerate)")
                   : 0;
    // (4.48 returns the DynamicCache object itself, which the conversion does not enter)
    std::vector<Id> fp32(m.kv_cache.size(), 0);
    for (std::size_t i = 0; i < m.kv_cache.size() && d.tf4_minor <= 47; ++i)
      if (m.kv_cache[i].second != 4)
        fp32[i] = t.alloc(d.BT * d.kvd * 4, A, "DynamicCache key/value to fp32 (accelerate)");
    if (out32 != 0) {
      t.free(logits);
      logits = out32;
    }
    for (std::size_t i = m.kv_cache.size(); i-- > 0;) {
      if (fp32[i] == 0) continue;
      t.free(m.kv_cache[i].first);
      m.kv_cache[i] = {fp32[i], 4};
    }
  }
  if (d.ddp && d.ddp_find_unused) {
    // DDP's _post_forward with find_unused_parameters: _DDPSink clones every tensor of the outputs
    // (the loss, the logits, then each layer's cached key and value, the legacy cache tuple in
    // order); the originals go (the logits, then the cache last entry first) and the clones live
    // until compute_loss returns (the CPU traces of 4.45.2 under torchrun, one process and two).
    Id loss = t.alloc(4, Category::kLogitsLoss, "DDPSink clone of loss");
    // the logits the outputs hold are fp32 unless 4.46+ left them 16-bit and nothing converted them
    const u64 logits_e = d.e_c != 4 && (d.tf4_minor >= 46 || d.opt) && !d.mixed ? d.e_c : 4;
    Id clone = t.alloc(d.BT * d.V * logits_e, Category::kLogitsLoss, "DDPSink clone of logits");
    // (4.48 returns the DynamicCache object itself, which _DDPSink does not flatten: only the
    // logits are cloned, as with 4.43 and 4.44, which have no cache)
    std::vector<std::pair<Id, u64>> clones;
    if (d.tf4_minor <= 47)
      for (const auto& [id, e] : m.kv_cache)
        clones.emplace_back(t.alloc(d.BT * d.kvd * e, A, "DDPSink clone of DynamicCache key/value"), e);
    t.free(h.scalars[1]);
    h.scalars[1] = loss;
    t.free(logits);
    logits = clone;
    if (d.tf4_minor <= 47) {
      for (auto it = m.kv_cache.rbegin(); it != m.kv_cache.rend(); ++it) t.free(it->first);
      m.kv_cache = clones;
    }
  }
  t.free(logits);
  if (d.tf4_minor >= 48) {
    // 4.48's DynamicCache object goes with the outputs: its key_cache list, then its value_cache
    // list, each last item first (the CPU traces: the rotated keys' fp32 before the bf16 values)
    for (std::size_t i = m.kv_cache.size(); i-- > 0;)
      if (i % 2 == 0) t.free(m.kv_cache[i].first);
    for (std::size_t i = m.kv_cache.size(); i-- > 0;)
      if (i % 2 == 1) t.free(m.kv_cache[i].first);
  } else {
    for (auto it = m.kv_cache.rbegin(); it != m.kv_cache.rend(); ++it) t.free(it->first);
  }
  m.kv_cache.clear();
  begin_backward(t, d, m);
  return h;
}

}  // namespace

// The training DynamicCache going (4.49 to 4.57): to 4.53 its key list, then its value list, each
// last item first (as 4.48's, head_forward_tf4x); from 4.54 its list of DynamicLayer objects, the
// last layer first, each its key, then its value (the CPU traces of 4.53.3 and 4.55.4).
void free_cache(Tape& t, const Dims& d, Model& m) {
  if (d.cache_layers) {
    for (std::size_t l = m.kv_cache.size() / 2; l-- > 0;) {
      t.free(m.kv_cache[2 * l].first);
      t.free(m.kv_cache[2 * l + 1].first);
    }
  } else {
    for (std::size_t i = m.kv_cache.size(); i-- > 0;)
      if (i % 2 == 0) t.free(m.kv_cache[i].first);
    for (std::size_t i = m.kv_cache.size(); i-- > 0;)
      if (i % 2 == 1) t.free(m.kv_cache[i].first);
  }
  m.kv_cache.clear();
}

Head head_forward(Tape& t, const Dims& d, Model& m, std::vector<Id>& cached_casts, Id& final_out) {
  Head h;
  Id& wl = h.wl;
  Id& inl = h.inl;
  Id logits = 0;
  if (d.autocast) {
    wl = t.alloc(d.V * d.H * 2, Category::kAutocastCache, "autocast cast of lm_head.weight");
    inl = t.alloc(d.BT * d.H * 2, A, "autocast cast of final norm output");
  } else if (d.head_in_fp32) {  // bf16 weight: only the fp32 input is cast
    inl = t.alloc(d.BT * d.H * 2, A, "autocast cast of final norm output");
  }
  logits = t.alloc(d.BT * d.V * d.e_c, Category::kLogitsLoss, "logits");
  if (d.tf4x) return head_forward_tf4x(t, d, m, cached_casts, final_out, h, logits);
  // ForCausalLMLoss: logits.float() (a copy unless fp32), labels padded and shifted (no logits
  // copy), cross_entropy = log_softmax (saved, fp32) + nll_loss.
  Id lf = d.e_c == 4 ? 0 : t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "logits.float()");
  Id pad = t.alloc(d.B * (d.T + 1) * 8, Category::kInputs, "labels padded with -100");
  h.shift = t.alloc(d.BT * 8, Category::kInputs, "shift_labels (saved by nll_loss)");
  h.ls = t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "log_softmax (saved)");
  // nll_loss's total weight and the loss, num_items_in_batch's device copy (0-d tensors alive
  // until backward is done: the scalars the CPU trace shows live at backward). The CPU trace's
  // other 8-byte tensors live at backward are eager attention's wrapped `* scaling` scalars, one
  // per layer, which stay on the host under CUDA (the Qwen2 sdpa traces, which have none, show it).
  Id* sc = h.scalars;
  // (4.50 to 4.56 keep num_items_in_batch on the host: their CPU traces have no such tensor; 4.57's
  // has it again)
  const bool items_on_device = !(d.train_cache && !d.tf4x && d.late4_minor >= 50 && d.late4_minor <= 56);
  // (with the count on the host, 4.50 to 4.56: nll_loss's summed output, its total weight, then the
  // quotient by the count, and the sum goes: three 0-d tensors at once at the end of the forward,
  // where OPT-1.3B peaks; the H200 trace of 4.55.4)
  Id sum = items_on_device ? 0 : t.alloc(4, Category::kLogitsLoss, "nll_loss output (the sum)");
  Id init[3] = {t.alloc(4, Category::kLogitsLoss, "nll_loss total_weight"),
                   t.alloc(4, Category::kLogitsLoss, "loss"),
                   items_on_device ? t.alloc(8, Category::kInputs, "num_items_in_batch (device)") : 0};
  t.free(sum);
  for (int i = 0; i < 3; ++i) sc[i] = init[i];
  t.free(lf);
  t.free(pad);
  // the model's forward returns: its output (the final norm's, when only its cast was saved) goes
  // before autocast exits and its cache with it (the bias casts only the cache held: the H200
  // trace of OPT under bf16 autocast)
  if (d.autocast || d.head_in_fp32) t.free(final_out);
  for (Id& c : cached_casts) t.free(c);
  // accelerate's convert_outputs_to_fp32 (mixed precision): the model's outputs cast to fp32.
  Id out32 = d.mixed && d.e_c != 4 ? t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "outputs to fp32 (accelerate)")
                                   : 0;
  // OPT under 4.49 to 4.53 returns its cache as a legacy tuple, which the conversion enters: each
  // layer's 16-bit key and value copied to fp32 in order, the originals gone after the logits, the
  // last entry first (their CPU traces, bf16 autocast; as 4.4x's, head_forward_tf4x)
  const bool tuple32 = d.opt_cache_tuple && out32 != 0 && d.train_cache;
  std::vector<Id> fp32(tuple32 ? m.kv_cache.size() : 0, 0);
  for (std::size_t i = 0; i < fp32.size(); ++i)
    if (m.kv_cache[i].second != 4) fp32[i] = t.alloc(d.BT * d.kvd * 4, A, "legacy cache key/value to fp32 (accelerate)");
  if (out32 != 0) t.free(logits);
  for (std::size_t i = fp32.size(); i-- > 0;) {
    if (fp32[i] == 0) continue;
    t.free(m.kv_cache[i].first);
    m.kv_cache[i] = {fp32[i], 4};
  }
  if (d.ddp && d.ddp_find_unused) {
    // DDP's _post_forward with find_unused_parameters: _DDPSink clones the outputs (the loss, then
    // the logits the inner forward returned); the originals go.
    Id& out = out32 != 0 ? out32 : logits;
    const u64 out_bytes = out32 != 0 ? d.BT * d.V * 4 : d.BT * d.V * d.e_c;
    Id loss = t.alloc(4, Category::kLogitsLoss, "DDPSink clone of loss");
    Id clone = t.alloc(out_bytes, Category::kLogitsLoss, "DDPSink clone of logits");
    // 4.50 to 4.55 register DynamicCache as a pytree node (cache_utils.py), so _DDPSink's
    // tree_flatten enters it and clones every key, then every value, layer by layer; the original
    // cache then goes as compute_loss's would (below), the clones live until compute_loss returns
    // (the CPU traces of 4.50.3 to 4.55.4 under torchrun; 4.49, 4.56 and 4.57 register none)
    std::vector<std::pair<Id, u64>> cache_clones;
    const bool tuple = d.opt_cache_tuple && d.train_cache;
    if (tuple) {
      // OPT under 4.49 to 4.53: the legacy cache tuple, which tree_flatten always enters: each
      // layer's key and value in order, the originals then going last item first (their CPU traces)
      for (const auto& [id, e] : m.kv_cache)
        cache_clones.emplace_back(t.alloc(d.BT * d.kvd * e, A, "DDPSink clone of the legacy cache key/value"), e);
    } else if (d.train_cache && !d.tf4x && d.late4_minor >= 50 && d.late4_minor <= 55) {
      for (int part = 0; part < 2; ++part)
        for (std::size_t i = static_cast<std::size_t>(part); i < m.kv_cache.size(); i += 2)
          cache_clones.emplace_back(t.alloc(d.BT * d.kvd * m.kv_cache[i].second, A, "DDPSink clone of DynamicCache key/value"),
                                    m.kv_cache[i].second);
    }
    t.free(sc[1]);
    sc[1] = loss;
    t.free(out);
    out = clone;
    if (tuple) {
      for (std::size_t i = m.kv_cache.size(); i-- > 0;) t.free(m.kv_cache[i].first);
      m.kv_cache = cache_clones;
    } else if (!cache_clones.empty()) {
      free_cache(t, d, m);
      const std::size_t layers = cache_clones.size() / 2;
      for (std::size_t l = 0; l < layers; ++l) {
        m.kv_cache.push_back(cache_clones[l]);
        m.kv_cache.push_back(cache_clones[layers + l]);
      }
    }
  }
  t.free(logits);
  t.free(out32);  // compute_loss returns: the outputs go
  // 4.49 to 4.57: the DynamicCache object (or _DDPSink's clone of it) goes with them (free_cache)
  if (d.opt_cache_tuple && d.train_cache) {  // the legacy tuple (or a copy of it): CPython releases the last item first
    for (std::size_t i = m.kv_cache.size(); i-- > 0;) t.free(m.kv_cache[i].first);
    m.kv_cache.clear();
  } else {
    free_cache(t, d, m);
  }
  begin_backward(t, d, m);
  return h;
}

void begin_backward(Tape& t, const Dims& d, Model& m) {
  t.phase("backward");
  // 4.50 to 4.56 (the count on the host): the backward's start leaves one more 0-d tensor alive to
  // its end than the loss's scalars account for (the H200 traces of 4.55.4 hold two small blocks
  // made there to the end of backward, as 5.17's do, whose device count is the other)
  if (d.train_cache && !d.tf4x && d.late4_minor >= 50 && d.late4_minor <= 56)
    m.backward_seed = t.alloc(4, Category::kLogitsLoss, "backward seed (alive to the end of backward)");
  if (!d.grad_scaler) return;
  // scale(): _lazy_init_scale_growth_tracker at the first call (torch.full((), init_scale) fp32,
  // torch.full((), 0) int32), then `outputs * scale`; backward's seed (ones_like of the scaled
  // loss) goes through MulBackward0 (grad * scale) to the loss's own backward.
  if (m.scaler_scale == 0) {
    m.scaler_scale = t.alloc(4, Category::kOptimizerStates, "GradScaler _scale");
    m.scaler_growth = t.alloc(4, Category::kOptimizerStates, "GradScaler _growth_tracker");
  }
  m.scaled_loss = t.alloc(4, Category::kLogitsLoss, "GradScaler loss * scale");
  Id seed = t.alloc(4, Category::kLogitsLoss, "GradScaler backward seed (ones_like)");
  Id g = t.alloc(4, Category::kLogitsLoss, "GradScaler MulBackward0 grad * scale");
  t.free(seed);
  t.free(g);
}

Id eager_scores_to_softmax(Tape& t, const Dims& d, Id scores, Id& probs32, const char* scale_label, bool unscaled) {
  const u64 bhtt = d.B * d.nh * d.T * d.T;
  Id scaled = unscaled ? scores : t.alloc(bhtt * d.e_c, Category::kTemporaries, scale_label);
  if (!unscaled) t.free(scores);
  // + causal mask, which is in the embeddings' dtype (fp32 under autocast: the sum is fp32)
  const u64 e_masked = std::max(d.e_c, d.e_r);
  Id masked = t.alloc(bhtt * e_masked, Category::kTemporaries, "scores + mask");
  t.free(scaled);
  // softmax(dtype=fp32) converts a bf16 input to fp32 first (a transient copy)
  Id conv = e_masked != 4 ? t.alloc(bhtt * 4, Category::kTemporaries, "softmax input .to(fp32)") : 0;
  probs32 = t.alloc(bhtt * 4, Category::kActivations, "softmax(dtype=fp32)");
  t.free(conv);
  return masked;
}

void full_slices_backward(Tape& t, Id& g, u64 bytes, int slices, const char* label) {
  for (int i = 0; i < slices; ++i) {
    Id c = t.alloc(bytes, Category::kTemporaries, label);
    t.free(g);
    g = c;
  }
}

// Its backward down to the gradient of the final norm's output.
Id head_backward(Tape& t, const Dims& d, Model& m, Param& head, Head& h, Id& final_out) {
  Id& wl = h.wl;
  Id& inl = h.inl;
  // nll_loss backward, log_softmax backward (over B·(T−1) rows under transformers 4.45's shifted copy)
  const u64 rows = d.tf4x ? d.B * (d.T - 1) : d.BT;
  // the slice's backward below: a zero-filled [B, T, V] with the rows copied in, fp32 (Llama, Qwen2:
  // their logits were upcast before the slice) or, for OPT, in the compute dtype
  const u64 slice_e = d.tf4x && d.opt && d.tf4_minor <= 47 ? d.e_c : 4;  // (OPT 4.48: ForCausalLMLoss, as Llama)
  Id g_nll = t.alloc(rows * d.V * 4, Category::kLogitsLoss, "nll_loss backward");
  Id g_ls = 0;
  if (h.ls32 != 0) {
    // OPT under CUDA autocast (head_forward_tf4x): nll_loss's node releases its fp32 cast, target and
    // total weight; the cast's backward takes the gradient to the compute dtype, then log_softmax's
    // backward runs in it and its saved output goes (the H200 trace of 4.45.2 under bf16 autocast)
    t.free(h.ls32);
    t.free(h.shift);
    t.free(h.scalars[0]);
    Id g16 = t.alloc(rows * d.V * slice_e, Category::kLogitsLoss, "grad log-probs (cast backward)");
    t.free(g_nll);
    g_ls = t.alloc(rows * d.V * slice_e, Category::kLogitsLoss, "log_softmax backward (compute dtype)");
    t.free(g16);
    t.free(h.ls);
  } else {
    t.free(h.shift);  // nll_loss's saved target, released as its node finishes (the H200 trace)
    g_ls = t.alloc(rows * d.V * 4, Category::kLogitsLoss, "log_softmax backward");
    t.free(g_nll);
    t.free(h.ls);
  }
  m.kept_loss = h.scalars[1];  // the loss compute_loss returned: the Trainer keeps it
  h.scalars[1] = 0;
  for (Id& sc : h.scalars) t.free(sc);
  if (d.tf4x && slice_e != 4 && d.cpu_kernels) {  // (CPU: the fp32 cast's backward, after log_softmax's)
    Id g16 = t.alloc(rows * d.V * slice_e, Category::kLogitsLoss, "grad shift_logits (cast backward, CPU)");
    t.free(g_ls);
    g_ls = g16;
  }
  Id g_logits = g_ls;
  if (d.tf4x) {
    Id rows_grad = g_ls;
    if (d.slice_copies) {  // torch 2.4-2.8: first the last dimension's full slice `:`, a zero-filled copy
      rows_grad = t.alloc(rows * d.V * slice_e, Category::kLogitsLoss,
                          "grad shift_logits (torch <= 2.8 full-slice backward)");
      t.free(g_ls);
    }
    g_logits = t.alloc(d.BT * d.V * slice_e, Category::kLogitsLoss, "grad logits (slice backward, zero-filled)");
    t.free(rows_grad);
  }
  if (d.e_c != 4 && slice_e == 4) {
    Id g32 = g_logits;
    g_logits = t.alloc(d.BT * d.V * d.e_c, Category::kLogitsLoss, "grad logits (compute dtype)");
    t.free(g32);
  }
  // lm_head backward: the weight gradient is allocated before the first GEMM of autograd's thread
  // makes its cuBLAS workspace (the H200 traces)
  Id gh;
  if (d.autocast) {
    Id gw16 = t.alloc(d.V * d.H * 2, Tmp, "lm_head weight grad (bf16)");
    gemm_workspace(t, m.ws_autograd);
    Id gin16 = t.alloc(d.BT * d.H * 2, Tmp, "grad final norm output");
    t.free(g_logits);
    t.free(wl);
    t.free(inl);
    gh = t.alloc(d.BT * d.H * 4, Tmp, "grad final norm output (fp32)");
    t.free(gin16);
    Id gw = t.alloc(d.V * d.H * 4, Category::kGradients, "lm_head weight grad");
    t.free(gw16);
    head_gradient(t, m, head, gw, true);  // the cast's backward made it
  } else {
    Id gw = t.alloc(d.V * d.H * d.e_w, Category::kGradients, "lm_head weight grad");
    gemm_workspace(t, m.ws_autograd);
    gh = t.alloc(d.BT * d.H * d.e_c, Tmp, "grad final norm output");
    t.free(g_logits);
    head_gradient(t, m, head, gw, false);  // linear's own weight gradient
    if (d.head_in_fp32) {  // the input cast's backward: the gradient back to fp32
      t.free(inl);
      Id g32 = t.alloc(d.BT * d.H * 4, Tmp, "grad final norm output (fp32)");
      t.free(gh);
      gh = g32;
    }
  }
  if (!d.autocast) t.free(final_out);
  // torch 2.4 to 2.8, transformers 4.45 to 4.48 and 5.17 (Llama, Qwen2, OPT):
  // `self.lm_head(hidden_states[:, -num_logits_to_keep:, :])` (5.17: `[:, slice(-0, None), :]`) is
  // three full slices of the final norm's output, copied in gh's dtype (the norm output's: fp32 under
  // autocast and for OPT's fp32 final LayerNorm, else the compute dtype); 4.43 and 4.44 do not slice
  if (d.slice_copies && (!d.tf4x || (d.tf4_minor >= 45 && !d.opt))) {  // (OPT 4.4x slices nothing there)
    const u64 gh_e = d.autocast || d.head_in_fp32 ? 4 : d.e_c;
    full_slices_backward(t, gh, d.BT * d.H * gh_e, 3, "grad final norm output (torch <= 2.8 full-slice backward)");
  }
  return gh;
}

namespace {

// GradScaler.unscale_ (accelerate's clip_grad_norm_ calls it first; without clipping scaler.step
// does): inv_scale = scale.double().reciprocal().float(), found_inf = torch.full((), 0.0), and
// _amp_foreach_non_finite_check_and_unscale_ on the gradients in place; inv_scale goes when
// unscale_ returns, found_inf stays in the optimizer's state until update().
void scaler_unscale(Tape& t, Model& m) {
  Id dbl = t.alloc(8, Category::kOptimizerTemporaries, "GradScaler scale.double()");
  Id rec = t.alloc(8, Category::kOptimizerTemporaries, "GradScaler .reciprocal()");
  t.free(dbl);
  Id inv = t.alloc(4, Category::kOptimizerTemporaries, "GradScaler inv_scale");
  t.free(rec);
  m.found_inf = t.alloc(4, Category::kOptimizerTemporaries, "GradScaler found_inf");
  t.free(inv);
}

// clip_grad_norm_(foreach): _foreach_norm's per-tensor results and its chunk partials, the stack,
// the total norm, the clip coefficient; then _foreach_mul_ in place.
void clip_grad_norm(Tape& t, const Dims& d, Model& m) {
  t.free(m.kept_grad_norm);  // the previous step's, which the Trainer kept for logging
  const u64 n = m.order.size();
  u64 max_numel = 0;  // the gradients are in the parameters' dtype (the bf16 H200 trace: 2,340,864 B)
  for (Param* p : m.order) max_numel = std::max<u64>(max_numel, p->bytes / d.e_w);
  const u64 chunks = (max_numel + 65535) / 65536;
  Id partial = t.alloc(n * chunks * 4, Category::kOptimizerTemporaries, "foreach_norm chunk partials");
  std::vector<Id> norms(n);
  for (u64 i = 0; i < n; ++i) norms[i] = t.alloc(4, Category::kOptimizerTemporaries, "foreach_norm result");
  t.free(partial);
  Id stack = t.alloc(n * 4, Category::kOptimizerTemporaries, "torch.stack(norms)");
  Id total = t.alloc(4, Category::kOptimizerTemporaries, "total norm");
  t.free(stack);
  for (auto& id : norms) t.free(id);
  Id coef = t.alloc(4, Category::kOptimizerTemporaries, "clip coef");
  Id clamped = t.alloc(4, Category::kOptimizerTemporaries, "clip coef clamped");
  t.free(coef);
  t.free(clamped);
  m.kept_grad_norm = total;  // returned by clip_grad_norm_ and kept by the Trainer
}

// AdamW over the Trainer's two parameter groups (get_decay_parameter_names: weight decay on all
// but biases and norm weights; the group is made even when weight_decay is 0), each stepped on
// its own: states created lazily on the first step (exp_avg, exp_avg_sq per parameter in the
// group's order; step counters on the CPU); foreach path: _foreach_sqrt(exp_avg_sqs) is the only
// new memory, freed as the Python list dies (CPython frees list items from the last). The fused
// path makes no temporaries.
void optimizer_step(Tape& t, const Dims& d, Model& m, bool fused, bool& states) {
  t.phase("optimizer_step");
  // fp16: scaler.step(). The foreach AdamW: unscale_ if clipping did not, then found_inf.item()
  // (no memory). The fused one (_step_supports_amp_scaling) takes found_inf = sum([found_inf])
  // (0 + t: a new tensor) and, when nothing unscaled the gradients, grad_scale = scale * 1 after
  // _check_inf_per_device (a dummy inv_scale of 1 and its own found_inf); both go after the step.
  Id found_sum = 0, grad_scale = 0;
  if (d.grad_scaler) {
    const bool unscaled = m.found_inf != 0;
    if (!fused && !unscaled) scaler_unscale(t, m);
    if (fused) {
      if (!unscaled) {
        Id dummy = t.alloc(4, Category::kOptimizerTemporaries, "GradScaler dummy inv_scale");
        m.found_inf = t.alloc(4, Category::kOptimizerTemporaries, "GradScaler found_inf");
        t.free(dummy);
      }
      found_sum = t.alloc(4, Category::kOptimizerTemporaries, "GradScaler sum(found_inf)");
      if (!unscaled) grad_scale = t.alloc(4, Category::kOptimizerTemporaries, "GradScaler grad_scale");
    }
  }
  std::vector<Param*> groups[2];
  for (Param* p : m.order) {
    const std::string_view name = p->name;
    const bool norm = name.find("norm") != std::string_view::npos || name.find("bias") != std::string_view::npos;
    groups[norm ? 1 : 0].push_back(p);
  }
  for (auto& group : groups) {
    if (!states) {
      for (Param* p : group) {
        p->exp_avg = t.alloc(p->bytes, Category::kOptimizerStates, "exp_avg");
        p->exp_avg_sq = t.alloc(p->bytes, Category::kOptimizerStates, "exp_avg_sq");
      }
    }
    if (!fused) {
      std::vector<Id> sq;
      for (Param* p : group) sq.push_back(t.alloc(p->bytes, Category::kOptimizerTemporaries, "foreach sqrt(exp_avg_sq)"));
      for (auto it = sq.rbegin(); it != sq.rend(); ++it) t.free(*it);
    }
  }
  states = true;
  // del optimizer.grad_scale, optimizer.found_inf; update() rescales in place and drops the
  // per-optimizer state (found_inf). A step skipped for an overflow is not modelled: its states
  // appear at the first step that runs, with the same peak.
  t.free(grad_scale);
  t.free(found_sum);
  t.free(m.found_inf);
}

}  // namespace
}  // namespace detail

std::vector<ScheduleEvent> hf_trainer_schedule(const HfJob& job) {
  using namespace detail;
  validate_job(job);
  std::vector<ScheduleEvent> ev;
  Tape t(ev);
  const Dims d = dims_of(job);
  Model model;
  bool states = false;
  t.phase("load");
  const bool opt = job.model.family == ModelFamily::kOPT;
  if (opt) {
    load_opt(t, model, d, job.model);
  } else {
    load_llama(t, model, d, job.model.tie_word_embeddings);
    // the rotary inv_freq and original_inv_freq (fp32); 4.43 to 4.47: the model's inv_freq and
    // each layer's own (load_llama); 4.48: the model's inv_freq alone
    model.buffer_count = d.inline_attn ? d.L + 1 : d.inv_freq_alias ? 1 : 2;
    model.buffer_bytes = d.hd / 2 * 4 * model.buffer_count;
  }
  if (d.ddp) {
    t.phase("ddp_init");
    ddp_construct(t, model, d);
  }
  // The Trainer's running loss (tr_loss, a 0-d tensor made before the first batch and added to in
  // place), then per optimizer step: get_batch_samples fetches every micro-step's batch (accelerate
  // moves each to the GPU: input_ids, labels) and computes num_items_in_batch (one int64 on the
  // device) before the first forward; the previous step's batches and count go only then, when the
  // loop's variables are rebound (the H200 traces: a step's batch is alive through its optimizer
  // step). The count's own temporaries (the mask of labels != -100 and its sum, < 1 MiB) are not
  // modelled.
  Id tr_loss = t.alloc(4, Category::kLogitsLoss, "Trainer tr_loss");
  (void)tr_loss;  // kept to the end
  std::vector<Id> held;
  Id kept_loss = 0;
  for (std::int64_t step = 0; step < job.steps; ++step) {
    std::vector<Id> fetched;
    for (std::int64_t micro = 0; micro < job.grad_accum_steps; ++micro) {
      fetched.push_back(t.alloc(static_cast<u64>(d.BT) * 8, Category::kInputs, "input_ids"));
      fetched.push_back(t.alloc(static_cast<u64>(d.BT) * 8, Category::kInputs, "labels"));
    }
    // (transformers 4.43 to 4.45 count no items: num_items_in_batch came with 4.46's
    // get_batch_samples; the H200 traces of 4.45.2 have no such tensor)
    if (!(d.tf4x && d.tf4_minor <= 45)) fetched.push_back(t.alloc(8, Category::kInputs, "num_items_in_batch"));
    for (Id& h : held) t.free(h);
    held = fetched;
    for (std::int64_t micro = 0; micro < job.grad_accum_steps; ++micro) {
      model.ddp_sync = micro == job.grad_accum_steps - 1;
      if (opt) {
        opt_forward_backward(t, d, job, model);
      } else {
        llama_forward_backward(t, d, job, model);
      }
      t.free(model.scaled_loss);  // backward returned: the scaled loss goes (fp16)
      t.free(model.backward_seed);
      // training_step returned: the loop rebinds tr_loss_step, the previous micro-step's loss goes
      t.free(kept_loss);
      kept_loss = model.kept_loss;
      model.kept_loss = 0;
      // find_unused_parameters False: the buckets are rebuilt once, before the forward after the
      // first synchronized backward (the Reducer records the gradients' ready order only then)
      if (d.ddp && !d.ddp_find_unused && step == 0 && model.ddp_sync) model.ddp_rebuild = true;
    }
    t.phase("clip_grad_norm");
    if (job.max_grad_norm > 0) {
      if (d.grad_scaler) scaler_unscale(t, model);
      clip_grad_norm(t, d, model);
    }
    optimizer_step(t, d, model, job.optimizer == "adamw_torch_fused", states);
    t.phase("zero_grad");
    for (Param* p : model.order) t.free(p->grad);
    t.phase("step_end");
  }
  return ev;
}

}  // namespace scalelab::predict
