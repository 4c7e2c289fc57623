// Checks of the nf4 family (kernels/nf4.h): QLoRA's NF4 dequantization of a tile of rows, both
// flavours (torchao's and bitsandbytes'), fp32 tiles (the only dtype the kernel writes).
//
// Tolerance: 0 elements whose bits differ from the CPU's. Each element is a table lookup times its
// block's absmax, decoded with one IEEE fp32 division (torchao) or product (bitsandbytes) and one
// sum: cuda/nf4.cu spells each as a correctly rounded intrinsic (__fdiv_rn, __fmul_rn, __fadd_rn,
// no fused multiply-add), as the CPU (cpu/nf4.cpp, mul_then_add) computes them. Outputs
// "rows A-B (bits)" (the tile of rows [A, B)): the "rel error" column of these rows is the number
// of elements whose bits differ (a NaN-poisoned element of the tile never written counts).
//
// Inputs: the quantized state is random bytes and floats (every 4-bit code, every scaler byte;
// factors, a mean and, for bitsandbytes, a 256-entry map of random values): the kernel only decodes
// it, so it need not come from the quantizer (model/nf4.h, tested bit for bit against the
// references on the CPU). The weight is 300 x 75 (22,500 elements: 352 absmax blocks, the last one
// partial, and 2 factor blocks); the tiles are the whole weight, rows [3, 253) (starts on an odd
// element, the low nibble of a byte, and crosses the factor block boundary at element 16,384),
// and the last row alone.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/nf4.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

constexpr std::int64_t kRows = 300, kCols = 75;

// Bytes in a host int32 tensor (the storage Nf4Store uses), padded to whole words.
Tensor byte_tensor(const std::vector<std::uint8_t>& bytes, DeviceAllocator& host) {
  const std::int64_t words = static_cast<std::int64_t>((bytes.size() + 3) / 4);
  Tensor t = Tensor::empty({words}, DType::kI32, host, "selftest nf4 state");
  std::vector<std::uint8_t> padded(static_cast<std::size_t>(words) * 4, 0);
  std::memcpy(padded.data(), bytes.data(), bytes.size());
  t.copy_from_host(padded.data());
  return t;
}

Tensor float_tensor(const std::vector<float>& v, DeviceAllocator& host) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::kF32, host, "selftest nf4 state");
  t.copy_from_host(v.data());
  return t;
}

// One quantized weight's state on one side.
struct State {
  Tensor codes, scalers, factors, map;
  Nf4View view(Nf4Flavor flavor, float mean, DeviceType device) const {
    Nf4View w;
    w.flavor = flavor;
    w.rows = kRows;
    w.cols = kCols;
    w.codes = static_cast<const std::uint8_t*>(codes.raw());
    w.scalers = static_cast<const std::uint8_t*>(scalers.raw());
    w.factors = static_cast<const float*>(factors.raw());
    w.dynamic_map = map.defined() ? static_cast<const float*>(map.raw()) : nullptr;
    w.mean = mean;
    w.device = device;
    return w;
  }
};

std::vector<CheckResult> dequantize_check(const CheckEnv& env, Nf4Flavor flavor) {
  const Sides s(env);
  const std::int64_t n = kRows * kCols, blocks = (n + kNf4BlockSize - 1) / kNf4BlockSize;
  const std::int64_t factor_blocks = (blocks + kNf4ScalerBlockSize - 1) / kNf4ScalerBlockSize;
  std::mt19937_64 rng(env.seed * 1000003u + (flavor == Nf4Flavor::kTorchao ? 1 : 2));
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>((n + 1) / 2)), scalers(static_cast<std::size_t>(blocks));
  for (auto& b : codes) b = static_cast<std::uint8_t>(byte(rng));
  for (auto& b : scalers) b = static_cast<std::uint8_t>(byte(rng));
  // torchao divides the int8 scaler by its factor (256 / (2·max |absmax − mean|): tens to
  // thousands); bitsandbytes multiplies a map value in [−1, 1] by its factor (that max).
  const bool torchao = flavor == Nf4Flavor::kTorchao;
  std::uniform_real_distribution<float> factor(torchao ? 50.0f : 0.01f, torchao ? 3000.0f : 0.2f), u(-1.0f, 1.0f);
  std::vector<float> factors(static_cast<std::size_t>(factor_blocks)), map;
  for (auto& f : factors) f = factor(rng);
  const float mean = std::uniform_real_distribution<float>(0.01f, 0.1f)(rng);
  if (!torchao) {
    map.resize(256);
    for (auto& m : map) m = u(rng);
  }

  State host{byte_tensor(codes, *env.host), byte_tensor(scalers, *env.host), float_tensor(factors, *env.host),
             torchao ? Tensor() : float_tensor(map, *env.host)};
  State dev{s.on_dev(host.codes), s.on_dev(host.scalers), s.on_dev(host.factors),
            torchao ? Tensor() : s.on_dev(host.map)};
  const Nf4View hw = host.view(flavor, mean, DeviceType::kCPU);
  const Nf4View dw = dev.view(flavor, mean, env.device->device());

  std::vector<CheckResult> out;
  struct Tile {
    std::int64_t row0, rows;
  };
  for (const Tile t : {Tile{0, kRows}, Tile{3, 250}, Tile{kRows - 1, 1}}) {
    ExecContext hc = s.host, dc = s.dev;
    Tensor ref = s.host_out({t.rows, kCols}, DType::kF32), got = s.dev_out({t.rows, kCols}, DType::kF32);
    nf4_dequantize(ref, hw, t.row0, hc);
    nf4_dequantize(got, dw, t.row0, dc);
    const std::string name =
        "rows " + std::to_string(t.row0) + "-" + std::to_string(t.row0 + t.rows) + " (bits)";
    out.push_back({name, bits_differing(got, ref), 0.0});
  }
  return out;
}

}  // namespace

std::vector<OpCheck> nf4_checks() {
  return {
      {"nf4", "nf4_dequantize (nf4, torchao)", {DType::kF32},
       [](const CheckEnv& env, DType) { return dequantize_check(env, Nf4Flavor::kTorchao); }},
      {"nf4", "nf4_dequantize (nf4-bnb)", {DType::kF32},
       [](const CheckEnv& env, DType) { return dequantize_check(env, Nf4Flavor::kBnb); }},
  };
}

}  // namespace scalelab::kernels::selftest
