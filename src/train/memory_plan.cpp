#include "train/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/allocator.h"
#include "core/error.h"
#include "dist/zero.h"
#include "kernels/attention.h"
#include "kernels/fused.h"
#include "kernels/matmul.h"
#include "model/params.h"

namespace scalelab {

namespace {

// A backend that hands out distinct fake addresses and never touches memory: the plan runs the
// real allocator's caching policy over the schedule of requests the engine makes.
class VirtualBackend final : public MemoryBackend {
 public:
  void* raw_alloc(std::size_t bytes) override {
    void* p = reinterpret_cast<void*>(next_);
    next_ += (bytes + 4095) / 4096 * 4096 + 4096;
    return p;
  }
  void raw_free(void*, std::size_t) override {}
  DeviceType device() const override { return DeviceType::kCPU; }

 private:
  std::uintptr_t next_ = 0x100000;
};

// Categories of the plan, in display order.
const char* const kCategories[] = {"weights",          "gradients",        "optimizer states",     "batch",
                                   "activations",      "attention scores", "logits",               "fused loss chunk",
                                   "head buffers",     "recomputed layer", "backward temporaries", "workspace"};

class Schedule {
 public:
  // capacity 0: unlimited (the plain plan); else the allocator flushes its cache and fails as
  // the real one does, which tells whether a configuration fits.
  explicit Schedule(std::size_t capacity = 0)
      : alloc_(std::make_unique<VirtualBackend>(), capacity == 0 ? ~std::size_t{0} : capacity) {}

  int alloc(const char* category, std::size_t bytes) {
    void* p = alloc_.allocate(bytes);
    const int id = next_id_++;
    const std::size_t rounded = DeviceAllocator::round_size(std::max<std::size_t>(bytes, 1));
    live_[id] = {p, rounded, category};
    rounding_[category] += rounded - bytes;
    std::size_t& cur = current_[category];
    cur += rounded;
    most_[category] = std::max(most_[category], cur);
    const MemoryStats st = alloc_.stats();
    if (st.reserved > peak_reserved_) {
      peak_reserved_ = st.reserved;
      snapshot_.clear();
      for (const auto& [k, v] : live_) snapshot_[v.category] += v.bytes;
      cached_at_peak_ = st.reserved - st.allocated;
    }
    return id;
  }
  void free(int id) {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    alloc_.deallocate(it->second.p);
    current_[it->second.category] -= it->second.bytes;
    live_.erase(it);
  }
  std::size_t peak_reserved() const { return peak_reserved_; }
  const std::map<std::string, std::size_t>& snapshot() const { return snapshot_; }
  // Per category: the most bytes live at once during the schedule (what that part needs).
  const std::map<std::string, std::size_t>& most() const { return most_; }
  std::size_t cached_at_peak() const { return cached_at_peak_; }
  std::size_t rounding_total() const {
    std::size_t r = 0;
    for (const auto& [k, v] : rounding_) r += v;
    return r;
  }

 private:
  struct Live {
    void* p;
    std::size_t bytes;
    std::string category;
  };
  DeviceAllocator alloc_;
  std::map<int, Live> live_;
  std::map<std::string, std::size_t> snapshot_, rounding_, current_, most_;
  std::size_t peak_reserved_ = 0, cached_at_peak_ = 0;
  int next_id_ = 0;
};

struct Sizes {
  std::size_t T, B, S, H, I, Q, KV, V, NH, L, P, ld;
  std::size_t E;  // OPT: word_embed_proj_dim (the token embedding and LM head width)
};

struct LayerActs {
  int rstd1 = -1, y1 = -1, qkv = -1, attn = -1, probs = -1, h = -1, rstd2 = -1, y2 = -1, gu = -1, act = -1;
  int x = -1;
};

// The transient GEMM panels gemm_ex takes (and frees in reverse order) for one product.
void gemm_schedule(Schedule& s, std::size_t m, std::size_t n, std::size_t k, DType at, DType bt, DType ct) {
  std::vector<int> ids;
  for (std::size_t b : kernels::gemm_ex_workspace_blocks(static_cast<std::int64_t>(m), static_cast<std::int64_t>(n),
                                                        static_cast<std::int64_t>(k), at, bt, ct))
    ids.push_back(s.alloc("workspace", b));
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) s.free(*it);
}

// The chunked linear + cross-entropy of fused kernels (both families): its blocks, and per chunk
// the low-precision path's three GEMMs (input A, weight W, gradients G dtypes).
void fused_loss_schedule(Schedule& s, std::size_t T, std::size_t H, std::size_t V, DType A, DType W, DType G) {
  const auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  const auto blocks = kernels::fused_linear_cross_entropy_workspace_blocks(i64(T), 0, i64(H), i64(V), A, W, A, G, true);
  std::vector<int> ids;
  for (std::size_t b : blocks) ids.push_back(s.alloc("fused loss chunk", b));
  if (blocks.size() > 1) {
    const std::size_t c = static_cast<std::size_t>(kernels::fused_linear_cross_entropy_chunk(i64(T), 0, i64(V)));
    for (std::size_t r0 = 0; r0 < T; r0 += c) {
      const std::size_t cc = std::min(c, T - r0);
      gemm_schedule(s, cc, V, H, DType::kF32, W, DType::kF32);
      gemm_schedule(s, cc, H, V, DType::kF32, W, A);
      gemm_schedule(s, V, H, cc, DType::kF32, DType::kF32, G);
    }
  }
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) s.free(*it);
}

