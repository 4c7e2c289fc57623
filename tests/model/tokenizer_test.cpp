// The byte-level BPE tokenizer against Hugging Face `tokenizers`: ids identical on every
// golden case and every non-empty line of the Debian license corpus, decode(encode(s)) == s,
// and the errors for files it must refuse. Goldens: tests/golden/tokenizer/make_tokenizer_golden.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/utf8.h"

namespace scalelab::tok {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kGolden = fs::path(SCALELAB_SOURCE_DIR) / "tests/golden/data/tokenizer";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string fnv1a64(const std::string& data) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : data) h = (h ^ c) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<std::uint32_t> ids_of(const json& j) { return j.get<std::vector<std::uint32_t>>(); }

class GoldenTokenizer : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // The real Llama 3 vocabulary (17 MB) is not committed: make_tokenizer_golden.py --real
    // converts it from the llama-models package.
    if (!fs::exists(kGolden / GetParam() / "tokenizer.json")) {
      GTEST_SKIP() << (kGolden / GetParam() / "tokenizer.json")
                   << " is absent; run tests/golden/tokenizer/make_tokenizer_golden.sh --real to convert it";
    }
  }
};

TEST_P(GoldenTokenizer, CasesMatchHuggingFace) {
  const fs::path dir = kGolden / GetParam();
  const Tokenizer t = Tokenizer::load((dir / "tokenizer.json").string());
  const json g = json::parse(slurp(dir / "golden.json"));
  int n = 0;
  for (const json& c : g["cases"]) {
    const std::string text = unhex(c["hex"].get<std::string>());
    const auto ids = ids_of(c["ids"]);
    const auto plain = ids_of(c["ids_plain"]);
    ASSERT_EQ(t.encode(text, true), ids) << "input hex " << c["hex"];
    ASSERT_EQ(t.encode(text, false), plain) << "input hex " << c["hex"];
    EXPECT_EQ(t.decode(ids), unhex(c["decoded_hex"].get<std::string>())) << "input hex " << c["hex"];
    // decode(encode(s)) == s byte for byte, except where the tokenizer itself changes the text
    // (add_prefix_space in the ignore_merges pair; [MARK] strips the spaces around it).
    const bool changes_text = GetParam().find("ignore_merges") != std::string::npos || text.find("[MARK]") != std::string::npos;
    if (is_valid_utf8(text) && !changes_text) {
      EXPECT_EQ(t.decode(plain), text) << "round trip, input hex " << c["hex"];
    }
    ++n;
  }
  EXPECT_GT(n, 5);
}

TEST_P(GoldenTokenizer, LicenseCorpusLinesMatchHuggingFace) {
  const fs::path dir = kGolden / GetParam();
  const json g = json::parse(slurp(dir / "golden.json"));
  if (!g.contains("corpus")) {
    GTEST_SKIP() << GetParam() << " has case goldens only";
  }
  const Tokenizer t = Tokenizer::load((dir / "tokenizer.json").string());
  int files = 0;
  std::size_t lines_checked = 0;
  for (const json& f : g["corpus"]) {
    const fs::path p = fs::path("/usr/share/common-licenses") / f["file"].get<std::string>();
    const std::string raw = slurp(p);
    if (raw.empty() || fnv1a64(raw) != f["fnv1a64"].get<std::string>()) {
      std::printf("note: %s is absent or differs from the one the goldens were made from; skipped\n", p.c_str());
      continue;
    }
    std::vector<std::string> lines;
    std::size_t s = 0;
    while (s <= raw.size()) {
      std::size_t e = raw.find('\n', s);
      if (e == std::string::npos) e = raw.size();
      if (e > s) lines.push_back(raw.substr(s, e - s));
      s = e + 1;
    }
    ASSERT_EQ(lines.size(), f["lines"].size()) << p;
    std::vector<std::string_view> views(lines.begin(), lines.end());
    const auto batch = t.encode_batch(views, true, 2);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      ASSERT_EQ(batch[i], ids_of(f["lines"][i])) << p << " line " << i << ": " << lines[i];
      EXPECT_EQ(t.decode(batch[i], true), lines[i]);
    }
    lines_checked += lines.size();
    ++files;
  }
  if (files == 0) {
    GTEST_SKIP() << "no license file of the goldens is on this system (/usr/share/common-licenses)";
  }
  EXPECT_GT(lines_checked, 100u);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, GoldenTokenizer,
                         ::testing::Values("gpt2_style", "llama3_style", "smollm_style", "ignore_merges", "no_ignore_merges",
                                           "real_gpt2", "real_llama3"));

