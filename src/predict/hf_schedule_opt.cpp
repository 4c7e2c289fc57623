// The OPT schedule of a Hugging Face Trainer step (transformers' OPTForCausalLM: pre-LayerNorm,
// learned positions, biases, ReLU, residual dropout): the model's move to the GPU and one
// micro-step's forward and backward. See hf_schedule.cpp for how the schedule was written.
#include <algorithm>
#include <string>
#include <vector>

#include <tuple>

#include "predict/schedule_internal.h"

namespace scalelab::predict::detail {

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

namespace {

struct LnSaved {
  Id out = 0, mean = 0, rstd = 0;
  Id x32 = 0, w32 = 0, b32 = 0;  // ln_upcast: autocast's fp32 casts of the input, weight and bias (saved)
};
// nn.LayerNorm (native_layer_norm): the output, and the fp32 mean / rstd it saves with its input.
// Under ln_upcast (bf16 weights, autocast) layer_norm is on autocast's fp32 list: its arguments are
// cast right to left (bias, weight, input; none cached: the cache holds only casts down to bf16),
// native_layer_norm saves the three casts (its backward takes input, weight and bias) and returns
// fp32; the bf16 input itself is no longer saved by it.
// `drop`: a checkpointed layer's first forward (see opt_layer_forward): only the output stays.
LnSaved ln_forward(Tape& t, const Dims& d, bool drop = false) {
  LnSaved s;
  if (d.ln_upcast) {
    s.b32 = t.alloc(d.H * 4, A, "autocast: layer_norm bias .to(fp32)");
    s.w32 = t.alloc(d.H * 4, A, "autocast: layer_norm weight .to(fp32)");
    s.x32 = t.alloc(d.BT * d.H * 4, A, "autocast: layer_norm input .to(fp32)");
  }
  s.out = t.alloc(d.BT * d.H * (d.ln_upcast ? 4 : d.e_r), A, "layer_norm output");
  s.mean = t.alloc(d.BT * 4, A, "layer_norm mean");
  s.rstd = t.alloc(d.BT * 4, A, "layer_norm rstd");
  if (drop) {
    for (Id* id : {&s.mean, &s.rstd, &s.x32, &s.w32, &s.b32}) t.free(*id);
  }
  return s;
}
// native_layer_norm_backward: the input gradient (added into the residual buffer, or becoming it)
// and the weight / bias gradients.
void ln_backward(Tape& t, const Dims& d, LnSaved& s, Param& w, Param& b, Id& g_in, Id& g_res, Id& x_in) {
  // Under ln_upcast the gradients come out fp32 (the casts' dtype), then each cast's backward (the
  // input's, created last, first) takes them back to bf16.
  const bool up = d.ln_upcast;
  Id gx = t.alloc(d.BT * d.H * (up ? 4 : d.e_r), Tmp, up ? "layer_norm input grad (fp32)" : "layer_norm input grad");
  Id gw = t.alloc(d.H * (up ? 4 : d.e_w), up ? Tmp : Category::kGradients, "layer_norm weight grad");
  Id gb = t.alloc(d.H * (up ? 4 : d.e_w), up ? Tmp : Category::kGradients, "layer_norm bias grad");
  t.free(g_in);
  t.free(s.out);
  if (!up) t.free(x_in);  // the node's saved input, released before its mean and rstd
  t.free(s.mean);
  t.free(s.rstd);
  t.free(s.x32);  // (0 unless ln_upcast)
  t.free(s.w32);
  t.free(s.b32);
  if (up) t.free(x_in);
  if (up) {
    auto cast_back = [&](Id& g, u64 bytes, Category cat, const char* label) {
      Id c = t.alloc(bytes, cat, label);
      t.free(g);
      g = c;
    };
    cast_back(gx, d.BT * d.H * d.e_r, Tmp, "layer_norm input grad");
    cast_back(gw, d.H * d.e_w, Category::kGradients, "layer_norm weight grad");
    cast_back(gb, d.H * d.e_w, Category::kGradients, "layer_norm bias grad");
  }
  accumulate(t, w, gw);
  accumulate(t, b, gb);
  if (g_res == 0) {
    g_res = gx;
  } else {
    // The residual stream's gradient arrives as a view (OPT's layer reshapes it to [B*T, H] and
    // back), so autograd's InputBuffer cannot add in place: old + new, a new tensor, then both go
    // (the H200 trace of bf16 autocast, every layer's two norms).
    Id sum = t.alloc(d.BT * d.H * d.e_r, Tmp, "residual gradient sum");
    t.free(g_res);
    t.free(gx);
    g_res = sum;
  }
}

struct OptSaved {
  LnSaved ln1, ln2;
  // transformers 4.43 to 4.47 (opt_attention_forward_tf4x): q_c / k_c / v_c, the [B·heads, T, hd]
  // copies bmm saves (k_c and v_c also the returned cache), the masked scores torch.max saves, the
  // softmax output (saved by softmax and the second bmm; under autocast its bf16 cast, saved by the
  // bmm) and the 0-d finfo.min tensor torch.max saves
  Id q_c = 0, k_c = 0, v_c = 0, masked = 0, probs = 0, probs_cast = 0, fmin = 0;
  Id in_q = 0, in_k = 0, in_v = 0, in_fc1 = 0;
  Id casts[16] = {};
  int ncasts = 0;
  Id qc = 0, kT = 0, vc = 0, probs32 = 0, probs16 = 0, ctx = 0, lse = 0, attn_out = 0, q_s = 0, k = 0, v = 0;
  Id h1 = 0, relu = 0, out = 0;
  Id mask1 = 0, mask2 = 0;  // dropout masks (config dropout > 0)
  Id rng_seed = 0, rng_offset = 0;  // flash sdpa's philox seed and offset (0-d, saved)
};

// Linear with bias (addmm): autocast casts the weight and the bias (cached) and the input (saved).
Id opt_linear(Tape& t, const Dims& d, Model& m, OptSaved& s, u64 in_f, u64 out_f, bool in_is_compute, Id* incast,
              const char* label) {
  if (d.autocast) {
    // autocast casts right to left: the bias (cached, not saved by addmm: it goes with autocast's
    // cache when the forward ends, as the CPU trace shows), then the weight (saved)
    m.bias_casts.push_back(t.alloc(out_f * 2, Category::kAutocastCache, "autocast bias cast"));
    s.casts[s.ncasts++] = t.alloc(in_f * out_f * 2, Category::kAutocastCache, "autocast weight cast");
    if (!in_is_compute && incast != nullptr) *incast = t.alloc(d.BT * in_f * 2, A, "autocast input cast");
  } else if (d.ln_upcast && !in_is_compute && incast != nullptr) {  // bf16 weight and bias: the fp32 input only
    *incast = t.alloc(d.BT * in_f * 2, A, "autocast input cast");
  }
  // addmm's result is made before the GEMM takes cuBLAS's workspace and then cuBLASLt's (the first
  // call of the process: the H200 trace)
  Id out = t.alloc(d.BT * out_f * d.e_c, A, label);
  gemm_workspace(t, m.ws_main);
  lt_workspace(t, m.ws_lt);  // every OPT Linear has a bias
  return out;
}

// transformers 4.43 to 4.47's OPTAttention (4.48's rewrite allocates the same: its CPU traces)
// (eager, written inline in its forward; traced on the CPU
// under 4.45.2, tools/predict/trace_hf.py): q = q_proj(x) * scaling; k and v each made
// [B, heads, T, hd] by `_shape`'s .contiguous() as soon as projected (the copies are what bmm saves
// and what the layer returns as its cache), then q's copy; scores = bmm(q, kᵀ) + the [B, 1, T, T]
// float mask (the sum saved by torch.max, as is the 0-d finfo.min it is compared with), softmax
// (saved), bmm with v, and the [B, T, H] copy attn_output.transpose(1, 2).reshape makes for
// out_proj. Under autocast the scores are bf16 and the mask fp32: their sum, the max and the
// softmax are fp32, which the second bmm casts back to bf16 (saved).
void opt_attention_forward_tf4x(Tape& t, const Dims& d, Model& m, OptSaved& s) {
  const u64 nq = d.BT * d.H, bhtt = d.B * d.nh * d.T * d.T;
  const u64 e_s = std::max(d.e_c, d.e_r);  // the masked scores: promoted to the mask's dtype
  Id q = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_q, "q_proj output");
  Id q_s = t.alloc(nq * d.e_c, Tmp, "q * scaling");
  t.free(q);
  Id k = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_k, "k_proj output");
  s.k_c = t.alloc(nq * d.e_c, A, "k _shape contiguous (saved; the cache's key)");
  t.free(k);
  Id v = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_v, "v_proj output");
  s.v_c = t.alloc(nq * d.e_c, A, "v _shape contiguous (saved; the cache's value)");
  t.free(v);
  s.q_c = t.alloc(nq * d.e_c, A, "q _shape contiguous (saved)");
  t.free(q_s);
  Id scores = t.alloc(bhtt * d.e_c, Tmp, "bmm(q, k^T)");
  s.masked = t.alloc(bhtt * e_s, A, "scores + causal mask (saved by torch.max)");
  t.free(scores);
  s.fmin = t.alloc(4, A, "torch.tensor(finfo.min) (saved by torch.max)");
  Id mx = t.alloc(bhtt * e_s, Tmp, "torch.max(scores, finfo.min)");
  s.probs = t.alloc(bhtt * e_s, A, "softmax (saved)");
  t.free(mx);
  if (d.autocast && e_s == 4) s.probs_cast = t.alloc(bhtt * 2, A, "autocast: softmax .to(bf16) (saved by bmm)");
  Id o = t.alloc(nq * d.e_c, Tmp, "probs @ v");
  s.ctx = t.alloc(nq * d.e_c, A, "attn_output reshape (contiguous copy, saved by out_proj)");
  t.free(o);
  // the layer returns (k_c, v_c) as its cache, which the model's outputs hold until compute_loss
  // returns (head_forward_tf4x: converted to fp32 by accelerate under autocast, cloned by DDP's
  // sink); the tensors themselves live on, saved for backward (0: not the outputs' to free)
  m.kv_cache.emplace_back(0, d.e_c);
  m.kv_cache.emplace_back(0, d.e_c);
}

