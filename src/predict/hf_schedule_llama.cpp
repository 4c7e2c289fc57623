// The Llama schedule of a Hugging Face Trainer step (transformers' LlamaForCausalLM): the model's
// move to the GPU and one micro-step's forward and backward. Qwen2ForCausalLM (transformers 5.17)
// is the same code with biases on q_proj / k_proj / v_proj (Dims::qkv_bias): addmm instead of mm
// (the same saved tensors), the biases' casts under autocast, their gradients in backward; its
// eager_attention_forward, rotary embedding and RMSNorm are Llama's; sliding-window attention is
// refused by the config reader (use_sliding_window true). See hf_schedule.cpp for how the
// schedule was written and checked.
#include <cstring>
#include <algorithm>
#include <string>
#include <vector>

#include "predict/schedule_internal.h"

namespace scalelab::predict::detail {

namespace {

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
  Id rng_seed = 0, rng_offset = 0;   // flash sdpa's philox seed and offset (0-d, saved)
  Id ctx = 0;                        // attn_output.transpose(1,2).contiguous(): o_proj's input
  Id h1 = 0;                         // residual after attention
  Id in_g = 0, in_u = 0;             // autocast casts of n2.out
  Id gate = 0, act = 0, up = 0, prod = 0;
  Id out = 0;                        // the layer's output (next layer's input)
};

}  // namespace

// Model.to(device): Module._apply visits children before a module's own parameters; the order of
// children is their registration order in __init__.
void load_llama(Tape& t, Model& m, const Dims& d, bool tied) {
  m.tied = tied;
  m.layers.resize(d.L);
  add_param(m, m.embed, d.V * d.H * d.e_w, "model.embed_tokens.weight");
  for (auto& l : m.layers) {
    // nn.Linear registers weight then bias; Qwen2's q/k/v carry a bias each
    add_param(m, l.q, d.qd * d.H * d.e_w, "q_proj.weight");
    if (d.qkv_bias) add_param(m, l.qb, d.qd * d.e_w, "q_proj.bias");
    add_param(m, l.k, d.kvd * d.H * d.e_w, "k_proj.weight");
    if (d.qkv_bias) add_param(m, l.kb, d.kvd * d.e_w, "k_proj.bias");
    add_param(m, l.v, d.kvd * d.H * d.e_w, "v_proj.weight");
    if (d.qkv_bias) add_param(m, l.vb, d.kvd * d.e_w, "v_proj.bias");
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
    // transformers 4.43 to 4.47 also give every LlamaAttention its own LlamaRotaryEmbedding
    // (registered after o_proj, unused in the forward): one more inv_freq buffer per layer
    if (d.inline_attn && std::strcmp(p->name, "o_proj.weight") == 0)
      t.alloc(d.hd / 2 * 4, Category::kInputs, "rotary inv_freq (the layer's own, unused)");
    // LlamaRotaryEmbedding's buffers (inv_freq, original_inv_freq: fp32 [head_dim/2]) come after
    // model.norm, before lm_head. Before 4.48 original_inv_freq is an attribute, not a buffer: it
    // stays on the CPU.
    if (p == &m.norm) {
      m.inv_freq = t.alloc(d.hd / 2 * 4, Category::kInputs, "rotary inv_freq");
      if (!d.inv_freq_alias) m.inv_freq_orig = t.alloc(d.hd / 2 * 4, Category::kInputs, "rotary original_inv_freq");
    }
    ++i;
  }
}