// The Llama engine's requests for one training step, in the order src/model/llama.cpp makes them
// (including the kernels' transient workspaces). Keep the two in step: tests compare the plan
// with the allocator's measured peak.
void llama_step(Schedule& s, const Sizes& z, const PlanInput& in) {
  const DType A = in.precision.activation, W = in.precision.compute_weights, G = in.precision.grad;
  const std::size_t a = dtype_size(A), f = 4;
  const bool ckpt = in.options.activation_checkpointing;
  const bool fused = in.options.fused_kernels;
  const auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  auto gemm_ws = [&](std::size_t m, std::size_t n, std::size_t k, DType at, DType bt, DType ct) {
    gemm_schedule(s, m, n, k, at, bt, ct);
  };
  auto lin_fwd = [&](std::size_t in_f, std::size_t out_f) { gemm_ws(z.T, out_f, in_f, A, W, A); };
  auto lin_bwd = [&](std::size_t in_f, std::size_t out_f) {
    gemm_ws(z.T, in_f, out_f, A, W, A);
    gemm_ws(out_f, in_f, z.T, A, A, G);
  };
  kernels::AttentionShape as{i64(z.B), i64(z.S), i64(z.NH), i64(z.NH * z.KV / z.Q), i64(z.Q / z.NH)};
  const bool flash = in.options.attention == AttentionImpl::kFlash;
  const int nt = std::max(1, in.threads);
  const std::size_t attn_fwd_ws = flash ? kernels::attention_flash_workspace_bytes(as, nt, Phase::kForward, A)
                                        : kernels::attention_eager_forward_workspace_bytes(as, nt, A);
  const std::size_t attn_bwd_ws = flash ? kernels::attention_flash_workspace_bytes(as, nt, Phase::kBackward, A)
                                        : kernels::attention_eager_backward_workspace_bytes(as, nt, A);
  auto layer_forward = [&](LayerActs& la, const char* cat) {
    la.rstd1 = s.alloc(cat, z.T * f);
    la.y1 = s.alloc(cat, z.T * z.H * a);
    la.qkv = s.alloc(cat, z.T * z.ld * a);
    lin_fwd(z.H, z.ld);
    if (fused) s.free(la.y1), la.y1 = -1;
    la.attn = s.alloc(cat, z.T * z.Q * a);
    if (flash) {
      la.probs = s.alloc(cat, z.B * z.NH * z.S * f);  // the saved log-sum-exp
    } else {
      la.probs = s.alloc(ckpt && cat[0] == 'r' ? cat : "attention scores", z.B * z.NH * z.S * z.S * a);
    }
    if (attn_fwd_ws > 0) s.free(s.alloc("workspace", attn_fwd_ws));
    la.h = s.alloc(cat, z.T * z.H * a);
    lin_fwd(z.Q, z.H);
    la.rstd2 = s.alloc(cat, z.T * f);
    la.y2 = s.alloc(cat, z.T * z.H * a);
    la.gu = s.alloc(cat, z.T * 2 * z.I * a);
    lin_fwd(z.H, 2 * z.I);
    if (fused) s.free(la.y2), la.y2 = -1;
    la.act = s.alloc(cat, z.T * z.I * a);
    lin_fwd(z.I, z.H);  // into the layer output allocated by the caller
    if (fused) s.free(la.act), la.act = -1;
  };
  auto drop_all_but_input = [&](LayerActs& la) {
    for (int id : {la.rstd1, la.y1, la.qkv, la.probs, la.attn, la.h, la.rstd2, la.y2, la.gu, la.act}) s.free(id);
    const int x = la.x;
    la = LayerActs();
    la.x = x;
  };
  std::vector<LayerActs> acts(z.L);
  int x = s.alloc("activations", z.T * z.H * a);  // embeddings
  for (std::size_t l = 0; l < z.L; ++l) {
    const int out = s.alloc("activations", z.T * z.H * a);
    acts[l].x = x;
    layer_forward(acts[l], "activations");
    if (ckpt) drop_all_but_input(acts[l]);
    x = out;
  }
  const int xf = s.alloc("head buffers", z.T * z.H * a), rstdf = s.alloc("head buffers", z.T * f);
  int dxf;
  if (fused) {
    dxf = s.alloc("head buffers", z.T * z.H * a);
    fused_loss_schedule(s, z.T, z.H, z.V, A, W, G);
  } else {
    const int logits = s.alloc("logits", z.T * z.V * a);
    lin_fwd(z.H, z.V);
    const int lse = s.alloc("head buffers", z.T * f);
    dxf = s.alloc("head buffers", z.T * z.H * a);
    lin_bwd(z.H, z.V);
    s.free(lse);
    s.free(logits);
  }
  const int dx = s.alloc("backward temporaries", z.T * z.H * a);
  s.free(dxf);
  s.free(xf);
  for (std::size_t li = z.L; li-- > 0;) {
    LayerActs& la = acts[li];
    if (ckpt) {
      const int out = s.alloc("recomputed layer", z.T * z.H * a);
      layer_forward(la, "recomputed layer");
      s.free(out);
    }
    int dgu, y2 = la.y2;
    if (fused) {
      const int scratch = s.alloc("backward temporaries", z.T * z.I * a);  // dact, then act
      gemm_ws(z.T, z.I, z.H, A, W, A);
      gemm_ws(z.H, z.I, z.T, A, A, G);
      s.free(scratch);
      dgu = -1;  // written over gu
      y2 = s.alloc("backward temporaries", z.T * z.H * a);
    } else {
      const int dact = s.alloc("backward temporaries", z.T * z.I * a);
      lin_bwd(z.I, z.H);
      s.free(la.act);
      dgu = s.alloc("backward temporaries", z.T * 2 * z.I * a);
      s.free(dact);
    }
    const int dy = s.alloc("backward temporaries", z.T * z.H * a);
    lin_bwd(z.H, 2 * z.I);
    s.free(dgu);
    s.free(la.gu);
    s.free(y2);
    const int dattn = s.alloc("backward temporaries", z.T * z.Q * a);
    lin_bwd(z.Q, z.H);
    const int dqkv = s.alloc("backward temporaries", z.T * z.ld * a);
    s.free(s.alloc("workspace", attn_bwd_ws));
    s.free(dattn);
    s.free(la.probs);
    int y1 = la.y1;
    if (fused) y1 = s.alloc("backward temporaries", z.T * z.H * a);
    lin_bwd(z.H, z.ld);
    s.free(y1);
    s.free(dqkv);
    s.free(dy);
    for (int id : {la.x, la.rstd1, la.qkv, la.attn, la.h, la.rstd2}) s.free(id);
  }
  s.free(x);
  s.free(rstdf);
  s.free(dx);
}

