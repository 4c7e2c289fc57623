#pragma once
// QLoRA's NF4 base weights (--quantize-base nf4|nf4-bnb): the quantizers, bit for bit as the two
// reference implementations, and the device storage the model reads (kernels/nf4.h for the format).
//
// Both quantize blocks of 64 elements of the flattened weight by their absmax to the nearest of 16
// NormalFloat values, and quantize the absmaxes again (double quantization) around their mean in
// blocks of 256. They differ in the details, which change codes:
//
//   nf4 (torchao's to_nf4, torchtune's QLoRA; the default)
//     table     the NF4 values written to four decimals (-0.6962, ..., 0.7230), as fp32
//     codes     x / absmax (fp32 division), the first index of the smallest |x/absmax − table[i]|
//               (ties go to the lower value; an all-zero block gives 0/0 = NaN and code 0)
//     scalers   int8 round-half-even((absmax − mean) · f) clamped to [−128, 127], f = 256 / (2 ·
//               max |absmax − mean| over the scaler block) per 256 absmaxes (NaN → 0)
//     sizes     numel a multiple of 64 · 256 (torchao asserts it; refused here with the reason)
//   nf4-bnb (bitsandbytes' quantize_4bit(quant_type="nf4", compress_statistics=True), peft's)
//     table     the NF4 values to full fp32 precision (-0.6961928, ...)
//     codes     clamp(x · (1 / max(absmax, 1e-38)), −1, 1) (a reciprocal, then a product),
//               bucketized against the fp32 midpoints of the table (x <= midpoint goes down);
//               a partial last block (numel not a multiple of 64) is scaled by its own absmax
//     scalers   uint8 indices into bitsandbytes' 256-entry dynamic map: per 256 centred absmaxes
//               (a partial last block too) their absmax m, then c · (1 / m) looked up as its CPU
//               quantize_blockwise does, in a 65,536-point table over [−1, 1] (mostly the nearest
//               map value; near a midpoint sometimes its neighbour; m = 0 → 0); factors = m
//     sizes     any
//   Both: mean = torch's fp32 mean of the absmaxes (torch_cpu_sum_f32 / n, the reduction order of
//   PyTorch's CPU sum, so the means are bit-identical too).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "kernels/nf4.h"

namespace scalelab {

class ParamLayout;

using kernels::Nf4Flavor;

// "nf4" -> kTorchao, "nf4-bnb" -> kBnb; "" -> nullopt. Anything else: InvalidInput naming
// --quantize-base and the accepted values.
std::optional<Nf4Flavor> parse_quantize_base(const std::string& flag);
const char* nf4_flavor_name(Nf4Flavor f);       // "nf4", "nf4-bnb"
const char* nf4_flavor_reference(Nf4Flavor f);  // what it reproduces, for the run record

// The two NF4 tables (fp32) and bitsandbytes' dynamic 8-bit map (create_dynamic_map(signed=True),
// as its QuantState.state2.code holds it; 256 values, ascending).
const float* nf4_table(Nf4Flavor f);
const float* bnb_dynamic_map();

// PyTorch's CPU sum of n contiguous fp32 values (at::native cascade_sum: vectorized inner sum of
// `lanes`-wide vectors in 4 interleaved rows with multi-level accumulators, then the scalar tail and
// the lanes), single-threaded; lanes = 8 is Vectorized<float> of its AVX2 kernel, which x86 machines
// run whatever their capability (PyTorch registers no AVX-512 sum kernel; checked on one). PyTorch
// splits a reduction over threads above 32768 elements: the means are bit-identical for weights of
// up to 32768 blocks (2M elements) or with torch.set_num_threads(1).
float torch_cpu_sum_f32(const float* x, std::int64_t n, int lanes = 8);
// torch.mean: the sum divided by n in fp32.
float torch_cpu_mean_f32(const float* x, std::int64_t n, int lanes = 8);

// One quantized weight on the host.
struct Nf4Quantized {
  Nf4Flavor flavor = Nf4Flavor::kTorchao;
  std::int64_t numel = 0;
  std::vector<std::uint8_t> codes;    // ceil(numel / 2)
  std::vector<std::uint8_t> scalers;  // ceil(numel / 64) (int8 bits for torchao)
  std::vector<float> factors;         // ceil(scalers / 256)
  float mean = 0.0f;
};

// Why `flavor` cannot quantize a weight of `numel` elements, or "" when it can (torchao: numel a
// multiple of 16384; bitsandbytes: any numel > 0).
std::string nf4_refusal(Nf4Flavor flavor, std::int64_t numel);
// Quantizes n fp32 values (InvalidInput with nf4_refusal's reason when refused).
Nf4Quantized quantize_nf4(const float* x, std::int64_t n, Nf4Flavor flavor);
// The dequantized values (the host reference of kernels::nf4_dequantize) and the block absmaxes.
std::vector<float> dequantize_nf4(const Nf4Quantized& q);
std::vector<float> nf4_block_absmax(const Nf4Quantized& q);

// The device bytes of one quantized weight of `numel` elements: codes, scalers and factors, each
// section padded to 16 bytes (about 0.516 bytes per element).
std::size_t nf4_storage_bytes(std::int64_t numel);

// The quantized base weights of a layout (ParamLayout::quantize_base): one device buffer
// ("weights (nf4)", planned under weights) holding every quantized parameter's sections, and for
// bitsandbytes its dynamic map. Built on the meta device it allocates the same bytes and holds
// nothing.
class Nf4Store {
 public:
  Nf4Store(const ParamLayout& layout, Nf4Flavor flavor, DeviceAllocator& alloc);
  Nf4Flavor flavor() const { return flavor_; }
  // Quantizes the host fp32 values of parameter `name` and writes them to the device.
  void quantize(const std::string& name, const float* host_values);
  // The kernel's view of parameter `name` (RuntimeError when it is not quantized here).
  kernels::Nf4View view(const std::string& name) const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  std::size_t bytes() const { return bytes_; }
  // Calls f(name, bytes, n) for each quantized parameter in name order, three times: its codes,
  // its scalers and its factors (the bytes the kernels read, without the sections' padding), then
  // once with its fp32 mean — the whole quantized state, read back to the host once (a resumed
  // QLoRA run checks the base it re-quantized against the checkpointed run's). Nothing on meta.
  void visit_state(const std::function<void(const std::string& name, const void* bytes, std::size_t n)>& f) const;

 private:
  struct Entry {
    std::int64_t rows = 0, cols = 0;
    std::size_t codes = 0, scalers = 0, factors = 0;  // byte offsets in the buffer
    float mean = 0.0f;
  };
  Nf4Flavor flavor_;
  std::size_t bytes_ = 0;
  Tensor buffer_;       // int32 words: the sections
  Tensor dynamic_map_;  // bitsandbytes: 256 fp32 on the device
  std::map<std::string, Entry> entries_;
  std::uint8_t* base() const;
};

}  // namespace scalelab
