// The Llama schedule of a Hugging Face Trainer step (torch 2.11, transformers 5.17, accelerate).
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
    case Category::kCount: break;
  }
  return "?";
}

void validate_job(const HfJob& j) {
  auto bad = [](const std::string& m) { throw InvalidInput("[plan --stack hf-trainer] " + m); };
  if (j.versions.torch != kSupportedTorch)
    bad("--torch-version " + j.versions.torch + " is not modelled — supported: " + kSupportedTorch);
  if (j.versions.transformers != kSupportedTransformers)
    bad("--transformers-version " + j.versions.transformers + " is not modelled — supported: " +
        kSupportedTransformers);
  if (j.model.family != ModelFamily::kLlama && j.model.family != ModelFamily::kOPT)
    bad(std::string("model family '") + family_name(j.model.family) +
        "' has no hf-trainer schedule yet — supported: llama, opt (Qwen2 is not modelled)");
  if (j.model.family == ModelFamily::kOPT) {
    if (j.model.word_embed_proj_dim != j.model.hidden_size)
      bad("OPT with word_embed_proj_dim != hidden_size (project_in/out, opt-350m) is not modelled");
    if (!j.model.do_layer_norm_before) bad("OPT with do_layer_norm_before = false is not modelled");
    if (j.model.activation_function != "relu") bad("OPT with activation " + j.model.activation_function + " is not modelled");
    if (j.activation_checkpointing) bad("--activation-checkpointing is modelled for llama only");
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
  if (j.fused_kernels)
    bad("--fused-kernels (Liger) is not modelled yet for hf-trainer — drop the flag (docs/predict.md)");
  if (j.grad_accum_steps < 1) bad("--grad-accum-steps must be at least 1");
  if (j.optimizer != "adamw_torch" && j.optimizer != "adamw_torch_fused")
    bad("optimizer " + j.optimizer + " — supported: adamw_torch, adamw_torch_fused");
  if (j.steps < 1 || j.steps > 100) bad("steps must be in [1, 100]");
}

namespace {

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
  bool mixed;     // Trainer bf16=/fp16= (accelerate's convert_outputs_to_fp32)
  bool eager;
  bool dropout = false;  // OPT residual dropout (config "dropout" > 0)
};

// One parameter: its tensor ids across steps.
struct Param {
  u64 bytes = 0;
  Id weight = 0, grad = 0, exp_avg = 0, exp_avg_sq = 0;
  const char* name = "";
};

struct LayerParams {
  Param q, k, v, o, gate, up, down, ln1, ln2;
};

struct Model {
  Param embed;
  std::vector<LayerParams> layers;
  Param norm;
  Param lm_head;  // untied only
  bool tied = true;
  Id inv_freq = 0, inv_freq_orig = 0;
  Id ws_main = 0, ws_autograd = 0;
  std::vector<Param*> order;  // module order: the optimizer's and zero_grad's
  // OPT
  struct OptLayer {
    Param k, kb, v, vb, q, qb, o, ob, ln1w, ln1b, fc1, fc1b, fc2, fc2b, ln2w, ln2b;
  };
  std::vector<OptLayer> opt_layers;
  Param pos, flnw, flnb;
  bool opt = false;
  bool final_ln = true;
};

// What one decoder layer's forward leaves for its backward.
struct RmsSaved {
  Id x32 = 0;      // bf16 input upcast (bf16 weights only); else the input itself is saved
  Id rsqrt = 0;
  Id xr = 0;       // x * rsqrt (fp32); bf16 weights: its bf16 cast
  Id out = 0;      // weight * xr: saved by the next linears when no autocast cast is
};
struct LayerSaved {
  RmsSaved n1, n2;
  Id in_q = 0, in_k = 0, in_v = 0;   // autocast input casts (else n1.out)
  Id wq = 0, wk = 0, wv = 0, wo = 0, wg = 0, wu = 0, wd = 0;  // autocast weight casts
  Id q_embed = 0, q16 = 0, kT = 0;   // scores = q @ k^T operands
  Id probs32 = 0, probs16 = 0, v_rep = 0, v = 0;
  Id lse = 0, attn_out_sdpa = 0;     // flash / mem-efficient sdpa
  Id ctx = 0;                        // attn_output.transpose(1,2).contiguous(): o_proj's input
  Id h1 = 0;                         // residual after attention
  Id in_g = 0, in_u = 0;             // autocast casts of n2.out
  Id gate = 0, act = 0, up = 0, prod = 0;
  Id out = 0;                        // the layer's output (next layer's input)
};

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
  d.e_c = (d.autocast || d.e_w == 2) ? 2 : 4;
  d.e_r = d.e_w;
  d.e_rope = d.e_w;  // cos/sin come in the residual dtype: q (compute dtype) * cos promotes to it
  d.eager = j.attn == "eager";
  d.dropout = j.model.family == ModelFamily::kOPT && j.model.dropout > 0;
  return d;
}

void add_param(Model& m, Param& p, u64 bytes, const char* name) {
  p.bytes = bytes;
  p.name = name;
  m.order.push_back(&p);
}

// Model.to(device): Module._apply visits children before a module's own parameters; the order of
// children is their registration order in __init__.
void load_model(Tape& t, Model& m, const Dims& d, bool tied) {
  m.tied = tied;
  m.layers.resize(d.L);
  add_param(m, m.embed, d.V * d.H * d.e_w, "model.embed_tokens.weight");
  for (auto& l : m.layers) {
    add_param(m, l.q, d.qd * d.H * d.e_w, "q_proj.weight");
    add_param(m, l.k, d.kvd * d.H * d.e_w, "k_proj.weight");
    add_param(m, l.v, d.kvd * d.H * d.e_w, "v_proj.weight");
    add_param(m, l.o, d.H * d.qd * d.e_w, "o_proj.weight");
    add_param(m, l.gate, d.I * d.H * d.e_w, "gate_proj.weight");
    add_param(m, l.up, d.I * d.H * d.e_w, "up_proj.weight");
    add_param(m, l.down, d.H * d.I * d.e_w, "down_proj.weight");
    add_param(m, l.ln1, d.H * d.e_w, "input_layernorm.weight");
    add_param(m, l.ln2, d.H * d.e_w, "post_attention_layernorm.weight");
  }
  add_param(m, m.norm, d.H * d.e_w, "model.norm.weight");
  if (!tied) add_param(m, m.lm_head, d.V * d.H * d.e_w, "lm_head.weight");
  std::size_t i = 0;
  for (Param* p : m.order) {
    p->weight = t.alloc(p->bytes, Category::kWeights, p->name);
    // LlamaRotaryEmbedding's buffers (inv_freq, original_inv_freq: fp32 [head_dim/2]) come after
    // model.norm, before lm_head.
    if (p == &m.norm) {
      m.inv_freq = t.alloc(d.hd / 2 * 4, Category::kInputs, "rotary inv_freq");
      m.inv_freq_orig = t.alloc(d.hd / 2 * 4, Category::kInputs, "rotary original_inv_freq");
    }
    ++i;
  }
}

// The cuBLAS workspace of the calling thread, allocated through the caching allocator at its
// first GEMM and kept for the process's life.
void gemm_workspace(Tape& t, Id& ws) {
  if (ws == 0) ws = t.alloc(kCublasWorkspace, Category::kWorkspace, "cuBLAS workspace");
}

// AccumulateGrad: the first gradient of a parameter becomes its .grad (stolen, no copy); a later
// one is added in place and freed.
void accumulate(Tape& t, Param& p, Id& g) {
  if (p.grad == 0) {
    p.grad = g;
    g = 0;
  } else {
    t.free(g);
  }
}

// LlamaRMSNorm: x.to(fp32); var = x.pow(2).mean(-1, keepdim); x * rsqrt(var + eps);
// weight * x.to(input_dtype).
RmsSaved rms_forward(Tape& t, const Dims& d, Id x) {
  RmsSaved s;
  const u64 n = d.BT * d.H;
  (void)x;
  if (d.e_r == 2) s.x32 = t.alloc(n * 4, A, "rmsnorm x.to(fp32)");
  Id pw = t.alloc(n * 4, Tmp, "rmsnorm pow");
  Id var = t.alloc(d.BT * 4, Tmp, "rmsnorm variance");
  t.free(pw);
  Id add = t.alloc(d.BT * 4, Tmp, "rmsnorm var+eps");
  s.rsqrt = t.alloc(d.BT * 4, A, "rmsnorm rsqrt");
  t.free(add);
  Id xr = 0;
  if (d.e_r == 2) {
    xr = t.alloc(n * 4, Tmp, "rmsnorm x*rsqrt");
    s.xr = t.alloc(n * 2, A, "rmsnorm .to(bf16)");
  } else {
    s.xr = t.alloc(n * 4, A, "rmsnorm x*rsqrt");
  }
  s.out = t.alloc(n * d.e_r, A, "rmsnorm output");
  t.free(xr);
  t.free(var);
  return s;
}

