#include "model/quantize.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/qat.h"
#include "model/config.h"
#include "model/params.h"
#include "model/safetensors.h"

namespace scalelab {

namespace fs = std::filesystem;

void pack_int4(std::uint8_t* packed, const std::int8_t* q, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = 0; i < n; i += 2) {
    const auto lo = static_cast<std::uint8_t>(q[i]) & 0x0Fu, hi = static_cast<std::uint8_t>(q[i + 1]) & 0x0Fu;
    packed[i / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

void unpack_int4(std::int8_t* q, const std::uint8_t* packed, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = 0; i < n; i += 2) {
    const std::uint8_t b = packed[i / 2];
    // sign-extend each nibble: values 8..15 are −8..−1
    q[i] = static_cast<std::int8_t>((b & 0x0F) >= 8 ? (b & 0x0F) - 16 : (b & 0x0F));
    q[i + 1] = static_cast<std::int8_t>((b >> 4) >= 8 ? (b >> 4) - 16 : (b >> 4));
  }
}

namespace {

// One tensor to write as raw little-endian bytes under a safetensors dtype name. The shared writer
// (model/safetensors.h) converts between the float dtypes the engine computes in and has no
// integer bytes; this is the format's header + data, nothing more.
struct RawTensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::size_t bytes = 0;
};

void write_raw_safetensors(const std::string& path, const std::vector<RawTensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  // Larger elements first keeps each tensor aligned to its element size (as the shared writer).
  auto elem = [](const std::string& d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "U8" || d == "I8" || d == "BOOL") return 1;
    return 2;
  };
  std::vector<const RawTensor*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [&](const RawTensor* a, const RawTensor* b) { return elem(a->dtype) > elem(b->dtype); });
  nlohmann::json header = nlohmann::json::object();
  std::size_t offset = 0;
  for (const auto* t : order) {
    header[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {offset, offset + t->bytes}}};
    offset += t->bytes;
  }
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    throw InvalidInput("[quantize] cannot create " + tmp + " (" + std::strerror(errno) +
                       ") — check that the directory is writable");
  }
  bool good = true;
  auto put = [&](const void* p, std::size_t k) {
    if (good && k > 0 && std::fwrite(p, 1, k, f) != k) good = false;
  };
  const std::uint64_t len = text.size();
  put(&len, 8);
  put(text.data(), text.size());
  for (const auto* t : order) put(t->data, t->bytes);
  good = std::fclose(f) == 0 && good;
  if (!good) {
    fs::remove(tmp);
    throw RuntimeError("[quantize] writing " + tmp + " failed (disk full?)");
  }
  fs::rename(tmp, path);
}

}  // namespace

std::int64_t read_qat_group_size(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / kQatRecordFile;
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return 0;
  std::ifstream f(p);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("group_size") || !j["group_size"].is_number_integer() ||
      j["group_size"].get<std::int64_t>() <= 1) {
    throw InvalidInput("[qat] " + p.string() + " is not a QAT record (a JSON object with an integer group_size > 1) "
                       "— remove it, or give --group-size");
  }
  return j["group_size"].get<std::int64_t>();
}