// x_in: the layer's input. Under ln_upcast no op saves it (the layer norm saved its fp32 cast), so
// it goes once the first residual sum is made; so does that sum once the second is.
// `drop`: the first forward of a checkpointed layer (use_reentrant=False): the pack hook keeps no
// reference to what autograd saves, so each tensor goes when Python drops it (as in Llama's layer_forward);
// the recompute in backward saves as usual and stops early (`recompute`) once the last saved tensor
// is back: at fc2's mm as it packs its input, before fc2's output exists; with dropout, at the
// dropout's mask (its output and fc2's go in the unwinding).
void opt_layer_forward(Tape& t, const Dims& d, Model& m, OptSaved& s, Id mask, Id& x_in, bool drop = false,
                       bool recompute = false) {
  (void)mask;
  auto gone = [&](Id& id) {
    if (drop) t.free(id);
  };
  const u64 nq = d.BT * d.H, bhtt = d.B * d.nh * d.T * d.T;
  const bool ac = d.autocast || d.ln_upcast;  // the layer norms' outputs are fp32, cast for the linears
  s.ln1 = ln_forward(t, d, drop);
  if (d.tf4x) {
    opt_attention_forward_tf4x(t, d, m, s);
  } else {
    Id q = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_q, "q_proj output");
    gone(s.in_q);
    s.q_s = t.alloc(nq * d.e_c, Tmp, "q * scaling");
    t.free(q);
    s.k = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_k, "k_proj output");
    gone(s.in_k);
    s.v = opt_linear(t, d, m, s, d.H, d.H, false, &s.in_v, "v_proj output");
    gone(s.in_v);
    // transformers 4.56 and 4.57: DynamicLayer.update concatenates onto empty tensors, so the cache
    // holds contiguous [B, heads, T, hd] copies of k and v (the projections' dtype: no promotion,
    // unlike Llama's fp32 rotated key) and the originals go; bmm then takes the copies as they are,
    // with no contiguous copy of k^T or v, and saves them (their CPU traces)
    const bool cat = d.cache_cat && d.train_cache && !drop && (d.eager || d.e_c == 4);
    if (cat) {
      Id kc = t.alloc(nq * d.e_c, A, "DynamicLayer torch.cat copy of k");
      Id vc = t.alloc(nq * d.e_c, A, "DynamicLayer torch.cat copy of v");
      t.free(s.k);
      t.free(s.v);
      s.k = kc;
      s.v = vc;
    }
    if (d.eager || d.e_c == 4) {
      // [B, heads, T, hd] views of [B, T, H] buffers: bmm needs copies of q and k^T (saved)
      s.qc = t.alloc(nq * d.e_c, A, "q contiguous for bmm");
      if (cat) {
        s.kT = s.k;  // saved by bmm; the cache's entry counts it once (below)
        s.k = 0;
      } else {
        s.kT = t.alloc(nq * d.e_c, A, "k^T contiguous for bmm");
      }
      Id scores = t.alloc(bhtt * d.e_c, Tmp, "attention scores");
      gone(s.qc);
      gone(s.kT);
      // (4.49 to 4.51: no `* 1.0`, the scores go straight into the sum with the mask)
      Id masked = eager_scores_to_softmax(t, d, scores, s.probs32, "scores * 1.0", d.opt_unscaled);
      if (d.e_c == 2) {
        s.probs16 = t.alloc(bhtt * 2, A, "probs.to(query dtype)");
        gone(s.probs32);  // attn_weights is rebound
      }
      t.free(masked);
      if (cat) {
        s.vc = s.v;
        s.v = 0;
      } else {
        s.vc = t.alloc(nq * d.e_c, A, "v contiguous for bmm");
      }
      Id o = t.alloc(nq * d.e_c, Tmp, "probs @ v");
      gone(s.vc);
      s.ctx = t.alloc(nq * d.e_c, A, "attn_output.transpose(1,2).contiguous()");
      t.free(o);
    } else {
      s.rng_seed = t.alloc(8, A, "flash attention philox seed");  // as Llama's (0-d, saved)
      s.rng_offset = t.alloc(8, A, "flash attention philox offset");
      s.attn_out = t.alloc(nq * d.e_c, A, "flash attention output");
      s.lse = t.alloc(d.B * d.nh * d.T * 4, A, "flash attention log-sum-exp");
      gone(s.lse);  // only autograd held it
      gone(s.rng_seed);
      gone(s.rng_offset);
    }
  }
  Id o_out = opt_linear(t, d, m, s, d.H, d.H, true, nullptr, "out_proj output");
  gone(s.ctx);  // attn_output is rebound to out_proj's output
  gone(s.attn_out);
  if (d.eager || d.e_c == 4 || drop) {  // locals of the attention go; flash saved q, k, v themselves
    t.free(s.q_s);
    if (d.train_cache && !d.tf4x && !drop) {
      // 4.54 and 4.55: past_key_value.update() put k and v (the projections' outputs, viewed) in
      // the forward's DynamicCache, which holds them until compute_loss returns (head_forward);
      // 4.56 and 4.57: its copies, which bmm saved (id 0: counted once, freed with bmm's backward)
      m.kv_cache.emplace_back(s.k, d.e_c);
      m.kv_cache.emplace_back(s.v, d.e_c);
      s.k = 0;
      s.v = 0;
    }
    t.free(s.k);
    t.free(s.v);
  }
  if (ac || drop) t.free(s.ln1.out);
  if (d.dropout) {  // F.dropout(p > 0) on CUDA: native_dropout's output and its saved bool mask
    Id dr = t.alloc(nq * d.e_c, Tmp, "dropout output");
    s.mask1 = t.alloc(nq, A, "dropout mask");
    gone(s.mask1);
    t.free(o_out);
    o_out = dr;
  }
  s.h1 = t.alloc(nq * d.e_r, A, "residual + attention");
  t.free(o_out);
  if (d.ln_upcast) t.free(x_in);
  s.ln2 = ln_forward(t, d, drop);
  Id fc1 = opt_linear(t, d, m, s, d.H, d.I, false, &s.in_fc1, "fc1 output");
  gone(s.in_fc1);
  // hidden_states is rebound to fc1's output: the norm's output goes now unless fc1 saved it (it
  // saved its bf16 cast instead when the norm ran in fp32: the H200 trace of bf16 autocast)
  if (ac) {
    t.free(s.ln2.out);
  } else {
    gone(s.ln2.out);
  }
  s.relu = t.alloc(d.BT * d.I * d.e_c, A, "relu (saved)");
  t.free(fc1);
  if (recompute && !d.dropout) {  // the early stop: fc2's casts are made before its mm packs them
    if (d.autocast) {
      m.bias_casts.push_back(t.alloc(d.H * 2, Category::kAutocastCache, "autocast bias cast"));
      s.casts[s.ncasts++] = t.alloc(d.I * d.H * 2, Category::kAutocastCache, "autocast weight cast");
    }
    return;
  }
  Id fc2 = opt_linear(t, d, m, s, d.I, d.H, true, nullptr, "fc2 output");
  gone(s.relu);
  if (d.dropout) {
    Id dr = t.alloc(nq * d.e_c, Tmp, "dropout output");
    s.mask2 = t.alloc(nq, A, "dropout mask");
    gone(s.mask2);
    t.free(fc2);
    fc2 = dr;
  }
  if (recompute) {  // the early stop (with dropout: here, its mask saved)
    t.free(fc2);
    return;
  }
  s.out = t.alloc(nq * d.e_r, A, "residual + mlp");
  t.free(fc2);
  if (d.ln_upcast || drop) t.free(s.h1);
  // the attention weights eager attention returned: bound to `_` until the layer returns
  gone(s.probs32);
  gone(s.probs16);
}