// Its backward, given the gradient of its output `g_in` (freed here). The gradient of its input
// goes into the residual stream's gradient buffer `g_res` in place (autograd's InputBuffer adds
// into the buffer it holds); for the final norm, which has no residual path, it becomes that
// buffer. `x_in` is the norm's input when it is saved (fp32 residual stream): freed here.
// Temporaries as the CUDA trace shows them: g*w and g*h with the weight-grad reduction buffer,
// the x*rsqrt backward, the rsqrt / mean / pow backward.
void rms_backward(Tape& t, const Dims& d, RmsSaved& s, Param& w, Id& g_in, Id& g_res, Id& x_in) {
  const u64 n = d.BT * d.H;
  Id gh = t.alloc(n * d.e_r, Tmp, "rmsnorm grad g*w");
  Id gw_t = t.alloc(n * d.e_r, Tmp, "rmsnorm grad g*h");
  Id gw = t.alloc(d.H * d.e_w, Category::kGradients, "norm weight grad");
  Id red = t.alloc(n * 8, Tmp, "rmsnorm weight-grad reduction buffer");
  Id part = t.alloc(64, Tmp, "reduction partials");
  t.free(part);
  t.free(red);
  t.free(gw_t);
  accumulate(t, w, gw);
  t.free(g_in);
  t.free(s.out);
  t.free(s.xr);
  if (d.e_r == 2) {  // .to(bf16) backward: the gradient back to fp32
    Id gh32 = t.alloc(n * 4, Tmp, "rmsnorm grad to fp32");
    t.free(gh);
    gh = gh32;
  }
  Id prod = t.alloc(n * 4, Tmp, "rmsnorm grad g*x (for rsqrt)");
  Id gx = t.alloc(n * 4, Tmp, "rmsnorm grad g*rsqrt");
  Id gr = t.alloc(d.BT * 4, Tmp, "rmsnorm grad sum");
  t.free(prod);
  t.free(gh);
  Id s1 = t.alloc(d.BT * 4, Tmp, "rsqrt backward");
  Id s2 = t.alloc(d.BT * 4, Tmp, "rsqrt backward");
  Id s3 = t.alloc(d.BT * 4, Tmp, "mean backward");
  t.free(s2);
  t.free(s1);
  t.free(gr);
  t.free(s.rsqrt);
  Id gm = t.alloc(n * 4, Tmp, "mean backward expand");
  t.free(s3);
  Id gp1 = t.alloc(n * 4, Tmp, "pow backward");
  Id gp2 = t.alloc(n * 4, Tmp, "pow backward");
  Id gp3 = t.alloc(n * 4, Tmp, "pow backward");
  t.free(gp2);
  t.free(gp1);
  t.free(gm);
  t.free(x_in);
  t.free(s.x32);
  if (d.e_r == 2) {
    t.free(gp3);  // summed into gx (fp32), then x.to(fp32) backward casts to bf16
    Id gb = t.alloc(n * 2, Tmp, "rmsnorm input grad (bf16)");
    t.free(gx);
    gx = gb;
  } else if (g_res == 0) {
    t.free(gp3);  // summed into gx, which becomes the residual buffer
  }
  if (g_res == 0) {
    g_res = gx;
    gx = 0;
  } else {
    t.free(gx);
    t.free(gp3);
  }
}

// y = x @ W^T in the compute dtype. Autocast: the weight's cast (cached for the forward, saved by
// the matmul) and the input's cast (saved) come first.
Id linear_forward(Tape& t, const Dims& d, Model& m, Param& p, Id in, u64 in_f, u64 out_f, bool in_is_compute,
                  Id& wcast, Id& incast, const char* label) {
  if (d.autocast) {
    wcast = t.alloc(in_f * out_f * 2, Category::kAutocastCache, "autocast weight cast");
    if (!in_is_compute) incast = t.alloc(d.BT * in_f * 2, A, "autocast input cast");
  }
  (void)in;
  gemm_workspace(t, m.ws_main);
  return t.alloc(d.BT * out_f * d.e_c, A, label);
}

// Its backward: weight grad first (cuBLAS order in mm_mat1/mat2 backward), then the input grad;
// under autocast the input grad is cast back to fp32 when the input was a cast.
Id linear_backward(Tape& t, const Dims& d, Model& m, Param& p, Id& g, u64 in_f, u64 out_f, Id& wcast,
                   Id& incast, bool in_was_cast) {
  gemm_workspace(t, m.ws_autograd);
  Id gw16 = 0;
  if (d.autocast) {
    gw16 = t.alloc(in_f * out_f * 2, Tmp, "weight grad (autocast dtype)");
  } else {
    Id gw = t.alloc(in_f * out_f * d.e_w, Category::kGradients, "weight grad");
    accumulate(t, p, gw);
  }
  Id gin = t.alloc(d.BT * in_f * d.e_c, Tmp, "input grad");
  t.free(g);
  t.free(wcast);
  t.free(incast);
  if (d.autocast && in_was_cast) {
    Id g32 = t.alloc(d.BT * in_f * 4, Tmp, "input grad (fp32)");
    t.free(gin);
    gin = g32;
  }
  if (d.autocast) {
    Id gw = t.alloc(in_f * out_f * 4, Category::kGradients, "weight grad");
    t.free(gw16);
    accumulate(t, p, gw);
  }
  return gin;
}

// apply_rotary_pos_emb for one of q / k ([B, heads, T, hd] view of the projection):
// x * cos + rotate_half(x) * sin, rotate_half = cat(-x2, x1).
Id rope_forward(Tape& t, const Dims& d, u64 width) {
  const u64 n = d.BT * width;
  Id xc = t.alloc(n * d.e_rope, Tmp, "rope x*cos");
  Id neg = t.alloc(n / 2 * d.e_c, Tmp, "rope -x2");
  Id cat = t.alloc(n * d.e_c, Tmp, "rope cat");
  t.free(neg);
  Id rs = t.alloc(n * d.e_rope, Tmp, "rope rot*sin");
  t.free(cat);
  Id out = t.alloc(n * d.e_rope, A, "rope output");
  t.free(xc);
  t.free(rs);
  return out;
}

// Its backward: g*cos, g*sin, rotate_half's cat/neg/slice backward, summed.
Id rope_backward(Tape& t, const Dims& d, u64 width, Id& g) {
  const u64 n = d.BT * width;
  Id gc = t.alloc(n * d.e_rope, Tmp, "rope grad g*cos");
  Id gs = t.alloc(n * d.e_rope, Tmp, "rope grad g*sin");
  t.free(g);
  Id gs_c = 0;
  if (d.e_rope != d.e_c) {  // grad of rotate_half(x), cast to x's dtype
    gs_c = t.alloc(n * d.e_c, Tmp, "rope grad to compute dtype");
    t.free(gs);
    gs = gs_c;
  }
  Id neg = t.alloc(n / 2 * d.e_c, Tmp, "rope grad neg");
  Id s1 = t.alloc(n * d.e_c, Tmp, "rope grad slice");
  Id s2 = t.alloc(n * d.e_c, Tmp, "rope grad slice");
  t.free(neg);
  t.free(gs);
  t.free(s1);
  t.free(s2);
  if (d.e_rope != d.e_c) {
    Id gcc = t.alloc(n * d.e_c, Tmp, "rope grad to compute dtype");
    t.free(gc);
    gc = gcc;
  }
  return gc;
}

