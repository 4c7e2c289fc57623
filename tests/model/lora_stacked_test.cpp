// LoRA's stacked products (model/decoder/lora.h): when the parts of a fused projection (q/k/v,
// gate/up) have their lora_A's adjacent in memory, the adapter multiplies the shared input by all
// of them in one GEMM (z, then dA and dx likewise). These tests check that the layout puts them
// side by side, that the adapter then takes the stacked path, and that it computes what the
// per-part path computes: the same products, only the GEMMs' blocking differs, so the results
// agree to fp32 rounding of sums of K <= 64 terms (relative 1e-5 is ~100x that).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/test_util.h"
#include "model/config.h"
#include "model/decoder/lora.h"
#include "model/params.h"

namespace scalelab {
namespace {

TEST(LoraStacked, TheLayoutPutsALayersLoraAsSideBySide) {
  LoraConfig lora;
  lora.rank = 4;
  lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const ParamLayout L = ParamLayout::build(preset_config("llama-tiny"), "", lora);
  for (const std::string layer : {"model.layers.0.", "model.layers.1."}) {
    for (const auto& group : std::vector<std::vector<std::string>>{{"self_attn.q_proj", "self_attn.k_proj",
                                                                    "self_attn.v_proj"},
                                                                   {"mlp.gate_proj", "mlp.up_proj"}}) {
      for (std::size_t i = 1; i < group.size(); ++i) {
        const ParamInfo& prev = L.at(layer + group[i - 1] + ".lora_A.weight");
        const ParamInfo& next = L.at(layer + group[i] + ".lora_A.weight");
        EXPECT_EQ(next.offset, prev.offset + prev.numel) << layer << group[i];
      }
    }
  }
}

constexpr std::int64_t T = 40, In = 24, R = 4;
constexpr float kScale = 2.0f;
const std::int64_t kOuts[3] = {24, 8, 8};  // q, k, v widths (GQA-like)

struct Adapters {
  test::Cpu c;
  Tensor x = c.randn({T, In}, 1.0f, 1);
  Tensor a_stack = c.randn({3 * R * In}, 0.3f, 2);  // [A_q; A_k; A_v], flat
  Tensor b[3] = {c.randn({kOuts[0], R}, 0.3f, 3), c.randn({kOuts[1], R}, 0.3f, 4), c.randn({kOuts[2], R}, 0.3f, 5)};

