#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel.h"

// Hand-written rather than a library: Debian ships no C++ safetensors library, and the format is
// small (a length, a JSON header parsed with nlohmann-json, raw little-endian data).
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; this host is not");

namespace scalelab {

namespace {

using nlohmann::json;

constexpr const char* kFixHint = "the file is corrupt or incomplete — download or save it again";
constexpr int kMaxJsonDepth = 8;  // the format nests 3 deep; deeper is an attack or garbage

std::string where(const std::string& path) { return "[safetensors] " + path + ": "; }

[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& hint = kFixHint) {
  throw InvalidInput(where(path) + what + " — " + hint);
}

// Element size of every dtype the format defines; 0 for an unknown name.
std::size_t element_bytes_of(const std::string& d) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::optional<DType> readable_dtype(const std::string& d) {
  if (d == "F32") return DType::kF32;
  if (d == "BF16") return DType::kBF16;
  if (d == "F16") return DType::kF16;
  if (d == "I32") return DType::kI32;
  return std::nullopt;
}

std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

std::int64_t SafetensorsTensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string SafetensorsTensor::shape_str() const { return shape_string(shape); }

std::string_view safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
  }
  return "?";
}

// A read-only memory mapping of a whole file.
struct SafetensorsFile::Mapping {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data != nullptr && size > 0) munmap(const_cast<std::uint8_t*>(data), size);
  }
};