void layer_forward(Tape& t, const Dims& d, Model& m, LayerParams& p, LayerSaved& s, Id x, Id mask) {
  (void)mask;
  s.n1 = rms_forward(t, d, x);
  const bool ac = d.autocast;
  Id q = linear_forward(t, d, m, p.q, s.n1.out, d.H, d.qd, false, s.wq, s.in_q, "q_proj output");
  Id k = linear_forward(t, d, m, p.k, s.n1.out, d.H, d.kvd, false, s.wk, s.in_k, "k_proj output");
  s.v = linear_forward(t, d, m, p.v, s.n1.out, d.H, d.kvd, false, s.wv, s.in_v, "v_proj output");
  s.q_embed = rope_forward(t, d, d.qd);
  Id k_embed = rope_forward(t, d, d.kvd);
  t.free(q);
  t.free(k);
  const u64 rep = d.nh / d.nkv;
  const u64 bhtt = d.B * d.nh * d.T * d.T;
  if (d.eager || d.e_c == 4) {
    // eager_attention_forward. sdpa in fp32 runs the same way: there is no fp32 flash kernel and
    // the memory-efficient kernel takes no GQA, so PyTorch falls back to the math path, which
    // allocates as eager (measured identical to the byte on the H200).
    // repeat_kv: expand + reshape, a copy when heads are grouped.
    Id k_rep = rep > 1 ? t.alloc(d.BT * d.qd * d.e_rope, Tmp, "repeat_kv(key)") : 0;
    s.v_rep = rep > 1 ? t.alloc(d.BT * d.qd * d.e_c, A, "repeat_kv(value)") : 0;
    // torch.matmul(q, k^T): under autocast both operands are cast (q's cast saved); bmm takes the
    // transposed key made contiguous (saved).
    Id kcast = 0;
    if (ac) {
      s.q16 = t.alloc(d.BT * d.qd * 2, A, "autocast cast of q");
      kcast = t.alloc(d.BT * d.qd * 2, Tmp, "autocast cast of k");
    }
    s.kT = t.alloc(d.BT * d.qd * d.e_c, A, "k^T contiguous for bmm");
    Id scores = t.alloc(bhtt * d.e_c, Tmp, "attention scores");
    t.free(kcast);
    Id scaled = t.alloc(bhtt * d.e_c, Tmp, "scores * scaling");
    t.free(scores);
    // + causal mask, which is in the embeddings' dtype (fp32 under autocast: the sum is fp32)
    const u64 e_masked = std::max(d.e_c, d.e_r);
    Id masked = t.alloc(bhtt * e_masked, Tmp, "scores + mask");
    t.free(scaled);
    // softmax(dtype=fp32) converts a bf16 input to fp32 first (a transient copy)
    Id conv = e_masked != 4 ? t.alloc(bhtt * 4, Tmp, "softmax input .to(fp32)") : 0;
    s.probs32 = t.alloc(bhtt * 4, A, "softmax(dtype=fp32)");
    t.free(conv);
    // .to(query.dtype) is a cast when q is bf16 (bf16 weights); autocast's matmul casts it too.
    if (d.e_rope == 2 || ac) s.probs16 = t.alloc(bhtt * 2, A, ac ? "autocast cast of probs" : "probs.to(bf16)");
    t.free(masked);  // attn_weights is rebound
    Id o = t.alloc(d.BT * d.qd * d.e_c, Tmp, "probs @ v");
    s.ctx = t.alloc(d.BT * d.qd * d.e_c, A, "attn_output.transpose(1,2).contiguous()");
    t.free(o);
    t.free(k_rep);
  } else {
    // sdpa on the flash kernel with enable_gqa (no S x S matrix): saves q, k, v, the output and
    // the log-sum-exp (fp32 [B, heads, T]); modelled from the kernel's source
    // (aten/src/ATen/native/transformers/cuda/attention.cu, flash_api.cpp), not traced. Under
    // autocast q and k (fp32 after rope) are cast to bf16 and the casts saved.
    if (ac) {
      s.q16 = t.alloc(d.BT * d.qd * 2, A, "autocast cast of q");
      s.kT = t.alloc(d.BT * d.kvd * 2, A, "autocast cast of k");
      t.free(s.q_embed);
      t.free(k_embed);
    } else {
      s.kT = k_embed;
      k_embed = 0;
    }
    s.attn_out_sdpa = t.alloc(d.BT * d.qd * d.e_c, A, "flash attention output");
    s.lse = t.alloc(d.B * d.nh * d.T * 4, A, "flash attention log-sum-exp");
    // flash returns a transposed view of a [B, T, heads, hd] buffer: .transpose(1,2).contiguous()
    // is then a no-op, and o_proj saves the same storage.
    s.ctx = 0;
  }
  Id ctx_unused = 0;
  Id o_out = linear_forward(t, d, m, p.o, s.ctx, d.qd, d.H, true, s.wo, ctx_unused, "o_proj output");
  // LlamaAttention.forward returns: its locals go.
  if (d.eager || d.e_c == 4) {
    t.free(k_embed);
    if (ac) t.free(s.q_embed);  // its cast is what bmm saved
    if (rep > 1) t.free(s.v);   // the repeated copy is saved instead
  }
  if (ac) t.free(s.n1.out);  // the input casts of q/k/v were saved, not the fp32 normalized input
  s.h1 = t.alloc(d.BT * d.H * d.e_r, A, "residual + attention");
  t.free(o_out);
  s.n2 = rms_forward(t, d, s.h1);
  s.gate = linear_forward(t, d, m, p.gate, s.n2.out, d.H, d.I, false, s.wg, s.in_g, "gate_proj output");
  s.act = t.alloc(d.BT * d.I * d.e_c, A, "silu(gate)");
  s.up = linear_forward(t, d, m, p.up, s.n2.out, d.H, d.I, false, s.wu, s.in_u, "up_proj output");
  s.prod = t.alloc(d.BT * d.I * d.e_c, A, "silu(gate) * up");
  Id in_d = 0;
  Id down = linear_forward(t, d, m, p.down, s.prod, d.I, d.H, true, s.wd, in_d, "down_proj output");
  if (ac) t.free(s.n2.out);
  s.out = t.alloc(d.BT * d.H * d.e_r, A, "residual + mlp");
  t.free(down);
}

// Backward of one layer, given the gradient of its output `g` (residual dtype); returns the
// gradient of its input.
// Without autocast (fp32, or bf16 weights), eager attention's backward down to the layer's input,
// in the order the recorded CUDA run shows: probs @ v backward (the output gradient made
// contiguous; grad v before grad probs), softmax backward through its fp32 upcast (with one
// transient of the probs' size), the scaling, q @ k^T backward, repeat_kv's sums, rotary
// backward, then v/k/q projections each on a contiguous copy of its output gradient, their input
// gradients summed (the first sum out of place), then input_layernorm.
void eager_attention_backward_plain(Tape& t, const Dims& d, Model& m, LayerParams& p, LayerSaved& s, Id& g_ctx,
                                    Id& g_res, Id& x_in) {
  const u64 e = d.e_c;
  const u64 rep = d.nh / d.nkv;
  const u64 bhtt = d.B * d.nh * d.T * d.T;
  const u64 nq = d.BT * d.qd, nk = d.BT * d.kvd;
  Id gc = t.alloc(nq * e, Tmp, "grad contiguous");
  t.free(g_ctx);
  Id gv_rep = t.alloc(nq * e, Tmp, "grad v (repeated)");
  Id gp = t.alloc(bhtt * e, Tmp, "grad probs");
  t.free(gc);
  t.free(s.v_rep);
  t.free(s.probs16);
  if (e != 4) {
    Id gp32 = t.alloc(bhtt * 4, Tmp, "grad probs to fp32");
    t.free(gp);
    gp = gp32;
  }
  Id gsm = t.alloc(bhtt * 4, Tmp, "softmax backward");
  Id tmp = t.alloc(bhtt * 4, Tmp, "softmax backward grad*out");
  t.free(tmp);
  t.free(gp);
  t.free(s.probs32);
  if (e != 4) {
    Id g16 = t.alloc(bhtt * e, Tmp, "softmax backward to the input dtype");
    t.free(gsm);
    gsm = g16;
  }
  Id gsc = t.alloc(bhtt * e, Tmp, "scaling backward");
  t.free(gsm);
  Id gk_rep = t.alloc(nq * e, Tmp, "grad k (repeated)");
  Id gq = t.alloc(nq * e, Tmp, "grad q");
  t.free(gsc);
  t.free(s.kT);
  t.free(s.q_embed);
  Id gv = gv_rep, gk = gk_rep;
  if (rep > 1) {
    gv = t.alloc(nk * e, Tmp, "repeat_kv backward (v)");
    t.free(gv_rep);
    gk = t.alloc(nk * e, Tmp, "repeat_kv backward (k)");
    t.free(gk_rep);
  }
  auto rope_bw = [&](Id& g, u64 n) {
    Id a = t.alloc(n * e, Tmp, "rope grad g*sin");
    Id neg = t.alloc(n / 2 * e, Tmp, "rope grad neg");
    Id res = t.alloc(n * e, Tmp, "rope grad");
    t.free(neg);
    Id c = t.alloc(n * e, Tmp, "rope grad g*cos");
    t.free(a);
    t.free(c);
    Id acc = t.alloc(n * e, Tmp, "rope grad sum");
    t.free(g);
    t.free(acc);
    return res;
  };
  Id gk2 = rope_bw(gk, nk);
  Id gq2 = rope_bw(gq, nq);
  auto proj_bw = [&](Param& w, Id& g, u64 out_f) {
    Id cont = t.alloc(d.BT * out_f * e, Tmp, "grad contiguous");
    t.free(g);
    gemm_workspace(t, m.ws_autograd);
    Id gw = t.alloc(out_f * d.H * d.e_w, Category::kGradients, "weight grad");
    accumulate(t, w, gw);
    Id gin = t.alloc(d.BT * d.H * e, Tmp, "input grad");
    t.free(cont);
    return gin;
  };
  Id gin_v = proj_bw(p.v, gv, d.kvd);
  Id gin_k = proj_bw(p.k, gk2, d.kvd);
  Id sum = t.alloc(d.BT * d.H * e, Tmp, "input grad sum");
  t.free(gin_v);
  t.free(gin_k);
  Id gin_q = proj_bw(p.q, gq2, d.qd);
  t.free(s.n1.out);
  t.free(gin_q);  // added in place into the sum
  t.free(s.v);
  rms_backward(t, d, s.n1, p.ln1, sum, g_res, x_in);
}

