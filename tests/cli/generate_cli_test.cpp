// End-to-end: `scalelab train --val-data`, `scalelab generate` and `scalelab compare` on the tiny
// models of tests/golden/data/textgen, and the inputs they refuse with exit code 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "cli_run.h"

namespace {

using scalelab::cli_test::CmdResult;
const auto& run_cli = scalelab::cli_test::run;
using scalelab::cli_test::read_json;

std::string textgen(const std::string& name) {
  return std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/textgen/" + name;
}

std::string joined(const nlohmann::json& ids) {
  std::string s;
  for (const auto& t : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(t.get<int>());
  }
  return s;
}

TEST(GenerateCli, GreedyIdsStreamedAsTransformersGenerates) {
  const auto e = read_json(textgen("opt_prenorm") + "/expected.json");
  const auto& g = e["generate"][0];
  const std::string json = testing::TempDir() + "generate_cli.json";
  const CmdResult r = run_cli("generate --model " + textgen("opt_prenorm") + " --prompt-ids 5,17,33,8 --prompt-ids 40 " +
                              "--max-new-tokens 16 --no-eos --threads 1 --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("=> " + joined(g["greedy"])), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("=> " + joined(e["generate"][1]["greedy"])), std::string::npos) << r.output;
  const auto j = read_json(json);
  ASSERT_EQ(j["answers"].size(), 2u);
  EXPECT_EQ(j["answers"][0]["tokens"], g["greedy"]);
  EXPECT_EQ(j["answers"][0]["stop"], "length");
  EXPECT_GT(j["memory_plan"]["kv_cache_bytes"].get<double>(), 0);
  EXPECT_GE(j["max_allocated_bytes"].get<double>(), j["memory_plan"]["total_bytes"].get<double>());
  // --eos-token-id: stops right after it.
  const CmdResult s = run_cli("generate --model " + textgen("opt_prenorm") + " --prompt-ids 5,17,33,8 " +
                              "--max-new-tokens 16 --threads 1 --eos-token-id " +
                              std::to_string(g["eos_token_id"].get<int>()));
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("=> " + joined(g["greedy_with_eos"]) + "\n"), std::string::npos) << s.output;
  // Sampling with a seed: the same answer twice.
  const std::string sample = "generate --model " + textgen("llama_gqa_untied") +
                             " --prompt-ids 1,2,3 --max-new-tokens 8 --temperature 0.8 --top-k 20 --top-p 0.9 "
                             "--seed 5 --quiet --threads 1";
  const CmdResult a = run_cli(sample), b = run_cli(sample);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
}

TEST(GenerateCli, RefusesBadInput) {
  const std::string m = "generate --model " + textgen("llama_gqa_untied");
  CmdResult r = run_cli(m + " --prompt 'What is it?'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--prompt-ids"), std::string::npos) << r.output;
  r = run_cli(m + " --prompt-ids 1,x,3");
  EXPECT_EQ(r.code, 2) << r.output;
  r = run_cli(m + " --prompt-ids 1,96");  // vocab 96
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("vocabulary"), std::string::npos) << r.output;
  r = run_cli(m + " --prompt-ids 1 --max-new-tokens 100");  // max_position_embeddings 64
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("max_position_embeddings"), std::string::npos) << r.output;
  r = run_cli(m + " --prompt-ids 1 --top-p 0");
  EXPECT_EQ(r.code, 2) << r.output;
  r = run_cli("generate --model " + testing::TempDir() + "no_such_model --prompt-ids 1");
  EXPECT_EQ(r.code, 2) << r.output;
  r = run_cli(m + " --prompt-ids 1 --device-memory 100KB");  // the weights alone do not fit
  EXPECT_EQ(r.code, 3) << r.output;
}