// The OPT engine's requests for one training step, in the order src/model/opt.cpp makes them
// (pre-LN or post-LN layers, project_in/out, fused or unfused, dropout gradient buffers, eager or
// flash, checkpointing; kernels' transient workspaces included).
void opt_step(Schedule& s, const Sizes& z, const PlanInput& in) {
  const ModelConfig& c = in.config;
  const DType A = in.precision.activation, W = in.precision.compute_weights, G = in.precision.grad;
  const std::size_t a = dtype_size(A), f = 4;
  const bool ckpt = in.options.activation_checkpointing, fused = in.options.fused_kernels;
  const bool drop = in.options.dropout > 0, pre_ln = c.do_layer_norm_before, final_ln = c.has_final_layer_norm();
  const bool proj = z.E != z.H;
  const auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  auto gemm_ws = [&](std::size_t m, std::size_t n, std::size_t k, DType at, DType bt, DType ct) {
    gemm_schedule(s, m, n, k, at, bt, ct);
  };
  auto lin_fwd = [&](std::size_t in_f, std::size_t out_f) { gemm_ws(z.T, out_f, in_f, A, W, A); };
  auto lin_bwd = [&](std::size_t in_f, std::size_t out_f) {
    gemm_ws(z.T, in_f, out_f, A, W, A);
    gemm_ws(out_f, in_f, z.T, A, A, G);
  };
  kernels::AttentionShape as{i64(z.B), i64(z.S), i64(z.NH), i64(z.NH), i64(z.H / z.NH)};
  const bool flash = in.options.attention == AttentionImpl::kFlash;
  const int nt = std::max(1, in.threads);
  const std::size_t attn_fwd_ws = flash ? kernels::attention_flash_workspace_bytes(as, nt, Phase::kForward, A)
                                        : kernels::attention_eager_forward_workspace_bytes(as, nt, A);
  const std::size_t attn_bwd_ws = flash ? kernels::attention_flash_workspace_bytes(as, nt, Phase::kBackward, A)
                                        : kernels::attention_eager_backward_workspace_bytes(as, nt, A);
  const std::size_t TH = z.T * z.H * a, TI = z.T * z.I * a;
  struct Acts {
    int x = -1, mean1 = -1, rstd1 = -1, a_in = -1, qkv = -1, probs = -1, attn = -1, h = -1, mean2 = -1, rstd2 = -1,
        m_in = -1, pre = -1, act = -1, h2 = -1;
    void free_all(Schedule& sc, bool keep_input) {
      for (int id : {mean1, rstd1, a_in, qkv, probs, attn, h, mean2, rstd2, m_in, pre, act, h2}) sc.free(id);
      if (!keep_input) sc.free(x);
      const int in = x;
      *this = Acts();
      if (keep_input) x = in;
    }
  };
  auto attention_forward = [&](Acts& la, const char* cat) {
    la.qkv = s.alloc(cat, z.T * 3 * z.H * a);
    lin_fwd(z.H, 3 * z.H);
    la.attn = s.alloc(cat, TH);
    if (flash) {
      la.probs = s.alloc(cat, z.B * z.NH * z.S * f);  // the saved log-sum-exp
    } else {
      la.probs = s.alloc(ckpt && cat[0] == 'r' ? cat : "attention scores", z.B * z.NH * z.S * z.S * a);
    }
    if (attn_fwd_ws > 0) s.free(s.alloc("workspace", attn_fwd_ws));
    la.h = s.alloc(cat, TH);
    lin_fwd(z.H, z.H);
  };
  auto mlp_up = [&](Acts& la, const char* cat) {
    if (fused) {
      la.act = s.alloc(cat, TI);
      lin_fwd(z.H, z.I);
    } else {
      la.pre = s.alloc(cat, TI);
      lin_fwd(z.H, z.I);
      la.act = s.alloc(cat, TI);
    }
  };
  auto layer_forward = [&](Acts& la, const char* cat) {
    if (pre_ln) {
      la.mean1 = s.alloc(cat, z.T * f);
      la.rstd1 = s.alloc(cat, z.T * f);
      la.a_in = s.alloc(cat, TH);
      attention_forward(la, cat);
      if (fused) {
        s.free(la.a_in);
        la.a_in = -1;
      }
      la.mean2 = s.alloc(cat, z.T * f);
      la.rstd2 = s.alloc(cat, z.T * f);
      la.m_in = s.alloc(cat, TH);
      mlp_up(la, cat);
      if (fused) {
        s.free(la.m_in);
        la.m_in = -1;
      }
      lin_fwd(z.I, z.H);  // into the layer output allocated by the caller
    } else {
      attention_forward(la, cat);
      la.mean1 = s.alloc(cat, z.T * f);
      la.rstd1 = s.alloc(cat, z.T * f);
      la.m_in = s.alloc(cat, TH);
      mlp_up(la, cat);
      la.h2 = s.alloc(cat, TH);
      lin_fwd(z.I, z.H);
      la.mean2 = s.alloc(cat, z.T * f);
      la.rstd2 = s.alloc(cat, z.T * f);
      if (fused) {
        s.free(la.m_in);
        la.m_in = -1;
      }
    }
  };
  // MLP backward from the output gradient: dropout buffer, dact, the recomputed norm output.
  auto mlp_backward = [&](Acts& la) {
    const int dd = drop ? s.alloc("backward temporaries", TH) : -1;
    const int dact = s.alloc("backward temporaries", TI);
    lin_bwd(z.I, z.H);
    s.free(dd);
    if (fused) {
      s.free(la.act);
      const int m = s.alloc("backward temporaries", TH);
      lin_bwd(z.H, z.I);
      s.free(m);
    } else {
      s.free(la.act);
      s.free(la.pre);
      lin_bwd(z.H, z.I);
    }
    la.act = la.pre = -1;
    s.free(dact);
  };
  auto attention_backward = [&](Acts& la) {
    const int dd = drop ? s.alloc("backward temporaries", TH) : -1;
    const int dattn = s.alloc("backward temporaries", TH);
    lin_bwd(z.H, z.H);
    s.free(dd);
    const int dqkv = s.alloc("backward temporaries", z.T * 3 * z.H * a);
    s.free(s.alloc("workspace", attn_bwd_ws));
    s.free(dattn);
    s.free(la.probs);
    la.probs = -1;
    return dqkv;
  };

  // Embeddings.
  std::vector<Acts> acts(z.L);
  int emb_in = -1, x;
  if (proj) {
    emb_in = s.alloc("activations", z.T * z.E * a);
    x = s.alloc("activations", TH);
    lin_fwd(z.E, z.H);
  } else {
    x = s.alloc("activations", TH);
  }
  for (std::size_t l = 0; l < z.L; ++l) {
    const int out = s.alloc("activations", TH);
    acts[l].x = x;
    layer_forward(acts[l], "activations");
    if (ckpt) acts[l].free_all(s, true);
    x = out;
  }
  // Head: final norm, project_out, LM head + loss, and their backward.
  int meanf = -1, rstdf = -1, xf = -1, xp = -1;
  if (final_ln) {
    meanf = s.alloc("head buffers", z.T * f);
    rstdf = s.alloc("head buffers", z.T * f);
    xf = s.alloc("head buffers", TH);
  }
  if (proj) {
    xp = s.alloc("head buffers", z.T * z.E * a);
    lin_fwd(z.H, z.E);
  }
  int dxp = s.alloc("head buffers", z.T * z.E * a);
  if (fused) {
    fused_loss_schedule(s, z.T, z.E, z.V, A, W, G);
  } else {
    const int logits = s.alloc("logits", z.T * z.V * a);
    lin_fwd(z.E, z.V);
    const int lse = s.alloc("head buffers", z.T * f);
    lin_bwd(z.E, z.V);
    s.free(lse);
    s.free(logits);
  }
  int dx = dxp;  // the head's gradient flowing into the last layer
  int dxf = -1;
  if (proj) {
    dxf = s.alloc("backward temporaries", TH);
    lin_bwd(z.H, z.E);
    s.free(dxp);
    s.free(xp);
    dxp = -1;
    dx = dxf;
  }
  if (final_ln) {
    dx = s.alloc("backward temporaries", TH);
    s.free(dxf);
    s.free(dxp);
    s.free(meanf);
    s.free(rstdf);
    s.free(xf);
  }
  s.free(x);
  for (std::size_t li = z.L; li-- > 0;) {
    Acts& la = acts[li];
    if (ckpt) {
      const int out = s.alloc("recomputed layer", TH);
      layer_forward(la, "recomputed layer");
      s.free(out);
    }
    if (pre_ln) {
      const int dy = s.alloc("backward temporaries", TH);
      mlp_backward(la);
      const int dqkv = attention_backward(la);
      if (fused) {
        const int m = s.alloc("backward temporaries", TH);
        lin_bwd(z.H, 3 * z.H);
        s.free(m);
      } else {
        lin_bwd(z.H, 3 * z.H);
      }
      s.free(dqkv);
      s.free(dy);
    } else {
      const int dh2 = s.alloc("backward temporaries", TH);
      s.free(dx);
      dx = dh2;
      mlp_backward(la);
      const int dh = s.alloc("backward temporaries", TH);
      s.free(dx);
      dx = dh;
      const int dqkv = attention_backward(la);
      lin_bwd(z.H, 3 * z.H);
      s.free(dqkv);
    }
    la.free_all(s, false);
  }
  // Embedding backward: through project_in when there is one.
  if (proj) {
    const int de = s.alloc("backward temporaries", z.T * z.E * a);
    lin_bwd(z.E, z.H);
    s.free(dx);
    s.free(emb_in);
    s.free(de);
  } else {
    s.free(dx);
  }
}

