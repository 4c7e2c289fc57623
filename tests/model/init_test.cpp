#include "model/init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "model_test_util.h"

namespace scalelab {
namespace {

using testing::host_alloc;

TEST(Philox, KnownAnswers) {
  // Known-answer vectors of the Random123 distribution (kat_vectors, philox4x32_10).
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<std::uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (std::array<std::uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (std::array<std::uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

Tensor init(const ModelConfig& c, const ParamLayout& L, std::uint64_t seed, DType dt = DType::kF32) {
  Tensor t = Tensor::empty({L.total_numel()}, dt, host_alloc());
  init_params(t, L, c, seed);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(InitParams, DeterministicForASeedAndAnyThreadCount) {
  const ModelConfig c = preset_config("llama-tiny");
  const ParamLayout L = ParamLayout::build(c);
  const int before = num_threads();
  set_num_threads(1);
  const Tensor a = init(c, L, 42);
  set_num_threads(2);
  const Tensor b = init(c, L, 42);
  set_num_threads(before);
  EXPECT_TRUE(same_bytes(a, b));
  EXPECT_FALSE(same_bytes(a, init(c, L, 43)));
  // bf16 initialization is the fp32 one rounded to nearest even.
  Tensor expect = Tensor::empty({L.total_numel()}, DType::kBF16, host_alloc());
  expect.copy_from(a);
  EXPECT_TRUE(same_bytes(init(c, L, 42, DType::kBF16), expect));
}

TEST(InitParams, IndependentOfLayoutOrderAndTying) {
  ModelConfig tied = preset_config("llama-tiny");
  ModelConfig untied = tied;
  untied.tie_word_embeddings = false;
  const ParamLayout T = ParamLayout::build(tied), U = ParamLayout::build(untied);
  const Tensor a = init(tied, T, 5), b = init(untied, U, 5);
  for (const auto& p : T.params()) {
    const Tensor x = T.view(a, p), y = U.view(b, p.name);
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << p.name;
  }
}

struct Moments {
  double mean = 0, std = 0;
  std::int64_t n = 0;
};

TEST(InitParams, Statistics) {
  for (const char* preset : {"llama-tiny", "opt-tiny"}) {
    ModelConfig c = preset_config(preset);
    c.initializer_range = 0.02;
    const ParamLayout L = ParamLayout::build(c);
    const Tensor t = init(c, L, 1);
    double s = 0, s2 = 0;
    std::int64_t n = 0;
    for (const auto& p : L.params()) {
      const float* v = L.view(t, p).f32();
      if (p.is_bias) {
        for (std::int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(v[i], 0.0f) << p.name;
      } else if (p.is_norm) {
        for (std::int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(v[i], 1.0f) << p.name;
      } else {
        double ps = 0, ps2 = 0;
        for (std::int64_t i = 0; i < p.numel; ++i) {
          ps += v[i];
          ps2 += static_cast<double>(v[i]) * v[i];
        }
        // Each parameter on its own: std within 10% (the smallest have 4096 elements).
        const double pstd = std::sqrt(ps2 / static_cast<double>(p.numel) - std::pow(ps / static_cast<double>(p.numel), 2));
        EXPECT_NEAR(pstd, 0.02, 0.002) << preset << " " << p.name;
        s += ps;
        s2 += ps2;
        n += p.numel;
      }
    }
    const double mean = s / static_cast<double>(n);
    const double std = std::sqrt(s2 / static_cast<double>(n) - mean * mean);
    // Sampling error of the mean is 0.02 / sqrt(n); 5 sigma.
    EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(static_cast<double>(n))) << preset;
    EXPECT_NEAR(std, 0.02, 0.0004) << preset;
    if (c.family == ModelFamily::kOPT) {
      const Tensor emb = L.view(t, "model.decoder.embed_tokens.weight");
      for (std::int64_t i = 0; i < c.word_embed_proj_dim; ++i) {
        EXPECT_EQ(emb.f32()[c.word_embed_proj_dim + i], 0.0f) << "padding row 1";
        EXPECT_NE(emb.f32()[i], 0.0f);
      }
    }
  }
}

TEST(InitParams, NormalTails) {
  // The generator is a normal distribution, not just the right variance: the fraction of
  // values beyond 1, 2 and 3 sigma (0.3173, 0.0455, 0.0027) over ~16k + 2x8k + ... samples.
  ModelConfig c = preset_config("llama-tiny");
  c.initializer_range = 1.0;
  const ParamLayout L = ParamLayout::build(c);
  const Tensor t = init(c, L, 9);
  std::int64_t n = 0, k1 = 0, k2 = 0, k3 = 0;
  for (const auto& p : L.params()) {
    if (p.is_norm || p.is_bias) continue;
    const float* v = L.view(t, p).f32();
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const double a = std::fabs(v[i]);
      k1 += a > 1;
      k2 += a > 2;
      k3 += a > 3;
      ++n;
    }
  }
  const double N = static_cast<double>(n);
  auto within = [&](std::int64_t k, double p) { return std::fabs(static_cast<double>(k) / N - p) < 5 * std::sqrt(p * (1 - p) / N); };
  EXPECT_TRUE(within(k1, 0.3173)) << k1 << " of " << n;
  EXPECT_TRUE(within(k2, 0.0455)) << k2 << " of " << n;
  EXPECT_TRUE(within(k3, 0.0027)) << k3 << " of " << n;
}

}  // namespace
}  // namespace scalelab