void layer_backward(Tape& t, const Dims& d, Model& m, LayerParams& p, LayerSaved& s, Id& g_res, Id& x_in) {
  const bool ac = d.autocast;
  const u64 rep = d.nh / d.nkv;
  const u64 bhtt = d.B * d.nh * d.T * d.T;
  // residual: g flows to h1 unchanged; the mlp branch gets it (cast to bf16 under autocast).
  Id gprod;
  if (ac) {
    Id gd = t.alloc(d.BT * d.H * 2, Tmp, "grad .to(bf16) into the mlp branch");  // of g_res
    Id none = 0;
    gprod = linear_backward(t, d, m, p.down, gd, d.I, d.H, s.wd, none, false);
  } else {
    gemm_workspace(t, m.ws_autograd);
    Id gw = t.alloc(d.H * d.I * d.e_w, Category::kGradients, "weight grad");
    accumulate(t, p.down, gw);
    gprod = t.alloc(d.BT * d.I * d.e_c, Tmp, "input grad");
  }
  t.free(s.prod);
  Id g_act = t.alloc(d.BT * d.I * d.e_c, Tmp, "mul grad wrt silu");
  Id g_up = t.alloc(d.BT * d.I * d.e_c, Tmp, "mul grad wrt up");
  t.free(gprod);
  t.free(s.up);
  t.free(s.act);
  Id gn2 = linear_backward(t, d, m, p.up, g_up, d.H, d.I, s.wu, s.in_u, ac);
  Id g_gate = t.alloc(d.BT * d.I * d.e_c, Tmp, "silu backward");
  t.free(g_act);
  t.free(s.gate);
  Id gn2b = linear_backward(t, d, m, p.gate, g_gate, d.H, d.I, s.wg, s.in_g, ac);
  if (ac) {
    t.free(gn2b);  // added in place into the fp32 buffer (a cast it owns)
  } else {
    // autograd's InputBuffer: the first sum of two matmul outputs is out of place
    Id sum = t.alloc(d.BT * d.H * d.e_c, Tmp, "input grad sum");
    t.free(gn2);
    t.free(gn2b);
    gn2 = sum;
  }
  if (!ac) t.free(s.n2.out);
  rms_backward(t, d, s.n2, p.ln2, gn2, g_res, s.h1);
  // attention branch
  Id g_ctx;
  if (ac) {
    Id gc_in = t.alloc(d.BT * d.H * 2, Tmp, "grad .to(bf16) into the attention branch");
    Id none = 0;
    g_ctx = linear_backward(t, d, m, p.o, gc_in, d.qd, d.H, s.wo, none, false);
  } else {
    gemm_workspace(t, m.ws_autograd);
    Id gw = t.alloc(d.H * d.qd * d.e_w, Category::kGradients, "weight grad");
    accumulate(t, p.o, gw);
    g_ctx = t.alloc(d.BT * d.qd * d.e_c, Tmp, "input grad");
  }
  t.free(s.ctx);
  Id gq, gk, gv;
  if (!ac && (d.eager || d.e_c == 4)) {
    eager_attention_backward_plain(t, d, m, p, s, g_ctx, g_res, x_in);
    return;
  }
  if (d.eager || d.e_c == 4) {
    // probs @ v backward: grad probs and grad v (the transposed gradient made contiguous first)
    Id gc = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad contiguous");
    t.free(g_ctx);
    Id gp = t.alloc(bhtt * d.e_c, Tmp, "grad probs");
    Id gv_rep = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad v (repeated)");
    t.free(gc);
    t.free(s.v_rep);
    Id gp32 = gp;
    if (s.probs16 != 0) {
      t.free(s.probs16);
      if (ac || d.e_rope == 2) {
        gp32 = t.alloc(bhtt * 4, Tmp, "grad probs to fp32");
        t.free(gp);
      }
    }
    Id gsm = t.alloc(bhtt * 4, Tmp, "softmax backward");
    t.free(gp32);
    t.free(s.probs32);
    Id gsc = gsm;
    if (d.e_c != 4) {
      gsc = t.alloc(bhtt * d.e_c, Tmp, "grad scores to compute dtype");
      t.free(gsm);
    }
    Id gsc2 = t.alloc(bhtt * d.e_c, Tmp, "scaling backward");
    t.free(gsc);
    Id gq_ = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad q");
    Id gkT = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad k^T");
    t.free(gsc2);
    t.free(s.kT);
    t.free(s.q16);
    if (!ac) t.free(s.q_embed);
    gq = gq_;
    if (ac) {
      gq = t.alloc(d.BT * d.qd * 4, Tmp, "grad q to fp32");
      t.free(gq_);
      Id gk32 = t.alloc(d.BT * d.qd * 4, Tmp, "grad k to fp32");
      t.free(gkT);
      gkT = gk32;
    }
    // repeat_kv backward: sum over the groups
    if (rep > 1) {
      gk = t.alloc(d.BT * d.kvd * d.e_rope, Tmp, "repeat_kv backward (k)");
      t.free(gkT);
      gv = t.alloc(d.BT * d.kvd * d.e_c, Tmp, "repeat_kv backward (v)");
      t.free(gv_rep);
    } else {
      gk = gkT;
      gv = gv_rep;
    }
  } else {
    // flash backward (flash_api.cpp mha_bwd): dq, dk, dv, the fp32 dq accumulator and softmax_d,
    // and with grouped heads the expanded dk / dv that are summed into the grouped ones.
    gq = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad q");
    gk = t.alloc(d.BT * d.kvd * d.e_c, Tmp, "grad k");
    gv = t.alloc(d.BT * d.kvd * d.e_c, Tmp, "grad v");
    Id softmax_d = t.alloc(d.B * d.nh * d.T * 4, Tmp, "flash softmax_d");
    Id dq_acc = t.alloc(d.BT * d.qd * 4, Tmp, "flash dq accumulator");
    Id dk_exp = rep > 1 ? t.alloc(d.BT * d.qd * d.e_c, Tmp, "flash dk expanded") : 0;
    Id dv_exp = rep > 1 ? t.alloc(d.BT * d.qd * d.e_c, Tmp, "flash dv expanded") : 0;
    t.free(dk_exp);
    t.free(dv_exp);
    t.free(dq_acc);
    t.free(softmax_d);
    t.free(g_ctx);
    t.free(s.attn_out_sdpa);
    t.free(s.lse);
    t.free(s.q16);
    t.free(s.kT);
    t.free(s.q_embed);
    if (ac) {
      Id q32 = t.alloc(d.BT * d.qd * 4, Tmp, "grad q to fp32");
      t.free(gq);
      gq = q32;
      Id k32 = t.alloc(d.BT * d.kvd * 4, Tmp, "grad k to fp32");
      t.free(gk);
      gk = k32;
    }
  }
  Id gq2 = rope_backward(t, d, d.qd, gq);
  Id gk2 = rope_backward(t, d, d.kvd, gk);
  // v_proj, k_proj, q_proj backward (reverse creation order); the input grads sum in place.
  Id gn1 = linear_backward(t, d, m, p.v, gv, d.H, d.kvd, s.wv, s.in_v, ac);
  Id gn1k = linear_backward(t, d, m, p.k, gk2, d.H, d.kvd, s.wk, s.in_k, ac);
  t.free(gn1k);
  Id gn1q = linear_backward(t, d, m, p.q, gq2, d.H, d.qd, s.wq, s.in_q, ac);
  t.free(gn1q);
  t.free(s.v);
  if (!ac) t.free(s.n1.out);
  rms_backward(t, d, s.n1, p.ln1, gn1, g_res, x_in);
}