namespace {

// LlamaRMSNorm: x.to(fp32); var = x.pow(2).mean(-1, keepdim); x * rsqrt(var + eps);
// weight * x.to(input_dtype). `drop` (a checkpointed layer's first forward): what autograd would
// save goes as soon as Python lets it go (see drop_saved).
RmsSaved rms_forward(Tape& t, const Dims& d, Id x, bool drop = false) {
  RmsSaved s;
  const u64 n = d.BT * d.H;
  (void)x;
  if (d.liger) {  // LigerRMSNorm: one kernel; saves its input (the caller keeps it) and rstd
    s.out = t.alloc(n * d.e_r, A, "liger rmsnorm output");
    s.rsqrt = t.alloc(d.BT * 4, A, "liger rmsnorm rstd");
    if (drop) t.free(s.rsqrt);
    return s;
  }
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
    if (drop) {  // hidden_states is rebound: x.to(fp32) goes, and nothing holds rsqrt
      t.free(s.rsqrt);
      t.free(s.x32);
    }
    s.xr = t.alloc(n * 2, A, "rmsnorm .to(bf16)");
  } else {
    s.xr = t.alloc(n * 4, A, "rmsnorm x*rsqrt");
    if (drop) t.free(s.rsqrt);
  }
  s.out = t.alloc(n * d.e_r, A, "rmsnorm output");
  if (drop) t.free(s.xr);  // the .to(bf16) temporary, or x*rsqrt as the function returns
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
  if (d.liger) {
    // LigerRMSNorm backward (in_place): dX is written into dY's buffer; dW from per-SM fp32
    // partial rows (132 SMs on an H100/H200) summed into the weight's dtype.
    Id partial = t.alloc(132 * d.H * 4, Tmp, "liger rmsnorm dW partials");
    Id gw = t.alloc(d.H * d.e_w, Category::kGradients, "norm weight grad");
    t.free(partial);
    accumulate(t, w, gw);
    t.free(s.out);
    t.free(s.rsqrt);
    t.free(x_in);
    if (g_res == 0) {
      g_res = g_in;
      g_in = 0;
    } else {
      t.free(g_in);  // added into the residual buffer
    }
    return;
  }
  Id gh = t.alloc(n * d.e_r, Tmp, "rmsnorm grad g*w");
  Id gw_t = t.alloc(n * d.e_r, Tmp, "rmsnorm grad g*h");
  Id gw = t.alloc(d.H * d.e_w, Category::kGradients, "norm weight grad");
  row_sum_scratch(t, d.BT, d.H, "rmsnorm weight-grad reduction staging");
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
  // fp32: x itself is the input (its .to(fp32) is a no-op), so the mul's gradient goes straight into
  // the residual buffer, in place, before the pow path's (the H200 fp32 trace)
  if (d.e_r == 4 && g_res != 0) t.free(gx);
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

// y = x @ W^T (+ b) in the compute dtype. Autocast: the weight's cast (cached for the forward,
// saved by the matmul) and the input's cast (saved) come first; autocast casts its arguments
// right to left (GCC's evaluation order of cached_cast(args)...), so a bias's cast (cached, not
// saved by addmm: it goes with the cache) comes before the weight's.
Id linear_forward(Tape& t, const Dims& d, Model& m, Param& p, Id in, u64 in_f, u64 out_f, bool in_is_compute,
                  Id& wcast, Id& incast, const char* label, const Param* bias = nullptr) {
  if (d.autocast && bias != nullptr && bias->bytes != 0)
    m.bias_casts.push_back(t.alloc(out_f * 2, Category::kAutocastCache, "autocast bias cast"));
  if (d.autocast) {
    wcast = t.alloc(in_f * out_f * 2, Category::kAutocastCache, "autocast weight cast");
    if (!in_is_compute) incast = t.alloc(d.BT * in_f * 2, A, "autocast input cast");
  }
  (void)in;
  if (bias != nullptr && bias->bytes != 0) {
    // addmm's result comes before the GEMM takes the thread's workspaces (OPT's and Qwen2's traces)
    Id out = t.alloc(d.BT * out_f * d.e_c, A, label);
    gemm_workspace(t, m.ws_main);
    lt_workspace(t, m.ws_lt);
    return out;
  }
  gemm_workspace(t, m.ws_main);
  return t.alloc(d.BT * out_f * d.e_c, A, label);
}

// A bias's gradient (Qwen2's q/k/v; addmm): the output gradient summed over the rows (sum_to the
// bias's shape, after AddmmBackward's matmuls); under autocast in bf16, then cast to the fp32
// parameter's dtype. No-op for a missing bias.
void bias_backward(Tape& t, const Dims& d, Param* b, u64 out_f) {
  if (b == nullptr || b->bytes == 0) return;
  auto staging = [&] { row_sum_scratch(t, d.BT, out_f, "bias grad reduction staging"); };
  if (d.autocast) {
    Id g16 = t.alloc(out_f * 2, Tmp, "bias grad (autocast dtype)");
    staging();
    Id g = t.alloc(out_f * 4, Category::kGradients, "bias grad");
    t.free(g16);
    accumulate(t, *b, g);
  } else {
    Id g = t.alloc(out_f * d.e_w, Category::kGradients, "bias grad");
    staging();
    accumulate(t, *b, g);
  }
}

// Its backward: weight grad first (cuBLAS order in mm_mat1/mat2 backward), then the input grad
// (and a bias's grad); under autocast the input grad is cast back to fp32 when the input was a cast.
// `sum_into`: the input's gradient buffer when one is already there (q/k/v's and gate/up's shared
// input): under autocast the input cast's backward runs before the weight cast's (it was created
// later in the forward), and its fp32 gradient is added into that buffer in place at once (the
// H200 trace of bf16 autocast); the function then returns 0.
// `unpacked`: under checkpointing, the recomputed input this node saved, when this node is its
// last user: the checkpoint's unpack hook hands it over, so it goes when the node's apply returns,
// before the engine sums the bias gradient (the H200 trace of Qwen2 + Liger + checkpointing).
Id linear_backward(Tape& t, const Dims& d, Model& m, Param& p, Id& g, u64 in_f, u64 out_f, Id& wcast,
                   Id& incast, bool in_was_cast, Param* bias = nullptr, Id* sum_into = nullptr,
                   Id* unpacked = nullptr) {
  gemm_workspace(t, m.ws_autograd);
  Id gw16 = 0, gw = 0, gin = 0;
  // addmm (a bias) computes mat1's gradient (the input's) before mat2's (the H200 trace of Qwen2)
  const bool addmm = bias != nullptr && bias->bytes != 0;
  if (addmm) gin = t.alloc(d.BT * in_f * d.e_c, Tmp, "input grad");
  if (d.autocast) {
    gw16 = t.alloc(in_f * out_f * 2, Tmp, "weight grad (autocast dtype)");
  } else {
    gw = t.alloc(in_f * out_f * d.e_w, Category::kGradients, "weight grad");
  }
  if (!addmm) gin = t.alloc(d.BT * in_f * d.e_c, Tmp, "input grad");
  if (unpacked != nullptr) t.free(*unpacked);
  bias_backward(t, d, bias, out_f);
  t.free(g);
  // AccumulateGrad runs once the matmul's node is done (its input gradient made): with gradient
  // accumulation the new weight gradient is added in place and freed only then (the CPU trace of
  // micro-step 2)
  if (!d.autocast) accumulate(t, p, gw);
  t.free(wcast);
  t.free(incast);
  if (d.autocast && in_was_cast) {
    Id g32 = t.alloc(d.BT * in_f * 4, Tmp, "input grad (fp32)");
    t.free(gin);
    gin = g32;
    if (sum_into != nullptr && *sum_into != 0) t.free(gin);
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

// Its backward where q and cos share the dtype (no autocast), as the H200 traces of fp32, bf16
// eager and bf16 sdpa show it (key first, then query): g*sin, rotate_half's neg and its gradient,
// g*cos, the sum; `n` elements.
Id rope_backward_plain(Tape& t, const Dims& d, u64 n, Id& g) {
  const u64 e = d.e_c;
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
}

// Under autocast (q and k promoted to fp32 by cos/sin, the projections' outputs bf16), as the H200
// trace of bf16 autocast shows it: g*sin in fp32 and its cast to bf16 (rotate_half's dtype), the
// neg and the two slices' gradients (the first becomes the result), then g*cos in fp32 and its
// cast, added into the result; `n` elements.
Id rope_backward_autocast(Tape& t, const Dims& d, u64 n, Id& g) {
  Id gs = t.alloc(n * d.e_rope, Tmp, "rope grad g*sin");
  Id gs_c = t.alloc(n * d.e_c, Tmp, "rope grad g*sin to compute dtype");
  t.free(gs);
  Id neg = t.alloc(n / 2 * d.e_c, Tmp, "rope grad neg");
  Id res = t.alloc(n * d.e_c, Tmp, "rope grad");
  t.free(neg);
  Id s2 = t.alloc(n * d.e_c, Tmp, "rope grad slice");
  t.free(gs_c);
  t.free(s2);
  Id gc = t.alloc(n * d.e_rope, Tmp, "rope grad g*cos");
  Id gc_c = t.alloc(n * d.e_c, Tmp, "rope grad g*cos to compute dtype");
  t.free(gc);
  t.free(g);
  t.free(gc_c);  // added into the result
  return res;
}

// One decoder layer's forward. `drop`: the first forward of a checkpointed layer
// (torch.utils.checkpoint, use_reentrant=False): the pack hook keeps no reference to what
// autograd saves, so every tensor goes when Python drops it — a projection's autocast input cast as
// the projection returns, gate_proj's output after silu, the MLP's product after down_proj, the
// attention's locals as it returns — rather than when the layer's backward ends. What is still
// live at the layer's end goes in drop_saved. The recompute in backward saves as usual (drop false)
// and stops early (`recompute`): torch.utils.checkpoint's early stop ends it as soon as every saved
// tensor is back, which is when down_proj's mm packs its input — before that mm makes its output, so
// neither down_proj's output nor the layer's output exists (the CPU trace has neither).
void layer_forward(Tape& t, const Dims& d, Model& m, LayerParams& p, LayerSaved& s, Id x, Id mask, bool drop = false,
                   bool recompute = false) {
  (void)mask;
  auto gone = [&](Id& id) {
    if (drop) t.free(id);
  };
  s.n1 = rms_forward(t, d, x, drop);
  const bool ac = d.autocast;
  Id q = linear_forward(t, d, m, p.q, s.n1.out, d.H, d.qd, false, s.wq, s.in_q, "q_proj output", &p.qb);
  gone(s.in_q);
  Id k = linear_forward(t, d, m, p.k, s.n1.out, d.H, d.kvd, false, s.wk, s.in_k, "k_proj output", &p.kb);
  gone(s.in_k);
  s.v = linear_forward(t, d, m, p.v, s.n1.out, d.H, d.kvd, false, s.wv, s.in_v, "v_proj output", &p.vb);
  gone(s.in_v);
  Id k_embed;
  if (d.liger) {
    // liger_rotary_pos_emb rotates q and k in place (their [B, T, heads, hd] buffers; rope.py
    // rope_forward). Until 2026-11-27 the schedule had k come back as a contiguous copy, inferred
    // from the H200 measurements while sdpa's backward was modelled as four requests instead of
    // the one workspace the trace shows; with the workspace, in place matches: the Liger rows'
    // segment counts equal the GPU's (Qwen2 305 / 305, Llama under autocast 492 / 492).
    s.q_embed = q;
    q = 0;
    k_embed = k;
    k = 0;
  } else {
    s.q_embed = rope_forward(t, d, d.qd);
    k_embed = rope_forward(t, d, d.kvd);
  }
  t.free(q);
  t.free(k);
  // 4.56 and 4.57 under autocast over fp32 weights: the layer's empty tensors take the rotated
  // key's dtype, fp32, so torch.cat promotes the bf16 value: the cache and the attention hold an
  // fp32 value (their CPU traces)
  const bool v32 = d.cache_cat && d.train_cache && !drop && ac;
  if (d.cache_cat && d.train_cache && !drop) {
    // transformers 4.56 and 4.57: DynamicLayer.update concatenates onto the empty tensors it was
    // made with, so the cache holds copies of the rotated key and of the value, and the attention
    // runs on those; the originals go at once (their CPU traces)
    Id kc = t.alloc(d.BT * d.kvd * d.e_rope, A, "DynamicLayer torch.cat copy of the rotated key");
    Id vcast = v32 ? t.alloc(d.BT * d.kvd * 4, Tmp, "value .to(fp32) (torch.cat's type promotion)") : 0;
    Id vc = t.alloc(d.BT * d.kvd * (v32 ? 4 : d.e_c), A, "DynamicLayer torch.cat copy of the value");
    t.free(vcast);
    t.free(k_embed);
    t.free(s.v);
    k_embed = kc;
    s.v = vc;
  }
  const u64 rep = d.nh / d.nkv;
  const u64 bhtt = d.B * d.nh * d.T * d.T;
  Id q_view = 0;  // Liger + eager: the rotated q, once bmm has its copy
  Id k_rep_late = 0;
  if (d.eager || d.e_c == 4) {
    // eager_attention_forward. sdpa in fp32 runs the same way: there is no fp32 flash kernel and
    // the memory-efficient kernel takes no GQA, so PyTorch falls back to the math path, which
    // allocates as eager (measured identical to the byte on the H200).
    // repeat_kv: expand + reshape, a copy when heads are grouped.
    Id k_rep = rep > 1 ? t.alloc(d.BT * d.qd * d.e_rope, Tmp, "repeat_kv(key)") : 0;
    // transformers 4.43 and 4.44 rebind key_states / value_states to the repeats inline, with no
    // cache holding the originals: the rotated key and the value go as each repeat is made
    const bool rebound = d.tf4x && d.tf4_minor < 45 && rep > 1 && !drop;
    if (rebound) t.free(k_embed);
    // (v32: the repeat is fp32 and only autocast's bf16 cast of it, below, is saved)
    Id v_rep32 = v32 && rep > 1 ? t.alloc(d.BT * d.qd * 4, Tmp, "repeat_kv(value) (fp32)") : 0;
    s.v_rep = rep > 1 && !v32 ? t.alloc(d.BT * d.qd * d.e_c, A, "repeat_kv(value)") : 0;
    if (rebound) t.free(s.v);
    // torch.matmul(q, k^T): under autocast both operands are cast (q's cast saved); bmm takes the
    // transposed key made contiguous (saved).
    Id kcast = 0;
    if (ac && !d.liger) {  // Liger's RoPE left q and k in bf16: autocast has nothing to cast
      s.q16 = t.alloc(d.BT * d.qd * 2, A, "autocast cast of q");
      kcast = t.alloc(d.BT * d.qd * 2, Tmp, "autocast cast of k");
    }
    // Liger's RoPE returns q as a transposed view of q_proj's [B, T, heads, hd] buffer (rope.py
    // rope_forward: transpose, kernel in place, transpose back): matmul's reshape of it to
    // [B*heads, T, hd] cannot be a view, so bmm gets (and saves) a contiguous copy; the rotated
    // buffer itself goes when the attention returns. Eager only: the fp32 sdpa math path is not
    // modelled op by op (it allocates as eager without Liger).
    if (d.liger && d.eager) {
      q_view = s.q_embed;
      s.q_embed = t.alloc(d.BT * d.qd * d.e_c, A, "q reshaped for bmm (copy of Liger's transposed q)");
    }
    // matmul's operands reshaped to [B*heads, ...]: the rotated q is a [B, heads, T, hd] view of
    // a [B, T, heads, hd] buffer, which cannot be reshaped without a copy once B > 1; bmm gets
    // and saves that copy (the H200 traces: bf16 and bf16 autocast at micro-batch 6 and fp32 at
    // micro-batch 2 make one, fp32 at micro-batch 1 does not). The transposed repeated key
    // reshapes as a view: bmm saves the repeated key itself. Without autocast the copy is of the
    // rotated q, which goes when the attention returns (as the repeated key did in the other
    // reading of the same sizes, which the traces cannot tell apart except by the addresses
    // freed: fp32 micro-batch 2's step-2 segments tell); under autocast it is modelled as a
    // copy of the key beside q's saved cast, which matches its trace to the byte.
    const bool kt_copy = d.e_c == 2 || d.B > 1;
    if (kt_copy && !ac && !drop && rep > 1 && !d.liger) {
      s.kT = k_rep;  // saved by bmm (its transpose, a view)
      k_rep = s.q_embed;  // the rotated q: goes where the repeated key went
      s.q_embed = t.alloc(d.BT * d.qd * d.e_c, A, "q contiguous for bmm (matmul's reshape)");
    } else if (kt_copy) {
      s.kT = t.alloc(d.BT * d.qd * d.e_c, A, "k^T contiguous for bmm");
    } else if (k_rep != 0) {
      s.kT = k_rep;
      k_rep = 0;
    } else {
      s.kT = k_embed;
      k_embed = 0;
    }
    Id scores = t.alloc(bhtt * d.e_c, Tmp, "attention scores");
    t.free(kcast);
    if (kt_copy) gone(s.kT);  // the matmul's operands: the contiguous copy and autocast's cast of q
    gone(s.q16);
    Id masked = eager_scores_to_softmax(t, d, scores, s.probs32, "scores * scaling");
    // .to(query.dtype) is a cast when q is bf16 (bf16 weights); autocast's matmul casts it too.
    if (d.e_rope == 2 && !ac) {
      s.probs16 = t.alloc(bhtt * 2, A, "probs.to(bf16)");
      gone(s.probs32);  // the fp32 softmax, a temporary of the expression
    }
    t.free(masked);  // attn_weights is rebound
    // autocast casts the probabilities for the matmul with v, after the rebinding (the H200 trace
    // of bf16 autocast, micro-batch 6)
    // (v32: matmul's arguments cast right to left, the fp32 repeated value first)
    if (v32) s.v_rep = t.alloc(d.BT * d.qd * 2, A, "autocast cast of v (the fp32 cache's repeat)");
    if (ac) s.probs16 = t.alloc(bhtt * 2, A, "autocast cast of probs");
    Id o = t.alloc(d.BT * d.qd * d.e_c, Tmp, "probs @ v");
    if (ac) gone(s.probs16);  // autocast's cast of the probabilities for the matmul
    s.ctx = t.alloc(d.BT * d.qd * d.e_c, A, "attn_output.transpose(1,2).contiguous()");
    t.free(o);
    // full bf16: the repeated key goes only after o_proj's output is made (the H200 trace; under
    // autocast and in fp32 before it)
    if ((!ac || d.inline_attn) && kt_copy && !drop) {
      k_rep_late = k_rep;
      k_rep = 0;
    }
    t.free(k_rep);
    t.free(v_rep32);
    if (!kt_copy && rep > 1) gone(s.kT);  // the repeated key, when bmm saved it
    gone(s.v_rep);  // eager_attention_forward returns: its repeated key and value go
  } else {
    // sdpa on the flash kernel with enable_gqa (no S x S matrix): saves q, k, v, the output and
    // the log-sum-exp (fp32 [B, heads, T]); modelled from the kernel's source
    // (aten/src/ATen/native/transformers/cuda/attention.cu, flash_api.cpp), not traced. Under
    // autocast q and k (fp32 after rope) are cast to bf16 and the casts saved.
    // transformers 4.54 and 4.55 (Dims::sdpa_copies): sdpa_attention_forward makes query, key and
    // value .contiguous() first (copies: the rotated q and k and the value are [B, heads, T, hd]
    // views of [B, T, heads, hd] buffers), which the kernel (or autocast's casts) takes; the
    // kernel's output then follows its contiguous query, so attn_output.transpose(1,2).contiguous()
    // is a copy, which o_proj saves (their CPU traces; flash_api.cpp's empty_like(q) on CUDA). The
    // rotated key and the value stay in the DynamicCache; the rotated q goes as the attention returns.
    // 4.49 to 4.53 (Dims::sdpa_repeat) repeat k and v to the query's heads first (repeat_kv: no
    // enable_gqa there), then make the query contiguous (the repeats already are): the kernel saves
    // the repeats, at the query's size.
    Id qc = 0, kc = 0;
    const u64 kv_cols = d.sdpa_repeat && rep > 1 ? d.qd : d.kvd;
    if (d.sdpa_repeat || d.sdpa_copies) {
      // in the function's order: 4.49 to 4.53 repeat k and v before q's copy, 4.54 and 4.55 copy
      // q, k, v in turn
      if (d.sdpa_copies) qc = t.alloc(d.BT * d.qd * d.e_rope, A, "query.contiguous()");
      const bool repeats = d.sdpa_repeat && rep > 1;
      kc = t.alloc(d.BT * kv_cols * d.e_rope, A, repeats ? "repeat_kv(key)" : "key.contiguous()");
      Id vc = t.alloc(d.BT * kv_cols * d.e_c, A, repeats ? "repeat_kv(value) (saved by the kernel)"
                                                          : "value.contiguous() (saved by the kernel)");
      if (d.sdpa_repeat) qc = t.alloc(d.BT * d.qd * d.e_rope, A, "query.contiguous()");
      m.kv_cache.emplace_back(k_embed, d.e_rope);
      m.kv_cache.emplace_back(s.v, d.e_c);
      k_embed = 0;
      s.v = vc;
      q_view = s.q_embed;  // freed as LlamaAttention.forward returns (below)
      s.q_embed = 0;
    }
    if (d.train_cache && !d.tf4x && !d.sdpa_copies && !d.sdpa_repeat) {
      // 4.49 to 4.53: no copies (their traces), the cache holds the rotated key and the value:
      // under autocast the fp32 key stays there past its cast; otherwise the kernel saved both
      // anyway (id 0: counted once)
      m.kv_cache.emplace_back(ac && !d.liger ? k_embed : 0, d.e_rope);
      // (4.56, 4.57 under autocast: the cache's fp32 value, which the kernel gets cast, below)
      m.kv_cache.emplace_back(v32 ? s.v : 0, v32 ? 4 : d.e_c);
      if (ac && !d.liger) k_embed = 0;
      if (v32) s.v = 0;
    }
    if (ac && !d.liger) {
      // autocast casts sdpa's arguments right to left (GCC): the key's cast comes first
      // (not under Liger: its RoPE leaves q and k in the projections' bf16); 4.56 and 4.57's fp32
      // value before it (their CPU traces), saved by the kernel in the value's place
      if (v32) s.v = t.alloc(d.BT * d.kvd * 2, A, "autocast cast of v (the cache's fp32 value)");
      s.kT = t.alloc(d.BT * kv_cols * 2, A, "autocast cast of k");
      s.q16 = t.alloc(d.BT * d.qd * 2, A, "autocast cast of q");
      t.free(s.q_embed);
      t.free(k_embed);
    } else if (d.sdpa_copies || d.sdpa_repeat) {  // the copies are what the kernel saves
      s.kT = kc;
      s.q16 = qc;
      kc = qc = 0;
    } else {
      s.kT = k_embed;
      k_embed = 0;
    }
    // the kernel's philox RNG seed and offset (0-d int64 tensors on the GPU, made even without
    // dropout and saved for backward: two 512-byte blocks per layer in the H200 traces)
    s.rng_seed = t.alloc(8, A, "flash attention philox seed");
    s.rng_offset = t.alloc(8, A, "flash attention philox offset");
    s.attn_out_sdpa = t.alloc(d.BT * d.qd * d.e_c, A, "flash attention output");
    s.lse = t.alloc(d.B * d.nh * d.T * 4, A, "flash attention log-sum-exp");
    gone(s.lse);  // only autograd held it
    gone(s.rng_seed);
    gone(s.rng_offset);
    if (ac && !d.liger) {  // autocast's casts of q and k
      gone(s.kT);
      gone(s.q16);
    }
    // flash returns a transposed view of a [B, T, heads, hd] buffer: .transpose(1,2).contiguous()
    // is then a no-op, and o_proj saves the same storage (but after 4.49-4.55's copies, above).
    s.ctx = d.sdpa_copies || d.sdpa_repeat ? t.alloc(d.BT * d.qd * d.e_c, A, "attn_output.transpose(1,2).contiguous()")
                                           : 0;
    t.free(qc);  // sdpa_attention_forward returns: under autocast its fp32 copies go (their casts were saved)
    t.free(kc);
  }
  Id ctx_unused = 0;
  Id o_out = linear_forward(t, d, m, p.o, s.ctx, d.qd, d.H, true, s.wo, ctx_unused, "o_proj output");
  // transformers 4.43 to 4.47 run the eager attention inside LlamaAttention.forward (5.17: in
  // eager_attention_forward, which returns before o_proj): under autocast the repeated key is then a
  // local of the same frame, freed after the query as it returns (below)
  if (!(d.inline_attn && ac)) t.free(k_rep_late);
  gone(s.ctx);            // attn_output is rebound to o_proj's output
  gone(s.attn_out_sdpa);
  if ((d.sdpa_copies || d.sdpa_repeat) && !drop) t.free(q_view);  // 4.49-4.55 sdpa: the rotated q, a local of this frame
  // LlamaAttention.forward returns: its locals go (checkpointed: all of them, in the frame's
  // variable order, query, key, value, as the CPU trace of Qwen2 shows).
  if (drop) {
    t.free(s.q_embed);
    t.free(q_view);
    t.free(k_embed);
    t.free(s.kT);
    t.free(s.v);
    t.free(s.v_rep);
  }
  if (d.eager || d.e_c == 4) {  // in the frame's order: query, key, value (the H200 trace)
    if (ac && !d.liger) t.free(s.q_embed);  // its cast is what bmm saved
    t.free(q_view);                         // Liger: its copy is what bmm saved
    t.free(k_rep_late);                     // 4.4x under autocast (above)
    if (d.train_cache) {
      // transformers 4.45 to 4.55: past_key_value.update() put the rotated key and the value into
      // the forward's DynamicCache, which holds them until compute_loss returns (head_forward_tf4x;
      // 4.43 and 4.44 make no cache while training). What bmm saved instead (a copy, the repeated
      // key) goes with backward as before. Without grouped heads bmm saved the rotated key and the
      // value themselves: the cache holds them too (id 0 here: counted once), and what copies the
      // cache's tensors (accelerate's fp32 conversion, DDP's _DDPSink) copies them all the same.
      m.kv_cache.emplace_back(k_embed, d.e_rope);
      m.kv_cache.emplace_back(rep > 1 ? s.v : 0, v32 ? 4 : d.e_c);
      k_embed = 0;
      if (rep > 1) s.v = 0;
    }
    t.free(k_embed);
    if (rep > 1) t.free(s.v);   // the repeated copy is saved instead
  }
  if (ac || drop) t.free(s.n1.out);  // the input casts of q/k/v were saved, not the fp32 normalized input
  s.h1 = t.alloc(d.BT * d.H * d.e_r, A, "residual + attention");
  t.free(o_out);
  s.n2 = rms_forward(t, d, s.h1, drop);
  s.gate = linear_forward(t, d, m, p.gate, s.n2.out, d.H, d.I, false, s.wg, s.in_g, "gate_proj output");
  gone(s.in_g);
  if (!d.liger) {
    s.act = t.alloc(d.BT * d.I * d.e_c, A, "silu(gate)");  // Liger's SwiGLU recomputes it
    gone(s.gate);  // act_fn's argument
  }
  s.up = linear_forward(t, d, m, p.up, s.n2.out, d.H, d.I, false, s.wu, s.in_u, "up_proj output");
  gone(s.in_u);
  s.prod = t.alloc(d.BT * d.I * d.e_c, A, d.liger ? "liger swiglu output" : "silu(gate) * up");
  gone(s.gate);  // the product's operands (Liger: LigerSiLUMulFunction's two arguments)
  gone(s.act);
  gone(s.up);
  Id in_d = 0;
  if (recompute) {
    // the early stop: autocast's weight cast is made (and saved) before the mm stops the recompute;
    // the unwinding drops what nothing saved
    if (d.autocast) s.wd = t.alloc(d.I * d.H * 2, Category::kAutocastCache, "autocast weight cast");
    if (ac) t.free(s.n2.out);
    return;
  }
  Id down = linear_forward(t, d, m, p.down, s.prod, d.I, d.H, true, s.wd, in_d, "down_proj output");
  gone(s.prod);
  if (ac || drop) t.free(s.n2.out);
  s.out = t.alloc(d.BT * d.H * d.e_r, A, "residual + mlp");
  t.free(down);
  // as the layer returns: the residual, and the attention weights eager attention returned (the
  // decoder layer binds them to `_` until then)
  gone(s.h1);
  gone(s.probs32);
  gone(s.probs16);
}

// torch 2.4 to 2.8: repeat_kv's `hidden_states[:, :, None, :, :]` is four full slices (d.slice_copies)
constexpr const char* kRepeatKvSlices = "repeat_kv backward (torch <= 2.8 full-slice backward)";

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
  // probs @ v backward: in bf16 the output gradient is made contiguous first; fp32 bmm takes the
  // transposed view (as in the forward) and the output gradient goes after grad probs (the H200
  // traces: bf16 micro-batch 6, fp32 micro-batch 1).
  Id gc = e == 2 || d.B > 1 ? t.alloc(nq * e, Tmp, "grad contiguous") : 0;
  if (gc != 0) t.free(g_ctx);
  Id gv_rep = t.alloc(nq * e, Tmp, "grad v (repeated)");
  Id gp = t.alloc(bhtt * e, Tmp, "grad probs");
  t.free(gc);
  t.free(g_ctx);
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
    if (d.slice_copies) full_slices_backward(t, gv, nk * e, 4, kRepeatKvSlices);
    gk = t.alloc(nk * e, Tmp, "repeat_kv backward (k)");
    t.free(gk_rep);
    if (d.slice_copies) full_slices_backward(t, gk, nk * e, 4, kRepeatKvSlices);
  }
  Id gk2 = d.liger ? gk : rope_backward_plain(t, d, nk, gk);  // Liger: in place
  Id gq2 = d.liger ? gq : rope_backward_plain(t, d, nq, gq);
  if (d.liger) gk = gq = 0;
  // each projection's output gradient made contiguous (its view's backward on the transposed
  // gradient), then its matmul's backward
  auto contiguous = [&](Id& g, u64 out_f) {
    Id cont = t.alloc(d.BT * out_f * e, Tmp, "grad contiguous");
    t.free(g);
    return cont;
  };
  auto proj_mm_bw = [&](Param& w, Param& b, Id& cont, u64 out_f) {
    gemm_workspace(t, m.ws_autograd);
    const bool addmm = b.bytes != 0;  // mat1's gradient first (see linear_backward)
    Id gin = addmm ? t.alloc(d.BT * d.H * e, Tmp, "input grad") : 0;
    Id gw = t.alloc(out_f * d.H * d.e_w, Category::kGradients, "weight grad");
    if (!addmm) gin = t.alloc(d.BT * d.H * e, Tmp, "input grad");
    bias_backward(t, d, &b, out_f);
    t.free(cont);
    accumulate(t, w, gw);  // AccumulateGrad after the matmul's node (see linear_backward)
    return gin;
  };
  Id gin_v = 0, gin_k = 0, gin_q = 0, sum = 0;
  if (d.inline_attn) {
    // transformers 4.43 to 4.47 view and transpose q, k and v only after all three projections, so
    // their view nodes outrank every projection's matmul in autograd's queue: the three copies
    // come first (v, k, q), then the matmuls (v, k, q). Their CPU traces, request by request.
    Id cv = contiguous(gv, d.kvd);
    Id ck = contiguous(gk2, d.kvd);
    Id cq = contiguous(gq2, d.qd);
    gin_v = proj_mm_bw(p.v, p.vb, cv, d.kvd);
    gin_k = proj_mm_bw(p.k, p.kb, ck, d.kvd);
    sum = t.alloc(d.BT * d.H * e, Tmp, "input grad sum");
    t.free(gin_v);
    t.free(gin_k);
    gin_q = proj_mm_bw(p.q, p.qb, cq, d.qd);
  } else {
    Id cv = contiguous(gv, d.kvd);
    gin_v = proj_mm_bw(p.v, p.vb, cv, d.kvd);
    Id ck = contiguous(gk2, d.kvd);
    gin_k = proj_mm_bw(p.k, p.kb, ck, d.kvd);
    sum = t.alloc(d.BT * d.H * e, Tmp, "input grad sum");
    t.free(gin_v);
    t.free(gin_k);
    Id cq = contiguous(gq2, d.qd);
    gin_q = proj_mm_bw(p.q, p.qb, cq, d.qd);
  }
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
    // the product is the mm's saved input: released as its node finishes
    gprod = linear_backward(t, d, m, p.down, gd, d.I, d.H, s.wd, s.prod, false);
  } else {
    gemm_workspace(t, m.ws_autograd);
    Id gw = t.alloc(d.H * d.I * d.e_w, Category::kGradients, "weight grad");
    gprod = t.alloc(d.BT * d.I * d.e_c, Tmp, "input grad");
    t.free(s.prod);        // the node's saved input, released as it finishes
    accumulate(t, p.down, gw);  // then AccumulateGrad (see linear_backward)
  }
  Id g_act, g_up, g_gate;
  Id gn2;
  if (d.liger) {
    // Liger's SwiGLU backward writes d(gate) and d(up) into the saved gate / up buffers
    t.free(gprod);
    g_up = s.up;
    s.up = 0;
    g_gate = s.gate;
    s.gate = 0;
    gn2 = linear_backward(t, d, m, p.up, g_up, d.H, d.I, s.wu, s.in_u, ac);
  } else {
    // MulBackward0 makes the second operand's gradient first (as MmBackward0 its mat2's): the
    // gradient wrt up, then wrt silu(gate) (which of the two up_proj consumes, by address: the
    // H200 trace of fp32 micro-batch 2)
    g_up = t.alloc(d.BT * d.I * d.e_c, Tmp, "mul grad wrt up");
    g_act = t.alloc(d.BT * d.I * d.e_c, Tmp, "mul grad wrt silu");
    t.free(gprod);
    t.free(s.up);
    t.free(s.act);
    gn2 = linear_backward(t, d, m, p.up, g_up, d.H, d.I, s.wu, s.in_u, ac);
    g_gate = t.alloc(d.BT * d.I * d.e_c, Tmp, "silu backward");
    t.free(g_act);
    t.free(s.gate);
  }
  Id gn2b = linear_backward(t, d, m, p.gate, g_gate, d.H, d.I, s.wg, s.in_g, ac, nullptr, ac ? &gn2 : nullptr);
  if (ac) {
    t.free(gn2b);  // added in place into the fp32 buffer (a cast it owns)
  } else {
    // the normalized input gate_proj and up_proj saved goes with gate's node; then autograd's
    // InputBuffer sums the two matmul outputs, the first sum out of place (the H200 traces)
    t.free(s.n2.out);
    Id sum = t.alloc(d.BT * d.H * d.e_c, Tmp, "input grad sum");
    t.free(gn2);
    t.free(gn2b);
    gn2 = sum;
  }
  rms_backward(t, d, s.n2, p.ln2, gn2, g_res, s.h1);
  // attention branch
  Id g_ctx;
  if (ac) {
    Id gc_in = t.alloc(d.BT * d.H * 2, Tmp, "grad .to(bf16) into the attention branch");
    g_ctx = linear_backward(t, d, m, p.o, gc_in, d.qd, d.H, s.wo, s.ctx, false);  // ctx: the saved input
  } else {
    gemm_workspace(t, m.ws_autograd);
    Id gw = t.alloc(d.H * d.qd * d.e_w, Category::kGradients, "weight grad");
    g_ctx = t.alloc(d.BT * d.qd * d.e_c, Tmp, "input grad");
    t.free(s.ctx);
    accumulate(t, p.o, gw);
  }
  Id gq, gk, gv;
  if (!ac && (d.eager || d.e_c == 4)) {
    eager_attention_backward_plain(t, d, m, p, s, g_ctx, g_res, x_in);
    return;
  }
  if (d.eager || d.e_c == 4) {
    // probs @ v backward: grad probs and grad v (the transposed gradient made contiguous first)
    Id gc = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad contiguous");
    t.free(g_ctx);
    Id gv_rep = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad v (repeated)");
    Id gp = t.alloc(bhtt * d.e_c, Tmp, "grad probs");
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
    // 4.56 and 4.57 under autocast (the cache's fp32 value, layer_forward): the repeated value's
    // cast goes back to fp32 after the probabilities' (their CPU traces)
    const bool v32 = d.cache_cat && d.train_cache && ac;
    if (v32) {
      Id g32 = t.alloc(d.BT * d.qd * 4, Tmp, "grad v (repeated) to fp32");
      t.free(gv_rep);
      gv_rep = g32;
    }
    // softmax backward with its grad*out transient, freed first, then the node's inputs (the
    // H200 trace of bf16 autocast: the three are the same size, their addresses tell the order)
    Id gsm = t.alloc(bhtt * 4, Tmp, "softmax backward");
    Id tmp = t.alloc(bhtt * 4, Tmp, "softmax backward grad*out");
    t.free(tmp);
    t.free(gp32);
    t.free(s.probs32);
    Id gsc = gsm;
    if (d.e_c != 4) {
      gsc = t.alloc(bhtt * d.e_c, Tmp, "grad scores to compute dtype");
      t.free(gsm);
    }
    Id gsc2 = t.alloc(bhtt * d.e_c, Tmp, "scaling backward");
    t.free(gsc);
    // q @ k^T backward, then the casts back to fp32 (the query's first) and repeat_kv's sums (the
    // value's first), in the order the H200 trace of bf16 autocast shows
    Id gkT = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad k^T");
    Id gq_ = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad q");
    t.free(gsc2);
    t.free(s.q16);  // bmm's saved self (q's cast), then its mat2
    t.free(s.kT);
    if (!ac || d.liger) t.free(s.q_embed);
    gq = gq_;
    if (ac && !d.liger) {  // q and k were fp32 (rope promoted them); under Liger bf16
      gq = t.alloc(d.BT * d.qd * 4, Tmp, "grad q to fp32");
      t.free(gq_);
      Id gk32 = t.alloc(d.BT * d.qd * 4, Tmp, "grad k to fp32");
      t.free(gkT);
      gkT = gk32;
    }
    // repeat_kv backward: sum over the groups
    if (rep > 1) {
      gv = t.alloc(d.BT * d.kvd * (v32 ? 4 : d.e_c), Tmp, "repeat_kv backward (v)");
      t.free(gv_rep);
      if (d.slice_copies) full_slices_backward(t, gv, d.BT * d.kvd * d.e_c, 4, kRepeatKvSlices);
      gk = t.alloc(d.BT * d.kvd * d.e_rope, Tmp, "repeat_kv backward (k)");
      t.free(gkT);
      if (d.slice_copies) full_slices_backward(t, gk, d.BT * d.kvd * d.e_rope, 4, kRepeatKvSlices);
    } else {
      gk = gkT;
      gv = gv_rep;
    }
    if (v32) {  // torch.cat's promotion of the value, backward: the gradient back to bf16
      Id g16 = t.alloc(d.BT * d.kvd * d.e_c, Tmp, "grad v to bf16 (torch.cat's promotion)");
      t.free(gv);
      gv = g16;
    }
  } else {
    // flash backward: dq, dk, dv, then one workspace holding what flash_api.cpp's mha_bwd
    // allocates one by one (softmax_d, the fp32 dq accumulator and, with grouped heads, the
    // expanded dk / dv), 256 bytes more: the H200 trace of full bf16 sdpa shows a single request
    // of exactly that size (101,449,984 bytes at micro-batch 6). As the node finishes: the output
    // gradient, then the saved key, query and value (the value is saved by nothing else), the
    // log-sum-exp and the output.
    // (4.49 to 4.53: the kernel got k and v repeated, so their gradients come at the query's size
    // and the kernel expands nothing)
    const bool repeated = d.sdpa_repeat && rep > 1;
    const u64 kv_cols = repeated ? d.qd : d.kvd;
    gq = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad q");
    gk = t.alloc(d.BT * kv_cols * d.e_c, Tmp, "grad k");
    gv = t.alloc(d.BT * kv_cols * d.e_c, Tmp, "grad v");
    const u64 ws_bytes = d.B * d.nh * d.T * 4 + d.BT * d.qd * 4 + (rep > 1 && !repeated ? 2 * d.BT * d.qd * d.e_c : 0) + 256;
    Id ws = t.alloc(ws_bytes, Tmp, "flash backward workspace (softmax_d, dq accumulator, expanded dk/dv)");
    t.free(ws);
    t.free(s.rng_seed);
    t.free(s.rng_offset);
    t.free(g_ctx);
    t.free(s.kT);
    t.free(s.q16);
    t.free(s.q_embed);
    t.free(s.v);
    t.free(s.lse);
    t.free(s.attn_out_sdpa);
    if (ac && !d.liger) {  // under Liger q and k were bf16 (its RoPE keeps the projections' dtype)
      Id q32 = t.alloc(d.BT * d.qd * 4, Tmp, "grad q to fp32");
      t.free(gq);
      gq = q32;
      Id k32 = t.alloc(d.BT * kv_cols * 4, Tmp, "grad k to fp32");
      t.free(gk);
      gk = k32;
    }
    if (d.cache_cat && d.train_cache && ac) {
      // 4.56 and 4.57: the value's cast, then torch.cat's promotion, backward (their CPU traces)
      Id v32g = t.alloc(d.BT * d.kvd * 4, Tmp, "grad v to fp32");
      t.free(gv);
      Id v16g = t.alloc(d.BT * d.kvd * d.e_c, Tmp, "grad v to bf16 (torch.cat's promotion)");
      t.free(v32g);
      gv = v16g;
    }
    if (repeated) {  // repeat_kv's backward (ExpandBackward: a sum over the groups), v's first
      Id v1 = t.alloc(d.BT * d.kvd * d.e_c, Tmp, "repeat_kv backward (v)");
      t.free(gv);
      gv = v1;
      Id k1 = t.alloc(d.BT * d.kvd * (ac && !d.liger ? 4 : d.e_c), Tmp, "repeat_kv backward (k)");
      t.free(gk);
      gk = k1;
    }
  }
  Id gq2 = 0, gk2 = 0;
  if (d.liger) {  // Liger: in place
    gq2 = gq;
    gk2 = gk;
  } else if (!ac) {  // the key first, as the H200 sdpa trace shows
    gk2 = rope_backward_plain(t, d, d.BT * d.kvd, gk);
    gq2 = rope_backward_plain(t, d, d.BT * d.qd, gq);
  } else {  // autocast: the key first here too
    gk2 = rope_backward_autocast(t, d, d.BT * d.kvd, gk);
    gq2 = rope_backward_autocast(t, d, d.BT * d.qd, gq);
  }
  if (d.liger) gq = gk = 0;
  // v_proj, k_proj, q_proj backward (reverse creation order).
  // eager's v gradient is in [B, heads, T, hd] order, and so is the repeat sum's (4.49 to 4.53 sdpa)
  if ((ac && !d.liger && (d.eager || d.e_c == 4)) || d.sdpa_repeat) {
    Id c = t.alloc(d.BT * d.kvd * d.e_c, Tmp, "grad contiguous");
    t.free(gv);
    gv = c;
  }
  // transformers 4.43 to 4.47 (see eager_attention_backward_plain): under autocast the k and q
  // copies come before any projection's matmul too (their CPU traces)
  const bool early_copies = d.inline_attn && ac && !d.liger;
  if (early_copies) {
    for (auto [g, width] : {std::pair<Id*, u64>{&gk2, d.kvd}, std::pair<Id*, u64>{&gq2, d.qd}}) {
      Id c = t.alloc(d.BT * width * d.e_c, Tmp, "grad contiguous");
      t.free(*g);
      *g = c;
    }
  }
  Id gn1 = linear_backward(t, d, m, p.v, gv, d.H, d.kvd, s.wv, s.in_v, ac, &p.vb);
  if (!ac && !d.liger) {
    // Without autocast (the H200 trace of full bf16 sdpa): the rotary gradients of k and q are in
    // [B, heads, T, hd] order, so each is made contiguous for its projection's matmul; v's comes
    // from the attention already in [B, T, heads, hd]. The first two input gradients are summed
    // out of place (autograd's InputBuffer), q's is added into that sum, and the normalized input
    // the three matmuls saved goes with the last.
    Id none = 0;
    Id ck = t.alloc(d.BT * d.kvd * d.e_c, Tmp, "grad contiguous");
    t.free(gk2);
    Id gn1k = linear_backward(t, d, m, p.k, ck, d.H, d.kvd, s.wk, none, false, &p.kb);
    Id sum = t.alloc(d.BT * d.H * d.e_c, Tmp, "input grad sum");
    t.free(gn1);
    t.free(gn1k);
    gn1 = sum;
    Id cq = t.alloc(d.BT * d.qd * d.e_c, Tmp, "grad contiguous");
    t.free(gq2);
    Id gn1q = linear_backward(t, d, m, p.q, cq, d.H, d.qd, s.wq, none, false, &p.qb);
    t.free(gn1q);
    t.free(s.n1.out);
  } else {  // the input gradients sum in place
    // under autocast without Liger the rotary gradients are in [B, heads, T, hd] order, and with
    // eager attention v's too: each made contiguous for its projection (the H200 trace)
    const bool copies = ac && !d.liger && !early_copies;
    auto contiguous = [&](Id& g, u64 width) {
      if (!copies) return;
      Id c = t.alloc(d.BT * width * d.e_c, Tmp, "grad contiguous");
      t.free(g);
      g = c;
    };
    Id gn1k = 0;
    contiguous(gk2, d.kvd);
    gn1k = linear_backward(t, d, m, p.k, gk2, d.H, d.kvd, s.wk, s.in_k, ac, &p.kb, &gn1);
    if (!ac) {
      // v's and k's input gradients summed out of place, as without Liger (the H200 trace of
      // Qwen2 + Liger + checkpointing); q's is then added into that sum
      Id sum = t.alloc(d.BT * d.H * d.e_c, Tmp, "input grad sum");
      t.free(gn1);
      t.free(gn1k);
      gn1 = sum;
    }
    t.free(gn1k);
    contiguous(gq2, d.qd);
    Id gn1q = linear_backward(t, d, m, p.q, gq2, d.H, d.qd, s.wq, s.in_q, ac, &p.qb, &gn1,
                              !ac && d.ckpt ? &s.n1.out : nullptr);
    t.free(gn1q);
    if (!ac) t.free(s.n1.out);
  }
  t.free(s.v);
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
               &s.gate,   &s.act,     &s.up,    &s.prod,  &s.rng_seed, &s.rng_offset};
  for (Id* id : ids) t.free(*id);
}