  // The parts over one stacked A (and dA) buffer, or over three separate copies.
  LoraAdapter make(bool stacked, Tensor& da_stack, Tensor (&a_sep)[3], Tensor (&da_sep)[3], Tensor (&db)[3]) {
    std::vector<LoraAdapter::Part> parts;
    std::int64_t col = 0;
    for (int i = 0; i < 3; ++i) {
      LoraAdapter::Part p;
      if (stacked) {
        p.a = a_stack.slice(i * R * In, (i + 1) * R * In).view({R, In});
        p.da = da_stack.slice(i * R * In, (i + 1) * R * In).view({R, In});
      } else {
        a_sep[i] = c.zeros({R, In});
        std::memcpy(a_sep[i].raw(), static_cast<const float*>(a_stack.raw()) + i * R * In, R * In * sizeof(float));
        da_sep[i] = c.zeros({R, In});
        p.a = a_sep[i];
        p.da = da_sep[i];
      }
      p.b = b[i];
      db[i] = c.zeros({kOuts[i], R});
      p.db = db[i];
      p.col = col;
      col += kOuts[i];
      parts.push_back(p);
    }
    return LoraAdapter(parts, col, kScale);
  }
};

double rel(const Tensor& got, const Tensor& ref) {
  double num = 0, den = 0;
  const float* g = static_cast<const float*>(got.raw());
  const float* r = static_cast<const float*>(ref.raw());
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    num += (double(g[i]) - r[i]) * (double(g[i]) - r[i]);
    den += double(r[i]) * r[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(LoraStacked, StackedProductsEqualThePerPartOnes) {
  Adapters s;
  const std::int64_t out = kOuts[0] + kOuts[1] + kOuts[2];
  Tensor da_stack = s.c.zeros({3 * R * In}), unused_da = s.c.zeros({3 * R * In});
  Tensor a_sep[3], da_sep[3], db_st[3], db_pp[3], a_unused[3], da_unused[3];
  LoraAdapter stacked = s.make(true, da_stack, a_unused, da_unused, db_st);
  LoraAdapter per_part = s.make(false, unused_da, a_sep, da_sep, db_pp);
  ASSERT_TRUE(stacked.stacks_parts());
  ASSERT_FALSE(per_part.stacks_parts());

  // Forward: y starts as a base output; the adapters add to it.
  Tensor y_st = s.c.randn({T, out}, 1.0f, 6), y_pp = s.c.zeros({T, out});
  std::memcpy(y_pp.raw(), y_st.raw(), static_cast<std::size_t>(T * out) * sizeof(float));
  stacked.forward(y_st, s.x, s.c.ctx);
  per_part.forward(y_pp, s.x, s.c.ctx);
  EXPECT_LT(rel(y_st, y_pp), 1e-5);

  // Backward: dx accumulates onto the base's input gradient.
  const Tensor dy = s.c.randn({T, out}, 1.0f, 7);
  Tensor dx_st = s.c.randn({T, In}, 1.0f, 8), dx_pp = s.c.zeros({T, In});
  std::memcpy(dx_pp.raw(), dx_st.raw(), static_cast<std::size_t>(T * In) * sizeof(float));
  s.c.ctx.train_step = 0;
  stacked.backward(&dx_st, dy, s.x, s.c.ctx);
  per_part.backward(&dx_pp, dy, s.x, s.c.ctx);
  EXPECT_LT(rel(dx_st, dx_pp), 1e-5);
  for (int i = 0; i < 3; ++i) {
    const Tensor da_i = da_stack.slice(i * R * In, (i + 1) * R * In).view({R, In});
    EXPECT_LT(rel(da_i, da_sep[i]), 1e-5) << "dA part " << i;
    EXPECT_LT(rel(db_st[i], db_pp[i]), 1e-5) << "dB part " << i;
    // Not trivially equal: each part's gradients are non-zero.
    double sum = 0;
    for (std::int64_t k = 0; k < da_i.numel(); ++k) sum += std::fabs(static_cast<const float*>(da_i.raw())[k]);
    EXPECT_GT(sum, 0.0) << "dA part " << i;
  }
}

// A training forward (ctx.train_step >= 0) keeps z for its backward, which then runs one GEMM
// fewer (no x·Aᵀ again) and computes bit for bit what recomputing z computes: the kept z is the
// same GEMM on the same input. Backward in another micro-step, or after an evaluation forward
// (train_step < 0), recomputes.
TEST(LoraStacked, BackwardUsesTheZItsTrainingForwardKept) {
  for (bool stacked : {true, false}) {
    Adapters s;
    const std::int64_t out = kOuts[0] + kOuts[1] + kOuts[2];
    Tensor da_k = s.c.zeros({3 * R * In}), da_r = s.c.zeros({3 * R * In});
    Tensor a_k[3], a_r[3], das_k[3], das_r[3], db_k[3], db_r[3];
    LoraAdapter kept = s.make(stacked, da_k, a_k, das_k, db_k);
    LoraAdapter recomputed = s.make(stacked, da_r, a_r, das_r, db_r);
    ASSERT_EQ(kept.stacks_parts(), stacked);
    const Tensor dy = s.c.randn({T, out}, 1.0f, 7);
    Profiler prof;
    auto lora_backward_gemms = [&] {
      std::int64_t n = 0;
      for (const auto& row : prof.rows())
        if (row.family == "lora" && row.phase == Phase::kBackward) n += row.entry.calls;
      return n;
    };
    // Kept: forward and backward in micro-step 3.
    Tensor y_k = s.c.zeros({T, out}), dx_k = s.c.zeros({T, In});
    s.c.ctx.train_step = 3;
    kept.forward(y_k, s.x, s.c.ctx);
    s.c.ctx.profiler = &prof;
    kept.backward(&dx_k, dy, s.x, s.c.ctx);
    s.c.ctx.profiler = nullptr;
    const std::int64_t with_kept = lora_backward_gemms();
    // Recomputed: an evaluation forward keeps nothing.
    prof.clear();
    Tensor y_r = s.c.zeros({T, out}), dx_r = s.c.zeros({T, In});
    s.c.ctx.train_step = -1;
    recomputed.forward(y_r, s.x, s.c.ctx);
    s.c.ctx.train_step = 3;
    s.c.ctx.profiler = &prof;
    recomputed.backward(&dx_r, dy, s.x, s.c.ctx);
    s.c.ctx.profiler = nullptr;
    const std::int64_t with_recompute = lora_backward_gemms();
    // One x·Aᵀ per stacked adapter, one per part otherwise.
    EXPECT_EQ(with_recompute - with_kept, stacked ? 1 : 3) << "stacked " << stacked;
    auto bitwise = [](const Tensor& a, const Tensor& b) {
      return std::memcmp(a.raw(), b.raw(), static_cast<std::size_t>(a.numel()) * sizeof(float)) == 0;
    };
    EXPECT_TRUE(bitwise(y_k, y_r));
    EXPECT_TRUE(bitwise(dx_k, dx_r));
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(bitwise(db_k[i], db_r[i])) << "dB part " << i << " stacked " << stacked;
    EXPECT_TRUE(stacked ? bitwise(da_k, da_r) : bitwise(das_k[0], das_r[0]) && bitwise(das_k[2], das_r[2]));
    // The kept z is taken once: a second backward (another micro-step) recomputes.
    prof.clear();
    s.c.ctx.train_step = 4;
    s.c.ctx.profiler = &prof;
    kept.backward(&dx_k, dy, s.x, s.c.ctx);
    s.c.ctx.profiler = nullptr;
    EXPECT_EQ(lora_backward_gemms(), with_recompute);
  }
}

}  // namespace
}  // namespace scalelab