// addmm backward (AddmmBackward0, in its derivative's order): input grad (mat1), weight grad (mat2),
// then the bias grad, the output gradient summed over the rows (sum_to the bias's shape) with the
// reduction's staging buffer (row_sum_buffers); the saved input cast goes before the weight's (the
// H200 trace of OPT under bf16 autocast).
// `wcast` / `incast`: the weight's and the input's autocast casts the addmm saved, released as its
// node finishes; `sum_into`: the input's gradient buffer when one is there, into which the input
// cast's fp32 gradient is added at once, before the weight cast's backward (as Llama's
// linear_backward, read off the H200 trace of bf16 autocast).
Id opt_linear_backward(Tape& t, const Dims& d, Model& m, Param& w, Param& b, Id& g, u64 in_f, u64 out_f,
                       bool in_was_cast, bool contiguous_copy, Id* wcast = nullptr, Id* incast = nullptr,
                       Id* sum_into = nullptr) {
  gemm_workspace(t, m.ws_autograd);
  Id cont = contiguous_copy ? t.alloc(d.BT * out_f * d.e_c, Tmp, "grad contiguous") : 0;
  if (cont) t.free(g);
  Id gin = t.alloc(d.BT * in_f * d.e_c, Tmp, "input grad");
  Id gw = t.alloc(in_f * out_f * (d.autocast ? 2 : d.e_w), d.autocast ? Tmp : Category::kGradients, "weight grad");
  Id gb = t.alloc(out_f * (d.autocast ? 2 : d.e_w), d.autocast ? Tmp : Category::kGradients, "bias grad");
  row_sum_scratch(t, d.BT, out_f, "bias grad reduction staging");
  t.free(cont);
  t.free(g);
  if (incast != nullptr) t.free(*incast);  // addmm's saved mat1, then mat2
  if (wcast != nullptr) t.free(*wcast);
  if ((d.autocast || d.ln_upcast) && in_was_cast) {
    Id g32 = t.alloc(d.BT * in_f * 4, Tmp, "input grad (fp32)");
    t.free(gin);
    gin = g32;
    if (sum_into != nullptr && *sum_into != 0) t.free(gin);
  }
  if (d.autocast) {
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

// The v and k projections' input gradients summed: out of place (a new tensor, both go); under
// autocast (cast_in) the fp32 casts' gradients (ToCopyBackward's outputs) were summed into v's as k's
// was made (opt_linear_backward's sum_into), and k's goes.
Id sum_v_and_k(Tape& t, const Dims& d, bool cast_in, Id& gin_v, Id& gin_k) {
  Id sum = gin_v;
  if (!cast_in) {
    sum = t.alloc(d.BT * d.H * d.e_c, Tmp, "input grad sum");
    t.free(gin_v);
  }
  t.free(gin_k);
  return sum;
}

// The backward of opt_attention_forward_tf4x from out_proj's input gradient to the sum of the q, k
// and v projections' input gradients, in the order of the CPU trace of 4.45.2: the reshape's and
// each _shape's view backward copy their non-contiguous gradient; torch.max's backward makes
// grad / 2, the equality mask, the where() it keeps and the less-than mask; v's projection is
// differentiated first, then k's (their input gradients summed out of place), then q's through
// its `* scaling`, whose input gradient is added in place.
Id opt_attention_backward_tf4x(Tape& t, const Dims& d, Model& m, Model::OptLayer& p, OptSaved& s, Id g_ctx) {
  const bool cast_in = d.autocast || d.ln_upcast;
  const u64 nq = d.BT * d.H, bhtt = d.B * d.nh * d.T * d.T;
  const u64 e_s = std::max(d.e_c, d.e_r);
  auto cast = [&](int i) -> Id* { return i < s.ncasts ? &s.casts[i] : nullptr; };
  Id gc = t.alloc(nq * d.e_c, Tmp, "grad attn_output (view backward copy)");
  t.free(g_ctx);
  Id gv = t.alloc(nq * d.e_c, Tmp, "grad v (bmm backward)");
  Id gp = t.alloc(bhtt * d.e_c, Tmp, "grad probs (bmm backward)");
  t.free(gc);
  t.free(s.v_c);
  t.free(s.probs_cast);
  if (e_s != d.e_c) {  // the cast's backward: the gradient back in the softmax's dtype
    Id g32 = t.alloc(bhtt * e_s, Tmp, "grad probs .to(fp32)");
    t.free(gp);
    gp = g32;
  }
  // CUDA's softmax backward makes a grad*out transient of the output's size and frees it before
  // the node's inputs go (the H200 traces of 4.45.2, fp32 and bf16 autocast; the CPU kernel has none)
  Id gsm = t.alloc(bhtt * e_s, Tmp, "softmax backward");
  if (!d.cpu_kernels) {
    Id tmp = t.alloc(bhtt * e_s, Tmp, "softmax backward grad*out");
    t.free(tmp);
  }
  t.free(gp);
  t.free(s.probs);
  Id half = t.alloc(bhtt * e_s, Tmp, "maximum backward: grad / 2");
  Id eq = t.alloc(bhtt, Tmp, "maximum backward: self == other");
  Id gmax = t.alloc(bhtt * e_s, Tmp, "maximum backward: where");
  Id lt = t.alloc(bhtt, Tmp, "maximum backward: self < other");
  t.free(lt);
  t.free(eq);
  t.free(half);
  t.free(gsm);
  t.free(s.fmin);  // the node's saved 0-d minimum before the masked scores (the H200 traces)
  t.free(s.masked);
  if (e_s != d.e_c) {  // the sum's backward to the bf16 scores (the mask needs no gradient)
    Id g16 = t.alloc(bhtt * d.e_c, Tmp, "grad scores .to(bf16)");
    t.free(gmax);
    gmax = g16;
  }
  Id gk = t.alloc(nq * d.e_c, Tmp, "grad k (bmm backward)");
  Id gq = t.alloc(nq * d.e_c, Tmp, "grad q (bmm backward)");
  t.free(gmax);
  t.free(s.k_c);
  t.free(s.q_c);
  Id gqc = t.alloc(nq * d.e_c, Tmp, "grad q (view backward copy)");
  t.free(gq);
  Id gvc = t.alloc(nq * d.e_c, Tmp, "grad v (view backward copy)");
  t.free(gv);
  Id gin_v = opt_linear_backward(t, d, m, p.v, p.vb, gvc, d.H, d.H, cast_in, false, cast(2), &s.in_v);
  Id gkc = t.alloc(nq * d.e_c, Tmp, "grad k (view backward copy)");
  t.free(gk);
  Id gin_k = opt_linear_backward(t, d, m, p.k, p.kb, gkc, d.H, d.H, cast_in, false, cast(1), &s.in_k,
                                 cast_in ? &gin_v : nullptr);
  Id sum = sum_v_and_k(t, d, cast_in, gin_v, gin_k);
  Id gmul = t.alloc(nq * d.e_c, Tmp, "q scaling backward");
  t.free(gqc);
  Id gin_q = opt_linear_backward(t, d, m, p.q, p.qb, gmul, d.H, d.H, cast_in, false, cast(0), &s.in_q,
                                 cast_in ? &sum : nullptr);
  if (!cast_in) t.free(s.ln1.out);  // q/k/v's saved input, released with q_proj's node
  t.free(gin_q);
  return sum;
}

void opt_layer_backward(Tape& t, const Dims& d, Model& m, Model::OptLayer& p, OptSaved& s, Id& g_res, Id& x_in) {
  const bool ac = d.autocast;
  const bool cast_in = d.autocast || d.ln_upcast;  // the inputs of fc1 and q/k/v were cast from fp32
  const u64 nq = d.BT * d.H, bhtt = d.B * d.nh * d.T * d.T;
  // autocast's weight casts, saved by each addmm (q, k, v, out_proj, fc1, fc2 in the forward's
  // order), each released with its own node
  auto cast = [&](int i) -> Id* { return i < s.ncasts ? &s.casts[i] : nullptr; };
  // MLP branch (through fc2's dropout: grad * mask * scale, a new tensor)
  Id gd2 = 0;
  if (s.mask2) {
    gd2 = t.alloc(nq * d.e_c, Tmp, "dropout backward");
    t.free(s.mask2);
  }
  Id g2 = ac ? t.alloc(nq * 2, Tmp, "grad .to(bf16) into the mlp branch") : gd2;
  if (ac) t.free(gd2);
  Id g_relu;
  {
    Id gsrc = g2;
    if (!ac) {
      gemm_workspace(t, m.ws_autograd);
      g_relu = t.alloc(d.BT * d.I * d.e_c, Tmp, "input grad");
      Id gw = t.alloc(d.H * d.I * d.e_w, Category::kGradients, "weight grad");
      Id gb = t.alloc(d.H * d.e_w, Category::kGradients, "bias grad");
      row_sum_scratch(t, d.BT, d.H, "bias grad reduction staging");
      accumulate(t, p.fc2, gw);
      accumulate(t, p.fc2b, gb);
      t.free(gsrc);  // the dropout gradient, if any (else g_res itself, which stays)
    } else {
      g_relu = opt_linear_backward(t, d, m, p.fc2, p.fc2b, gsrc, d.I, d.H, false, false, cast(5));
    }
  }
  Id g_fc1 = t.alloc(d.BT * d.I * d.e_c, Tmp, "relu backward");
  t.free(g_relu);
  t.free(s.relu);
  Id g_ln2 = opt_linear_backward(t, d, m, p.fc1, p.fc1b, g_fc1, d.H, d.I, cast_in, false, cast(4), &s.in_fc1);
  t.free(s.in_fc1);
  if (d.tf4x && !cast_in) t.free(s.ln2.out);  // fc1's saved input, released with its node (4.4x traces)
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
    g_ctx = t.alloc(nq * d.e_c, Tmp, "input grad");
    Id gw = t.alloc(d.H * d.H * d.e_w, Category::kGradients, "weight grad");
    Id gb = t.alloc(d.H * d.e_w, Category::kGradients, "bias grad");
    row_sum_scratch(t, d.BT, d.H, "bias grad reduction staging");
    t.free(g1);
    t.free(s.ctx);  // addmm's saved mat1 (eager; flash's output stays with its own node)
    accumulate(t, p.o, gw);
    accumulate(t, p.ob, gb);
  } else {
    g_ctx = opt_linear_backward(t, d, m, p.o, p.ob, g1, d.H, d.H, false, false, cast(3), &s.ctx);
  }
  t.free(s.ctx);
  t.free(s.attn_out);
  if (d.tf4x) {
    Id sum = opt_attention_backward_tf4x(t, d, m, p, s, g_ctx);
    t.free(s.in_q);
    t.free(s.in_k);
    t.free(s.in_v);
    for (int i = 0; i < s.ncasts; ++i) t.free(s.casts[i]);
    ln_backward(t, d, s.ln1, p.ln1w, p.ln1b, sum, g_res, x_in);
    return;
  }
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
    if (d.e_c != 4) {  // softmax(dtype=fp32) over bf16 scores: the gradient back in their dtype
      Id g16 = t.alloc(bhtt * d.e_c, Tmp, "softmax backward to the input dtype");
      t.free(gsm);
      gsm = g16;
    }
    Id gsc = d.opt_unscaled ? gsm : t.alloc(bhtt * d.e_c, Tmp, "scaling (1.0) backward");
    if (!d.opt_unscaled) t.free(gsm);
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
    t.free(s.rng_seed);
    t.free(s.rng_offset);
    t.free(g_ctx);
    t.free(s.lse);
    t.free(s.q_s);
    t.free(s.k);
    t.free(s.v);
  }
  // v, k, q projections (reverse creation order) on contiguous copies of their output grads;
  // the input grads sum (the first sum out of place)
  Id gin_v = opt_linear_backward(t, d, m, p.v, p.vb, gv, d.H, d.H, cast_in, true, cast(2), &s.in_v);
  Id gin_k = opt_linear_backward(t, d, m, p.k, p.kb, gk, d.H, d.H, cast_in, true, cast(1), &s.in_k,
                                 cast_in ? &gin_v : nullptr);
  Id sum = sum_v_and_k(t, d, cast_in, gin_v, gin_k);
  // q's gradient through the q * scaling of the forward (a new tensor), made only now that v's and
  // k's projections are done, then made contiguous for addmm like theirs (the H200 trace)
  Id gq2 = t.alloc(nq * d.e_c, Tmp, "q scaling backward");
  t.free(gq);
  Id gin_q = opt_linear_backward(t, d, m, p.q, p.qb, gq2, d.H, d.H, cast_in, true, cast(0), &s.in_q,
                                 cast_in ? &sum : nullptr);
  t.free(gin_q);
  t.free(s.in_q);
  t.free(s.in_k);
  t.free(s.in_v);
  for (int i = 0; i < s.ncasts; ++i) t.free(s.casts[i]);
  ln_backward(t, d, s.ln1, p.ln1w, p.ln1b, sum, g_res, x_in);
}

}  // namespace