// What the OPT categories hold (where they differ from Llama's wording).
std::string opt_detail(const std::string& cat, const Sizes& z, const PlanInput& in) {
  const ModelConfig& c = in.config;
  const std::size_t a = dtype_size(in.precision.activation);
  const bool fused = in.options.fused_kernels, pre_ln = c.do_layer_norm_before;
  const auto rs = [](std::size_t b) { return DeviceAllocator::round_size(b); };
  if (cat == "activations") {
    if (in.options.activation_checkpointing)
      return "checkpointing keeps each layer's input only: " + format_bytes(rs(z.T * z.H * a)) + " per layer";
    // Kept per layer: input, qkv, attention output, residual h, MLP activation (+ fc1 output
    // unfused), the LayerNorm outputs (unfused; pre-LN: two, post-LN: one) and the post-LN second
    // residual, four fp32 statistics rows.
    std::size_t th = 3 + (pre_ln ? 0 : 1) + (fused ? 0 : (pre_ln ? 2 : 1));
    const std::size_t per_layer = rs(z.T * 4) * 4 + rs(z.T * z.H * a) * th + rs(z.T * 3 * z.H * a) +
                                  rs(z.T * z.I * a) * (fused ? 1 : 2);
    return format_bytes(per_layer) + " per layer kept for backward (input, qkv, attention output, residuals, " +
           (fused ? std::string("bias+ReLU output; LayerNorm outputs rebuilt in backward") :
                    std::string("LayerNorm outputs, fc1 output and activation")) +
           "; dropout masks are regenerated, never stored)";
  }
  if (cat == "head buffers")
    return std::string(c.has_final_layer_norm() ? "final LayerNorm output and statistics, " : "") +
           (z.E != z.H ? "project_out output, " : "") + "LM head input gradient, " +
           (fused ? std::string("no lse") : std::string("lse"));
  if (cat == "backward temporaries")
    return std::string("residual gradient and one layer's activation gradients") +
           (in.options.dropout > 0 ? ", a dropout-masked gradient [T, H]" : "") +
           (fused ? ", a recomputed LayerNorm output [T, H]" : "");
  return "";
}

