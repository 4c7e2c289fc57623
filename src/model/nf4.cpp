#include "model/nf4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "model/params.h"

namespace scalelab {

namespace {

// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8) as fp32, the
// QuantState.state2.code of quantize_4bit(compress_statistics=True). A constant of the reference
// (copied from its output by tests/golden/make_nf4_golden.py, checked by Nf4Golden.DynamicMap):
// recomputing it would mean reproducing torch.linspace's fp32 rounding for no gain.
const float kBnbDynamicMap[256] = {
    -0x1.fc66660000000p-1f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f, -0x1.e6cccc0000000p-1f,
    -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f, -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f,
    -0x1.c2cccc0000000p-1f, -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f,
    -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f, -0x1.9066660000000p-1f,
    -0x1.8933340000000p-1f, -0x1.8200000000000p-1f, -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f,
    -0x1.6c66680000000p-1f, -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f,
    -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f, -0x1.3a00000000000p-1f,
    -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f, -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f,
    -0x1.1600000000000p-1f, -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f,
    -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f, -0x1.c733340000000p-2f,
    -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f, -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f,
    -0x1.7f33340000000p-2f, -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f,
    -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f, -0x1.1a66680000000p-2f,
    -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f, -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f,
    -0x1.a4cccc0000000p-3f, -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f,
    -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f, -0x1.b666680000000p-4f,
    -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f, -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f,
    -0x1.65c2900000000p-4f, -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f,
    -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f, -0x1.151eba0000000p-4f,
    -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f, -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f,
    -0x1.b70a3e0000000p-5f, -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f,
    -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f, -0x1.15c2900000000p-5f,
    -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f, -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f,
    -0x1.451eba0000000p-6f, -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f,
    -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f, -0x1.072b020000000p-7f,
    -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f, -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f,
    -0x1.56041a0000000p-8f, -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f,
    -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f, -0x1.4fdf3a0000000p-10f,
    -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f, -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f,
    -0x1.02de020000000p-11f, -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f,
    -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f, -0x1.64840c0000000p-16f,
    -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f, -0x1.27476e0000000p-21f, 0x0.0p+0f,
    0x1.27476e0000000p-21f, 0x1.b435280000000p-19f, 0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f,
    0x1.6f00680000000p-15f, 0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f,
    0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f, 0x1.3dd9820000000p-11f,
    0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f, 0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f,
    0x1.e353f80000000p-10f, 0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f,
    0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f, 0x1.7ae1480000000p-8f,
    0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f, 0x1.e978d40000000p-8f, 0x1.072b020000000p-7f,
    0x1.19999a0000000p-7f, 0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f,
    0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f, 0x1.7333340000000p-6f,
    0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f, 0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f,
    0x1.2cccce0000000p-5f, 0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f,
    0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f, 0x1.ce147a0000000p-5f,
    0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f, 0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f,
    0x1.20a3d60000000p-4f, 0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f,
    0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f, 0x1.7147ae0000000p-4f,
    0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f, 0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f,
    0x1.f000000000000p-4f, 0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f,
    0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f, 0x1.c1999a0000000p-3f,
    0x1.de66660000000p-3f, 0x1.fb33320000000p-3f, 0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f,
    0x1.28cccc0000000p-2f, 0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f,
    0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f, 0x1.8d99980000000p-2f,
    0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f, 0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f,
    0x1.d599980000000p-2f, 0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f,
    0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f, 0x1.1d33340000000p-1f,
    0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f, 0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f,
    0x1.4133340000000p-1f, 0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f,
    0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f, 0x1.73999a0000000p-1f,
    0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f, 0x1.8933340000000p-1f, 0x1.9066660000000p-1f,
    0x1.97999a0000000p-1f, 0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f,
    0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f, 0x1.ca00000000000p-1f,
    0x1.d133340000000p-1f, 0x1.d866660000000p-1f, 0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f,
    0x1.ee00000000000p-1f, 0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f,
};

constexpr std::int64_t kBlock = kernels::kNf4BlockSize, kScalerBlock = kernels::kNf4ScalerBlockSize;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// c10::CeilLog2.
std::int64_t ceil_log2(std::int64_t x) {
  if (x <= 2) return 1;
  std::int64_t msb = 63 - __builtin_clzll(static_cast<unsigned long long>(x - 1));
  return msb + 1;
}

// at::native multi_row_sum over `size` rows of `nrows` columns, one accumulator per column:
// element (i, k) is load(i, k). Accumulators of type Acc with += (float or a lane array).
template <class Acc, class Load>
std::vector<Acc> multi_row_sum(std::int64_t size, int nrows, const Load& load, const Acc& zero) {
  constexpr int kLevels = 4;
  const std::int64_t level_power = std::max<std::int64_t>(4, ceil_log2(size) / kLevels);
  const std::int64_t level_step = std::int64_t{1} << level_power, level_mask = level_step - 1;
  std::vector<std::vector<Acc>> acc(kLevels, std::vector<Acc>(static_cast<std::size_t>(nrows), zero));
  std::int64_t i = 0;
  while (i + level_step <= size) {
    for (std::int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < nrows; ++k) acc[0][k] += load(i, k);
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < nrows; ++k) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = zero;
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < nrows; ++k) acc[0][k] += load(i, k);
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < nrows; ++k) acc[0][k] += acc[j][k];
  return acc[0];
}