// Activation checkpointing (transformers 5.17: torch.utils.checkpoint with use_reentrant=False):
// the layer runs with its saved tensors packed into handles, so they go as soon as nothing else
// holds them; what stays is the checkpoint frame's arguments (the layer input, the mask and the
// rotary tables) and, under autocast, the weight casts in autocast's cache until the forward ends.
void drop_saved(Tape& t, LayerSaved& s) {
  Id* ids[] = {&s.n1.x32, &s.n1.rsqrt, &s.n1.xr, &s.n1.out, &s.n2.x32, &s.n2.rsqrt, &s.n2.xr, &s.n2.out,
               &s.in_q,   &s.in_k,    &s.in_v,  &s.q_embed, &s.q16,   &s.kT,       &s.probs32, &s.probs16,
               &s.v_rep,  &s.v,       &s.lse,   &s.attn_out_sdpa, &s.ctx, &s.h1,   &s.in_g,   &s.in_u,
               &s.gate,   &s.act,     &s.up,    &s.prod};
  for (Id* id : ids) t.free(*id);
}

// The LM head and ForCausalLMLoss, shared by the families: lm_head on the last hidden states
// (logits_to_keep = 0: all positions); the loss: logits.float() (a copy unless fp32), labels
// padded and shifted (no logits copy), cross_entropy = log_softmax (saved, fp32) + nll_loss; the
// autocast cache goes when the forward returns; accelerate's convert_outputs_to_fp32 under mixed
// precision; compute_loss returns and the outputs go. Ends at the backward marker.
struct Head {
  Id wl = 0, inl = 0, shift = 0, ls = 0;
  Id scalars[5] = {};
};

Head head_forward(Tape& t, const Dims& d, std::vector<Id>& cached_casts, Id& final_out, Id& ids) {
  Head h;
  Id& wl = h.wl;
  Id& inl = h.inl;
  Id logits = 0;
  if (d.autocast) {
    wl = t.alloc(d.V * d.H * 2, Category::kAutocastCache, "autocast cast of lm_head.weight");
    inl = t.alloc(d.BT * d.H * 2, A, "autocast cast of final norm output");
  }
  logits = t.alloc(d.BT * d.V * d.e_c, Category::kLogitsLoss, "logits");
  // ForCausalLMLoss: logits.float() (a copy unless fp32), labels padded and shifted (no logits
  // copy), cross_entropy = log_softmax (saved, fp32) + nll_loss.
  Id lf = d.e_c == 4 ? 0 : t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "logits.float()");
  Id pad = t.alloc(d.B * (d.T + 1) * 8, Category::kInputs, "labels padded with -100");
  h.shift = t.alloc(d.BT * 8, Category::kInputs, "shift_labels (saved by nll_loss)");
  h.ls = t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "log_softmax (saved)");
  // nll_loss's total weight and the loss, num_items_in_batch and its device copy (0-d tensors
  // alive until backward is done: the scalars the CPU trace shows live at backward)
  Id* sc = h.scalars;
  Id init[5] = {t.alloc(4, Category::kLogitsLoss, "nll_loss total_weight"),
                   t.alloc(4, Category::kLogitsLoss, "loss"),
                   t.alloc(8, Category::kInputs, "num_items_in_batch"),
                   t.alloc(8, Category::kInputs, "ignore mask count"),
                   t.alloc(8, Category::kInputs, "num_items_in_batch (device)")};
  for (int i = 0; i < 5; ++i) sc[i] = init[i];
  t.free(lf);
  t.free(pad);
  for (Id& c : cached_casts) t.free(c);  // autocast exits: its cache goes
  if (d.autocast) t.free(final_out);
  // accelerate's convert_outputs_to_fp32 (mixed precision): the model's outputs cast to fp32.
  Id out32 = d.mixed && d.e_c != 4 ? t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "outputs to fp32 (accelerate)")
                                   : 0;
  t.free(logits);
  t.free(out32);  // compute_loss returns: the outputs go
  t.free(ids);
  t.phase("backward");
  return h;
}

// Its backward down to the gradient of the final norm's output.
Id head_backward(Tape& t, const Dims& d, Model& m, Param& head, Head& h, Id& final_out) {
  Id& wl = h.wl;
  Id& inl = h.inl;
  // nll_loss backward, log_softmax backward
  Id g_nll = t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "nll_loss backward");
  Id g_ls = t.alloc(d.BT * d.V * 4, Category::kLogitsLoss, "log_softmax backward");
  t.free(g_nll);
  t.free(h.ls);
  t.free(h.shift);
  for (Id& sc : h.scalars) t.free(sc);
  Id g_logits = g_ls;
  if (d.e_c != 4) {
    g_logits = t.alloc(d.BT * d.V * d.e_c, Category::kLogitsLoss, "grad logits (compute dtype)");
    t.free(g_ls);
  }
  // lm_head backward
  gemm_workspace(t, m.ws_autograd);
  Id gh;
  if (d.autocast) {
    Id gw16 = t.alloc(d.V * d.H * 2, Tmp, "lm_head weight grad (bf16)");
    Id gin16 = t.alloc(d.BT * d.H * 2, Tmp, "grad final norm output");
    t.free(g_logits);
    t.free(wl);
    t.free(inl);
    gh = t.alloc(d.BT * d.H * 4, Tmp, "grad final norm output (fp32)");
    t.free(gin16);
    Id gw = t.alloc(d.V * d.H * 4, Category::kGradients, "lm_head weight grad");
    t.free(gw16);
    accumulate(t, head, gw);
  } else {
    Id gw = t.alloc(d.V * d.H * d.e_w, Category::kGradients, "lm_head weight grad");
    gh = t.alloc(d.BT * d.H * d.e_c, Tmp, "grad final norm output");
    t.free(g_logits);
    accumulate(t, head, gw);
  }
  if (!d.autocast) t.free(final_out);
  return gh;
}


// ---- OPT (transformers' OPTForCausalLM: pre-LayerNorm, learned positions, biases, ReLU) ----

// Model.to(device) for OPT: OPTDecoder registers embed_tokens, embed_positions, (project_out /
// project_in when word_embed_proj_dim differs: refused), final_layer_norm, then the layers; a
// layer: self_attn (k, v, q, out_proj), self_attn_layer_norm, fc1, fc2, final_layer_norm.
void load_opt(Tape& t, Model& m, const Dims& d, const ModelConfig& c) {
  m.opt = true;
  m.tied = c.tie_word_embeddings;
  m.final_ln = c.has_final_layer_norm();
  m.opt_layers.resize(d.L);
  const u64 e = d.e_w, H = d.H, I = d.I;
  add_param(m, m.embed, d.V * H * e, "model.decoder.embed_tokens.weight");
  add_param(m, m.pos, (static_cast<u64>(c.max_position_embeddings) + 2) * H * e, "embed_positions.weight");
  if (m.final_ln) {
    add_param(m, m.flnw, H * e, "decoder.final_layer_norm.weight");
    add_param(m, m.flnb, H * e, "decoder.final_layer_norm.bias");
  }
  for (auto& l : m.opt_layers) {
    add_param(m, l.k, H * H * e, "k_proj.weight");
    add_param(m, l.kb, H * e, "k_proj.bias");
    add_param(m, l.v, H * H * e, "v_proj.weight");
    add_param(m, l.vb, H * e, "v_proj.bias");
    add_param(m, l.q, H * H * e, "q_proj.weight");
    add_param(m, l.qb, H * e, "q_proj.bias");
    add_param(m, l.o, H * H * e, "out_proj.weight");
    add_param(m, l.ob, H * e, "out_proj.bias");
    add_param(m, l.ln1w, H * e, "self_attn_layer_norm.weight");
    add_param(m, l.ln1b, H * e, "self_attn_layer_norm.bias");
    add_param(m, l.fc1, I * H * e, "fc1.weight");
    add_param(m, l.fc1b, I * e, "fc1.bias");
    add_param(m, l.fc2, H * I * e, "fc2.weight");
    add_param(m, l.fc2b, H * e, "fc2.bias");
    add_param(m, l.ln2w, H * e, "final_layer_norm.weight");
    add_param(m, l.ln2b, H * e, "final_layer_norm.bias");
  }
  if (!m.tied) add_param(m, m.lm_head, d.V * H * e, "lm_head.weight");
  for (Param* p : m.order) p->weight = t.alloc(p->bytes, Category::kWeights, p->name);
}

