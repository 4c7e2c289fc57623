// The qat family (kernels/qat.h) against torchao 0.18's Int8DynActInt4WeightQATLinear
// (tests/golden/data/qat/kernels.safetensors, make_qat_golden.py): the fake-quantized activations
// and weights and their straight-through gradients are torchao's bit for bit (the same operations
// in the same order) — in fp32 (kernels.safetensors) and in bf16 and fp16 (kernels_lowp.safetensors:
// torchao's arithmetic in the tensor's dtype) — and QatLinear (model/decoder/qat.h) gives torchao's
// linear forward and backward within the GEMMs' rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
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

// bf16 and fp16 (--model-precision bf16, --mixed-precision bf16/fp16): torchao's fake quantizers on
// tensors of that dtype (tests/golden/data/qat/kernels_lowp.safetensors, make_qat_golden.py), which
// compute the scales and zero points in the tensor's dtype and round the STE's two products to it
// (kernels/qat.h) — about a third of the activations and 5 to 25 % of the weights of these
// cases differ from the fp32 arithmetic rounded once (the generator prints the counts).
const std::string kGoldenLowp = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/qat/kernels_lowp.safetensors";

struct LowpGolden {
  test::Cpu cpu;
  SafetensorsFile file = SafetensorsFile::open(kGoldenLowp);
  const SafetensorsTensor* find(const std::string& name) {
    const SafetensorsTensor* t = file.find(name);
    EXPECT_NE(t, nullptr) << name << " missing from " << kGoldenLowp;
    return t;
  }
  // The tensor in its own dtype (the bits torchao wrote), or converted to `as`.
  Tensor get(const std::string& name, std::optional<DType> as = std::nullopt) {
    const SafetensorsTensor* t = find(name);
    if (t == nullptr) return Tensor();
    const Shape shape{t->shape[0], t->shape.size() > 1 ? t->shape[1] : 1};
    Tensor out = Tensor::empty(shape, as.value_or(*t->dtype), *cpu.alloc);
    file.read(*t, out.raw(), out.dtype());
    return out;
  }
  bool has(const std::string& name) const { return file.find(name) != nullptr; }
  std::int64_t group(const std::string& prefix) {  // the I32 [1] tensor prefix + "group"
    std::int32_t v = 0;
    std::memcpy(&v, file.bytes(*find(prefix + "group")), 4);
    return v;
  }
};