// A vector of lanes with lane-wise fp32 addition (Vectorized<float>).
struct Lanes {
  std::vector<float> v;
  Lanes& operator+=(const Lanes& o) {
    for (std::size_t l = 0; l < v.size(); ++l) v[l] += o.v[l];
    return *this;
  }
};

// at::native row_sum with ilp_factor 4 over `size` items.
template <class Acc, class Load>
Acc row_sum(std::int64_t size, const Load& load, const Acc& zero) {
  constexpr int kIlp = 4;
  const std::int64_t size_ilp = size / kIlp;
  std::vector<Acc> partial =
      multi_row_sum<Acc>(size_ilp, kIlp, [&](std::int64_t i, int k) { return load(i * kIlp + k); }, zero);
  for (std::int64_t i = size_ilp * kIlp; i < size; ++i) partial[0] += load(i);
  for (int k = 1; k < kIlp; ++k) partial[0] += partial[k];
  return partial[0];
}

}  // namespace

float torch_cpu_sum_f32(const float* x, std::int64_t n, int lanes) {
  // Hand-written: the point is PyTorch's exact order of fp32 additions (aten/src/ATen/native/cpu/
  // SumKernel.cpp), which no library exposes; the means of the NF4 references depend on it.
  if (n < lanes) return row_sum<float>(n, [&](std::int64_t i) { return x[i]; }, 0.0f);
  const std::int64_t vec_size = n / lanes;
  const Lanes zero{std::vector<float>(static_cast<std::size_t>(lanes), 0.0f)};
  const Lanes acc = row_sum<Lanes>(
      vec_size,
      [&](std::int64_t v) {
        Lanes l{std::vector<float>(x + v * lanes, x + (v + 1) * lanes)};
        return l;
      },
      zero);
  float final_acc = 0.0f;
  for (std::int64_t k = vec_size * lanes; k < n; ++k) final_acc += x[k];
  for (float p : acc.v) final_acc += p;
  return final_acc;
}

float torch_cpu_mean_f32(const float* x, std::int64_t n, int lanes) {
  return torch_cpu_sum_f32(x, n, lanes) / static_cast<float>(n);
}

std::optional<Nf4Flavor> parse_quantize_base(const std::string& flag) {
  if (flag.empty()) return std::nullopt;
  if (flag == "nf4") return Nf4Flavor::kTorchao;
  if (flag == "nf4-bnb") return Nf4Flavor::kBnb;
  throw InvalidInput("[--quantize-base] '" + flag + "' is not a quantization of the base — use nf4 (torchao's to_nf4, "
                     "torchtune's QLoRA) or nf4-bnb (bitsandbytes' quantize_4bit, peft's QLoRA)");
}