// Liger's fused linear cross-entropy (LigerForCausalLM with labels): no logits tensor. The
// forward walks the B*T rows in chunks of next_pow2(ceil(B*T / ceil(V / H))): each chunk's logits
// (chunk x V) are turned into their gradient in place, the input gradient's rows are written
// into a preallocated grad_input and grad_weight accumulates in place; both are saved for the
// backward, which only scales them (grad_output is 1). Modelled from liger_kernel/ops/fused_linear_cross_entropy.py.
//
// Under autocast over fp32 weights (modelled from the source, not measured): the Function is
// amp_custom_fwd, so autocast stays on inside it. grad_input = zeros_like(_input) is fp32 (the final
// norm's output), grad_weight = zeros_like(weight) fp32 (accum_dtype None); logits_storage is None
// (_can_use_mm_out: grad mode is off but autocast is on and _input is fp32). Per chunk:
// `_input_chunk @ weight.t()` casts weight.t() — a view, which autocast does not cache — and the
// input chunk (right to left), giving bf16 logits; `grad_logits_chunk @ weight` casts the weight
// itself (a leaf: cached from the first chunk until the model's autocast exits) and its bf16 result
// is copied into grad_input; grad_weight accumulates by addmm(out_dtype=fp32, out=grad_weight)
// (torch >= 2.8, sm >= 8) after `_input_chunk.to(bf16)`.
Id liger_flce(Tape& t, const Dims& d, Model& m, Param& head, Id& final_out, std::vector<Id>& cached_casts) {
  const u64 inc = (d.V + d.H - 1) / d.H;
  u64 chunk = 1;
  while (chunk < (d.BT + inc - 1) / inc) chunk *= 2;
  chunk = std::min(chunk, d.BT);
  Id gw = t.alloc(d.V * d.H * d.e_w, Category::kGradients, "liger flce grad_weight");
  Id gin = t.alloc(d.BT * d.H * d.e_r, Category::kLogitsLoss, "liger flce grad_input");
  Id loss1d = t.alloc(d.BT * 4, Category::kLogitsLoss, "liger flce loss_1d");
  Id shift = t.alloc(d.BT * 8, Category::kInputs, "shift_labels");
  gemm_workspace(t, m.ws_main);
  // _can_use_mm_out (grad mode is off inside the Function): the input and weight share a dtype and
  // autocast is off or already in that dtype — every case but autocast over fp32 weights. Then the
  // chunk's logits go into one preallocated logits_storage (chunk x V, the input's dtype) and
  // grad_input's rows are written by mm(out=); otherwise each matmul allocates its result.
  const bool mm_out = !d.autocast;
  Id storage = mm_out ? t.alloc(chunk * d.V * d.e_c, Category::kLogitsLoss, "liger flce logits_storage") : 0;
  Id wcache = 0;
  for (u64 start = 0; start < d.BT; start += chunk) {
    const u64 rows = std::min(chunk, d.BT - start);
    Id logits = 0;
    if (!mm_out) {
      Id wt = t.alloc(d.V * d.H * 2, Tmp, "autocast cast of lm_head.weight.t() (a view: not cached)");
      Id ic = t.alloc(rows * d.H * 2, Tmp, "autocast cast of the input chunk");
      logits = t.alloc(rows * d.V * d.e_c, Category::kLogitsLoss, "liger flce logits chunk");
      t.free(ic);
      t.free(wt);
      if (wcache == 0)
        wcache = t.alloc(d.V * d.H * 2, Category::kAutocastCache, "autocast cast of lm_head.weight (cached)");
      Id gchunk = t.alloc(rows * d.H * d.e_c, Tmp, "liger flce grad_input chunk");
      t.free(gchunk);  // copied into grad_input's rows
    }
    // grad_weight: fp32 accumulator with bf16/fp16 grad_logits (autocast): addmm(out_dtype=fp32)
    // after `_input_chunk.to(bf16)`; bf16 weights: addmm(out=grad_weight), no temporary; fp32
    // without autocast: the legacy `grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk)
    // .float()`, a V x H fp32 product per chunk.
    if (d.autocast) {
      Id icb = t.alloc(rows * d.H * 2, Tmp, "liger flce input chunk .to(bf16) for addmm");
      t.free(icb);
    } else if (d.e_c == 4) {
      Id prod = t.alloc(d.V * d.H * 4, Tmp, "liger flce grad_logits.t() @ input chunk (fp32)");
      t.free(prod);
    }
    t.free(logits);
  }
  t.free(storage);  // del logits_storage
  Id loss = t.alloc(4, Category::kLogitsLoss, "loss");
  t.free(loss1d);
  // the model's forward returns: autocast exits and its cache goes (the lm_head cast, the bias
  // casts, the checkpointed layers' weight casts)
  t.free(wcache);
  for (Id& c : cached_casts) t.free(c);
  cached_casts.clear();
  begin_backward(t, d, m);
  m.kept_loss = loss;  // the Trainer keeps the returned loss (Model::kept_loss)
  loss = 0;
  t.free(shift);
  head_gradient(t, m, head, gw, true);  // the fused loss's own grad_weight
  t.free(final_out);  // the fused loss saved its gradients, not the final norm's output
  return gin;
}

}  // namespace