namespace {
// Drops a read-only, private file mapping's pages covering [p, p + n) from the resident set.
void release_pages(const std::uint8_t* p, std::size_t n) {
  static const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const auto last = (reinterpret_cast<std::uintptr_t>(p) + n + page - 1) / page * page;
  if (n > 0) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // advice only: errors ignored
}
}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  auto map = std::make_shared<Mapping>();
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw InvalidInput(where(path) + "cannot open (" + std::strerror(errno) +
                         ") — check the path and that the file is readable");
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw InvalidInput(where(path) + "is not a regular file — give the path of a .safetensors file");
    }
    map->size = static_cast<std::size_t>(st.st_size);
    if (map->size > 0) {
      void* p = mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        throw RuntimeError(where(path) + "mmap of " + std::to_string(map->size) + " bytes failed (" +
                           std::strerror(e) + ")");
      }
      map->data = static_cast<const std::uint8_t*>(p);
    }
    ::close(fd);
  }
  f.map_ = map;
  const std::size_t size = map->size;

  if (size < 8) {
    fail(path, "truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  std::uint64_t n = 0;
  std::memcpy(&n, map->data, 8);  // little-endian (static_assert above)
  if (n > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(n) + " bytes is absurd (the limit is " +
                   std::to_string(kMaxHeaderBytes) + " bytes; the file has " + std::to_string(size) + ")",
         "this is not a safetensors file, or it is corrupt — download or save it again");
  }
  if (n > size - 8) {
    fail(path, "truncated: the header length says " + std::to_string(n) + " bytes of JSON but only " +
                   std::to_string(size - 8) + " bytes follow");
  }
  if (n < 2) fail(path, "header of " + std::to_string(n) + " bytes cannot hold a JSON object");
  f.data_start_ = 8 + static_cast<std::size_t>(n);
  const std::size_t data_size = size - f.data_start_;

  json header;
  try {
    const char* first = reinterpret_cast<const char*>(map->data + 8);
    header = json::parse(first, first + n, [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) fail(path, "header JSON nests deeper than " + std::to_string(kMaxJsonDepth));
      return true;
    });
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(path, "\"__metadata__\" is not an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail(path, "\"__metadata__\" value of \"" + mk + "\" is not a string");
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string tname = "tensor '" + key + "'";
    if (!value.is_object()) fail(path, tname + ": header entry is not an object");
    SafetensorsTensor t;
    t.name = key;
    if (!value.contains("dtype") || !value["dtype"].is_string()) fail(path, tname + ": no \"dtype\" string");
    t.dtype_name = value["dtype"].get<std::string>();
    t.element_bytes = element_bytes_of(t.dtype_name);
    if (t.element_bytes == 0) {
      fail(path, tname + ": unknown dtype \"" + t.dtype_name + "\"",
           "the safetensors dtypes are F32, BF16, F16, F64, I64, I32, I16, I8, U8, U16, U32, U64, BOOL, "
           "F8_E4M3, F8_E5M2; re-save the file with a standard writer");
    }
    t.dtype = readable_dtype(t.dtype_name);
    if (!value.contains("shape") || !value["shape"].is_array()) fail(path, tname + ": no \"shape\" array");
    std::uint64_t numel = 1;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
        fail(path, tname + ": shape " + value["shape"].dump() + " has a dimension that is not a non-negative integer");
      }
      const auto dim = d.get<std::int64_t>();
      t.shape.push_back(dim);
      if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(dim), &numel) || numel > (1ull << 62)) {
        fail(path, tname + ": shape " + value["shape"].dump() + " has an impossible number of elements");
      }
    }
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() || value["data_offsets"].size() != 2 ||
        !value["data_offsets"][0].is_number_unsigned() || !value["data_offsets"][1].is_number_unsigned()) {
      fail(path, tname + ": \"data_offsets\" must be [begin, end] with non-negative integers, got " +
                     (value.contains("data_offsets") ? value["data_offsets"].dump() : std::string("nothing")));
    }
    const auto begin = value["data_offsets"][0].get<std::uint64_t>();
    const auto end = value["data_offsets"][1].get<std::uint64_t>();
    const std::uint64_t need = numel * t.element_bytes;  // numel <= 2^62, element <= 8: may overflow
    if (numel > (std::uint64_t{1} << 60) || end < begin || end - begin != need) {
      fail(path, tname + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] cover " +
                     (end < begin ? std::string("a negative range") : std::to_string(end - begin) + " bytes") +
                     " but shape " + t.shape_str() + " of " + t.dtype_name + " needs " + std::to_string(need) +
                     " bytes");
    }
    if (end > data_size) {
      fail(path, tname + ": data_offsets end at byte " + std::to_string(end) + " of the data section but the file has " +
                     std::to_string(data_size) + " data bytes (the file is truncated, or its header lies about offsets)");
    }
    t.begin = static_cast<std::size_t>(begin);
    t.end = static_cast<std::size_t>(end);
    f.tensors_.push_back(std::move(t));
  }

  std::stable_sort(f.tensors_.begin(), f.tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::size_t covered = 0;
  const SafetensorsTensor* prev = nullptr;
  for (const auto& t : f.tensors_) {
    if (t.begin < covered) {
      fail(path, "tensor '" + t.name + "' (bytes " + std::to_string(t.begin) + ".." + std::to_string(t.end) +
                     ") overlaps tensor '" + (prev ? prev->name : std::string("?")) + "' (bytes " +
                     std::to_string(prev ? prev->begin : 0) + ".." + std::to_string(covered) +
                     ") — the header lies about offsets");
    }
    if (t.begin > covered) {
      fail(path, "bytes " + std::to_string(covered) + ".." + std::to_string(t.begin) + " before tensor '" + t.name +
                     "' belong to no tensor — the header lies about offsets");
    }
    covered = t.end;
    if (t.end > t.begin || prev == nullptr) prev = &t;
  }
  if (covered != data_size) {
    fail(path, "the tensors cover " + std::to_string(covered) + " data bytes but the file has " +
                   std::to_string(data_size) + " — the header does not describe the whole file");
  }
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::size_t SafetensorsFile::file_bytes() const { return map_ ? map_->size : 0; }

const std::uint8_t* SafetensorsFile::bytes(const SafetensorsTensor& t) const {
  return map_->data + data_start_ + t.begin;
}

void SafetensorsFile::read(const SafetensorsTensor& t, void* dst, DType dst_type) const {
  const bool float_src = t.dtype && *t.dtype != DType::kI32;
  const bool ok = t.dtype && (float_src ? dst_type != DType::kI32 : dst_type == DType::kI32);
  if (!ok) {
    throw InvalidInput(where(path_) + "tensor '" + t.name + "' has dtype " + t.dtype_name + ", which cannot be read as " +
                       std::string(dtype_name(dst_type)) +
                       " — scalelab reads F32, BF16 and F16 weights; convert the checkpoint (e.g. "
                       "model.to(torch.bfloat16).save_pretrained(dir) in transformers)");
  }
  const auto n = static_cast<std::size_t>(t.numel());
  if (n == 0) return;
  const std::uint8_t* src = bytes(t);
  // The format does not promise alignment; our converters read whole elements, so copy a
  // misaligned tensor to an aligned buffer first (never the case for files written by
  // safetensors/transformers or by write_safetensors).
  std::vector<std::uint64_t> aligned;
  if (reinterpret_cast<std::uintptr_t>(src) % t.element_bytes != 0) {
    aligned.resize((t.end - t.begin + 7) / 8);
    std::memcpy(aligned.data(), src, t.end - t.begin);
    src = reinterpret_cast<const std::uint8_t*>(aligned.data());
  }
  const DType st = *t.dtype;
  const std::size_t ss = dtype_size(st), ds = dtype_size(dst_type);
  constexpr std::int64_t kChunk = 1 << 16;
  const std::int64_t chunks = static_cast<std::int64_t>((n + kChunk - 1) / kChunk);
  parallel_for(chunks, 4, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::size_t b = static_cast<std::size_t>(c) * kChunk;
      const std::size_t len = std::min<std::size_t>(kChunk, n - b);
      convert(src + b * ss, st, static_cast<std::uint8_t*>(dst) + b * ds, dst_type, len);
    }
  });
  // The file's pages just read would stay in this process's resident set until the file is
  // closed, on top of the copy they were read into: loading a checkpoint would hold it twice
  // (bench/finetune_vs_hf.py measured 0.5 GiB more peak RSS than the allocator's peak for
  // SmolLM2). Drop them from the mapping (they stay in the page cache; the mapping is private and
  // never written, so a later read of the same range faults the same bytes back in).
  release_pages(bytes(t), t.end - t.begin);
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsSource>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string w = "[safetensors] writing " + path + ": ";
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") throw RuntimeError(w + "invalid tensor name '" + t.name + "'");
    if (!names.insert(t.name).second) throw RuntimeError(w + "tensor '" + t.name + "' is given twice");
    if ((t.data_dtype == DType::kI32) != (t.file_dtype == DType::kI32)) {
      throw RuntimeError(w + "tensor '" + t.name + "': cannot convert between int32 and a float type");
    }
    for (auto d : t.shape)
      if (d < 0) throw RuntimeError(w + "tensor '" + t.name + "' has a negative dimension " + shape_string(t.shape));
  }
  std::vector<const SafetensorsSource*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const SafetensorsSource* a, const SafetensorsSource* b) {
    return dtype_size(a->file_dtype) > dtype_size(b->file_dtype);
  });

  json header = json::object();
  std::size_t offset = 0;
  for (const auto* t : order) {
    std::int64_t n = 1;
    for (auto d : t->shape) n *= d;
    const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(t->file_dtype);
    header[t->name] = {{"dtype", std::string(safetensors_dtype_name(t->file_dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');

  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) {
    throw InvalidInput(w + "cannot create " + tmp + " (" + std::strerror(errno) +
                       ") — check that the directory exists and is writable");
  }
  bool good = true;
  auto put = [&](const void* p, std::size_t k) {
    if (good && k > 0 && std::fwrite(p, 1, k, out) != k) good = false;
  };
  const std::uint64_t len = text.size();
  put(&len, 8);
  put(text.data(), text.size());
  std::vector<std::uint8_t> buf;
  constexpr std::size_t kChunk = 1 << 16;
  for (const auto* t : order) {
    std::int64_t n64 = 1;
    for (auto d : t->shape) n64 *= d;
    const auto n = static_cast<std::size_t>(n64);
    const auto* src = static_cast<const std::uint8_t*>(t->data);
    if (t->data_dtype == t->file_dtype) {
      put(src, n * dtype_size(t->file_dtype));
      continue;
    }
    buf.resize(kChunk * dtype_size(t->file_dtype));
    for (std::size_t b = 0; b < n; b += kChunk) {
      const std::size_t k = std::min(kChunk, n - b);
      convert(src + b * dtype_size(t->data_dtype), t->data_dtype, buf.data(), t->file_dtype, k);
      put(buf.data(), k * dtype_size(t->file_dtype));
    }
  }
  int err = good ? 0 : errno;
  if (std::fclose(out) != 0) {
    // A buffered write that fails only when flushed reports its errno here.
    if (good) err = errno;
    good = false;
  }
  if (!good) {
    std::remove(tmp.c_str());
    throw RuntimeError(w + "write failed (" + std::strerror(err ? err : EIO) +
                       ") — check free disk space and file-size limits (ulimit -f); the file was not replaced");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw InvalidInput(w + "cannot rename " + tmp + " to " + path + " (" + ec.message() + ")");
  }
}

}  // namespace scalelab