struct LnSaved {
  Id out = 0, mean = 0, rstd = 0;
};
// nn.LayerNorm (native_layer_norm): the output, and the fp32 mean / rstd it saves with its input.
LnSaved ln_forward(Tape& t, const Dims& d) {
  LnSaved s;
  s.out = t.alloc(d.BT * d.H * d.e_r, A, "layer_norm output");
  s.mean = t.alloc(d.BT * 4, A, "layer_norm mean");
  s.rstd = t.alloc(d.BT * 4, A, "layer_norm rstd");
  return s;
}
// native_layer_norm_backward: the input gradient (added into the residual buffer, or becoming it)
// and the weight / bias gradients.
void ln_backward(Tape& t, const Dims& d, LnSaved& s, Param& w, Param& b, Id& g_in, Id& g_res, Id& x_in) {
  Id gx = t.alloc(d.BT * d.H * d.e_r, Tmp, "layer_norm input grad");
  Id gw = t.alloc(d.H * d.e_w, Category::kGradients, "layer_norm weight grad");
  Id gb = t.alloc(d.H * d.e_w, Category::kGradients, "layer_norm bias grad");
  t.free(g_in);
  t.free(s.out);
  t.free(s.mean);
  t.free(s.rstd);
  t.free(x_in);
  accumulate(t, w, gw);
  accumulate(t, b, gb);
  if (g_res == 0) {
    g_res = gx;
  } else {
    t.free(gx);
  }
}

struct OptSaved {
  LnSaved ln1, ln2;
  Id in_q = 0, in_k = 0, in_v = 0, in_fc1 = 0;
  Id casts[16] = {};
  int ncasts = 0;
  Id qc = 0, kT = 0, vc = 0, probs32 = 0, probs16 = 0, ctx = 0, lse = 0, attn_out = 0, q_s = 0, k = 0, v = 0;
  Id h1 = 0, relu = 0, out = 0;
  Id mask1 = 0, mask2 = 0;  // dropout masks (config dropout > 0)
};

// Linear with bias (addmm): autocast casts the weight and the bias (cached) and the input (saved).
Id opt_linear(Tape& t, const Dims& d, Model& m, OptSaved& s, u64 in_f, u64 out_f, bool in_is_compute, Id* incast,
              const char* label) {
  if (d.autocast) {
    s.casts[s.ncasts++] = t.alloc(in_f * out_f * 2, Category::kAutocastCache, "autocast weight cast");
    s.casts[s.ncasts++] = t.alloc(out_f * 2, Category::kAutocastCache, "autocast bias cast");
    if (!in_is_compute && incast != nullptr) *incast = t.alloc(d.BT * in_f * 2, A, "autocast input cast");
  }
  gemm_workspace(t, m.ws_main);
  return t.alloc(d.BT * out_f * d.e_c, A, label);
}

void opt_layer_forward(Tape& t, const Dims& d, Model& m, OptSaved& s, Id mask) {
  (void)mask;
  const u64 nq = d.BT * d.H, bhtt = d.B * d.nh * d.T * d.T;
  const bool ac = d.autocast;
  s.ln1 = ln_forward(t, d);
  Id q = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_q, "q_proj output");
  s.q_s = t.alloc(nq * d.e_c, Tmp, "q * scaling");
  t.free(q);
  s.k = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_k, "k_proj output");
  s.v = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_v, "v_proj output");
  if (d.eager || d.e_c == 4) {
    // [B, heads, T, hd] views of [B, T, H] buffers: bmm needs copies of q and k^T (saved)
    s.qc = t.alloc(nq * d.e_c, A, "q contiguous for bmm");
    s.kT = t.alloc(nq * d.e_c, A, "k^T contiguous for bmm");
    Id scores = t.alloc(bhtt * d.e_c, Tmp, "attention scores");
    Id scaled = t.alloc(bhtt * d.e_c, Tmp, "scores * 1.0");
    t.free(scores);
    const u64 e_masked = std::max(d.e_c, d.e_r);
    Id masked = t.alloc(bhtt * e_masked, Tmp, "scores + mask");
    t.free(scaled);
    Id conv = e_masked != 4 ? t.alloc(bhtt * 4, Tmp, "softmax input .to(fp32)") : 0;
    s.probs32 = t.alloc(bhtt * 4, A, "softmax(dtype=fp32)");
    t.free(conv);
    if (d.e_c == 2) s.probs16 = t.alloc(bhtt * 2, A, "probs.to(query dtype)");
    t.free(masked);
    s.vc = t.alloc(nq * d.e_c, A, "v contiguous for bmm");
    Id o = t.alloc(nq * d.e_c, Tmp, "probs @ v");
    s.ctx = t.alloc(nq * d.e_c, A, "attn_output.transpose(1,2).contiguous()");
    t.free(o);
  } else {
    s.attn_out = t.alloc(nq * d.e_c, A, "flash attention output");
    s.lse = t.alloc(d.B * d.nh * d.T * 4, A, "flash attention log-sum-exp");
  }
  Id o_out = opt_linear(t, d, m, s, d.H, d.H, true, nullptr, "out_proj output");
  if (d.eager || d.e_c == 4) {  // locals of the attention go; flash saved q, k, v themselves
    t.free(s.q_s);
    t.free(s.k);
    t.free(s.v);
  }
  if (ac) t.free(s.ln1.out);
  if (d.dropout) {  // F.dropout(p > 0) on CUDA: native_dropout's output and its saved bool mask
    Id dr = t.alloc(nq * d.e_c, Tmp, "dropout output");
    s.mask1 = t.alloc(nq, A, "dropout mask");
    t.free(o_out);
    o_out = dr;
  }
  s.h1 = t.alloc(nq * d.e_r, A, "residual + attention");
  t.free(o_out);
  s.ln2 = ln_forward(t, d);
  Id fc1 = opt_linear(t, d, m, s, d.H, d.I, false, &s.in_fc1, "fc1 output");
  s.relu = t.alloc(d.BT * d.I * d.e_c, A, "relu (saved)");
  t.free(fc1);
  Id fc2 = opt_linear(t, d, m, s, d.I, d.H, true, nullptr, "fc2 output");
  if (ac) t.free(s.ln2.out);
  if (d.dropout) {
    Id dr = t.alloc(nq * d.e_c, Tmp, "dropout output");
    s.mask2 = t.alloc(nq, A, "dropout mask");
    t.free(fc2);
    fc2 = dr;
  }
  s.out = t.alloc(nq * d.e_r, A, "residual + mlp");
  t.free(fc2);
}