struct Result {
  std::size_t total = 0;
  std::vector<PlanItem> items;
};

Result simulate(const PlanInput& in, bool with_items, std::size_t capacity = 0) {
  const ModelConfig& c = in.config;
  const ParamLayout layout = ParamLayout::build(c);
  Sizes z{};
  z.B = static_cast<std::size_t>(in.micro_batch);
  z.S = static_cast<std::size_t>(in.seq_len);
  z.T = z.B * z.S;
  z.H = static_cast<std::size_t>(c.hidden_size);
  z.I = static_cast<std::size_t>(c.intermediate_size);
  z.Q = static_cast<std::size_t>(c.q_dim());
  z.KV = static_cast<std::size_t>(c.kv_dim());
  z.V = static_cast<std::size_t>(c.vocab_size);
  z.NH = static_cast<std::size_t>(c.num_attention_heads);
  z.L = static_cast<std::size_t>(c.num_hidden_layers);
  z.P = static_cast<std::size_t>(layout.total_numel());
  z.ld = z.Q + 2 * z.KV;
  z.E = c.family == ModelFamily::kOPT ? static_cast<std::size_t>(c.word_embed_proj_dim) : z.H;
  const PrecisionPlan& pr = in.precision;
  const std::size_t a = dtype_size(pr.activation), f = 4;

  Schedule s(capacity);
  s.alloc("weights", z.P * dtype_size(pr.param));
  if (pr.weight_copy) s.alloc("weights", z.P * dtype_size(pr.compute_weights));
  s.alloc("gradients", z.P * dtype_size(pr.grad));
  const std::size_t states = static_cast<std::size_t>(optimizer_state_numel(in, static_cast<std::int64_t>(z.P)));
  s.alloc("optimizer states", states * dtype_size(pr.optim_state));
  s.alloc("optimizer states", states * dtype_size(pr.optim_state));
  const bool zero_shard = in.zero_stage == 1 && in.world_size > 1;
  if (zero_shard && states > 0) s.alloc("gradients", states * 4);  // ZeRO-1: the shard's reduce-scatter output
  s.alloc("batch", z.T * 4);
  s.alloc("batch", z.T * 4);
  for (int step = 0; step < 2; ++step) {
    if (c.family == ModelFamily::kOPT) {
      opt_step(s, z, in);
    } else {
      llama_step(s, z, in);
    }
  }

  Result r;
  r.total = s.peak_reserved();
  if (!with_items) return r;
  const auto& snap = s.snapshot();
  auto detail = [&](const std::string& cat) -> std::string {
    const std::string pd(dtype_name(pr.param)), wd(dtype_name(pr.compute_weights));
    if (c.family == ModelFamily::kOPT) {
      const std::string d = opt_detail(cat, z, in);
      if (!d.empty()) return d;
    }
    if (cat == "weights")
      return std::to_string(z.P) + " parameters, " + pd + (pr.weight_copy ? " master + " + wd + " compute copy" : "");
    const std::int64_t shard = optimizer_state_numel(in, static_cast<std::int64_t>(z.P));
    const std::string zero_note = in.zero_stage == 1 && in.world_size > 1
                                      ? ", ZeRO-1 shard of rank " + std::to_string(in.rank) + ": " +
                                            std::to_string(shard) + " of " + std::to_string(z.P) + " parameters"
                                      : "";
    if (cat == "gradients")
      return std::string(dtype_name(pr.grad)) + ", same layout as the weights" +
             (zero_note.empty() ? "" : " (+ the fp32 reduce-scatter output" + zero_note + ")");
    if (cat == "optimizer states")
      return "AdamW exp_avg and exp_avg_sq, " + std::string(dtype_name(pr.optim_state)) + zero_note;
    if (cat == "batch") return "input and target token ids";
    if (cat == "activations") {
      const std::size_t per_layer = DeviceAllocator::round_size(z.T * f) * 2 +
                                    DeviceAllocator::round_size(z.T * z.H * a) * 5 +
                                    DeviceAllocator::round_size(z.T * z.ld * a) +
                                    DeviceAllocator::round_size(z.T * z.Q * a) +
                                    DeviceAllocator::round_size(z.T * 2 * z.I * a) +
                                    DeviceAllocator::round_size(z.T * z.I * a);
      if (in.options.activation_checkpointing)
        return "checkpointing keeps each layer's input only: " + format_bytes(DeviceAllocator::round_size(z.T * z.H * a)) +
               " per layer";
      return format_bytes(per_layer) + " per layer kept for backward (input, norms, qkv, attention output, residual, "
                                       "gate/up, activation)";
    }
    if (cat == "attention scores" && in.options.attention == AttentionImpl::kFlash)
      return "flash attention keeps only the log-sum-exp";
    if (cat == "attention scores")
      return format_bytes(DeviceAllocator::round_size(z.B * z.NH * z.S * z.S * a)) +
             " per layer: eager softmax(QK^T) [B, heads, S, S]";
    if (cat == "fused loss chunk")
      return "fused linear + cross-entropy: one chunk of logits at a time (the full logits never exist)";
    if (cat == "logits")
      return "[tokens, vocab] " + std::string(dtype_name(pr.activation)) + "; the loss gradient is written in place";
    if (cat == "head buffers") return "final residual norm output, its gradient, rstd, lse";
    if (cat == "recomputed layer") return "one layer rebuilt in backward under checkpointing";
    if (cat == "backward temporaries") return "residual gradient and one layer's activation gradients";
    if (cat == "workspace") return "kernel scratch at the peak (attention blocks, GEMM conversion panels)";
    return "";
  };
  const auto& most = s.most();
  for (const char* cat : kCategories) {
    auto it = most.find(cat);
    if (it == most.end() || it->second == 0) continue;
    auto at = snap.find(cat);
    r.items.push_back({cat, it->second, at == snap.end() ? 0 : at->second, detail(cat)});
  }
  r.items.push_back({"allocator cache", s.cached_at_peak(), s.cached_at_peak(),
                     "freed blocks the caching allocator keeps reserved at the peak (reused next step)"});
  r.items.push_back({"allocator rounding", s.rounding_total(), 0,
                     "requests rounded up to 512 bytes (already counted in the lines above)"});
  return r;
}

}  // namespace

