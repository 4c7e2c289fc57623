#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "core/error.h"
#include "model_test_util.h"

namespace scalelab {
namespace {

using ::testing::HasSubstr;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  if (n > 3) {
    v[0] = 0.0f;
    v[1] = -0.0f;
    v[2] = 1e-6f;  // fp16 subnormal
    v[3] = 65504.0f;
  }
  return v;
}

// A file from a literal header and data; `length` overrides the 8-byte header length.
std::string raw_file(const ScratchDir& dir, const std::string& header, std::size_t data_bytes,
                     std::optional<std::uint64_t> length = std::nullopt) {
  std::vector<std::uint8_t> b(8);
  const std::uint64_t n = length ? *length : header.size();
  std::memcpy(b.data(), &n, 8);
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + data_bytes, 0x11);
  const std::string path = dir / "raw.safetensors";
  write_bytes(path, b);
  return path;
}

// Expects SafetensorsFile::open(path) to throw InvalidInput whose message has every fragment.
void expect_open_error(const std::string& path, const std::vector<std::string>& fragments) {
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "opened " << path << " without error";
  } catch (const InvalidInput& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    for (const auto& f : fragments) EXPECT_THAT(e.what(), HasSubstr(f));
  }
}

TEST(Safetensors, RoundTripEveryDtype) {
  ScratchDir dir;
  const auto a = random_floats(6 * 5, 1), b = random_floats(7, 2), c = random_floats(3 * 2 * 4, 3);
  const float scalar = 2.5f;
  const std::vector<std::int32_t> ids = {0, 7, -3, 1 << 30};
  const std::string path = dir / "t.safetensors";
  write_safetensors(path, {
                              {"z.f32", {6, 5}, a.data(), DType::kF32, DType::kF32},
                              {"a.bf16", {7}, b.data(), DType::kF32, DType::kBF16},
                              {"m.f16", {3, 2, 4}, c.data(), DType::kF32, DType::kF16},
                              {"scalar", {}, &scalar, DType::kF32, DType::kF32},
                              {"empty", {0, 4}, nullptr, DType::kF32, DType::kBF16},
                              {"ids", {4}, ids.data(), DType::kI32, DType::kI32},
                          });
  const auto bytes = read_bytes(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header must be padded to 8 bytes";

  const auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 6u);
  const auto* tf = f.find("z.f32");
  const auto* tb = f.find("a.bf16");
  const auto* th = f.find("m.f16");
  ASSERT_TRUE(tf && tb && th && f.find("scalar") && f.find("empty") && f.find("ids"));
  EXPECT_EQ(tf->dtype_name, "F32");
  EXPECT_EQ(tb->dtype_name, "BF16");
  EXPECT_EQ(th->dtype_name, "F16");
  EXPECT_EQ(tf->shape, (std::vector<std::int64_t>{6, 5}));
  EXPECT_EQ(th->shape, (std::vector<std::int64_t>{3, 2, 4}));
  EXPECT_TRUE(f.find("scalar")->shape.empty());
  EXPECT_EQ(f.find("empty")->numel(), 0);
  // Every tensor is aligned to its element size (4-byte tensors first).
  for (const auto& t : f.tensors()) EXPECT_EQ(t.begin % t.element_bytes, 0u) << t.name;

  std::vector<float> out(a.size());
  f.read(*tf, out.data(), DType::kF32);
  EXPECT_EQ(std::memcmp(out.data(), a.data(), a.size() * 4), 0);

  std::vector<float> ob(b.size());
  f.read(*tb, ob.data(), DType::kF32);
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT_EQ(ob[i], bf16_to_float(float_to_bf16(b[i]))) << i;
  std::vector<bf16> raw_b(b.size());
  f.read(*tb, raw_b.data(), DType::kBF16);
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT_EQ(raw_b[i].bits, float_to_bf16(b[i]).bits);

  std::vector<float> oh(c.size());
  f.read(*th, oh.data(), DType::kF32);
  for (std::size_t i = 0; i < c.size(); ++i) EXPECT_EQ(oh[i], fp16_to_float(float_to_fp16(c[i]))) << i;
  // F16 file into a bf16 buffer: through float, rounded to nearest even.
  std::vector<bf16> hb(c.size());
  f.read(*th, hb.data(), DType::kBF16);
  for (std::size_t i = 0; i < c.size(); ++i) EXPECT_EQ(hb[i].bits, float_to_bf16(oh[i]).bits);

  float s = 0;
  f.read(*f.find("scalar"), &s, DType::kF32);
  EXPECT_EQ(s, 2.5f);
  std::vector<std::int32_t> oi(4);
  f.read(*f.find("ids"), oi.data(), DType::kI32);
  EXPECT_EQ(oi, ids);
  EXPECT_THROW(f.read(*f.find("ids"), out.data(), DType::kF32), InvalidInput);
}