TEST(GenerateCli, TrainWithValidationThenCompareBaseAndTuned) {
  const std::string base = textgen("llama_gqa_untied"), val = base + "/val.bin";
  const std::string tuned = testing::TempDir() + "compare_tuned", rec = testing::TempDir() + "compare_train.json";
  CmdResult t = run_cli("train --model " + base + " --data " + val + " --val-data " + val +
                        " --seq-len 12 --micro-batch-size 2 --max-steps 8 --lr 1e-2 --eval-every 4 --threads 1 "
                        "--save " + tuned + " --json " + rec);
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("eval step 4/8 | val loss"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("Validation loss:"), std::string::npos) << t.output;
  const auto tr = read_json(rec);
  ASSERT_EQ(tr["evals"].size(), 2u);
  EXPECT_EQ(tr["val_loss"], tr["evals"][1]["val_loss"]);
  EXPECT_EQ(tr["config"]["val_data"], val);
  // The saved model keeps the source's generation_config.json: the same EOS as the base.
  EXPECT_TRUE(std::ifstream(tuned + "/generation_config.json").good());

  const std::string ids = testing::TempDir() + "compare_prompts.txt", json = testing::TempDir() + "compare.json",
                    md = testing::TempDir() + "compare.md";
  {
    std::ofstream f(ids);
    f << "5,17,33,8\n\n40\n";
  }
  CmdResult c = run_cli("compare --base " + base + " --tuned " + tuned + " --prompt-ids-file " + ids +
                        " --val-data " + val + " --seq-len 12 --max-new-tokens 6 --threads 1 --json " + json +
                        " --markdown " + md);
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_NE(c.output.find("| validation loss |"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("## Prompt 2"), std::string::npos) << c.output;
  const auto j = read_json(json);
  // The base's validation loss is transformers' (golden); the tuned model trained on that very
  // data: lower.
  const auto e = read_json(base + "/expected.json");
  EXPECT_NEAR(j["base"]["val_loss"].get<double>(), e["val_loss"].get<double>(), 1e-5);
  EXPECT_LT(j["tuned"]["val_loss"].get<double>(), j["base"]["val_loss"].get<double>());
  EXPECT_EQ(j["base"]["answers"].size(), 2u);
  EXPECT_LE(j["base"]["answers"][0]["tokens"].size(), 6u);  // --max-new-tokens, or fewer at EOS
  std::ifstream mdf(md);
  const std::string mdtext((std::istreambuf_iterator<char>(mdf)), std::istreambuf_iterator<char>());
  EXPECT_NE(mdtext.find("# Base vs tuned"), std::string::npos);
  // Another vocabulary: refused.
  c = run_cli("compare --base " + base + " --tuned opt-tiny --prompt-ids 1 --threads 1");
  EXPECT_EQ(c.code, 2) << c.output;
}

}  // namespace