// Bit equality of two tensors of the same 16-bit dtype (the first 5 differences reported).
void expect_bits16(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const auto* a = static_cast<const std::uint16_t*>(got.raw());
  const auto* b = static_cast<const std::uint16_t*>(want.raw());
  int bad = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    if (a[i] != b[i] && ++bad <= 5) {
      ADD_FAILURE() << what << " element " << i << ": bits 0x" << std::hex << a[i] << " vs torchao 0x" << b[i]
                    << std::dec;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// A tensor of dtype dt filled with −0.0: x + (−0) = x for every x, +0 included, so accumulating
// into it gives exactly the value added (the sign of a zero gradient kept, as torch's assigned
// .grad keeps it).
Tensor negative_zeros(test::Cpu& c, const Shape& s, DType dt) {
  Tensor f = c.zeros(s);
  for (std::int64_t i = 0; i < f.numel(); ++i) f.f32()[i] = -0.0f;
  Tensor o = Tensor::empty(s, dt, *c.alloc);
  convert(f.raw(), DType::kF32, o.raw(), dt, static_cast<std::size_t>(f.numel()));
  return o;
}

TEST(QatKernels, LowPrecisionFakeQuantizationIsTorchaosBitForBit) {
  LowpGolden g;
  int acts = 0, weights = 0;
  for (const char* d : {"bf16", "fp16"}) {
    for (int k = 0; g.has(std::string(d) + ".a" + std::to_string(k) + ".x"); ++k, ++acts) {
      const std::string p = std::string(d) + ".a" + std::to_string(k) + ".";
      Tensor x = g.get(p + "x"), gx = g.get(p + "g"), want_fq = g.get(p + "fq"), want_ste = g.get(p + "ste");
      ASSERT_NE(x.dtype(), DType::kF32) << p;
      Tensor y = Tensor::empty(x.shape(), x.dtype(), *g.cpu.alloc);
      kernels::fake_quant_per_token_forward(y, x, g.cpu.ctx);
      expect_bits16(y, want_fq, p + "fq");
      Tensor dx = Tensor::empty(x.shape(), x.dtype(), *g.cpu.alloc);
      kernels::fake_quant_per_token_backward(dx, gx, x, /*accumulate=*/false, g.cpu.ctx);
      expect_bits16(dx, want_ste, p + "ste");
      // accumulate: old + ste in fp32, rounded once (autograd's add of two tensors of this dtype)
      Tensor old = Tensor::empty(x.shape(), x.dtype(), *g.cpu.alloc);
      Tensor r = g.cpu.randn(x.shape(), 1.0f, 17 + static_cast<std::uint32_t>(k));
      convert(r.raw(), DType::kF32, old.raw(), x.dtype(), static_cast<std::size_t>(r.numel()));
      Tensor acc = test::clone(g.cpu, old);
      kernels::fake_quant_per_token_backward(acc, gx, x, /*accumulate=*/true, g.cpu.ctx);
      Tensor sum = g.cpu.zeros(x.shape()), old32 = g.cpu.zeros(x.shape()), ste32 = g.get(p + "ste", DType::kF32);
      convert(old.raw(), old.dtype(), old32.raw(), DType::kF32, static_cast<std::size_t>(old.numel()));
      for (std::int64_t i = 0; i < sum.numel(); ++i) sum.f32()[i] = old32.f32()[i] + ste32.f32()[i];
      Tensor want_acc = Tensor::empty(x.shape(), x.dtype(), *g.cpu.alloc);
      convert(sum.raw(), DType::kF32, want_acc.raw(), x.dtype(), static_cast<std::size_t>(sum.numel()));
      expect_bits16(acc, want_acc, p + "ste accumulated");
    }
    for (int k = 0; g.has(std::string(d) + ".w" + std::to_string(k) + ".w"); ++k, ++weights) {
      const std::string p = std::string(d) + ".w" + std::to_string(k) + ".";
      Tensor w = g.get(p + "w"), gw = g.get(p + "g"), want_fq = g.get(p + "fq"), want_ste = g.get(p + "ste");
      const std::int64_t group = g.group(p);
      Tensor wq = Tensor::empty(w.shape(), w.dtype(), *g.cpu.alloc);
      kernels::fake_quant_group_forward(wq, w, group, g.cpu.ctx);
      expect_bits16(wq, want_fq, p + "fq");
      Tensor dw = negative_zeros(g.cpu, w.shape(), w.dtype());
      kernels::fake_quant_group_backward(dw, gw, w, group, g.cpu.ctx);
      expect_bits16(dw, want_ste, p + "ste");
    }
  }
  EXPECT_EQ(acts, 6);
  EXPECT_EQ(weights, 10);
}

// scalelab quantize of a bf16 / fp16 checkpoint: torchao's convert of a model of that dtype (the
// int4 values, the fp32 scales — bf16- or fp16-valued — and zero zeros), and q·scale rounded to
// the dtype is the weight the forward of that model multiplied with (the fake-quantized golden).
TEST(QatKernels, LowPrecisionInt4ConversionIsTorchaosConvert) {
  LowpGolden g;
  for (const char* d : {"bf16", "fp16"}) {
    for (int k = 0; g.has(std::string(d) + ".w" + std::to_string(k) + ".w"); ++k) {
      const std::string p = std::string(d) + ".w" + std::to_string(k) + ".";
      const DType dt = *g.find(p + "w")->dtype;
      Tensor w = g.get(p + "w", DType::kF32), fq = g.get(p + "fq");
      const std::int64_t rows = w.dim(0), cols = w.dim(1);
      const std::int64_t group = g.group(p);
      std::vector<std::int8_t> q(static_cast<std::size_t>(w.numel()));
      std::vector<float> s(static_cast<std::size_t>(w.numel() / group));
      kernels::quantize_int4_grouped(q.data(), s.data(), w.f32(), rows, cols, group, dt);
      const SafetensorsTensor* tq = g.find(p + "q");
      ASSERT_EQ(tq->dtype_name, "I8");
      EXPECT_EQ(std::memcmp(q.data(), g.file.bytes(*tq), q.size()), 0) << p << "q";
      Tensor scales = g.get(p + "scales"), zeros = g.get(p + "zeros");
      ASSERT_EQ(scales.numel(), static_cast<std::int64_t>(s.size()));
      EXPECT_EQ(std::memcmp(s.data(), scales.raw(), s.size() * 4), 0) << p << "scales";
      for (std::int64_t i = 0; i < zeros.numel(); ++i) ASSERT_EQ(zeros.f32()[i], 0.0f) << p;
      Tensor back = g.cpu.zeros(w.shape());
      for (std::int64_t i = 0; i < w.numel(); ++i) {
        back.f32()[i] = static_cast<float>(q[static_cast<std::size_t>(i)]) * s[static_cast<std::size_t>(i / group)];
      }
      Tensor back16 = Tensor::empty(w.shape(), dt, *g.cpu.alloc);
      convert(back.raw(), DType::kF32, back16.raw(), dt, static_cast<std::size_t>(w.numel()));
      expect_bits16(back16, fq, p + "q·scale");
    }
  }
}

// The AVX2 path's roundings to bf16 / fp16 (the STE's two products) against qat_math.h's scalar
// steps, every length 1..80 (all vector tails) with ties, clamps, signed zeros and random values,
// forward and backward, assigned and accumulated: the golden cases above cover some shapes,
// this every alignment.
TEST(QatKernels, LowPrecisionVectorPathEqualsScalarSteps) {
  test::Cpu c;
  std::mt19937 rng(1126);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const DType dt : {DType::kBF16, DType::kF16}) {
    auto narrow = [&](const Tensor& t) {
      Tensor o = Tensor::empty(t.shape(), dt, *c.alloc);
      convert(t.raw(), DType::kF32, o.raw(), dt, static_cast<std::size_t>(t.numel()));
      return o;
    };
    auto widen = [&](const Tensor& t) {
      Tensor o = c.zeros(t.shape());
      convert(t.raw(), dt, o.raw(), DType::kF32, static_cast<std::size_t>(t.numel()));
      return o;
    };
    for (std::int64_t n = 2; n <= 80; ++n) {
      const std::int64_t rows = 4;
      Tensor x = c.zeros({rows, n}), w = c.zeros({rows, n}), g = c.zeros({rows, n});
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t i = 0; i < n; ++i) {
          float* xv = x.f32() + r * n + i;
          float* wv = w.f32() + r * n + i;
          switch ((r + i) % 4) {
            case 0: *xv = normal(rng) * 3.0f; *wv = normal(rng) * 0.05f; break;
            case 1: *xv = static_cast<float>(static_cast<int>(rng() % 190) - 64) + 0.5f;
                    *wv = static_cast<float>(static_cast<int>(rng() % 16) - 8) + 0.5f; break;
            case 2: *xv = (rng() & 1) ? -0.0f : 0.0f; *wv = (rng() & 1) ? -0.0f : 0.0f; break;
            default: *xv = normal(rng) * 1e-3f; *wv = (rng() & 1) ? 7.5f : -7.5f; break;
          }
          g.f32()[r * n + i] = normal(rng) * (r == 3 ? 1e-30f : 1.0f);  // row 3: products near underflow
        }
        if (r % 2 == 0) {  // scale 1: the halves are ties
          x.f32()[r * n] = -64.0f;
          x.f32()[r * n + n - 1] = 191.0f;
        }
      }
      Tensor xl = narrow(x), wl = narrow(w), gl = narrow(g);
      Tensor xv = widen(xl), wv = widen(wl), gv = widen(gl);
      const bool acc = n % 2 == 1;
      Tensor fx = Tensor::empty(x.shape(), dt, *c.alloc), fw = Tensor::empty(w.shape(), dt, *c.alloc);
      Tensor sx = narrow(c.randn({rows, n}, 1.0f, 5)), sw = narrow(c.randn({rows, n}, 1.0f, 6));
      Tensor sx0 = widen(sx), sw0 = widen(sw);
      kernels::fake_quant_per_token_forward(fx, xl, c.ctx);
      kernels::fake_quant_per_token_backward(sx, gl, xl, acc, c.ctx);
      kernels::fake_quant_group_forward(fw, wl, n, c.ctx);
      kernels::fake_quant_group_backward(sw, gl, wl, n, c.ctx);
      Tensor fx32 = widen(fx), fw32 = widen(fw), sx32 = widen(sx), sw32 = widen(sw);
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t o = r * n;
        float xlo = xv.f32()[o], xhi = xlo, wlo = wv.f32()[o], whi = wlo;
        for (std::int64_t i = 1; i < n; ++i) {
          xlo = std::min(xlo, xv.f32()[o + i]);
          xhi = std::max(xhi, xv.f32()[o + i]);
          wlo = std::min(wlo, wv.f32()[o + i]);
          whi = std::max(whi, wv.f32()[o + i]);
        }
        const auto ax = kernels::qat::per_token_params(xlo, xhi, dt), aw = kernels::qat::group_params(wlo, whi, dt);
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t k = o + i;
          using kernels::qat::stored;
          const float want[4] = {stored(kernels::qat::fake_quant(xv.f32()[k], ax), dt),
                                 stored(kernels::qat::fake_quant(wv.f32()[k], aw), dt),
                                 stored((acc ? sx0.f32()[k] : -0.0f) +
                                            kernels::qat::ste(gv.f32()[k], xv.f32()[k], ax), dt),
                                 stored(sw0.f32()[k] + kernels::qat::ste(gv.f32()[k], wv.f32()[k], aw), dt)};
          const float got[4] = {fx32.f32()[k], fw32.f32()[k], sx32.f32()[k], sw32.f32()[k]};
          for (int j = 0; j < 4; ++j) {
            ASSERT_EQ(std::memcmp(&got[j], &want[j], 4), 0)
                << dtype_name(dt) << " n " << n << " row " << r << " col " << i << " output " << j << ": " << got[j]
                << " vs " << want[j];
          }
        }
      }
    }
  }
}