TEST(Tokenizer, SpecialTokenRolesFromTokenizerConfig) {
  const Tokenizer l = Tokenizer::load((kGolden / "llama3_style/tokenizer.json").string());
  ASSERT_TRUE(l.bos_id() && l.eos_id());
  EXPECT_EQ(*l.bos_id(), *l.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(*l.eos_id(), *l.token_to_id("<|end_of_text|>"));
  EXPECT_TRUE(l.is_special(*l.eos_id()));
  EXPECT_EQ(l.encode("", true), std::vector<std::uint32_t>{*l.bos_id()});
  const Tokenizer g = find_tokenizer((kGolden / "gpt2_style").string());
  EXPECT_EQ(*g.eos_id(), *g.token_to_id("<|endoftext|>"));
  EXPECT_TRUE(g.encode("", true).empty());
}

TEST(Tokenizer, BatchEqualsOneByOne) {
  const Tokenizer t = Tokenizer::load((kGolden / "llama3_style/tokenizer.json").string());
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) texts.push_back("document " + std::to_string(i * 7919) + " 'S the\tlicense  \n" + std::string(static_cast<std::size_t>(i % 13), 'x'));
  std::vector<std::string_view> views(texts.begin(), texts.end());
  const auto batch = t.encode_batch(views, true, 2);
  for (std::size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], t.encode(texts[i], true));
}

TEST(Tokenizer, MegabyteRunsRoundTrip) {
  // One pre-token of a megabyte (the regex's repeats, the long-piece merge strategy).
  for (const char* name : {"gpt2_style", "llama3_style"}) {
    const Tokenizer t = Tokenizer::load((kGolden / name / "tokenizer.json").string());
    for (const std::string& s : {std::string(1 << 20, ' '), std::string(1 << 20, 'a'), std::string(1 << 20, '7'),
                                 std::string(1 << 19, '\n') + "x", std::string(1 << 18, '!') + " end"}) {
      const auto ids = t.encode(s, false);
      EXPECT_EQ(t.decode(ids), s) << name << " run of " << s.size();
    }
  }
}

TEST(Tokenizer, SanitizeMatchesPythonReplace) {
  // bytes.decode("utf-8", "replace") of each input, written out.
  EXPECT_EQ(sanitize_utf8("\xff"), "\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("a\xC3(b"), "a\xEF\xBF\xBD(b");
  EXPECT_EQ(sanitize_utf8("\xE2\x82"), "\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98 ok"), "\xEF\xBF\xBD ok");
  EXPECT_EQ(sanitize_utf8("caf\xC3\xA9"), "caf\xC3\xA9");
}

TEST(Tokenizer, PatternTranslationSpellsOutWhiteSpace) {
  const std::string p = translate_pattern(R"(\s+(?!\S)|[^\s\p{L}])");
  EXPECT_EQ(p.find("\\s"), std::string::npos);
  EXPECT_EQ(p.find("\\S"), std::string::npos);
  EXPECT_NE(p.find("[^\\x{9}"), std::string::npos);
  // U+180E is not White_Space (Oniguruma's \s) although PCRE2's UCP \s matches it.
  SplitRegex r(R"(\s+|\S+)", "test");
  std::vector<std::pair<std::size_t, std::size_t>> out;
  r.split("a\xE1\xA0\x8E" "b c", out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], (std::pair<std::size_t, std::size_t>{0, 5}));
}

// ---- files it must refuse ----

std::string golden_json(const std::string& name) { return slurp(kGolden / name / "tokenizer.json"); }

void expect_refused(const std::string& text, const std::string& needle) {
  try {
    (void)Tokenizer::from_json(text, "bad/tokenizer.json");
    FAIL() << "accepted a tokenizer that should be refused (" << needle << ")";
  } catch (const InvalidInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad/tokenizer.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(Tokenizer, RefusesOtherModelTypes) {
  json j = json::parse(golden_json("gpt2_style"));
  j["model"]["type"] = "WordPiece";
  expect_refused(j.dump(), "model type 'WordPiece' is not supported");
  j = json::parse(golden_json("gpt2_style"));
  j["normalizer"] = json{{"type", "NFKC"}};
  expect_refused(j.dump(), "normalizer 'NFKC'");
  j = json::parse(golden_json("gpt2_style"));
  j["pre_tokenizer"] = json{{"type", "Metaspace"}};
  expect_refused(j.dump(), "pre-tokenizer type 'Metaspace'");
  expect_refused("{\"model\": 3", "not valid JSON");
  expect_refused("[]", "no 'model' object");
}

TEST(Tokenizer, RefusesVocabMergesMismatch) {
  json j = json::parse(golden_json("llama3_style"));
  j["model"]["merges"].push_back(json::array({"Ġ", "not-a-token"}));
  expect_refused(j.dump(), "vocab and merges do not match");
  j = json::parse(golden_json("gpt2_style"));
  j["model"]["merges"].push_back("a b c");
  expect_refused(j.dump(), "is not two tokens separated by one space");
}

TEST(Tokenizer, FindTokenizerSaysWhatToDo) {
  const fs::path dir = fs::temp_directory_path() / "scalelab_tok_find";
  fs::create_directories(dir);
  try {
    (void)find_tokenizer(dir.string());
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Tokenizer, DecodeRefusesUnknownIds) {
  const Tokenizer t = Tokenizer::load((kGolden / "gpt2_style/tokenizer.json").string());
  const std::vector<std::uint32_t> ids{5, static_cast<std::uint32_t>(t.vocab_size())};
  EXPECT_THROW((void)t.decode(ids), InvalidInput);
}

}  // namespace
}  // namespace scalelab::tok