// addmm backward: weight grad, input grad, bias grad (a reduction over the rows).
Id opt_linear_backward(Tape& t, const Dims& d, Model& m, Param& w, Param& b, Id& g, u64 in_f, u64 out_f,
                       bool in_was_cast, bool contiguous_copy) {
  gemm_workspace(t, m.ws_autograd);
  Id cont = contiguous_copy ? t.alloc(d.BT * out_f * d.e_c, Tmp, "grad contiguous") : 0;
  if (cont) t.free(g);
  Id gw = t.alloc(in_f * out_f * (d.autocast ? 2 : d.e_w), d.autocast ? Tmp : Category::kGradients, "weight grad");
  Id gin = t.alloc(d.BT * in_f * d.e_c, Tmp, "input grad");
  Id gb = t.alloc(out_f * (d.autocast ? 2 : d.e_w), d.autocast ? Tmp : Category::kGradients, "bias grad");
  t.free(cont);
  t.free(g);
  if (d.autocast) {
    if (in_was_cast) {
      Id g32 = t.alloc(d.BT * in_f * 4, Tmp, "input grad (fp32)");
      t.free(gin);
      gin = g32;
    }
    Id w32 = t.alloc(in_f * out_f * 4, Category::kGradients, "weight grad");
    t.free(gw);
    gw = w32;
    Id b32 = t.alloc(out_f * 4, Category::kGradients, "bias grad");
    t.free(gb);
    gb = b32;
  }
  accumulate(t, w, gw);
  accumulate(t, b, gb);
  return gin;
}

void opt_layer_backward(Tape& t, const Dims& d, Model& m, Model::OptLayer& p, OptSaved& s, Id& g_res, Id& x_in) {
  const bool ac = d.autocast;
  const u64 nq = d.BT * d.H, bhtt = d.B * d.nh * d.T * d.T;
  for (int i = 0; i < s.ncasts; ++i) {
    // the weight casts are released with their matmul's backward; modelled as going together
  }
  // MLP branch (through fc2's dropout: grad * mask * scale, a new tensor)
  Id gd2 = 0;
  if (s.mask2) {
    gd2 = t.alloc(nq * d.e_c, Tmp, "dropout backward");
    t.free(s.mask2);
  }
  Id g2 = ac ? t.alloc(nq * 2, Tmp, "grad .to(bf16) into the mlp branch") : gd2;
  if (ac) t.free(gd2);
  Id g_fc2_in = g2 ? g2 : 0;
  Id g_relu;
  {
    Id gsrc = g2;
    if (!ac) {
      gemm_workspace(t, m.ws_autograd);
      Id gw = t.alloc(d.H * d.I * d.e_w, Category::kGradients, "weight grad");
      g_relu = t.alloc(d.BT * d.I * d.e_c, Tmp, "input grad");
      Id gb = t.alloc(d.H * d.e_w, Category::kGradients, "bias grad");
      accumulate(t, p.fc2, gw);
      accumulate(t, p.fc2b, gb);
      t.free(gsrc);  // the dropout gradient, if any (else g_res itself, which stays)
    } else {
      g_relu = opt_linear_backward(t, d, m, p.fc2, p.fc2b, gsrc, d.I, d.H, false, false);
    }
  }
  (void)g_fc2_in;
  Id g_fc1 = t.alloc(d.BT * d.I * d.e_c, Tmp, "relu backward");
  t.free(g_relu);
  t.free(s.relu);
  Id g_ln2 = opt_linear_backward(t, d, m, p.fc1, p.fc1b, g_fc1, d.H, d.I, ac, false);
  t.free(s.in_fc1);
  ln_backward(t, d, s.ln2, p.ln2w, p.ln2b, g_ln2, g_res, s.h1);
  // attention branch
  Id gd1 = 0;
  if (s.mask1) {
    gd1 = t.alloc(nq * d.e_c, Tmp, "dropout backward");
    t.free(s.mask1);
  }
  Id g1 = ac ? t.alloc(nq * 2, Tmp, "grad .to(bf16) into the attention branch") : gd1;
  if (ac) t.free(gd1);
  Id g_ctx;
  if (!ac) {
    gemm_workspace(t, m.ws_autograd);
    Id gw = t.alloc(d.H * d.H * d.e_w, Category::kGradients, "weight grad");
    g_ctx = t.alloc(nq * d.e_c, Tmp, "input grad");
    Id gb = t.alloc(d.H * d.e_w, Category::kGradients, "bias grad");
    accumulate(t, p.o, gw);
    accumulate(t, p.ob, gb);
    t.free(g1);
  } else {
    g_ctx = opt_linear_backward(t, d, m, p.o, p.ob, g1, d.H, d.H, false, false);
  }
  t.free(s.ctx);
  t.free(s.attn_out);
  Id gq, gk, gv;
  if (d.eager || d.e_c == 4) {
    Id gc = t.alloc(nq * d.e_c, Tmp, "grad contiguous");
    t.free(g_ctx);
    gv = t.alloc(nq * d.e_c, Tmp, "grad v");
    Id gp = t.alloc(bhtt * d.e_c, Tmp, "grad probs");
    t.free(gc);
    t.free(s.vc);
    t.free(s.probs16);
    if (d.e_c != 4) {
      Id gp32 = t.alloc(bhtt * 4, Tmp, "grad probs to fp32");
      t.free(gp);
      gp = gp32;
    }
    Id gsm = t.alloc(bhtt * 4, Tmp, "softmax backward");
    Id tmp = t.alloc(bhtt * 4, Tmp, "softmax backward grad*out");
    t.free(tmp);
    t.free(gp);
    t.free(s.probs32);
    if (std::max(d.e_c, d.e_r) != 4) {
      Id g16 = t.alloc(bhtt * d.e_c, Tmp, "softmax backward to the input dtype");
      t.free(gsm);
      gsm = g16;
    }
    Id gsc = t.alloc(bhtt * d.e_c, Tmp, "scaling (1.0) backward");
    t.free(gsm);
    gk = t.alloc(nq * d.e_c, Tmp, "grad k");
    gq = t.alloc(nq * d.e_c, Tmp, "grad q");
    t.free(gsc);
    t.free(s.qc);
    t.free(s.kT);
  } else {
    gq = t.alloc(nq * d.e_c, Tmp, "grad q");
    gk = t.alloc(nq * d.e_c, Tmp, "grad k");
    gv = t.alloc(nq * d.e_c, Tmp, "grad v");
    Id softmax_d = t.alloc(d.B * d.nh * d.T * 4, Tmp, "flash softmax_d");
    Id dq_acc = t.alloc(nq * 4, Tmp, "flash dq accumulator");
    t.free(dq_acc);
    t.free(softmax_d);
    t.free(g_ctx);
    t.free(s.lse);
    t.free(s.q_s);
    t.free(s.k);
    t.free(s.v);
  }
  Id gq2 = t.alloc(nq * d.e_c, Tmp, "q scaling backward");
  t.free(gq);
  // v, k, q projections (reverse creation order) on contiguous copies of their output grads;
  // the input grads sum (the first sum out of place)
  Id gin_v = opt_linear_backward(t, d, m, p.v, p.vb, gv, d.H, d.H, ac, true);
  Id gin_k = opt_linear_backward(t, d, m, p.k, p.kb, gk, d.H, d.H, ac, true);
  Id sum = gin_v;
  if (!ac) {
    sum = t.alloc(nq * d.e_c, Tmp, "input grad sum");
    t.free(gin_v);
  }
  t.free(gin_k);
  Id gin_q = opt_linear_backward(t, d, m, p.q, p.qb, gq2, d.H, d.H, ac, false);
  t.free(gin_q);
  t.free(s.in_q);
  t.free(s.in_k);
  t.free(s.in_v);
  for (int i = 0; i < s.ncasts; ++i) t.free(s.casts[i]);
  ln_backward(t, d, s.ln1, p.ln1w, p.ln1b, sum, g_res, x_in);
}

