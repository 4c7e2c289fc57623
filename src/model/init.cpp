#include "model/init.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "model/family.h"

namespace scalelab {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a64(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Standard normal values for elements [begin, begin + n) of the stream `key`; begin % 4 == 0.
// Philox block j gives four uniforms u0..u3 in (0, 1); Box-Muller turns (u0, u1) into elements
// 4j, 4j+1 and (u2, u3) into 4j+2, 4j+3.
void normal_block(std::array<std::uint32_t, 2> key, std::int64_t begin, std::int64_t n, double stddev, float* out) {
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  constexpr double kScale = 1.0 / 4294967296.0;
  for (std::int64_t i = 0; i < n; i += 4) {
    const auto j = static_cast<std::uint64_t>((begin + i) / 4);
    const auto r = philox4x32_10({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(j >> 32), 0u, 0u}, key);
    double z[4];
    for (int h = 0; h < 2; ++h) {
      const double u1 = (static_cast<double>(r[2 * h]) + 0.5) * kScale;
      const double u2 = (static_cast<double>(r[2 * h + 1]) + 0.5) * kScale;
      const double rad = std::sqrt(-2.0 * std::log(u1));
      z[2 * h] = rad * std::cos(kTwoPi * u2);
      z[2 * h + 1] = rad * std::sin(kTwoPi * u2);
    }
    for (std::int64_t l = 0; l < 4 && i + l < n; ++l) out[i + l] = static_cast<float>(z[l] * stddev);
  }
}

// Uniform values in [-bound, bound) for elements [begin, begin + n) of the stream `key`.
void uniform_block(std::array<std::uint32_t, 2> key, std::int64_t begin, std::int64_t n, double bound, float* out) {
  constexpr double kScale = 1.0 / 4294967296.0;
  for (std::int64_t i = 0; i < n; i += 4) {
    const auto j = static_cast<std::uint64_t>((begin + i) / 4);
    const auto r = philox4x32_10({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(j >> 32), 1u, 0u}, key);
    for (std::int64_t l = 0; l < 4 && i + l < n; ++l)
      out[i + l] = static_cast<float>((2.0 * static_cast<double>(r[static_cast<std::size_t>(l)]) * kScale - 1.0) * bound);
  }
}

void init_adapter(const ParamInfo& p, std::uint8_t* dst, DType dt, std::uint64_t seed_key) {
  const std::size_t es = dtype_size(dt);
  if (p.name.ends_with(".lora_B.weight")) {
    std::memset(dst, 0, static_cast<std::size_t>(p.numel) * es);  // B = 0: the adapted model starts as the base
    return;
  }
  // kaiming_uniform_(a=√5) on [r, in]: gain √(2/(1+5)), bound gain·√(3/in) = 1/√in.
  const double bound = 1.0 / std::sqrt(static_cast<double>(p.shape[1]));
  const std::uint64_t k = splitmix64(seed_key ^ fnv1a64(p.name));
  const std::array<std::uint32_t, 2> key{static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k >> 32)};
  std::vector<float> buf(static_cast<std::size_t>(p.numel));
  uniform_block(key, 0, p.numel, bound, buf.data());
  convert(buf.data(), DType::kF32, dst, dt, buf.size());
}

}  // namespace

void init_adapters(const Tensor& flat, const ParamLayout& layout, std::uint64_t seed) {
  SCALELAB_CHECK(flat.device() == DeviceType::kCPU && flat.numel() == layout.total_numel(),
                 "[init] init_adapters writes a host buffer of the layout's size");
  const std::size_t es = dtype_size(flat.dtype());
  auto* base = static_cast<std::uint8_t*>(flat.raw());
  for (const ParamInfo& p : layout.params())
    if (p.is_adapter) init_adapter(p, base + static_cast<std::size_t>(p.offset) * es, flat.dtype(), splitmix64(seed));
}

void init_params(const Tensor& flat, const ParamLayout& layout, const ModelConfig& config, std::uint64_t seed) {
  SCALELAB_CHECK(flat.device() == DeviceType::kCPU,
                 "[init] init_params writes host memory — initialize a CPU buffer and copy it to the device");
  SCALELAB_CHECK(flat.dtype() != DType::kI32, "[init] the parameter buffer must be a float dtype");
  SCALELAB_CHECK(flat.numel() == layout.total_numel(),
                 "[init] buffer has " + std::to_string(flat.numel()) + " elements, the layout " +
                     std::to_string(layout.total_numel()));
  SCALELAB_CHECK(config.initializer_range >= 0,
                 "[init] initializer_range must be non-negative, got " + std::to_string(config.initializer_range));
  const DType dt = flat.dtype();
  const std::size_t es = dtype_size(dt);
  auto* base = static_cast<std::uint8_t*>(flat.raw());
  const std::uint64_t seed_key = splitmix64(seed);
  const ModelFamilySpec& family = family_of(config);
  const bool pad_row = family.embedding_padding_idx && config.pad_token_id.has_value();
  constexpr std::int64_t kChunk = 4096;  // a multiple of 4: chunks start on Philox block boundaries

  for (const ParamInfo& p : layout.params()) {
    std::uint8_t* dst = base + static_cast<std::size_t>(p.offset) * es;
    if (p.is_adapter) {
      init_adapter(p, dst, dt, seed_key);
      continue;
    }
    if (p.is_bias || p.is_norm) {
      const float v = (p.is_norm && !p.is_bias) ? 1.0f : 0.0f;
      std::uint8_t one[4];
      convert(&v, DType::kF32, one, dt, 1);
      for (std::int64_t i = 0; i < p.numel; ++i) std::memcpy(dst + static_cast<std::size_t>(i) * es, one, es);
      continue;
    }
    const std::uint64_t k = splitmix64(seed_key ^ fnv1a64(p.name));
    const std::array<std::uint32_t, 2> key{static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k >> 32)};
    const std::int64_t chunks = (p.numel + kChunk - 1) / kChunk;
    parallel_for(chunks, 2, [&](std::int64_t c0, std::int64_t c1) {
      std::vector<float> buf(kChunk);
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::int64_t b = c * kChunk;
        const std::int64_t n = std::min(kChunk, p.numel - b);
        normal_block(key, b, n, config.initializer_range, buf.data());
        convert(buf.data(), DType::kF32, dst + static_cast<std::size_t>(b) * es, dt, static_cast<std::size_t>(n));
      }
    });
    if (pad_row && p.name == family.token_embedding && *config.pad_token_id < p.shape[0]) {
      const std::int64_t width = p.shape[1];
      std::memset(dst + static_cast<std::size_t>(*config.pad_token_id * width) * es, 0,
                  static_cast<std::size_t>(width) * es);  // the padding row
    }
  }
}

}  // namespace scalelab