TEST(Safetensors, WriterIsDeterministicAndReplacesAtomically) {
  ScratchDir dir;
  const auto a = random_floats(64, 4);
  const std::vector<SafetensorsSource> t = {{"b", {8, 8}, a.data(), DType::kF32, DType::kBF16},
                                            {"a", {64}, a.data(), DType::kF32, DType::kF32}};
  write_safetensors(dir / "1.safetensors", t);
  write_safetensors(dir / "2.safetensors", t);
  EXPECT_EQ(read_bytes(dir / "1.safetensors"), read_bytes(dir / "2.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "1.safetensors.tmp"));
  const auto f = SafetensorsFile::open(dir / "1.safetensors");
  EXPECT_EQ(f.tensors()[0].name, "a");  // 4-byte tensors are placed first
  EXPECT_EQ(f.tensors()[1].name, "b");
}

TEST(Safetensors, WriterRejectsDuplicatesAndUnwritablePaths) {
  ScratchDir dir;
  const float x = 1;
  EXPECT_THROW(write_safetensors(dir / "d.safetensors", {{"a", {1}, &x, DType::kF32, DType::kF32},
                                                         {"a", {1}, &x, DType::kF32, DType::kF32}}),
               RuntimeError);
  EXPECT_THROW(write_safetensors(dir / "no/such/dir/x.safetensors", {{"a", {1}, &x, DType::kF32, DType::kF32}}),
               InvalidInput);
}

TEST(Safetensors, MetadataIsOptional) {
  ScratchDir dir;
  const auto path = raw_file(dir, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  const auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.metadata().empty());
  ASSERT_NE(f.find("w"), nullptr);
  std::vector<float> v(2);
  f.read(*f.find("w"), v.data(), DType::kF32);
  std::uint32_t bits;
  std::memcpy(&bits, &v[0], 4);
  EXPECT_EQ(bits, 0x11111111u);
}

TEST(Safetensors, ReadsUnalignedTensors) {
  ScratchDir dir;
  // A 2-byte tensor first puts the F32 tensor at an odd-of-4 offset (valid, if unusual).
  const auto path = raw_file(
      dir, R"({"h":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"w":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}})",
      10);
  const auto f = SafetensorsFile::open(path);
  std::vector<float> v(2);
  f.read(*f.find("w"), v.data(), DType::kF32);
  std::uint32_t bits;
  std::memcpy(&bits, &v[1], 4);
  EXPECT_EQ(bits, 0x11111111u);
}

// The file-backed resident set of this process (kB), from /proc/self/status; -1 where absent.
long rss_file_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssFile:", 0) == 0) return std::stol(line.substr(8));
  }
  return -1;
}