// QatLinear (model/decoder/qat.h) on a bf16 model against torchao's Int8DynActInt4WeightQATLinear
// of a bf16 model: its fake quantizations are bit-exact (above); the GEMMs are bf16 on both sides
// with fp32 accumulation in different orders, so each output may differ by the fp32 sums' order
// (at most n·2^-24·Σ|a||b| over the n products) and then by where the two round to bf16 (an ulp,
// 2^-8 of the value); the STE's two roundings of dx and dw add at most two more ulps of a gradient
// element that entered them one ulp apart: |got − want| <= 2^-6·|want| + n·2^-22·Σ|a||b|.
TEST(QatKernels, QatLinearOnBf16IsTorchaosBf16LinearWithinTheGemmsRounding) {
  LowpGolden g;
  Tensor x = g.get("bf16.a0.x"), w = g.get("bf16.w0.w"), dy = g.get("bf16.linear.dy");
  ASSERT_EQ(x.dtype(), DType::kBF16);
  const Tensor fx = g.get("bf16.a0.fq", DType::kF32), fw = g.get("bf16.w0.fq", DType::kF32),
               dy32 = g.get("bf16.linear.dy", DType::kF32);
  const std::int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  QatLinear lin(32);
  Tensor y = Tensor::empty({T, out}, DType::kBF16, *g.cpu.alloc);
  lin.forward(y, x, w, nullptr, g.cpu.ctx);
  Tensor dx = Tensor::empty(x.shape(), DType::kBF16, *g.cpu.alloc), dw = negative_zeros(g.cpu, w.shape(), DType::kBF16);
  lin.backward(&dx, dw, nullptr, dy, x, w, g.cpu.ctx, false);
  auto widen = [&](const Tensor& t) {
    Tensor o = g.cpu.zeros(t.shape());
    convert(t.raw(), t.dtype(), o.raw(), DType::kF32, static_cast<std::size_t>(t.numel()));
    return o;
  };
  // sum_abs(i, j): Σ_k |a[i, k]·b[k, j]| for the GEMM that made element (i, j), over n products.
  auto check = [&](const Tensor& got_t, const char* name, std::int64_t n,
                   const std::function<double(std::int64_t, std::int64_t)>& sum_abs) {
    const Tensor got = widen(got_t), want = g.get(std::string("bf16.linear.") + name, DType::kF32);
    const std::int64_t cols = got.dim(1);
    int bad = 0, differing = 0;
    for (std::int64_t k = 0; k < got.numel(); ++k) {
      const double a = got.f32()[k], b = want.f32()[k];
      const double tol =
          std::ldexp(std::fabs(b), -6) + static_cast<double>(n) * std::ldexp(sum_abs(k / cols, k % cols), -22);
      differing += a != b;
      if (!(std::fabs(a - b) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << name << " element " << k << ": " << a << " vs torchao " << b << " (tolerance " << tol << ")";
      }
    }
    EXPECT_EQ(bad, 0) << name;
    std::printf("QatLinear bf16 %s: %d of %lld elements differ from torchao's bits (within the bound)\n", name,
                differing, static_cast<long long>(got.numel()));
  };
  check(y, "y", in, [&](std::int64_t t, std::int64_t o) {
    double s = 0;
    for (std::int64_t k = 0; k < in; ++k) s += std::fabs(double{fx.f32()[t * in + k]} * fw.f32()[o * in + k]);
    return s;
  });
  check(dx, "dx", out, [&](std::int64_t t, std::int64_t c) {
    double s = 0;
    for (std::int64_t o = 0; o < out; ++o) s += std::fabs(double{dy32.f32()[t * out + o]} * fw.f32()[o * in + c]);
    return s;
  });
  check(dw, "dw", T, [&](std::int64_t o, std::int64_t c) {
    double s = 0;
    for (std::int64_t t = 0; t < T; ++t) s += std::fabs(double{dy32.f32()[t * out + o]} * fx.f32()[t * in + c]);
    return s;
  });
}

// The fp32 arithmetic is untouched by the dtype parameter: qat_math.h's steps with t = fp32 are the
// plain fp32 operations (the fp32 goldens above hold them to torchao), and a bf16 tensor's scales
// are its dtype's roundings of them.
TEST(QatKernels, Bf16ParametersAreTheFp32OnesRoundedStepByStep) {
  using namespace kernels::qat;
  const float lo = -3.140625f, hi = 5.5f;  // bf16 values
  const Affine f = per_token_params(lo, hi), b = per_token_params(lo, hi, DType::kBF16);
  EXPECT_EQ(f.scale, (hi - lo) / 255.0f);
  EXPECT_EQ(b.scale, stored(stored(hi - lo, DType::kBF16) / 255.0f, DType::kBF16));
  EXPECT_NE(f.scale, b.scale);  // the case that differs (the reason for the bf16 arithmetic)
  EXPECT_EQ(stored(b.scale, DType::kBF16), b.scale);
  const Affine gf = group_params(-0.01f, 0.02f), gb = group_params(-0.01f, 0.02f, DType::kBF16);
  EXPECT_EQ(gf.scale, 0.02f / 7.5f);
  EXPECT_EQ(gb.scale, stored(0.02f / 7.5f, DType::kBF16));
  // fp16's floor is its smallest normal 2^-14 (torchao's eps for the weights: finfo(dtype).smallest_normal)
  EXPECT_EQ(group_params(-1e-5f, 1e-5f, DType::kF16).scale, 0x1p-14f);
  EXPECT_EQ(group_params(-1e-5f, 1e-5f, DType::kBF16).scale, stored(1e-5f / 7.5f, DType::kBF16));
}

TEST(QatKernels, BadGroupSizeIsRefused) {
  test::Cpu c;
  Tensor w = c.randn({4, 48}, 1.0f, 1), wq = c.zeros({4, 48});
  EXPECT_THROW(kernels::fake_quant_group_forward(wq, w, 32, c.ctx), InvalidInput);
  EXPECT_THROW(kernels::fake_quant_group_forward(wq, w, 1, c.ctx), InvalidInput);
}

}  // namespace
}  // namespace scalelab