const char* nf4_flavor_name(Nf4Flavor f) { return f == Nf4Flavor::kTorchao ? "nf4" : "nf4-bnb"; }

const char* nf4_flavor_reference(Nf4Flavor f) {
  return f == Nf4Flavor::kTorchao ? "torchao to_nf4 (block 64, scaler block 256; torchtune's QLoRA)"
                                  : "bitsandbytes quantize_4bit nf4, compress_statistics (block 64, absmax blocks of 256 "
                                    "in the dynamic 8-bit map; peft's QLoRA)";
}

const float* nf4_table(Nf4Flavor f) { return kernels::nf4_values(f); }
const float* bnb_dynamic_map() { return kBnbDynamicMap; }

std::string nf4_refusal(Nf4Flavor flavor, std::int64_t numel) {
  if (numel <= 0) return "it has no elements";
  if (flavor == Nf4Flavor::kTorchao && numel % (kBlock * kScalerBlock) != 0) {
    return "torchao's to_nf4 needs a number of elements divisible by 64 x 256 = 16384 (blocks of 64, their scalers "
           "in blocks of 256), and " + std::to_string(numel) + " is not; bitsandbytes' nf4 (--quantize-base nf4-bnb) "
           "takes any size";
  }
  return "";
}

namespace {

// torchao: codes, scalers, factors, mean.
void quantize_torchao(const float* x, std::int64_t n, Nf4Quantized& q) {
  const std::int64_t nb = n / kBlock, ns = nb / kScalerBlock;
  std::vector<float> absmax(static_cast<std::size_t>(nb));
  for (std::int64_t b = 0; b < nb; ++b) {
    float m = 0.0f;
    for (std::int64_t i = 0; i < kBlock; ++i) m = std::max(m, std::fabs(x[b * kBlock + i]));
    absmax[b] = m;
  }
  q.mean = torch_cpu_mean_f32(absmax.data(), nb);
  q.factors.resize(static_cast<std::size_t>(ns));
  q.scalers.resize(static_cast<std::size_t>(nb));
  for (std::int64_t s = 0; s < ns; ++s) {
    float m = 0.0f;
    for (std::int64_t i = 0; i < kScalerBlock; ++i) m = std::max(m, std::fabs(absmax[s * kScalerBlock + i] - q.mean));
    const float f = 256.0f / (2.0f * m);  // inf when every absmax of the block equals the mean
    q.factors[s] = f;
    for (std::int64_t i = 0; i < kScalerBlock; ++i) {
      const float v = std::nearbyint((absmax[s * kScalerBlock + i] - q.mean) * f);  // half to even, as torch.round
      // torch: clamp(-128, 127) then .to(int8); NaN (0 · inf) converts to 0 on x86.
      const float c = std::isnan(v) ? 0.0f : std::min(127.0f, std::max(-128.0f, v));
      q.scalers[s * kScalerBlock + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(c));
    }
  }
  const float* table = kernels::kNf4TableTorchao;
  q.codes.assign(static_cast<std::size_t>(n / 2), 0);
  for (std::int64_t e = 0; e < n; ++e) {
    const float v = x[e] / absmax[e / kBlock];
    int best = 0;
    if (!std::isnan(v)) {  // torch.min over NaN distances gives index 0
      float best_d = std::fabs(v - table[0]);
      for (int i = 1; i < 16; ++i) {
        const float d = std::fabs(v - table[i]);
        if (d < best_d) {  // the first of equal distances wins
          best_d = d;
          best = i;
        }
      }
    }
    q.codes[e >> 1] |= static_cast<std::uint8_t>((e & 1) ? best : best << 4);
  }
}

// The 65,536-entry table through which bitsandbytes' native CPU quantize_blockwise (csrc/cpu_ops.cpp
// build_quantize_lut / quantize_cpu_impl, 0.50.x) maps a normalized value to a dynamic-map index: the
// interval [-1, 1] cut into 65,535 steps, each grid point v_i = 2i / 65535 - 1 (fp32) given the first
// index whose fp32 midpoint 0.5 · (map[j] + map[j + 1]) is not below v_i. Reproduced rather than a
// nearest-value search because that is what the reference does: a value between two grid points
// takes the index of the grid point it rounds to, which is not always the nearest map value (values
// near a midpoint; 9 of the golden's 8,117 absmax indices).
const std::uint8_t* bnb_quantize_lut() {
  static const std::vector<std::uint8_t> lut = [] {
    constexpr int kSize = 65536, kCodes = 256;
    float mids[kCodes - 1];
    for (int j = 0; j + 1 < kCodes; ++j) mids[j] = 0.5f * (kBnbDynamicMap[j] + kBnbDynamicMap[j + 1]);
    std::vector<std::uint8_t> t(kSize);
    int j = 0;
    for (int i = 0; i < kSize; ++i) {
      const float v = (2.0f * static_cast<float>(i)) / static_cast<float>(kSize - 1) - 1.0f;
      while (j < kCodes - 1 && mids[j] < v) ++j;
      t[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(j);
    }
    return t;
  }();
  return lut.data();
}

// The table index of a normalized value, as quantize_cpu_impl computes it: clamp to [-1, 1], then
// (v + 1) · 0.5 · 65535 + 0.5 truncated, where the library's build (GCC, target avx2,fma) fuses the
// last product and the + 0.5 into one fused multiply-add; std::fma gives that single rounding.
// NaN (never from finite input) converts to index 0 as cvttss2si's 0x80000000 does.
std::uint16_t bnb_lut_index(float v) {
  if (std::isnan(v)) return 0;
  v = std::clamp(v, -1.0f, 1.0f);
  const float half = (v + 1.0f) * 0.5f;
  return static_cast<std::uint16_t>(static_cast<std::int32_t>(std::fma(half, 65535.0f, 0.5f)));
}

// bitsandbytes' quantize_blockwise of the centred absmaxes (quantize_cpu_impl): per block of 256 its
// absmax m (std::max from 0, so an all-zero block gives m = 0 and every index 0), each value times the
// fp32 reciprocal 1 / m, looked up in bnb_quantize_lut(); the factor is m.
void quantize_absmax_bnb(const std::vector<float>& c, Nf4Quantized& q) {
  const std::int64_t n = static_cast<std::int64_t>(c.size()), ns = ceil_div(n, kScalerBlock);
  q.factors.resize(static_cast<std::size_t>(ns));
  q.scalers.resize(static_cast<std::size_t>(n));
  const std::uint8_t* lut = bnb_quantize_lut();
  for (std::int64_t s = 0; s < ns; ++s) {
    const std::int64_t begin = s * kScalerBlock, end = std::min(n, begin + kScalerBlock);
    float m = 0.0f;
    for (std::int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(c[i]));
    q.factors[s] = m;
    if (m == 0.0f) {
      for (std::int64_t i = begin; i < end; ++i) q.scalers[i] = 0;
      continue;
    }
    const float inv = 1.0f / m;
    for (std::int64_t i = begin; i < end; ++i) q.scalers[i] = lut[bnb_lut_index(c[i] * inv)];
  }
}

void quantize_bnb(const float* x, std::int64_t n, Nf4Quantized& q) {
  const std::int64_t full = n / kBlock, rem = n % kBlock, nb = full + (rem ? 1 : 0);
  std::vector<float> absmax(static_cast<std::size_t>(nb));
  const float tiny = static_cast<float>(1e-38);
  float mids[15];
  for (int i = 0; i < 15; ++i) mids[i] = (kernels::kNf4Table[i] + kernels::kNf4Table[i + 1]) / 2.0f;
  auto code_of = [&](float v) {  // torch.bucketize(right=False): the number of midpoints below v
    return static_cast<int>(std::lower_bound(mids, mids + 15, v) - mids);
  };
  q.codes.assign(static_cast<std::size_t>(ceil_div(n, 2)), 0);
  auto put = [&](std::int64_t e, int code) { q.codes[e >> 1] |= static_cast<std::uint8_t>((e & 1) ? code : code << 4); };
  for (std::int64_t b = 0; b < full; ++b) {
    float m = 0.0f;
    for (std::int64_t i = 0; i < kBlock; ++i) m = std::max(m, std::fabs(x[b * kBlock + i]));
    absmax[b] = m;
    const float r = 1.0f / std::max(m, tiny);
    for (std::int64_t i = 0; i < kBlock; ++i) {
      const float v = std::min(1.0f, std::max(-1.0f, x[b * kBlock + i] * r));
      put(b * kBlock + i, code_of(v));
    }
  }
  if (rem) {
    float m = 0.0f;
    for (std::int64_t e = full * kBlock; e < n; ++e) m = std::max(m, std::fabs(x[e]));
    m = std::max(m, tiny);
    absmax[full] = m;
    for (std::int64_t e = full * kBlock; e < n; ++e) put(e, code_of(std::min(1.0f, std::max(-1.0f, x[e] / m))));
  }
  if (n % 2) put(n, code_of(0.0f));  // the pad element
  q.mean = torch_cpu_mean_f32(absmax.data(), nb);
  std::vector<float> centred(absmax.size());
  for (std::size_t i = 0; i < absmax.size(); ++i) centred[i] = absmax[i] - q.mean;
  quantize_absmax_bnb(centred, q);
}

}  // namespace

Nf4Quantized quantize_nf4(const float* x, std::int64_t n, Nf4Flavor flavor) {
  const std::string why = nf4_refusal(flavor, n);
  if (!why.empty()) throw InvalidInput("[--quantize-base] cannot quantize " + std::to_string(n) + " elements: " + why);
  Nf4Quantized q;
  q.flavor = flavor;
  q.numel = n;
  if (flavor == Nf4Flavor::kTorchao) {
    quantize_torchao(x, n, q);
  } else {
    quantize_bnb(x, n, q);
  }
  return q;
}

std::vector<float> nf4_block_absmax(const Nf4Quantized& q) {
  std::vector<float> a(q.scalers.size());
  for (std::size_t b = 0; b < a.size(); ++b) {
    const float f = q.factors[b / kScalerBlock];
    a[b] = q.flavor == Nf4Flavor::kTorchao
               ? static_cast<float>(static_cast<std::int8_t>(q.scalers[b])) / f + q.mean
               : kernels::mul_then_add(kBnbDynamicMap[q.scalers[b]], f, q.mean);
  }
  return a;
}

std::vector<float> dequantize_nf4(const Nf4Quantized& q) {
  const std::vector<float> a = nf4_block_absmax(q);
  const float* table = nf4_table(q.flavor);
  std::vector<float> out(static_cast<std::size_t>(q.numel));
  for (std::int64_t e = 0; e < q.numel; ++e) {
    const std::uint8_t byte = q.codes[e >> 1];
    out[e] = table[(e & 1) ? (byte & 15) : (byte >> 4)] * a[e / kBlock];
  }
  return out;
}

namespace {
std::size_t pad16(std::size_t b) { return (b + 15) / 16 * 16; }
}  // namespace

std::size_t nf4_storage_bytes(std::int64_t numel) {
  const std::int64_t nb = ceil_div(numel, kBlock), ns = ceil_div(nb, kScalerBlock);
  return pad16(static_cast<std::size_t>(ceil_div(numel, 2))) + pad16(static_cast<std::size_t>(nb)) +
         pad16(static_cast<std::size_t>(ns) * sizeof(float));
}

Nf4Store::Nf4Store(const ParamLayout& layout, Nf4Flavor flavor, DeviceAllocator& alloc) : flavor_(flavor) {
  for (const ParamInfo& p : layout.params()) {
    if (!p.quantized) continue;
    Entry e;
    e.rows = p.shape[0];
    e.cols = p.shape.rank() > 1 ? p.shape[1] : 1;
    const std::int64_t nb = ceil_div(p.numel, kBlock), ns = ceil_div(nb, kScalerBlock);
    e.codes = bytes_;
    e.scalers = e.codes + pad16(static_cast<std::size_t>(ceil_div(p.numel, 2)));
    e.factors = e.scalers + pad16(static_cast<std::size_t>(nb));
    bytes_ = e.factors + pad16(static_cast<std::size_t>(ns) * sizeof(float));
    entries_[p.name] = e;
  }
  if (bytes_ > 0) {
    buffer_ = Tensor::empty({static_cast<std::int64_t>(bytes_ / 4)}, DType::kI32, alloc, "weights (nf4)");
  }
  if (flavor == Nf4Flavor::kBnb && !entries_.empty()) {
    dynamic_map_ = Tensor::empty({256}, DType::kF32, alloc, "weights (nf4)");
    if (dynamic_map_.device() != DeviceType::kMeta) dynamic_map_.copy_from_host(kBnbDynamicMap);
  }
}

std::uint8_t* Nf4Store::base() const { return static_cast<std::uint8_t*>(buffer_.raw()); }

void Nf4Store::quantize(const std::string& name, const float* host_values) {
  auto it = entries_.find(name);
  SCALELAB_CHECK(it != entries_.end(), "[nf4] " + name + " is not a quantized parameter");
  Entry& e = it->second;
  const Nf4Quantized q = quantize_nf4(host_values, e.rows * e.cols, flavor_);
  e.mean = q.mean;
  if (buffer_.device() == DeviceType::kMeta) return;
  // Each section is a run of int32 words of the buffer (16-byte aligned), copied from a padded host copy.
  auto upload = [&](std::size_t offset, const void* src, std::size_t bytes) {
    std::vector<std::int32_t> words((bytes + 3) / 4, 0);
    std::memcpy(words.data(), src, bytes);
    const std::int64_t w0 = static_cast<std::int64_t>(offset / 4);
    Tensor dst = buffer_.slice(w0, w0 + static_cast<std::int64_t>(words.size()));
    dst.copy_from_host(words.data());
  };
  upload(e.codes, q.codes.data(), q.codes.size());
  upload(e.scalers, q.scalers.data(), q.scalers.size());
  upload(e.factors, q.factors.data(), q.factors.size() * sizeof(float));
}

void Nf4Store::visit_state(
    const std::function<void(const std::string& name, const void* bytes, std::size_t n)>& f) const {
  if (!buffer_.defined() || buffer_.device() == DeviceType::kMeta) return;
  std::vector<std::uint8_t> host;
  const std::uint8_t* b = base();
  if (buffer_.device() != DeviceType::kCPU) {
    host.resize(bytes_);
    buffer_.copy_to_host(host.data());
    b = host.data();
  }
  for (const auto& [name, e] : entries_) {
    const std::int64_t numel = e.rows * e.cols, nb = ceil_div(numel, kBlock), ns = ceil_div(nb, kScalerBlock);
    f(name, b + e.codes, static_cast<std::size_t>(ceil_div(numel, 2)));
    f(name, b + e.scalers, static_cast<std::size_t>(nb));
    f(name, b + e.factors, static_cast<std::size_t>(ns) * sizeof(float));
    f(name, &e.mean, sizeof(float));
  }
}

kernels::Nf4View Nf4Store::view(const std::string& name) const {
  auto it = entries_.find(name);
  SCALELAB_CHECK(it != entries_.end(), "[nf4] " + name + " is not a quantized parameter");
  const Entry& e = it->second;
  kernels::Nf4View v;
  v.flavor = flavor_;
  v.rows = e.rows;
  v.cols = e.cols;
  v.mean = e.mean;
  v.device = buffer_.device();
  if (v.device != DeviceType::kMeta) {
    v.codes = base() + e.codes;
    v.scalers = base() + e.scalers;
    v.factors = reinterpret_cast<const float*>(base() + e.factors);
    if (flavor_ == Nf4Flavor::kBnb) v.dynamic_map = dynamic_map_.data<float>();
  }
  return v;
}

}  // namespace scalelab
