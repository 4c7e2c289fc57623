#pragma once
// safetensors files, the Hugging Face weight format: a reader that memory-maps a file and checks
// everything its header claims, and a writer.
//
// Layout: an 8-byte little-endian header length N; N bytes of UTF-8 JSON,
//   {"<tensor name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string value>"}}
// (padded with spaces so that the data starts 8-byte aligned); then the data section. Offsets are
// relative to the data section; tensors are row-major and little-endian; the tensors cover the
// data section exactly, without holes or overlaps. "__metadata__" is optional.
//
// The reader rejects (InvalidInput naming the file and the tensor, saying what to do): a file
// shorter than its header says, a header length above kMaxHeaderBytes, malformed JSON, unknown
// dtypes, negative dimensions, data_offsets that disagree with shape x dtype size, fall outside
// the data section, overlap, or leave holes. Tensors of dtypes other than F32/BF16/F16 are
// listed (so a file can be inspected) but cannot be read into scalelab tensors.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace scalelab {

// One tensor as a safetensors header describes it.
struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;          // as written: "F32", "BF16", "F16", "I64", ...
  std::optional<DType> dtype;      // set for the readable dtypes F32, BF16, F16 (and I32)
  std::size_t element_bytes = 0;   // size of one element of dtype_name
  std::vector<std::int64_t> shape; // empty for a scalar
  std::size_t begin = 0;           // byte offsets into the data section: [begin, end)
  std::size_t end = 0;

  std::int64_t numel() const;
  std::string shape_str() const;   // "[2, 3]"
};

// The safetensors dtype name of a scalelab dtype: "F32", "BF16", "F16", "I32".
std::string_view safetensors_dtype_name(DType t);

class SafetensorsFile {
 public:
  // A header length above this is treated as corrupt (real headers are a few hundred KB at most).
  static constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

  // Maps and validates `path`. Throws InvalidInput on anything malformed.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // In data order (ascending offsets).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when absent.
  const SafetensorsTensor* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::size_t file_bytes() const;

  // The raw little-endian bytes of a tensor inside the mapping; valid while this object (or a
  // copy of it) lives.
  const std::uint8_t* bytes(const SafetensorsTensor& t) const;

  // Copies a tensor into `dst` (t.numel() elements of dst_type), converting between F32, BF16 and
  // F16 with round-to-nearest-even. Throws InvalidInput naming the file and tensor when the file
  // dtype is not one of those (or is I32 and dst_type is not).
  void read(const SafetensorsTensor& t, void* dst, DType dst_type) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<const Mapping> map_;
  std::size_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: `numel(shape)` elements at `data` in `data_dtype`, stored in the file as
// `file_dtype` (converted while writing, round-to-nearest-even).
struct SafetensorsSource {
  std::string name;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  DType data_dtype = DType::kF32;
  DType file_dtype = DType::kF32;
};

// Writes a safetensors file: the header's keys sorted by name (nlohmann's object order), the data
// in the order given (stable-sorted by element size, largest first, so every tensor is aligned to
// its element size), the header padded with spaces to a multiple of 8 bytes, `metadata` as
// "__metadata__" (the default is what PyTorch's safetensors writes). Writes to "<path>.tmp" and
// renames, so a reader never sees a half-written file. Throws InvalidInput when the path cannot
// be written (naming it), and on duplicate names or empty names.
void write_safetensors(const std::string& path, const std::vector<SafetensorsSource>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace scalelab