std::int64_t optimizer_state_numel(const PlanInput& in, std::int64_t total_params) {
  if (in.zero_stage != 1 || in.world_size <= 1) return total_params;
  SCALELAB_CHECK(in.rank >= 0 && in.rank < in.world_size, "[plan] rank outside the world");
  return ZeroOptimizer::shard_counts(total_params, in.world_size)[static_cast<std::size_t>(in.rank)];
}

std::size_t plan_total_bytes(const PlanInput& in) { return simulate(in, false).total; }

MemoryPlan plan_memory(const PlanInput& in) {
  MemoryPlan p;
  const Result r = simulate(in, true);
  p.items = r.items;
  p.total = r.total;
  p.capacity = in.capacity;
  p.micro_batch = in.micro_batch;
  p.world_size = in.world_size;
  p.rank = in.rank;
  p.zero_stage = in.zero_stage;
  p.fits = in.capacity == 0 || p.total <= in.capacity;
  if (!p.fits) {
    try {
      simulate(in, false, in.capacity);
      p.fits = true;  // fits once the allocator releases its cache under pressure
    } catch (const OutOfMemory&) {
    }
  }
  if (in.capacity > 0) {
    PlanInput probe = in;
    // Replays the schedule under the capacity: the caching allocator frees its cache before it
    // gives up, so a configuration can fit although its unconstrained peak is above capacity.
    auto fits = [&](std::int64_t mb) {
      probe.micro_batch = mb;
      try {
        simulate(probe, false, in.capacity);
        return true;
      } catch (const OutOfMemory&) {
        return false;
      }
    };
    std::int64_t lo = 0, hi = 1;
    while (fits(hi) && hi < (std::int64_t{1} << 16)) {
      lo = hi;
      hi *= 2;
    }
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    p.max_micro_batch = lo;
  }
  return p;
}