namespace {

TEST(ResumeCli, CheckpointsResumeAndRefuseAnotherModel) {
  const std::string out = testing::TempDir() + "resume_cli";
  std::filesystem::remove_all(out);
  // A stale checkpoint of a longer earlier run: rotation removes it before this run's.
  std::filesystem::create_directories(out + "/checkpoint-9");
  const std::string train = "train --model llama-tiny --seq-len 16 --micro-batch-size 2 --max-steps 4 --threads 1 "
                            "--save-every 2 --save-total-limit 1 --save " + out;
  CmdResult r = run_cli(train + " --json " + out + ".json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint " + out + "/checkpoint-2 (removed 1 older)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoint " + out + "/checkpoint-4 (removed 1 older)"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoint-9"));
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoint-2"));
  const auto full = read_json(out + ".json");
  // The last checkpoint is at the last step: nothing left to run; another model: refused naming it.
  r = run_cli(train + " --resume " + out + "/checkpoint-4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("nothing left to run"), std::string::npos) << r.output;
  r = run_cli("train --model opt-tiny --seq-len 16 --micro-batch-size 2 --max-steps 6 --threads 1 --resume " + out +
              "/checkpoint-4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("model_family \"llama\" in the checkpoint, \"opt\" now"), std::string::npos) << r.output;
  EXPECT_EQ(full["checkpoints"].size(), 2u);
}

}  // namespace

// A model directory with a tokenizer.json: --prompt takes text, encoded as `scalelab tokenize`
// encodes it, and the answer streams as text equal to the decoded tokens of the JSON record.
TEST(GenerateCli, TextPromptsThroughTheModelsTokenizer) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(testing::TempDir()) / "gen_text_model";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto cfg = read_json(textgen("llama_gqa_untied") + "/config.json");
  cfg["vocab_size"] = 1200;  // the GPT-2-style test tokenizer's vocabulary
  cfg["bos_token_id"] = 0;
  cfg["eos_token_id"] = 0;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  fs::copy_file(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/tokenizer/gpt2_style/tokenizer.json",
                dir / "tokenizer.json");
  const fs::path saved = dir / "saved";
  const CmdResult t = run_cli("train --model " + dir.string() + " --seq-len 16 --max-steps 1 --quiet --threads 1 --save " +
                              saved.string());
  ASSERT_EQ(t.code, 0) << t.output;
  ASSERT_TRUE(fs::exists(saved / "tokenizer.json")) << "saved models carry their tokenizer";
  const std::string json = (dir / "gen.json").string();
  const CmdResult g = run_cli("generate --model " + saved.string() +
                              " --prompt 'The licenses for most software' --max-new-tokens 6 --no-eos --threads 1 --json " + json);
  ASSERT_EQ(g.code, 0) << g.output;
  const auto j = read_json(json);
  ASSERT_EQ(j["answers"].size(), 1u);
  const auto& a = j["answers"][0];
  EXPECT_EQ(a["tokens"].size(), 6u);
  const std::string text = a["text"].get<std::string>();
  EXPECT_NE(g.output.find("=> " + text + "\n"), std::string::npos) << "streamed text = decoded tokens\n" << g.output;
  // The prompt's ids are the tokenizer's: the same as `scalelab tokenize` writes for that text.
  std::ofstream(dir / "prompt.txt") << "The licenses for most software";
  const CmdResult k = run_cli("tokenize --tokenizer " + (dir / "tokenizer.json").string() + " --input " +
                              (dir / "prompt.txt").string() + " --out " + (dir / "prompt.bin").string());
  ASSERT_EQ(k.code, 0) << k.output;
  std::ifstream in(dir / "prompt.bin", std::ios::binary);
  std::vector<std::uint32_t> ids;
  std::uint32_t v = 0;
  while (in.read(reinterpret_cast<char*>(&v), sizeof v)) ids.push_back(v);
  ASSERT_EQ(a["prompt_ids"].size(), ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(a["prompt_ids"][i].get<std::uint32_t>(), ids[i]);
}

// --chat: the prompt is the model's chat template rendered for a user message (after --system's
// message) exactly as transformers' apply_chat_template renders and tokenizes it (the chat goldens,
// tests/golden/make_chat_golden.py, SmolLM2's template with the SmolLM-style test tokenizer), and
// the answer stops at the template's end-of-turn token as well as the EOS.
TEST(GenerateCli, ChatPromptsThroughTheModelsTemplate) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(testing::TempDir()) / "gen_chat_model";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto cfg = read_json(textgen("llama_gqa_untied") + "/config.json");
  cfg["vocab_size"] = 1000;  // the SmolLM-style test tokenizer: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2
  cfg["bos_token_id"] = 0;
  cfg["eos_token_id"] = 0;
  cfg["max_position_embeddings"] = 256;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  std::ofstream(dir / "generation_config.json") << R"({"bos_token_id": 0, "eos_token_id": 0})";
  const std::string golden_dir = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/";
  fs::copy_file(golden_dir + "tokenizer/smollm_style/tokenizer.json", dir / "tokenizer.json");
  std::ifstream tin(golden_dir + "chat/templates/smollm2.jinja", std::ios::binary);
  const std::string tmpl((std::istreambuf_iterator<char>(tin)), std::istreambuf_iterator<char>());
  nlohmann::json tc = {{"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"}, {"chat_template", tmpl}};
  std::ofstream(dir / "tokenizer_config.json") << tc.dump(2);
  const fs::path saved = dir / "saved";
  const CmdResult t = run_cli("train --model " + dir.string() + " --seq-len 16 --max-steps 1 --quiet --threads 1 --save " +
                              saved.string());
  ASSERT_EQ(t.code, 0) << t.output;