namespace {

// The LM head's forward and backward over the final LayerNorm's output (or the last layer's,
// without one), then that norm's backward: the residual stream's gradient into the last layer.
// `cached`: autocast's cache, cleared as the forward's autocast exits.
Id opt_head(Tape& t, const Dims& d, Model& m, std::vector<Id>& cached, LnSaved& fln, Id& final_out, Id& last_out) {
  Param& head = m.tied ? m.embed : m.lm_head;
  Dims dh = d;
  dh.head_in_fp32 = d.ln_upcast && m.final_ln;  // the final LayerNorm's fp32 output
  Head hd = head_forward(t, dh, m, cached, final_out);
  Id gh = head_backward(t, dh, m, head, hd, final_out);
  if (!m.final_ln) return gh;
  Id g_res = 0;
  ln_backward(t, d, fln, m.flnw, m.flnb, gh, g_res, last_out);
  return g_res;
}

// The embeddings' backward: positions, then tokens (dense gradients; sort buffers above 3072
// indices); the token embedding's gradient summed with the tied LM head's. `off`: the position
// lookup's saved indices, released with its node.
// `g_res`: the residual stream's gradient, released (4.4x, its CPU traces) once the token lookup's
// gradient exists, before the tied sum; 0: released by the caller afterwards.
void opt_embeddings_backward(Tape& t, const Dims& d, Model& m, Id& off, Id& g_res) {
  for (Param* p : {&m.pos, &m.embed}) {
    Id sorted = 0, orig = 0;
    embedding_backward_sort_buffers(t, d.BT, sorted, orig);
    Id g = t.alloc(p->bytes, Category::kGradients, "embedding weight grad");
    t.free(sorted);
    t.free(orig);
    if (p == &m.embed) t.free(g_res);
    accumulate_tied(t, *p, g);
    if (p == &m.pos) t.free(off);
  }
}

// OPTDecoder and OPTForCausalLM under transformers 4.43 to 4.47 (eager, no checkpointing: see
// validate_job), read off the CPU trace of 4.45.2. The [B, 1, T, T] mask in the embeddings' dtype
// comes from _prepare_4d_causal_attention_mask: a [T, T] full() of finfo.min with its arange /
// lt pattern, 1 − the expanded padding mask, its masked_fill through a bool copy, then the causal
// mask's masked_fill (the kept copy) through another; the positions are the long mask's cumsum
// times the mask, − 1, + 2 (the last saved by the position lookup). The mask goes when the
// decoder returns (no op saves it). (Python-number scalars, which the CPU wraps into 0-d tensors,
// stay on the host under CUDA and are left out.)
void opt_forward_backward_tf4x(Tape& t, const Dims& d, Model& m, Id x_tok) {
  const u64 bt = d.BT, btt = d.B * d.T * d.T;
  Id am = t.alloc(bt * 4, Category::kInputs, "attention_mask ones");
  Id full = t.alloc(d.T * d.T * d.e_r, Tmp, "_make_causal_mask: full(T, T, finfo.min)");
  Id ar = t.alloc(d.T * 8, Tmp, "arange(T)");
  Id ar1 = t.alloc(d.T * 8, Tmp, "arange(T) + 1");
  Id lt = t.alloc(d.T * d.T, Tmp, "arange < (arange + 1) (bool)");
  t.free(ar1);
  t.free(lt);
  t.free(ar);
  Id inv = t.alloc(btt * d.e_r, Tmp, "1 - expanded attention_mask");
  Id b1 = t.alloc(btt, Tmp, "inverted mask .to(bool)");
  Id inv2 = t.alloc(btt * d.e_r, Tmp, "inverted mask masked_fill");
  t.free(b1);
  t.free(inv);
  Id b2 = t.alloc(btt, Tmp, "expanded mask .bool()");
  Id mask = t.alloc(btt * d.e_r, Category::kInputs, "causal mask [B,1,T,T] (masked_fill)");
  t.free(b2);
  t.free(inv2);
  t.free(full);
  Id lm = t.alloc(bt * 8, Category::kInputs, "attention_mask.long()");
  Id cs = t.alloc(bt * 8, Category::kInputs, "cumsum");
  Id mul = t.alloc(bt * 8, Category::kInputs, "cumsum * mask");
  t.free(cs);
  Id sub = t.alloc(bt * 8, Category::kInputs, "positions (- 1)");
  t.free(mul);
  Id off = t.alloc(bt * 8, Category::kInputs, "positions + offset (saved by the lookup)");
  Id x_pos = t.alloc(bt * d.H * d.e_r, A, "embed_positions output");
  t.free(lm);
  t.free(sub);
  Id x = t.alloc(bt * d.H * d.e_r, A, "inputs_embeds + pos_embeds");
  std::vector<OptSaved> saved(d.L);
  for (u64 l = 0; l < d.L; ++l) opt_layer_forward(t, d, m, saved[l], mask, l > 0 ? saved[l - 1].out : x);
  LnSaved fln;
  if (m.final_ln) {
    fln = ln_forward(t, d);
    if (d.ln_upcast) t.free(saved[d.L - 1].out);  // the final norm saved its fp32 cast instead
  }
  Id& final_out = m.final_ln ? fln.out : saved[d.L - 1].out;
  t.free(am);
  t.free(x_tok);
  t.free(mask);
  t.free(x_pos);
  std::vector<Id> cached = m.bias_casts;  // autocast's cache: cleared when the forward's autocast exits
  m.bias_casts.clear();
  Id g_res = opt_head(t, d, m, cached, fln, final_out, saved[d.L - 1].out);
  for (u64 l = d.L; l-- > 0;)
    opt_layer_backward(t, d, m, m.opt_layers[l], saved[l], g_res, l > 0 ? saved[l - 1].out : x);
  opt_embeddings_backward(t, d, m, off, g_res);
  t.free(x);
}

}  // namespace