// read() drops the pages it read from the mapping, so a loaded checkpoint is not held twice
// (the file's pages + the copy), and reading the same tensors again still gives their bytes.
TEST(Safetensors, ReadReleasesTheFilePagesItRead) {
  ScratchDir dir;
  const std::size_t n = std::size_t{16} << 20;  // 64 MiB of F32 in two tensors
  std::vector<float> a(n / 2), b(n / 2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 1000);
    b[i] = -static_cast<float>(i % 777);
  }
  const std::string path = dir / "big.safetensors";
  write_safetensors(path, {{"a", {static_cast<std::int64_t>(a.size())}, a.data(), DType::kF32, DType::kF32},
                           {"b", {static_cast<std::int64_t>(b.size())}, b.data(), DType::kF32, DType::kF32}});
  const auto f = SafetensorsFile::open(path);
  std::vector<float> out(n / 2);
  const long before = rss_file_kb();
  if (before < 0) GTEST_SKIP() << "no RssFile in /proc/self/status";
  f.read(*f.find("a"), out.data(), DType::kF32);
  f.read(*f.find("b"), out.data(), DType::kF32);
  const long grown = rss_file_kb() - before;
  EXPECT_LT(grown, 8 * 1024) << "reading 64 MiB left " << grown << " kB of the file resident";
  EXPECT_EQ(out, b);
  f.read(*f.find("a"), out.data(), DType::kF32);  // again, after its pages were dropped
  EXPECT_EQ(out, a);
}

TEST(SafetensorsBadInput, TruncatedFiles) {
  ScratchDir dir;
  const auto a = random_floats(16, 5);
  const std::string good = dir / "good.safetensors";
  write_safetensors(good, {{"weight", {4, 4}, a.data(), DType::kF32, DType::kF32}});
  auto bytes = read_bytes(good);

  // Data cut short: the tensor's offsets run past the end.
  auto cut = bytes;
  cut.resize(cut.size() - 1);
  write_bytes(dir / "cut.safetensors", cut);
  expect_open_error(dir / "cut.safetensors", {"'weight'", "truncated"});
  // Cut inside the header.
  cut.resize(20);
  write_bytes(dir / "cut.safetensors", cut);
  expect_open_error(dir / "cut.safetensors", {"truncated", "header length"});
  // Shorter than the length field.
  cut.resize(5);
  write_bytes(dir / "cut.safetensors", cut);
  expect_open_error(dir / "cut.safetensors", {"truncated", "8-byte"});
  write_bytes(dir / "empty.safetensors", {});
  expect_open_error(dir / "empty.safetensors", {"truncated"});
}

TEST(SafetensorsBadInput, AbsurdHeaderLength) {
  ScratchDir dir;
  const auto path = raw_file(dir, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, 1ull << 40);
  expect_open_error(path, {"header length 1099511627776", "absurd"});
  // Below the absurd limit but beyond the file: truncated.
  const auto path2 = raw_file(dir, R"({})", 0, 50ull << 20);
  expect_open_error(path2, {"truncated", "52428800"});
}

