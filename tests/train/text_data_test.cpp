// Text datasets: document boundaries, run_clm packing against goldens made with HF
// `tokenizers` (tests/golden/tokenizer/make_tokenizer_golden.py), padded samples with masked
// pads, the seeded split and shuffle, and the errors for bad corpora.
#include "train/text_data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "train/data.h"

namespace scalelab {
namespace {

namespace fs = std::filesystem;
const fs::path kGolden = fs::path(SCALELAB_SOURCE_DIR) / "tests/golden/data/tokenizer";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fnv1a64(const std::string& data) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : data) h = (h ^ c) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

struct TmpText {
  std::string path;
  TmpText(const std::string& text, const std::string& ext = ".txt") {
    static int n = 0;
    path = (fs::temp_directory_path() / ("scalelab_text_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ext)).string();
    std::ofstream(path, std::ios::binary) << text;
  }
  ~TmpText() { std::remove(path.c_str()); }
};

DeviceAllocator& alloc() {
  static DeviceAllocator a(make_host_backend(), std::size_t{1} << 30);
  return a;
}

TEST(TextData, DocumentsAreBlankLineBlocks) {
  TmpText f("\n\nfirst line\nsecond line\n \t\r\nthird\n\n\n  indented\nlast");
  const Corpus c = Corpus::read_text(f.path);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c.doc(0), "first line\nsecond line");
  EXPECT_EQ(c.doc(1), "third");
  EXPECT_EQ(c.doc(2), "  indented\nlast");
}

class Packing : public ::testing::TestWithParam<std::string> {};

TEST_P(Packing, GroupTextsEqualsRunClm) {
  const nlohmann::json g = nlohmann::json::parse(slurp(kGolden / GetParam() / "golden.json"))["packing"];
  const fs::path src = fs::path("/usr/share/common-licenses") / g["file"].get<std::string>();
  const std::string raw = slurp(src);
  if (raw.empty() || fnv1a64(raw) != g["fnv1a64"].get<std::string>()) {
    GTEST_SKIP() << src << " is absent or differs from the one the goldens were made from";
  }
  const tok::Tokenizer t = tok::Tokenizer::load((kGolden / GetParam() / "tokenizer.json").string());
  const Corpus c = Corpus::read_text(src.string());
  EXPECT_EQ(c.size(), g["documents"].get<std::size_t>());
  TokenizeOptions o;
  o.eos = t.eos_id();
  o.threads = 2;
  const TokenizedCorpus tc = tokenize_corpus(t, c, o);
  const std::int64_t block = g["block"].get<std::int64_t>();
  const std::vector<std::int32_t> packed = pack_group_texts(tc, block);
  std::vector<std::int32_t> expect;
  for (const auto& b : g["blocks"]) {
    for (const auto& id : b) expect.push_back(id.get<std::int32_t>());
  }
  ASSERT_EQ(packed.size(), expect.size());
  EXPECT_EQ(packed, expect);

  // The data source reads the same blocks: inputs the first seq-len, targets shifted by one.
  DataOptions d{"text:" + src.string(), block - 1, 2, t.vocab_size(), 0, 0, 1};
  auto source = make_data_source(d, TextSourceOptions{(kGolden / GetParam() / "tokenizer.json").string(), "", "--data"});
  Batch b = make_batch(2, block - 1, alloc());
  source->next(b);
  const auto* in = b.inputs.data<std::int32_t>();
  const auto* tg = b.targets.data<std::int32_t>();
  for (std::int64_t s = 0; s < 2; ++s) {
    for (std::int64_t p = 0; p < block - 1; ++p) {
      EXPECT_EQ(in[s * (block - 1) + p], expect[static_cast<std::size_t>(s * block + p)]);
      EXPECT_EQ(tg[s * (block - 1) + p], expect[static_cast<std::size_t>(s * block + p + 1)]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Packing, ::testing::Values("gpt2_style", "llama3_style"));

TEST(TextData, PaddedSamplesMaskPadsOutOfTheLoss) {
  TokenizedCorpus c;
  c.ids = {10, 11, 12, 20, 21, 22, 23, 24, 25, 26, 30};
  c.offsets = {0, 3, 10, 11};  // 3 tokens; 7 tokens; 1 token (nothing to predict: dropped)
  const PaddedSamples p = pack_padded(c, 4, 99);
  EXPECT_EQ(p.tokens, (std::vector<std::int32_t>{10, 11, 12, 99, 20, 21, 22, 23, 24, 25, 26, 99}));
  EXPECT_EQ(p.real, (std::vector<std::uint8_t>{1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0}));
}

TEST(TextData, PaddedSourceTargetsAreMinus100AtPads) {
  const std::string tokf = (kGolden / "gpt2_style/tokenizer.json").string();
  TmpText f("short one\n\nanother short document here\n");
  DataOptions d{"text:" + f.path + ",pad", 15, 2, 1200, 0, 0, 1};
  auto source = make_data_source(d, TextSourceOptions{tokf, "", "--data"});
  Batch b = make_batch(2, 15, alloc());
  source->next(b);
  const tok::Tokenizer t = tok::Tokenizer::load(tokf);
  const auto* in = b.inputs.data<std::int32_t>();
  const auto* tg = b.targets.data<std::int32_t>();
  for (int s = 0; s < 2; ++s) {
    auto ids = t.encode(s == 0 ? "short one" : "another short document here", true);
    ids.push_back(*t.eos_id());
    ASSERT_LT(ids.size(), 16u);
    for (std::size_t p = 0; p < 15; ++p) {
      if (p < ids.size()) {
        EXPECT_EQ(in[s * 15 + static_cast<int>(p)], static_cast<std::int32_t>(ids[p]));
      }
      const bool real_target = p + 1 < ids.size();
      EXPECT_EQ(tg[s * 15 + static_cast<int>(p)], real_target ? static_cast<std::int32_t>(ids[p + 1]) : -100) << s << " " << p;
    }
  }
}

TEST(TextData, SplitIsSeededDisjointAndComplete) {
  const auto v1 = validation_documents(200, 0.1, 7);
  EXPECT_EQ(v1, validation_documents(200, 0.1, 7));
  EXPECT_EQ(v1.size(), 20u);
  EXPECT_NE(v1, validation_documents(200, 0.1, 8));
  EXPECT_TRUE(std::is_sorted(v1.begin(), v1.end()));
  EXPECT_EQ(validation_documents(1, 0.5, 1).size(), 0u);
  EXPECT_EQ(validation_documents(2, 0.01, 1).size(), 1u);

  // split=train and split=val of one file: disjoint documents that make up the whole.
  std::string text;
  for (int i = 0; i < 40; ++i) text += "document number " + std::to_string(i) + " of the corpus\n\n";
  TmpText f(text);
  const std::string tokf = (kGolden / "gpt2_style/tokenizer.json").string();
  auto count = [&](const std::string& opts) {
    DataOptions d{"text:" + f.path + opts, 4, 1, 1200, 3, 0, 1};
    return make_data_source(d, TextSourceOptions{tokf, "", "--data"})->describe();
  };
  EXPECT_NE(count(",split=train,val-fraction=0.25").find("(30 documents"), std::string::npos) << count(",split=train,val-fraction=0.25");
  EXPECT_NE(count(",split=val,val-fraction=0.25").find("(10 documents"), std::string::npos);
}

TEST(TextData, ShuffleIsASeededPermutationPerEpoch) {
  const auto p = seeded_permutation(50, 1);
  std::set<std::size_t> s(p.begin(), p.end());
  EXPECT_EQ(s.size(), 50u);
  EXPECT_EQ(*s.rbegin(), 49u);
  EXPECT_EQ(p, seeded_permutation(50, 1));
  EXPECT_NE(p, seeded_permutation(50, 2));

  std::string text;
  for (int i = 0; i < 30; ++i) text += "doc " + std::to_string(i) + "\n\n";
  TmpText f(text);
  const std::string tokf = (kGolden / "gpt2_style/tokenizer.json").string();
  auto first_inputs = [&](const std::string& opts, int batches) {
    DataOptions d{"text:" + f.path + opts, 3, 1, 1200, 5, 0, 1};
    auto src = make_data_source(d, TextSourceOptions{tokf, "", "--data"});
    Batch b = make_batch(1, 3, alloc());
    std::vector<std::int32_t> firsts;
    for (int i = 0; i < batches; ++i) {
      src->next(b);
      firsts.push_back(b.inputs.data<std::int32_t>()[0] * 100000 + b.inputs.data<std::int32_t>()[1]);
    }
    return firsts;
  };
  const auto plain = first_inputs("", 200), shuffled = first_inputs(",shuffle", 200);
  EXPECT_NE(plain, shuffled);
  EXPECT_EQ(shuffled, first_inputs(",shuffle", 200));
  // Every sample once per epoch, in both orders.
  DataOptions d{"text:" + f.path, 3, 1, 1200, 5, 0, 1};
  const std::string what = make_data_source(d, TextSourceOptions{tokf, "", "--data"})->describe();
  const auto n = static_cast<std::size_t>(std::stoul(what.substr(what.find(" tokens, ") + 9)));
  std::multiset<std::int32_t> a(plain.begin(), plain.begin() + static_cast<std::ptrdiff_t>(n));
  std::multiset<std::int32_t> b(shuffled.begin(), shuffled.begin() + static_cast<std::ptrdiff_t>(n));
  EXPECT_EQ(a, b);
}

// --resume seeks: skip(k) then next() reads what k + 1 next() calls would, across epochs, shuffled
// or not, on each rank.
TEST(TextData, SkipEqualsReadingAndDropping) {
  std::string text;
  for (int i = 0; i < 12; ++i) text += "doc " + std::to_string(i) + "\n\n";
  TmpText f(text);
  const std::string tokf = (kGolden / "gpt2_style/tokenizer.json").string();
  for (const std::string opts : {"", ",shuffle", ",pad"}) {
    for (int rank = 0; rank < 2; ++rank) {
      DataOptions d{"text:" + f.path + opts, 3, 2, 1200, 5, rank, 2};
      auto read = make_data_source(d, TextSourceOptions{tokf, "", "--data"});
      auto seek = make_data_source(d, TextSourceOptions{tokf, "", "--data"});
      Batch a = make_batch(2, 3, alloc()), b = make_batch(2, 3, alloc());
      const int k = 23;  // several epochs of this small corpus
      for (int i = 0; i < k; ++i) read->next(a);
      seek->skip(k, b);
      for (int i = 0; i < 3; ++i) {
        read->next(a);
        seek->next(b);
        const auto* ia = a.inputs.data<std::int32_t>();
        const auto* ib = b.inputs.data<std::int32_t>();
        const auto* ta = a.targets.data<std::int32_t>();
        const auto* tb = b.targets.data<std::int32_t>();
        EXPECT_EQ(std::vector<std::int32_t>(ia, ia + 6), std::vector<std::int32_t>(ib, ib + 6)) << opts << " rank " << rank;
        EXPECT_EQ(std::vector<std::int32_t>(ta, ta + 6), std::vector<std::int32_t>(tb, tb + 6)) << opts << " rank " << rank;
      }
    }
  }
}

// A text source knows its size (packed and padded), so `--val-data text:...` can be evaluated
// whole (--eval-batches 0), as a token file can.
TEST(TextData, SourcesKnowTheirNumberOfSamples) {
  std::string text;
  for (int i = 0; i < 12; ++i) text += "paragraph " + std::to_string(i) + " of a held-out text, with a few words\n\n";
  TmpText f(text);
  const std::string tokf = (kGolden / "gpt2_style/tokenizer.json").string();
  for (const std::string opts : {"", ",pad", ",split=val,val-fraction=0.5"}) {
    DataOptions d{"text:" + f.path + opts, 8, 2, 1200, 1, 0, 1};
    auto src = make_data_source(d, TextSourceOptions{tokf, "", "--val-data"});
    const std::string what = src->describe();
    const auto at = what.find(" tokens, ");
    ASSERT_NE(at, std::string::npos) << what;
    EXPECT_EQ(src->num_samples(), std::stoll(what.substr(at + 9))) << what;
    EXPECT_GT(src->num_samples(), 0) << what;
  }
}

void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error (" << needle << ")";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TextData, BadCorporaAreClearErrors) {
  TmpText empty(""), ws(" \n\t\n  \n");
  expect_invalid([&] { Corpus::read_text(empty.path); }, "is empty");
  expect_invalid([&] { Corpus::read_text(ws.path); }, "all whitespace");
  TmpText j("{\"text\": \"a\"}\n{\"body\": \"b\"}\n{\"text\": 3}\n", ".jsonl");
  expect_invalid([&] { Corpus::read_jsonl(j.path, "text"); }, "2 of 3 lines have no string field 'text' (first: line 2)");
  TmpText bad("{\"text\": \"a\"}\nnot json\n", ".jsonl");
  expect_invalid([&] { Corpus::read_jsonl(bad.path, "text"); }, "line 2 is not JSON");
  expect_invalid([&] { parse_text_spec("text:x.txt,bogus"); }, "unknown option 'bogus'");
  expect_invalid([&] { parse_text_spec("text:x.txt,val-fraction=2"); }, "val-fraction");
  const TextSpec s = parse_text_spec("jsonl:data.jsonl:body,shuffle,split=val");
  EXPECT_EQ(s.path, "data.jsonl");
  EXPECT_EQ(s.field, "body");
  EXPECT_TRUE(s.shuffle);
  EXPECT_EQ(s.split, "val");

  // Parquet: without pyarrow, a message saying how to convert; with it, this non-Parquet file is refused.
  TmpText pq("not parquet", ".parquet");
  try {
    (void)Corpus::read_parquet(pq.path, "text");
    FAIL() << "a text file read as Parquet";
  } catch (const InvalidInput& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(pq.path), std::string::npos) << m;
    EXPECT_TRUE(m.find("pip install pyarrow") != std::string::npos || m.find("cannot read column") != std::string::npos) << m;
  }
  EXPECT_EQ(parse_text_spec("parquet:d.parquet:body").field, "body");

  // A validation set shorter than one sample.
  TmpText small("tiny\n");
  DataOptions d{"text:" + small.path, 64, 1, 1200, 0, 0, 1};
  expect_invalid([&] { make_data_source(d, TextSourceOptions{(kGolden / "gpt2_style/tokenizer.json").string(), "", "--val-data"}); },
                 "fewer than one sample");
  // No tokenizer.
  expect_invalid([&] { make_data_source(d, TextSourceOptions{"", "llama-small", "--data"}); }, "--tokenizer");
  // A tokenizer larger than the model's vocabulary.
  DataOptions v{"text:" + small.path, 1, 1, 100, 0, 0, 1};
  expect_invalid([&] { make_data_source(v, TextSourceOptions{(kGolden / "gpt2_style/tokenizer.json").string(), "", "--data"}); },
                 "vocab_size is 100");
}

}  // namespace
}  // namespace scalelab