void opt_forward_backward(Tape& t, const Dims& d, const HfJob& j, Model& m) {
  Id ids = t.alloc(d.BT * 8, Category::kInputs, "input_ids");
  Id labels = t.alloc(d.BT * 8, Category::kInputs, "labels");
  t.phase("forward");
  const u64 bt = d.BT;
  Id x_tok = t.alloc(bt * d.H * d.e_r, A, "embed_tokens output");
  // OPTDecoder: attention_mask = ones(B, T) (fp32), position_ids = cumsum(mask) * mask - 1
  Id am = t.alloc(bt * 4, Category::kInputs, "attention_mask ones");
  Id cs = t.alloc(bt * 4, Category::kInputs, "cumsum");
  Id mul = t.alloc(bt * 4, Category::kInputs, "cumsum * mask");
  t.free(cs);
  Id sub = t.alloc(bt * 4, Category::kInputs, "- 1");
  t.free(mul);
  Id pid = t.alloc(bt * 8, Category::kInputs, "position_ids");
  t.free(sub);
  Id mask = d.eager || d.e_c == 4 ? t.alloc(d.B * d.T * d.T * d.e_r, Category::kInputs, "causal mask [B,1,T,T]") : 0;
  Id off = t.alloc(bt * 8, Category::kInputs, "position_ids + offset");
  Id x_pos = t.alloc(bt * d.H * d.e_r, A, "embed_positions output");
  t.free(off);
  Id x = t.alloc(bt * d.H * d.e_r, A, "inputs_embeds + pos_embeds");
  std::vector<OptSaved> saved(d.L);
  Id layer_in = x;
  for (u64 l = 0; l < d.L; ++l) {
    opt_layer_forward(t, d, m, saved[l], mask);
    layer_in = saved[l].out;
  }
  LnSaved fln;
  if (m.final_ln) fln = ln_forward(t, d);
  Id& final_out = m.final_ln ? fln.out : layer_in;
  t.free(mask);
  t.free(am);
  t.free(pid);
  t.free(x_tok);
  t.free(x_pos);
  std::vector<Id> none;
  Param& head = m.tied ? m.embed : m.lm_head;
  Head hd = head_forward(t, d, none, final_out, ids);
  Id gh = head_backward(t, d, m, head, hd, final_out);
  Id g_res = 0;
  if (m.final_ln) {
    ln_backward(t, d, fln, m.flnw, m.flnb, gh, g_res, saved[d.L - 1].out);
  } else {
    g_res = gh;
  }
  for (u64 l = d.L; l-- > 0;) opt_layer_backward(t, d, m, m.opt_layers[l], saved[l], g_res, l > 0 ? saved[l - 1].out : x);
  // the embeddings' backward: positions, then tokens (dense gradients, sort buffers)
  for (Param* p : {&m.pos, &m.embed}) {
    Id sorted = t.alloc(bt * 8, Tmp, "embedding backward sorted indices");
    Id orig = t.alloc(bt * 8, Tmp, "embedding backward original indices");
    Id g = t.alloc(p->bytes, Category::kGradients, "embedding weight grad");
    t.free(sorted);
    t.free(orig);
    accumulate(t, *p, g);
  }
  t.free(g_res);
  t.free(x);
  t.free(labels);
  (void)j;
}

struct StepState {
  Model m;
  bool states = false;
};

void forward_backward(Tape& t, const Dims& d, const HfJob& j, StepState& st) {
  Model& m = st.m;
  // The batch (input_ids, labels: int64 [B, T]) and the Trainer's num_items_in_batch.
  Id ids = t.alloc(d.BT * 8, Category::kInputs, "input_ids");
  Id labels = t.alloc(d.BT * 8, Category::kInputs, "labels");
  t.phase("forward");
  Id x = t.alloc(d.BT * d.H * d.e_r, A, "embedding output");
  // create_causal_mask (eager: a float [B, 1, T, T] mask in the embeddings' dtype; sdpa: none)
  Id mask = d.eager ? t.alloc(d.B * d.T * d.T * d.e_r, Category::kInputs, "causal mask [B,1,T,T]") : 0;
  // rotary cos / sin: [1, T, head_dim] in the embeddings' dtype
  Id cos = t.alloc(d.T * d.hd * d.e_r, Category::kInputs, "rotary cos");
  Id sin = t.alloc(d.T * d.hd * d.e_r, Category::kInputs, "rotary sin");
  std::vector<LayerSaved> saved(d.L);
  Id layer_in = x;
  const bool ckpt = j.activation_checkpointing;
  std::vector<Id> cached_casts;
  for (u64 l = 0; l < d.L; ++l) {
    layer_forward(t, d, m, m.layers[l], saved[l], layer_in, mask);
    if (ckpt) {
      drop_saved(t, saved[l]);
      LayerSaved& s = saved[l];
      for (Id* w : {&s.wq, &s.wk, &s.wv, &s.wo, &s.wg, &s.wu, &s.wd}) {
        if (*w != 0) cached_casts.push_back(*w);
        *w = 0;
      }
    } else if (d.e_r == 2) {
      // bf16 residual stream: the norms save their fp32 upcasts, not the layer's input or h1;
      // both go when the decoder loop rebinds hidden_states (the embedding output is held by
      // LlamaModel.forward until it returns).
      if (l > 0) t.free(saved[l - 1].out);
      t.free(saved[l].h1);
    }
    layer_in = saved[l].out;
  }
  RmsSaved fn = rms_forward(t, d, layer_in);
  if (d.e_r == 2 && !ckpt) {
    t.free(saved[d.L - 1].out);
    t.free(x);
  }
  if (!ckpt) t.free(mask);  // else the checkpoint frames hold it until their backward
  Param& head = m.tied ? m.embed : m.lm_head;
  Head hd = head_forward(t, d, cached_casts, fn.out, ids);
  Id gh = head_backward(t, d, m, head, hd, fn.out);
  Id g_res = 0;  // the residual stream's gradient: one buffer, accumulated in place down the layers
  rms_backward(t, d, fn, m.norm, gh, g_res, saved[d.L - 1].out);
  for (u64 l = d.L; l-- > 0;) {
    Id& x_in = l > 0 ? saved[l - 1].out : x;
    if (ckpt) {
      // the first unpack recomputes the layer's forward (with grad, under the recorded autocast
      // state); early stop: the recomputed output is not needed and goes.
      LayerSaved r;
      layer_forward(t, d, m, m.layers[l], r, x_in, mask);
      t.free(r.out);
      if (d.e_r == 2) t.free(r.h1);
      saved[l] = r;
    }
    layer_backward(t, d, m, m.layers[l], saved[l], g_res, x_in);
  }
  t.free(mask);
  // embedding backward (CUDA embedding_dense_backward: sort-based; the dense [V, H] gradient)
  Id sorted = t.alloc(d.BT * 8, Tmp, "embedding backward sorted indices");
  Id orig = t.alloc(d.BT * 8, Tmp, "embedding backward original indices");
  Id gemb = t.alloc(d.V * d.H * d.e_w, Category::kGradients, "embedding weight grad");
  t.free(sorted);
  t.free(orig);
  t.free(g_res);
  t.free(x);
  t.free(cos);
  t.free(sin);
  accumulate(t, m.embed, gemb);
  t.free(labels);
}

// clip_grad_norm_(foreach): _foreach_norm's per-tensor results and its chunk partials, the stack,
// the total norm, the clip coefficient; then _foreach_mul_ in place.
void clip_grad_norm(Tape& t, Model& m) {
  const u64 n = m.order.size();
  u64 max_numel = 0;
  for (Param* p : m.order) max_numel = std::max<u64>(max_numel, p->bytes / 4);
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
  t.free(total);
}

// AdamW over the Trainer's two parameter groups (get_decay_parameter_names: weight decay on all
// but biases and norm weights; the group is made even when weight_decay is 0), each stepped on
// its own: states created lazily on the first step (exp_avg, exp_avg_sq per parameter in the
// group's order; step counters on the CPU); foreach path: _foreach_sqrt(exp_avg_sqs) is the only
// new memory, freed as the Python list dies (CPython frees list items from the last). The fused
// path makes no temporaries.
void optimizer_step(Tape& t, Model& m, bool fused, bool& states) {
  t.phase("optimizer_step");
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
}

}  // namespace

std::vector<ScheduleEvent> hf_trainer_schedule(const HfJob& job) {
  validate_job(job);
  std::vector<ScheduleEvent> ev;
  Tape t(ev);
  const Dims d = dims_of(job);
  StepState st;
  t.phase("load");
  const bool opt = job.model.family == ModelFamily::kOPT;
  if (opt) {
    load_opt(t, st.m, d, job.model);
  } else {
    load_model(t, st.m, d, job.model.tie_word_embeddings);
  }
  for (std::int64_t step = 0; step < job.steps; ++step) {
    for (std::int64_t micro = 0; micro < job.grad_accum_steps; ++micro) {
      if (opt) {
        opt_forward_backward(t, d, job, st.m);
      } else {
        forward_backward(t, d, job, st);
      }
    }
    t.phase("clip_grad_norm");
    if (job.max_grad_norm > 0) clip_grad_norm(t, st.m);
    optimizer_step(t, st.m, job.optimizer == "adamw_torch_fused", st.states);
    t.phase("zero_grad");
    for (Param* p : st.m.order) t.free(p->grad);
    t.phase("step_end");
  }
  return ev;
}

}  // namespace scalelab::predict