void opt_forward_backward(Tape& t, const Dims& d, const HfJob& j, Model& m) {
  // the batch (input_ids, labels) is the driver's (hf_trainer_schedule: the Trainer's loop holds
  // it until the next step's batches are fetched)
  if (d.ddp) ddp_pre_forward(t, m, d);  // DDP.forward before the module's: rebuild, buffers
  t.phase("forward");
  const u64 bt = d.BT;
  Id x_tok = t.alloc(bt * d.H * d.e_r, A, "embed_tokens output");
  if (d.tf4x) return opt_forward_backward_tf4x(t, d, m, x_tok);
  // transformers 4.49 to 4.57, 5.0 and 5.1 (eager): _prepare_4d_causal_attention_mask_with_cache_position,
  // before the positions (their CPU traces): a [T, T] full() of finfo.min and its triu, the
  // `arange > cache_position` pattern (a bool [T, T]; the CPU's float temporary for the in-place
  // product is TensorIterator's CPU path, not CUDA's), the triu expanded over the batch and cloned
  // (the mask kept), then mask + attention_mask, its `== 0` (bool) and the masked_fill written back
  // into the mask (a temporary)
  Id mask = 0;
  if (d.opt_mask_4x) {
    const u64 tt = d.T * d.T, btt = d.B * d.T * d.T;
    Id full = t.alloc(tt * d.e_r, Tmp, "causal mask full((T, T), min)");
    Id triu = t.alloc(tt * d.e_r, Tmp, "causal mask triu");
    t.free(full);
    Id gt = t.alloc(tt, Tmp, "arange > cache_position (bool)");
    t.free(gt);
    mask = t.alloc(btt * d.e_r, Category::kInputs, "causal mask [B,1,T,T] (expand().clone())");
    t.free(triu);
    Id sum = t.alloc(btt * d.e_r, Tmp, "causal mask + attention_mask");
    Id eq = t.alloc(btt, Tmp, "(causal mask + attention_mask) == 0 (bool)");
    t.free(sum);
    Id filled = t.alloc(btt * d.e_r, Tmp, "masked_fill (copied into the mask)");
    t.free(filled);
    t.free(eq);
  }
  // OPTDecoder: attention_mask = ones(B, T) (fp32), position_ids = cumsum(mask) * mask - 1
  Id am = t.alloc(bt * 4, Category::kInputs, "attention_mask ones");
  Id cs = t.alloc(bt * 4, Category::kInputs, "cumsum");
  Id mul = t.alloc(bt * 4, Category::kInputs, "cumsum * mask");
  t.free(cs);
  Id sub = t.alloc(bt * 4, Category::kInputs, "- 1");
  t.free(mul);
  Id pid = t.alloc(bt * 8, Category::kInputs, "position_ids");
  t.free(sub);
  // the float mask is made from boolean patterns (the H200 trace of eager attention): two [1, 1, T, T]
  // (the causal pattern, 1 MiB each at T = 1024) and the [B, 1, T, T] combined with the padding mask,
  // which goes once the float mask exists
  const bool masked = (d.eager || d.e_c == 4) && !d.opt_mask_4x;
  Id p1 = masked ? t.alloc(d.T * d.T, Tmp, "causal pattern (bool)") : 0;
  Id p2 = masked ? t.alloc(d.T * d.T, Tmp, "causal pattern (bool)") : 0;
  t.free(p1);
  Id pm = masked ? t.alloc(d.B * d.T * d.T, Tmp, "causal & padding mask (bool)") : 0;
  t.free(p2);
  if (masked) mask = t.alloc(d.B * d.T * d.T * d.e_r, Category::kInputs, "causal mask [B,1,T,T]");
  t.free(pm);
  Id off = t.alloc(bt * 8, Category::kInputs, "position_ids + offset");
  // the position embedding's lookup saves its indices (position_ids + offset) for its backward
  Id x_pos = t.alloc(bt * d.H * d.e_r, A, "embed_positions output");
  Id x = t.alloc(bt * d.H * d.e_r, A, "inputs_embeds + pos_embeds");
  std::vector<OptSaved> saved(d.L);
  Id layer_in = x;
  const bool ckpt = j.activation_checkpointing;
  std::vector<Id> ckpt_casts;  // checkpointing: the weight casts stay in autocast's cache only
  for (u64 l = 0; l < d.L; ++l) {
    opt_layer_forward(t, d, m, saved[l], mask, l > 0 ? saved[l - 1].out : x, ckpt);
    if (ckpt) {  // see llama's drop_saved: what the layer saved goes; the frame keeps its inputs
      OptSaved& s = saved[l];
      for (Id* id : {&s.ln1.out, &s.ln1.mean, &s.ln1.rstd, &s.ln2.out, &s.ln2.mean, &s.ln2.rstd, &s.in_q, &s.in_k,
                     &s.in_v, &s.in_fc1, &s.qc, &s.kT, &s.vc, &s.probs32, &s.probs16, &s.ctx, &s.lse, &s.attn_out, &s.rng_seed, &s.rng_offset,
                     &s.q_s, &s.k, &s.v, &s.h1, &s.relu, &s.mask1, &s.mask2})
        t.free(*id);
      for (int i = 0; i < s.ncasts; ++i) ckpt_casts.push_back(s.casts[i]);
      s.ncasts = 0;
    }
    layer_in = saved[l].out;
  }
  LnSaved fln;
  if (m.final_ln) {
    fln = ln_forward(t, d);
    if (d.ln_upcast) t.free(saved[d.L - 1].out);  // the final norm saved its fp32 cast instead
  }
  Id& final_out = m.final_ln ? fln.out : layer_in;
  if (!ckpt) {  // else the checkpoint frames hold the mask and position_ids until their backward
    t.free(mask);
    t.free(pid);
  }
  t.free(am);
  t.free(x_tok);
  t.free(x_pos);
  std::vector<Id> cached = m.bias_casts;  // autocast's cache: cleared when the forward's autocast exits
  m.bias_casts.clear();
  cached.insert(cached.end(), ckpt_casts.begin(), ckpt_casts.end());
  Id g_res = opt_head(t, d, m, cached, fln, final_out, saved[d.L - 1].out);
  for (u64 l = d.L; l-- > 0;) {
    if (ckpt) {
      // recomputed before its backward (under the recorded autocast state); early stop: the
      // recomputed output goes, and the recompute's autocast cache (its bias casts) with it
      OptSaved r;
      Id unused = 0;  // (checkpointing with ln_upcast is refused: the layer input is the frame's)
      m.swap_thread_workspaces();
      opt_layer_forward(t, d, m, r, mask, unused, false, true);
      m.swap_thread_workspaces();
      t.free(r.out);
      for (Id& c : m.bias_casts) t.free(c);
      m.bias_casts.clear();
      r.out = saved[l].out;
      saved[l] = r;
    }
    opt_layer_backward(t, d, m, m.opt_layers[l], saved[l], g_res, l > 0 ? saved[l - 1].out : x);
  }
  t.free(mask);
  t.free(pid);
  Id none = 0;
  opt_embeddings_backward(t, d, m, off, none);
  t.free(g_res);
  t.free(x);
}

}  // namespace scalelab::predict::detail