QuantizeReport quantize_checkpoint(const std::string& dir, const std::string& out, const QuantizeOptions& o) {
  if (o.to != "int4" && o.to != "int8") {
    throw InvalidInput("[--to] must be int4 (packed, two per byte) or int8 (torchao's layout), got '" + o.to + "'");
  }
  std::error_code ec;
  const fs::path src(dir);
  if (!fs::is_regular_file(src / "config.json", ec)) {
    throw InvalidInput("[quantize] " + dir + " has no config.json — give the directory train --save wrote");
  }
  if (!fs::is_regular_file(src / "model.safetensors", ec)) {
    const bool sharded = fs::is_regular_file(src / "model.safetensors.index.json", ec);
    throw InvalidInput("[quantize] " + dir +
                       (sharded ? " holds a sharded checkpoint — save it as one file (train --save without "
                                  "--max-shard-size) and quantize that"
                                : " has no model.safetensors — give the directory train --save wrote"));
  }
  if (fs::exists(out, ec) && fs::equivalent(out, dir, ec)) {
    throw InvalidInput("[--out] " + out + " is the checkpoint's own directory — write into a new one");
  }
  const ModelConfig config = resolve_model(dir);
  ParamLayout layout = ParamLayout::build(config);
  layout.set_qat(QatConfig{"8da4w", o.group_size});  // InvalidInput naming --qat-group-size
  const SafetensorsFile file = SafetensorsFile::open((src / "model.safetensors").string());

  QuantizeReport rep;
  std::vector<RawTensor> tensors;
  // Converted data, kept alive until written; a moved std::vector keeps its heap block, so the
  // data pointers taken below stay valid as `owned` grows.
  std::vector<std::vector<std::uint8_t>> owned;
  for (const SafetensorsTensor& t : file.tensors()) {
    if (!layout.qat_applies(t.name)) {
      tensors.push_back({t.name, t.dtype_name, t.shape, file.bytes(t), t.end - t.begin});
      ++rep.copied;
      continue;
    }
    if (t.shape.size() != 2 || !t.dtype || *t.dtype == DType::kI32) {
      throw InvalidInput("[quantize] " + file.path() + ": " + t.name + " is " + t.dtype_name + " " + t.shape_str() +
                         " — expected a float [out, in] weight");
    }
    const std::int64_t rows = t.shape[0], cols = t.shape[1], groups = cols / o.group_size;
    std::vector<float> w(static_cast<std::size_t>(rows * cols));
    file.read(t, w.data(), DType::kF32);
    std::vector<std::int8_t> q(w.size());
    std::vector<std::uint8_t> scales(static_cast<std::size_t>(rows * groups) * 4);
    // The arithmetic of the checkpoint's dtype: a bf16 checkpoint (--model-precision bf16) gets
    // the bf16 scales its training forward used, as torchao's convert on a bf16 model.
    kernels::quantize_int4_grouped(q.data(), reinterpret_cast<float*>(scales.data()), w.data(), rows, cols,
                                   o.group_size, *t.dtype);
    std::vector<std::uint8_t> weight;
    if (o.to == "int4") {
      weight.resize(q.size() / 2);
      pack_int4(weight.data(), q.data(), rows, cols);
    } else {
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(q.data());
      weight.assign(bytes, bytes + q.size());
    }
    std::vector<std::uint8_t> zeros(scales.size(), 0);  // +0.0f
    const std::string m = t.name.substr(0, t.name.size() - 7);  // drop ".weight"
    owned.push_back(std::move(weight));
    const std::vector<std::int64_t> wshape = o.to == "int4" ? std::vector<std::int64_t>{rows, cols / 2}
                                                            : std::vector<std::int64_t>{rows, cols};
    tensors.push_back({t.name, o.to == "int4" ? "U8" : "I8", wshape, owned.back().data(), owned.back().size()});
    owned.push_back(std::move(scales));
    tensors.push_back({m + ".scales", "F32", {rows, groups}, owned.back().data(), owned.back().size()});
    owned.push_back(std::move(zeros));
    tensors.push_back({m + ".zeros", "F32", {rows, groups}, owned.back().data(), owned.back().size()});
    ++rep.converted;
    rep.bytes_before += t.end - t.begin;
    rep.bytes_after += tensors[tensors.size() - 3].bytes + tensors[tensors.size() - 2].bytes +
                       tensors[tensors.size() - 1].bytes;
  }
  if (rep.converted == 0) {
    throw InvalidInput("[quantize] " + file.path() + " has no linear weight of the decoder layers to convert");
  }
  fs::create_directories(out, ec);
  if (ec) throw InvalidInput("[--out] cannot create " + out + ": " + ec.message());
  write_raw_safetensors((fs::path(out) / "model.safetensors").string(), tensors,
                        {{"format", "pt"}, {"quantization", "scalelab 8da4w " + o.to}});

  std::ifstream cin((src / "config.json").string());
  nlohmann::json cfg = nlohmann::json::parse(cin, nullptr, false);
  if (!cfg.is_object()) throw InvalidInput("[quantize] " + dir + "/config.json is not a JSON object");
  cfg["quantization_config"] = {
      {"quant_method", "scalelab-8da4w"},
      {"reference", "torchao Int8DynActInt4WeightQATQuantizer.convert"},
      {"weight_bits", 4},
      {"weight_dtype", o.to == "int4" ? "uint8, two int4 per byte (two's complement; low nibble: even column)"
                                      : "int8, one int4 value per byte"},
      {"group_size", o.group_size},
      {"symmetric", true},
      {"tensors", "<module>.weight, <module>.scales (fp32 [out, in/group_size]), <module>.zeros (0)"},
      {"activations", "int8 dynamic per-token asymmetric (computed at run time)"},
      {"modules", "every linear module of the decoder layers"}};
  const std::string cpath = (fs::path(out) / "config.json").string();
  {
    std::ofstream co(cpath + ".tmp");
    co << cfg.dump(2) << "\n";
    if (!co) throw RuntimeError("[quantize] writing " + cpath + " failed (disk full?)");
  }
  fs::rename(cpath + ".tmp", cpath);
  for (const auto& e : fs::directory_iterator(src, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name.rfind("model.safetensors", 0) == 0) continue;
    fs::copy_file(e.path(), fs::path(out) / name, fs::copy_options::overwrite_existing, ec);
  }
  return rep;
}

}  // namespace scalelab
