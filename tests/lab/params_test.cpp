#include "lab/params.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace scalelab::lab {
namespace {

TEST(Params, NamesAndFlags) {
  EXPECT_EQ(param_name("--micro-batch-size"), "micro_batch_size");
  EXPECT_EQ(param_name("micro-batch-size"), "micro_batch_size");
  EXPECT_EQ(param_name("seq_len"), "seq_len");
  EXPECT_EQ(param_flag("micro_batch_size"), "--micro-batch-size");
}

TEST(Params, WordsBecomeTypedValues) {
  EXPECT_EQ(parse_param_word("8"), Json(8));
  EXPECT_TRUE(parse_param_word("8").is_number_integer());
  EXPECT_DOUBLE_EQ(parse_param_word("1e-3").get<double>(), 1e-3);
  EXPECT_EQ(parse_param_word("true"), Json(true));
  EXPECT_EQ(parse_param_word("4GiB"), Json("4GiB"));
  EXPECT_EQ(parse_param_word("inf"), Json("inf"));
  EXPECT_EQ(parse_param_word("llama-small"), Json("llama-small"));
}

TEST(Params, ForwardedFlagsParse) {
  ParamMap p = parse_flag_words({"--model", "llama-small", "--seq-len", "1024", "--fused-kernels",
                                 "--device-memory=4GiB", "--lr", "-1e-3", "--activation-checkpointing"});
  EXPECT_EQ(p["model"], "llama-small");
  EXPECT_EQ(p["seq_len"], 1024);
  EXPECT_EQ(p["fused_kernels"], true);
  EXPECT_EQ(p["device_memory"], "4GiB");
  EXPECT_DOUBLE_EQ(p["lr"].get<double>(), -1e-3);
  EXPECT_EQ(p["activation_checkpointing"], true);
  EXPECT_THROW(parse_flag_words({"positional"}), InvalidInput);
  EXPECT_THROW(parse_flag_words({"--seq-len", "1", "--seq-len", "2"}), InvalidInput);
}

TEST(Params, FlagsFromParams) {
  ParamMap p{{"micro_batch_size", 8}, {"fused_kernels", true}, {"activation_checkpointing", false},
             {"attn", "flash"}, {"lr", 0.001}};
  auto flags = params_to_flags(p);
  std::vector<std::string> want = {"--attn", "flash", "--fused-kernels", "--lr", "0.001", "--micro-batch-size", "8"};
  EXPECT_EQ(flags, want);
  auto skipped = params_to_flags(p, {"attn", "lr"});
  std::vector<std::string> want2 = {"--fused-kernels", "--micro-batch-size", "8"};
  EXPECT_EQ(skipped, want2);
}

TEST(Params, HashIsStableAndSensitive) {
  EXPECT_EQ(fnv1a_hex(""), "cbf29ce484222325");  // the FNV-1a 64 offset basis
  EXPECT_EQ(fnv1a_hex("a"), "af63dc4c8601ec8c");  // published test vector
  EXPECT_NE(fnv1a_hex("{\"b\":1}"), fnv1a_hex("{\"b\":2}"));
  EXPECT_EQ(fnv1a_hex("abc").size(), 16u);
}

TEST(Params, LabelAndList) {
  ParamMap p{{"b", 2}, {"a", "x"}};
  EXPECT_EQ(params_label(p), "a=x b=2");
  EXPECT_EQ(params_label(p, {"b"}), "b=2");
  std::string list;
  append_item(list, "one");
  append_item(list, "two");
  EXPECT_EQ(list, "one, two");
}

}  // namespace
}  // namespace scalelab::lab