void llama_forward_backward(Tape& t, const Dims& d, const HfJob& j, Model& m) {
  // The batch (input_ids, labels: int64 [B, T]) is the driver's (hf_trainer_schedule: the
  // Trainer's loop holds it until the next step's batches are fetched).
  if (d.ddp) ddp_pre_forward(t, m, d);  // DDP.forward before the module's: rebuild, buffers
  t.phase("forward");
  Id x = t.alloc(d.BT * d.H * d.e_r, A, "embedding output");
  // position_ids = torch.arange(T, device).unsqueeze(0) (int64): held by LlamaModel.forward, and
  // with checkpointing by every layer's checkpoint frame (a keyword argument) until its backward
  Id pos = t.alloc(d.T * 8, Category::kInputs, "position_ids");
  Id mask = 0;
  if (d.mask_t1) {
    // transformers 4.43 to 4.52 _update_causal_mask (eager, no attention_mask):
    // _prepare_4d_causal_attention_mask_with_cache_position with target_length T + 1: full((T, T+1),
    // min), triu(diagonal=1), `*= arange(T+1) > cache_position.reshape(-1, 1)` (a bool [T, T+1];
    // the CPU trace shows the in-place product converting it into a float temporary, which is
    // TensorIterator's CPU path: on CUDA its kernels cast while they read, so no temporary), then
    // an expand over the batch (a view): the mask is [T, T+1] in the embeddings' dtype.
    const u64 tt = d.T * (d.T + 1);
    Id full = t.alloc(tt * d.e_r, Tmp, "causal mask full((T, T+1))");
    mask = t.alloc(tt * d.e_r, Category::kInputs, "causal mask triu [T, T+1]");
    t.free(full);
    Id ar = t.alloc((d.T + 1) * 8, Tmp, "arange(T+1)");
    Id gt = t.alloc(tt, Tmp, "arange > cache_position (bool)");
    t.free(ar);
    t.free(gt);
  } else if (d.eager) {
    // create_causal_mask (eager: a float [B, 1, T, T] mask in the embeddings' dtype; sdpa: none)
    // (the boolean [1, 1, T, T] causal pattern it starts from, 1 MiB at T = 1024, goes once the
    // float mask is made: the H200 traces of eager attention)
    Id causal = t.alloc(d.T * d.T, Tmp, "causal mask pattern (bool)");
    mask = t.alloc(d.B * d.T * d.T * d.e_r, Category::kInputs, "causal mask [B,1,T,T]");
    t.free(causal);
  }
  // rotary cos / sin: [1, T, head_dim] in the embeddings' dtype, as LlamaRotaryEmbedding makes them
  // (the H200 traces, request by request): position_ids.float(), inv_freq @ positions (the
  // process's first GEMM: cuBLAS's workspace is taken here, before the first layer; where it was
  // taken shapes the segments: with it at q_proj fp32 micro-batch 2's step-2 peak came one step
  // early), cat(freqs, freqs), cos() and sin() each times attention_scaling, then .to(dtype).
  const u64 rot = d.T * d.hd * 4;
  Id pf = t.alloc(d.T * 4, Tmp, "rotary position_ids.float()");
  Id freqs = t.alloc(d.T * d.hd / 2 * 4, Tmp, "rotary inv_freq @ positions");
  gemm_workspace(t, m.ws_main);
  Id emb = t.alloc(rot, Tmp, "rotary cat(freqs, freqs)");
  Id cos = 0, sin = 0;
  if (d.rope_both_first) {  // 4.43 to 4.50: cos() and sin() both, then each times attention_scaling (their CPU traces)
    Id c0 = t.alloc(rot, Tmp, "rotary emb.cos()");
    Id s0 = t.alloc(rot, Tmp, "rotary emb.sin()");
    cos = t.alloc(rot, Category::kInputs, "rotary cos");
    t.free(c0);
    sin = t.alloc(rot, Category::kInputs, "rotary sin");
    t.free(s0);
  } else {
    Id c0 = t.alloc(rot, Tmp, "rotary emb.cos()");
    cos = t.alloc(rot, Category::kInputs, "rotary cos");
    t.free(c0);
    Id s0 = t.alloc(rot, Tmp, "rotary emb.sin()");
    sin = t.alloc(rot, Category::kInputs, "rotary sin");
    t.free(s0);
  }
  Id cos32 = 0, sin32 = 0;
  if (d.e_r != 4) {
    cos32 = cos;
    sin32 = sin;
    cos = t.alloc(d.T * d.hd * d.e_r, Category::kInputs, "rotary cos");
    sin = t.alloc(d.T * d.hd * d.e_r, Category::kInputs, "rotary sin");
  }
  t.free(pf);
  t.free(freqs);
  t.free(emb);
  t.free(cos32);
  t.free(sin32);
  std::vector<LayerSaved> saved(d.L);
  Id layer_in = x;
  const bool ckpt = j.activation_checkpointing;
  std::vector<Id> cached_casts;
  for (u64 l = 0; l < d.L; ++l) {
    layer_forward(t, d, m, m.layers[l], saved[l], layer_in, mask, ckpt);
    if (ckpt) {
      drop_saved(t, saved[l]);
      LayerSaved& s = saved[l];
      for (Id* w : {&s.wq, &s.wk, &s.wv, &s.wo, &s.wg, &s.wu, &s.wd}) {
        if (*w != 0) cached_casts.push_back(*w);
        *w = 0;
      }
    } else if (d.e_r == 2 && !d.liger) {
      // bf16 residual stream: the norms save their fp32 upcasts, not the layer's input or h1;
      // both go when the decoder loop rebinds hidden_states (the embedding output is held by
      // LlamaModel.forward until it returns).
      if (l > 0) t.free(saved[l - 1].out);
      t.free(saved[l].h1);
    }
    layer_in = saved[l].out;
  }
  RmsSaved fn = rms_forward(t, d, layer_in);
  if (d.e_r == 2 && !ckpt && !d.liger) {
    t.free(saved[d.L - 1].out);
    if (d.late4_minor == 53) t.free(mask);  // 4.53 lets go of the mask first (its CPU traces, full bf16)
    t.free(x);
  } else if (d.e_r == 2 && ckpt && !d.liger) {
    // the last layer's output is held by no checkpoint frame, and the final norm saved its fp32
    // upcast: it goes when hidden_states is rebound (the CPU trace of Qwen2 shows it). LigerRMSNorm
    // saves its input X itself (liger_kernel/ops/rms_norm.py:674, ctx.save_for_backward(X, W,
    // RSTD)), so under Liger it stays until the final norm's backward.
    t.free(saved[d.L - 1].out);
  }
  if (!ckpt) {  // else the checkpoint frames hold them until their backward
    t.free(mask);
    t.free(pos);
  }
  // the bias casts are in autocast's cache with the checkpointed weight casts: cleared at its exit
  for (Id& c : m.bias_casts) cached_casts.push_back(c);
  m.bias_casts.clear();
  Param& head = m.tied ? m.embed : m.lm_head;
  Id gh;
  if (d.liger) {
    gh = liger_flce(t, d, m, head, fn.out, cached_casts);
  } else {
    Head hd = head_forward(t, d, m, cached_casts, fn.out);
    gh = head_backward(t, d, m, head, hd, fn.out);
  }
  Id g_res = 0;  // the residual stream's gradient: one buffer, accumulated in place down the layers
  rms_backward(t, d, fn, m.norm, gh, g_res, saved[d.L - 1].out);
  for (u64 l = d.L; l-- > 0;) {
    Id& x_in = l > 0 ? saved[l - 1].out : x;
    if (ckpt) {
      // the first unpack recomputes the layer's forward (with grad, under the recorded autocast
      // state) up to the early stop at down_proj (layer_forward's `recompute`).
      LayerSaved r;
      m.swap_thread_workspaces();
      layer_forward(t, d, m, m.layers[l], r, x_in, mask, false, true);
      m.swap_thread_workspaces();
      for (Id& c : m.bias_casts) t.free(c);  // the recompute's autocast exits: its cache goes
      m.bias_casts.clear();
      t.free(r.out);
      // bf16: post_attention_layernorm saved its fp32 upcast, not h1; LigerRMSNorm saves h1 itself
      if (d.e_r == 2 && !d.liger) t.free(r.h1);
      saved[l] = r;
    }
    layer_backward(t, d, m, m.layers[l], saved[l], g_res, x_in);
  }
  t.free(mask);
  t.free(pos);
  // embedding backward (CUDA embedding_dense_backward: the dense [V, H] gradient)
  Id sorted = 0, orig = 0;
  embedding_backward_sort_buffers(t, d.BT, sorted, orig);
  Id gemb = t.alloc(d.V * d.H * d.e_w, Category::kGradients, "embedding weight grad");
  t.free(sorted);
  t.free(orig);
  t.free(g_res);
  t.free(x);
  t.free(cos);
  t.free(sin);
  accumulate_tied(t, m.embed, gemb);
}

}  // namespace scalelab::predict::detail