  const auto gold = read_json(golden_dir + "chat/expected.json");
  auto golden_case = [&](const std::string& conv) {
    for (const auto& c : gold["cases"])
      if (c["template"] == "smollm2" && c["conversation"] == conv && c["add_generation_prompt"] == true) return c;
    ADD_FAILURE() << "no golden case " << conv;
    return nlohmann::json();
  };
  const std::string json = (dir / "chat.json").string();
  const auto& user_only = gold["conversations"]["user_only"]["messages"];
  CmdResult g = run_cli("generate --model " + saved.string() + " --chat --prompt '" +
                        user_only[0]["content"].get<std::string>() + "' --max-new-tokens 4 --threads 1 --json " + json);
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_NE(g.output.find("chat template: " + saved.string() + "/tokenizer_config.json chat_template"), std::string::npos)
      << g.output;
  auto j = read_json(json);
  const auto want = golden_case("user_only");
  EXPECT_EQ(j["answers"][0]["chat_prompt"], want["text"]);
  EXPECT_EQ(j["answers"][0]["prompt_ids"], want["ids"]);
  EXPECT_EQ(j["answers"][0]["prompt"], user_only[0]["content"]);
  // The EOS (0) and the template's <|im_end|> (2) both end an answer.
  EXPECT_EQ(j["eos_token_ids"], nlohmann::json::parse("[0, 2]"));

  const auto& sys = gold["conversations"]["system_user"]["messages"];
  g = run_cli("generate --model " + saved.string() + " --chat --system '" + sys[0]["content"].get<std::string>() +
              "' --prompt '" + sys[1]["content"].get<std::string>() + "' --max-new-tokens 2 --threads 1 --quiet --json " + json);
  ASSERT_EQ(g.code, 0) << g.output;
  j = read_json(json);
  EXPECT_EQ(j["answers"][0]["chat_prompt"], golden_case("system_user")["text"]);
  EXPECT_EQ(j["answers"][0]["prompt_ids"], golden_case("system_user")["ids"]);
  EXPECT_EQ(j["system"], sys[0]["content"]);

  // compare --chat renders the same prompt for both models.
  const std::string cj = (dir / "compare.json").string();
  g = run_cli("compare --base " + saved.string() + " --tuned " + saved.string() + " --chat --prompt '" +
              user_only[0]["content"].get<std::string>() + "' --max-new-tokens 2 --threads 1 --json " + cj);
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_NE(g.output.find("chat template"), std::string::npos) << g.output;
  j = read_json(cj);
  EXPECT_EQ(j["prompts"][0]["ids"], want["ids"]);
  EXPECT_EQ(j["base"]["eos_token_ids"], nlohmann::json::parse("[0, 2]"));

  // Refusals (exit 2, naming the flag or the template).
  const std::string m = "generate --model " + saved.string() + " --max-new-tokens 2 --threads 1";
  CmdResult r = run_cli(m + " --system 'Be brief.' --prompt 'Hi'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--system"), std::string::npos) << r.output;
  r = run_cli(m + " --chat --prompt-ids 1,2,3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--chat"), std::string::npos) << r.output;
  tc["chat_template"] = "{% for m in messages %}{% macro x() %}{% endmacro %}{% endfor %}";
  std::ofstream(saved / "tokenizer_config.json") << tc.dump(2);
  r = run_cli(m + " --chat --prompt 'Hi'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("tokenizer_config.json chat_template line 1: '{% macro %}' is not supported"), std::string::npos)
      << r.output;
  r = run_cli(m + " --prompt 'Hi'");  // without --chat the template is not read
  EXPECT_EQ(r.code, 0) << r.output;
  // A template list without "default": refused only when --chat needs it.
  tc["chat_template"] = nlohmann::json::parse(R"([{"name": "tool_use", "template": "T"}])");
  std::ofstream(saved / "tokenizer_config.json") << tc.dump(2);
  r = run_cli(m + " --prompt 'Hi'");
  EXPECT_EQ(r.code, 0) << r.output;
  r = run_cli(m + " --chat --prompt 'Hi'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("\"default\""), std::string::npos) << r.output;
  tc.erase("chat_template");
  std::ofstream(saved / "tokenizer_config.json") << tc.dump(2);
  r = run_cli(m + " --chat --prompt 'Hi'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no chat template"), std::string::npos) << r.output;
  fs::remove_all(dir);
}