nlohmann::json MemoryPlan::to_json() const {
  nlohmann::json j;
  j["micro_batch_size"] = micro_batch;
  j["total_bytes"] = total;
  j["capacity_bytes"] = capacity;
  j["fits"] = fits;
  j["max_micro_batch_size"] = max_micro_batch;
  if (world_size > 1) {
    j["world_size"] = world_size;
    j["rank"] = rank;
    j["zero_stage"] = zero_stage;
  }
  nlohmann::json items_j = nlohmann::json::array();
  for (const auto& it : items)
    items_j.push_back({{"name", it.name}, {"bytes", it.bytes}, {"at_peak_bytes", it.at_peak}, {"detail", it.detail}});
  j["items"] = items_j;
  return j;
}

std::string MemoryPlan::to_table() const {
  std::string out;
  char line[640];
  std::snprintf(line, sizeof line, "  %-22s %12s %12s\n", "part", "needs", "at peak");
  out += line;
  for (const auto& it : items) {
    std::snprintf(line, sizeof line, "  %-22s %12s %12s  %s\n", it.name.c_str(), format_bytes(it.bytes).c_str(),
                  it.name == "allocator rounding" ? "" : format_bytes(it.at_peak).c_str(), it.detail.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-22s %12s %12s  predicted peak reserved at micro-batch %lld\n", "total", "",
                format_bytes(total).c_str(), static_cast<long long>(micro_batch));
  out += line;
  if (capacity > 0) {
    const char* verdict = !fits ? "does NOT fit"
                          : total > capacity ? "fits once the allocator releases its cached blocks"
                                             : "fits";
    std::snprintf(line, sizeof line, "  %-22s %12s  %s; largest micro-batch that fits: %lld\n", "device memory",
                  format_bytes(capacity).c_str(), verdict, static_cast<long long>(max_micro_batch));
    out += line;
  }
  return out;
}

}  // namespace scalelab