TEST(SafetensorsBadInput, HeaderLiesAboutOffsets) {
  ScratchDir dir;
  // Size disagrees with shape x dtype.
  expect_open_error(raw_file(dir, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 12),
                    {"'w'", "[0, 12]", "cover 12 bytes", "[4] of F32 needs 16"});
  // Beyond the data section.
  expect_open_error(raw_file(dir, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16),
                    {"'w'", "end at byte 24", "16 data bytes"});
  // Overlapping tensors.
  expect_open_error(raw_file(dir,
                             R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                             24),
                    {"'b'", "overlaps", "'a'"});
  // A hole between tensors.
  expect_open_error(raw_file(dir,
                             R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                             12),
                    {"bytes 4..8", "'b'", "belong to no tensor"});
  // Trailing bytes no tensor describes.
  expect_open_error(raw_file(dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9),
                    {"cover 4 data bytes", "has 9"});
  // Reversed offsets.
  expect_open_error(raw_file(dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
                    {"'a'", "negative range"});
  // Offsets that are not two non-negative integers.
  expect_open_error(raw_file(dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
                    {"'a'", "data_offsets"});
  expect_open_error(raw_file(dir, R"({"a":{"dtype":"F32","shape":[1]}})", 4), {"'a'", "data_offsets"});
}

TEST(SafetensorsBadInput, MalformedHeaders) {
  ScratchDir dir;
  expect_open_error(raw_file(dir, R"({"w":{"dtype":"F32",)", 0), {"not valid JSON"});
  expect_open_error(raw_file(dir, R"([1,2,3])", 0), {"not a JSON object"});
  expect_open_error(raw_file(dir, R"({"w":[1]})", 0), {"'w'", "not an object"});
  expect_open_error(raw_file(dir, R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), {"'w'", "dtype"});
  expect_open_error(raw_file(dir, R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4),
                    {"'w'", "unknown dtype \"F33\""});
  expect_open_error(raw_file(dir, R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                    {"'w'", "non-negative"});
  expect_open_error(raw_file(dir, R"({"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", 4), {"'w'", "shape"});
  expect_open_error(raw_file(dir, R"({"__metadata__":{"format":1}})", 0), {"__metadata__", "format"});
  expect_open_error(raw_file(dir, R"({"__metadata__":[]})", 0), {"__metadata__"});
  expect_open_error(raw_file(dir, std::string(50, '[') + std::string(50, ']'), 0), {"nests deeper"});
  expect_open_error(raw_file(dir, "x", 0), {"cannot hold"});
  expect_open_error(dir / "does_not_exist.safetensors", {"cannot open"});
  expect_open_error(dir.str(), {"not a regular file"});
}

TEST(SafetensorsBadInput, UnsupportedDtypeIsListedButNotRead) {
  ScratchDir dir;
  const auto path = raw_file(dir, R"({"pos":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16);
  const auto f = SafetensorsFile::open(path);
  ASSERT_NE(f.find("pos"), nullptr);
  EXPECT_FALSE(f.find("pos")->dtype.has_value());
  std::vector<float> v(2);
  try {
    f.read(*f.find("pos"), v.data(), DType::kF32);
    ADD_FAILURE() << "read an I64 tensor";
  } catch (const InvalidInput& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    EXPECT_THAT(e.what(), HasSubstr("'pos'"));
    EXPECT_THAT(e.what(), HasSubstr("I64"));
    EXPECT_THAT(e.what(), HasSubstr("F32, BF16 and F16"));
  }
}

TEST(SafetensorsBadInput, CorruptedBytesNeverCrash) {
  // Random damage to the length and header of a valid file: open either succeeds (the damage hit
  // something harmless, such as padding or a digit that still agrees) and every tensor reads, or
  // it throws InvalidInput. Never a crash or another exception.
  ScratchDir dir;
  const auto a = random_floats(12, 6);
  write_safetensors(dir / "ok.safetensors", {{"x", {3, 4}, a.data(), DType::kF32, DType::kF32},
                                             {"y", {6}, a.data(), DType::kF32, DType::kBF16}});
  const auto good = read_bytes(dir / "ok.safetensors");
  std::uint64_t header = 0;
  std::memcpy(&header, good.data(), 8);
  std::mt19937 rng(11);
  int rejected = 0;
  for (int trial = 0; trial < 300; ++trial) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      const std::size_t at = rng() % (8 + header);
      b[at] = static_cast<std::uint8_t>(rng());
    }
    if (rng() % 10 == 0) b.resize(rng() % b.size());
    write_bytes(dir / "bad.safetensors", b);
    try {
      const auto f = SafetensorsFile::open(dir / "bad.safetensors");
      std::vector<float> out(64);
      for (const auto& t : f.tensors())
        if (t.dtype && *t.dtype != DType::kI32 && t.numel() <= 64) f.read(t, out.data(), DType::kF32);
    } catch (const InvalidInput&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 150);
}

TEST(Safetensors, ReadsFilesWrittenByPythonSafetensors) {
  // expected.safetensors was written by the safetensors Python package (tests/golden).
  const auto f = SafetensorsFile::open(testing::golden_dir("opt_tiny") + "/expected.safetensors");
  const auto* logits = f.find("logits");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->shape, (std::vector<std::int64_t>{2, 16, 256}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  std::vector<float> v(static_cast<std::size_t>(logits->numel()));
  f.read(*logits, v.data(), DType::kF32);
  for (float x : v) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace scalelab
