#pragma once
// Converting a QAT-trained checkpoint to real integer weights (scalelab quantize DIR --to int4),
// as torchao's Int8DynActInt4WeightQATQuantizer.convert does: every linear weight of the decoder
// layers (the modules --qat fake-quantizes, ParamLayout::qat_applies) becomes int4 values q in
// [−8, 7] with one fp32 scale per group of G input columns (symmetric: w ≈ q·scale, zero point 0;
// kernels::quantize_int4_grouped, the same arithmetic as the fake quantization — in the
// checkpoint's dtype: bf16 scales for a bf16 checkpoint, as torchao's convert on a bf16 model — so
// q·scale, rounded to the checkpoint's dtype, is bit for bit what training's forward used). Activations stay dynamic (int8 per token, computed at
// run time), so they have no tensors.
//
// Layout of <out>/model.safetensors (docs/finetuning.md), per converted module <m>:
//   --to int4:  <m>.weight  U8  [out, in/2]  two int4 per byte, two's complement: column 2j in the
//                                            low nibble, column 2j+1 in the high nibble
//   --to int8:  <m>.weight  I8  [out, in]    one int4 value per byte (torchao's convert layout)
//   both:       <m>.scales  F32 [out, in/G]  torchao's `scales`
//               <m>.zeros   F32 [out, in/G]  torchao's `zeros` (all 0: symmetric)
// every other tensor (embeddings, norms, biases, an untied LM head) copied byte for byte, and
// <out>/config.json = the source's with a "quantization_config" object saying all of this. The
// other files of the source directory (tokenizer, generation config) are copied.
#include <cstdint>
#include <string>

namespace scalelab {

struct QuantizeOptions {
  std::string to = "int4";        // int4 (packed) or int8 (torchao's unpacked layout)
  std::int64_t group_size = 256;  // --qat-group-size of the training run
};

struct QuantizeReport {
  std::int64_t converted = 0;      // modules converted
  std::int64_t copied = 0;         // tensors copied unchanged
  std::uint64_t bytes_before = 0;  // of the converted weights, as stored in the source
  std::uint64_t bytes_after = 0;   // their integer weights + scales + zeros
};

// Reads <dir>/config.json and <dir>/model.safetensors (one file; fp32, bf16 or fp16 weights),
// writes <out> (created; each file through a temporary name and a rename). InvalidInput naming
// the file or flag: no checkpoint there, a sharded one, a group size that does not divide a
// module's input features, an unknown --to, out equal to dir.
QuantizeReport quantize_checkpoint(const std::string& dir, const std::string& out, const QuantizeOptions& o);

// The QAT scheme a run trained with, beside what it saved (train --qat ... --save DIR writes
// DIR/qat_config.json: {"scheme": "8da4w", "group_size": G}, and removes a stale one when it
// saves without --qat; merge carries it from an adapter directory to the merged model), so that
// quantize converts with the group size the weights were trained at without being told again.
// read_qat_group_size: the recorded G, or 0 when DIR has no record; InvalidInput naming the file
// when it is unreadable or its group_size is not a number > 1.
inline constexpr const char* kQatRecordFile = "qat_config.json";
std::int64_t read_qat_group_size(const std::string& dir);

// int4 values (−8..7, one per int8) packed two per byte as the layout above says; cols even.
void pack_int4(std::uint8_t* packed, const std::int8_t* q, std::int64_t rows, std::int64_t cols);
// The inverse (for readers and tests).
void unpack_int4(std::int8_t* q, const std::uint8_t* packed, std::int64_t rows, std::int64_t cols);

}  // namespace scalelab
