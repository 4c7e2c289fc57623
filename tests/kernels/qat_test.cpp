// The qat family (kernels/qat.h) against torchao 0.18's Int8DynActInt4WeightQATLinear
// (tests/golden/data/qat/kernels.safetensors, make_qat_golden.py): the fake-quantized activations
// and weights and their straight-through gradients are torchao's bit for bit (the same fp32
// operations in the same order), and QatLinear (model/decoder/qat.h) gives torchao's linear forward
// and backward within the GEMMs' rounding.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/qat.h"
#include "kernels/qat_math.h"
#include "kernels/test_util.h"
#include "model/decoder/qat.h"
#include "model/safetensors.h"

namespace scalelab {
namespace {

const std::string kGolden = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/qat/kernels.safetensors";

struct Golden {
  test::Cpu cpu;
  SafetensorsFile file = SafetensorsFile::open(kGolden);
  Tensor get(const std::string& name) {
    const SafetensorsTensor* t = file.find(name);
    EXPECT_NE(t, nullptr) << name;
    Shape s = t->shape.size() == 2 ? Shape{t->shape[0], t->shape[1]} : Shape{t->shape[0]};
    Tensor out = Tensor::empty(s, DType::kF32, *cpu.alloc);
    file.read(*t, out.raw(), DType::kF32);
    return out;
  }
};

// Element-by-element bit equality (the first 5 differences reported).
void expect_bits(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  int bad = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    std::uint32_t a, b;
    std::memcpy(&a, got.f32() + i, 4);
    std::memcpy(&b, want.f32() + i, 4);
    if (a != b && ++bad <= 5) {
      ADD_FAILURE() << what << " element " << i << ": " << got.f32()[i] << " vs torchao " << want.f32()[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(QatKernels, FakeQuantizedActivationsAreTorchaosBitForBit) {
  Golden g;
  Tensor x = g.get("x"), want = g.get("fq_x");
  Tensor y = g.cpu.zeros(x.shape());
  kernels::fake_quant_per_token_forward(y, x, g.cpu.ctx);
  expect_bits(y, want, "fq(x)");
  // the all-zero row stays 0; the tie row (scale 1) holds integers
  for (std::int64_t i = 0; i < 64; ++i) EXPECT_EQ(y.f32()[i], 0.0f);
  for (std::int64_t i = 5 * 64; i < 6 * 64; ++i) EXPECT_EQ(y.f32()[i], std::nearbyint(y.f32()[i]));
}

TEST(QatKernels, FakeQuantizedWeightsAreTorchaosBitForBit) {
  Golden g;
  Tensor w = g.get("w"), want = g.get("fq_w");
  Tensor wq = g.cpu.zeros(w.shape());
  kernels::fake_quant_group_forward(wq, w, 32, g.cpu.ctx);
  expect_bits(wq, want, "fq(w)");
  // the tie group (amax 7.5, scale 1): +7.5 is clamped to 7, halves round to even
  EXPECT_EQ(wq.f32()[64 + 31 - 1], 7.0f);  // w = +7.5
  EXPECT_EQ(wq.f32()[64 + 0], -8.0f);      // w = −7.5 rounds to −8, within range
  EXPECT_EQ(wq.f32()[64 + 2], -6.0f);      // w = −6.5 → −6 (even)
}

TEST(QatKernels, StraightThroughGradientsAreTorchaosBitForBit) {
  Golden g;
  {
    Tensor x = g.get("x"), gx = g.get("g_x"), want = g.get("ste_x");
    Tensor dx = g.cpu.zeros(x.shape());
    kernels::fake_quant_per_token_backward(dx, gx, x, /*accumulate=*/false, g.cpu.ctx);
    expect_bits(dx, want, "ste(x)");
    // accumulate adds the same values
    Tensor acc = g.cpu.randn(x.shape(), 1.0f, 3);
    Tensor before = test::clone(g.cpu, acc);
    kernels::fake_quant_per_token_backward(acc, gx, x, /*accumulate=*/true, g.cpu.ctx);
    for (std::int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(acc.f32()[i], before.f32()[i] + want.f32()[i]) << i;
  }
  {
    Tensor w = g.get("w"), gw = g.get("g_w"), want = g.get("ste_w");
    Tensor dw = g.cpu.zeros(w.shape());
    kernels::fake_quant_group_backward(dw, gw, w, 32, g.cpu.ctx);
    expect_bits(dw, want, "ste(w)");
    int masked = 0;
    for (std::int64_t i = 0; i < w.numel(); ++i) masked += want.f32()[i] == 0.0f && gw.f32()[i] != 0.0f;
    EXPECT_GT(masked, 0) << "the golden has clamped elements (no gradient)";
    EXPECT_EQ(dw.f32()[64 + 30], 0.0f);  // +7.5 in the tie group: clamped, no gradient
  }
}

TEST(QatKernels, QatLinearMatchesTorchaosLinearForwardAndBackward) {
  Golden g;
  Tensor x = g.get("x"), w = g.get("w"), dy = g.get("dy");
  QatLinear lin(32);
  Tensor y = g.cpu.zeros({8, 16});
  lin.forward(y, x, w, nullptr, g.cpu.ctx);
  // fp32 GEMMs over the same (bit-exact) fake-quantized operands: only the summation order differs,
  // |error| <= k·eps·Σ|xq||wq| with k = 64 — within 1e-5 of the largest output here.
  test::expect_close(y, g.get("y"), "y", 1e-5, 1e-5 * 400);
  Tensor dx = g.cpu.zeros(x.shape()), dw = g.cpu.zeros(w.shape());
  lin.backward(&dx, dw, nullptr, dy, x, w, g.cpu.ctx, false);
  test::expect_close(dx, g.get("dx"), "dx", 1e-5, 1e-5);
  test::expect_close(dw, g.get("dw"), "dw", 1e-5, 1e-4);
}

TEST(QatKernels, Int4QuantizationMultipliesBackToTheFakeQuantizedWeights) {
  Golden g;
  Tensor w = g.get("w"), fq = g.get("fq_w");
  std::vector<std::int8_t> q(static_cast<std::size_t>(w.numel()));
  std::vector<float> s(static_cast<std::size_t>(w.numel() / 32));
  kernels::quantize_int4_grouped(q.data(), s.data(), w.f32(), 16, 64, 32);
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    ASSERT_GE(q[static_cast<std::size_t>(i)], -8);
    ASSERT_LE(q[static_cast<std::size_t>(i)], 7);
    ASSERT_EQ(static_cast<float>(q[static_cast<std::size_t>(i)]) * s[static_cast<std::size_t>(i / 32)], fq.f32()[i])
        << i;
  }
}

// The CPU kernel runs 8 lanes at a time with a scalar tail and splits rows over threads; it must
// give the bits of qat_math.h's scalar steps (which the golden tests tie to torchao) for every
// length and alignment: rows and groups of 1..80 elements (all tails, the 16-wide unroll and
// none) holding exact ties (scale 1, values on halves), the clamp bounds, signed zeros and random
// values; and a tall tensor that crosses the parallel grain.
TEST(QatKernels, VectorPathEqualsScalarSteps) {
  test::Cpu c;
  std::mt19937 rng(20261126);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto bits_equal = [](float a, float b) {
    std::uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y;
  };
  auto ref_params = [](const float* v, std::int64_t n, bool per_token) {
    float lo = v[0], hi = v[0];
    for (std::int64_t i = 1; i < n; ++i) {
      lo = v[i] < lo ? v[i] : lo;
      hi = v[i] > hi ? v[i] : hi;
    }
    return per_token ? kernels::qat::per_token_params(lo, hi) : kernels::qat::group_params(lo, hi);
  };
  for (const std::int64_t rows : {3, 8192}) {  // 8192 x 64 crosses the parallel grain (2^18 elements)
    for (std::int64_t n = 1; n <= 80; ++n) {
      if (rows > 3 && n != 64 && n != 37) continue;  // the tall case: one vector length, one with a tail
      Tensor x = c.zeros({rows, n}), w = c.zeros({rows, n}), g = c.zeros({rows, n});
      for (std::int64_t r = 0; r < rows; ++r) {
        float* xr = x.f32() + r * n;
        float* wr = w.f32() + r * n;
        for (std::int64_t i = 0; i < n; ++i) {
          switch ((r + i) % 4) {
            case 0: xr[i] = normal(rng) * 3.0f; wr[i] = normal(rng) * 0.05f; break;
            case 1: xr[i] = static_cast<float>(static_cast<int>(rng() % 256) - 64) + 0.5f;
                    wr[i] = static_cast<float>(static_cast<int>(rng() % 16) - 8) + 0.5f; break;
            case 2: xr[i] = (rng() & 1) ? -0.0f : 0.0f; wr[i] = (rng() & 1) ? -0.0f : 0.0f; break;
            default: xr[i] = normal(rng) * 1e-3f; wr[i] = (rng() & 1) ? 7.5f : -7.5f; break;
          }
          g.f32()[r * n + i] = normal(rng);
        }
        if (n >= 2 && r % 2 == 0) {  // scale exactly 1: the halves are ties
          xr[0] = -64.0f;
          xr[n - 1] = 191.0f;
        }
      }
      const std::int64_t group = n;  // one group per row (group_forward needs group > 1)
      Tensor fx = c.zeros({rows, n}), sx = c.randn({rows, n}, 1.0f, 5), fw = c.zeros({rows, n}),
             sw = c.randn({rows, n}, 1.0f, 6);
      Tensor sx0 = test::clone(c, sx), sw0 = test::clone(c, sw);
      kernels::fake_quant_per_token_forward(fx, x, c.ctx);
      kernels::fake_quant_per_token_backward(sx, g, x, /*accumulate=*/(n % 2) == 1, c.ctx);
      if (group > 1) {
        kernels::fake_quant_group_forward(fw, w, group, c.ctx);
        kernels::fake_quant_group_backward(sw, g, w, group, c.ctx);
      }
      int bad = 0;
      for (std::int64_t r = 0; r < rows && bad < 5; ++r) {
        const std::int64_t o = r * n;
        const auto ax = ref_params(x.f32() + o, n, true);
        const auto aw = ref_params(w.f32() + o, n, false);
        for (std::int64_t i = 0; i < n; ++i) {
          const float gi = g.f32()[o + i];
          const float want_fx = kernels::qat::fake_quant(x.f32()[o + i], ax);
          const float ste_x = kernels::qat::ste(gi, x.f32()[o + i], ax);
          const float want_sx = (n % 2) == 1 ? sx0.f32()[o + i] + ste_x : ste_x;
          bool ok = bits_equal(fx.f32()[o + i], want_fx) && bits_equal(sx.f32()[o + i], want_sx);
          if (group > 1) {
            ok = ok && bits_equal(fw.f32()[o + i], kernels::qat::fake_quant(w.f32()[o + i], aw)) &&
                 bits_equal(sw.f32()[o + i], sw0.f32()[o + i] + kernels::qat::ste(gi, w.f32()[o + i], aw));
          }
          if (!ok && ++bad <= 5) ADD_FAILURE() << "rows " << rows << " n " << n << " row " << r << " col " << i;
        }
      }
      ASSERT_EQ(bad, 0) << "rows " << rows << " n " << n;
    }
  }
}

// Several groups per row (as every real weight has): group sizes with and without a vector tail,
// groups of ties and clamped values next to random ones, against qat_math.h group by group.
TEST(QatKernels, VectorPathEqualsScalarStepsOverManyGroupsPerRow) {
  test::Cpu c;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const std::int64_t group : {2, 7, 8, 16, 24, 32, 40, 256}) {
    const std::int64_t rows = 5, cols = 4 * group;
    Tensor w = c.zeros({rows, cols}), g = c.randn({rows, cols}, 1.0f, 2);
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      const std::int64_t grp = i / group;
      w.f32()[i] = grp % 3 == 1 ? static_cast<float>(static_cast<int>(rng() % 16) - 8) + 0.5f  // ties, ±7.5 clamps
                                : normal(rng);
    }
    Tensor fw = c.zeros(w.shape()), sw = c.zeros(w.shape());
    kernels::fake_quant_group_forward(fw, w, group, c.ctx);
    kernels::fake_quant_group_backward(sw, g, w, group, c.ctx);
    for (std::int64_t grp = 0; grp < w.numel() / group; ++grp) {
      const float* v = w.f32() + grp * group;
      float lo = v[0], hi = v[0];
      for (std::int64_t i = 1; i < group; ++i) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
      }
      const auto a = kernels::qat::group_params(lo, hi);
      for (std::int64_t i = 0; i < group; ++i) {
        const std::int64_t k = grp * group + i;
        const float want_f = kernels::qat::fake_quant(w.f32()[k], a);
        const float want_s = 0.0f + kernels::qat::ste(g.f32()[k], w.f32()[k], a);
        ASSERT_EQ(std::memcmp(&fw.f32()[k], &want_f, 4), 0) << "group " << group << " element " << k;
        ASSERT_EQ(std::memcmp(&sw.f32()[k], &want_s, 4), 0) << "group " << group << " element " << k;
      }
    }
  }
}

// What holds under bf16 (--model-precision bf16, --mixed-precision bf16): the kernels widen the
// bf16 operands exactly, compute in fp32 and round each stored element to nearest even once, so
// a bf16 output is the fp32 kernel's output on the widened values, rounded: forward, the STE
// gradient assigned or accumulated (an accumulated bf16 gradient: old + ste in fp32, rounded
// once), and scalelab quantize's q·scale rounded to bf16 is the bf16 fake-quantized weight.
// This is not torchao's arithmetic on a bf16 model, which computes the scales and zero
// points in bf16 (choose_qparams_affine divides in the input's dtype, then casts the scale to
// fp32): there about 40 % of fake-quantized activations and 10 % of weights differ from these
// (measured with torchao 0.18 on random [64, 256] tensors, group 32), so bf16 QAT is not
// bit-exact with torchao (docs/finetuning.md).
TEST(QatKernels, Bf16StorageIsTheFp32ArithmeticRoundedOnce) {
  test::Cpu c;
  const std::int64_t rows = 37, n = 96, group = 32;
  Tensor x = c.randn({rows, n}, 2.0f, 11), w = c.randn({rows, n}, 0.05f, 12), g = c.randn({rows, n}, 1.0f, 13),
         d0 = c.randn({rows, n}, 1.0f, 14);
  for (std::int64_t i = 0; i < n; ++i) x.f32()[i] = static_cast<float>(i % 16) - 7.5f;  // ties in row 0
  auto to = [&](const Tensor& t, DType dt) {
    Tensor o = Tensor::empty(t.shape(), dt, *c.alloc);
    convert(t.raw(), t.dtype(), o.raw(), dt, static_cast<std::size_t>(t.numel()));
    return o;
  };
  // The bf16 operands, and the fp32 tensors holding exactly their values.
  Tensor xb = to(x, DType::kBF16), wb = to(w, DType::kBF16), gb = to(g, DType::kBF16), db0 = to(d0, DType::kBF16);
  Tensor xw = to(xb, DType::kF32), ww = to(wb, DType::kF32), gw = to(gb, DType::kF32);
  for (const bool accumulate : {false, true}) {
    Tensor fx = Tensor::empty(x.shape(), DType::kBF16, *c.alloc), fw = Tensor::empty(w.shape(), DType::kBF16, *c.alloc);
    Tensor sx = test::clone(c, db0), sw = test::clone(c, db0);
    kernels::fake_quant_per_token_forward(fx, xb, c.ctx);
    kernels::fake_quant_group_forward(fw, wb, group, c.ctx);
    kernels::fake_quant_per_token_backward(sx, gb, xb, accumulate, c.ctx);
    kernels::fake_quant_group_backward(sw, gb, wb, group, c.ctx);
    Tensor rfx = c.zeros(x.shape()), rfw = c.zeros(w.shape());
    Tensor rsx = to(db0, DType::kF32), rsw = to(db0, DType::kF32);
    kernels::fake_quant_per_token_forward(rfx, xw, c.ctx);
    kernels::fake_quant_group_forward(rfw, ww, group, c.ctx);
    kernels::fake_quant_per_token_backward(rsx, gw, xw, accumulate, c.ctx);
    kernels::fake_quant_group_backward(rsw, gw, ww, group, c.ctx);
    const std::pair<const Tensor*, const Tensor*> pairs[] = {{&fx, &rfx}, {&fw, &rfw}, {&sx, &rsx}, {&sw, &rsw}};
    const char* names[] = {"fq(x)", "fq(w)", "ste dx", "ste dw"};
    for (int k = 0; k < 4; ++k) {
      ASSERT_EQ(pairs[k].first->dtype(), DType::kBF16);
      Tensor want = to(*pairs[k].second, DType::kBF16);
      EXPECT_EQ(std::memcmp(pairs[k].first->raw(), want.raw(), static_cast<std::size_t>(want.numel()) * 2), 0)
          << names[k] << (accumulate ? " (accumulate)" : "");
    }
    // scalelab quantize of a bf16 checkpoint widens the weights and quantizes in fp32, so its
    // q·scale, rounded to bf16, is the weight the bf16 training forward multiplied with.
    std::vector<std::int8_t> q(static_cast<std::size_t>(w.numel()));
    std::vector<float> s(static_cast<std::size_t>(w.numel() / group));
    kernels::quantize_int4_grouped(q.data(), s.data(), ww.f32(), rows, n, group);
    Tensor back = c.zeros(w.shape());
    for (std::int64_t i = 0; i < w.numel(); ++i) back.f32()[i] = static_cast<float>(q[i]) * s[i / group];
    Tensor back16 = to(back, DType::kBF16);
    EXPECT_EQ(std::memcmp(back16.raw(), fw.raw(), static_cast<std::size_t>(w.numel()) * 2), 0) << "int4 q·scale";
  }
}

TEST(QatKernels, BadGroupSizeIsRefused) {
  test::Cpu c;
  Tensor w = c.randn({4, 48}, 1.0f, 1), wq = c.zeros({4, 48});
  EXPECT_THROW(kernels::fake_quant_group_forward(wq, w, 32, c.ctx), InvalidInput);
  EXPECT_THROW(kernels::fake_quant_group_forward(wq, w, 1, c.ctx), InvalidInput);
}

}  // namespace
}  // namespace scalelab
