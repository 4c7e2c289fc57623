// The family registry (src/model/family.h): every family is found by its name, its HF
// model_type and its presets; every preset validates, round-trips through config.json and builds
// a layout whose flags follow the one decay rule; the switch checks live in one place.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "model/family.h"
#include "model/init.h"
#include "model_test_util.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

using ::testing::HasSubstr;

TEST(ModelFamilies, RegistryFindsEachFamilyByNameTypeAndPreset) {
  std::set<std::string> names;
  for (const ModelFamilySpec* f : model_families()) {
    EXPECT_TRUE(names.insert(f->name).second) << f->name;
    EXPECT_EQ(&family_spec(f->id), f);
    EXPECT_EQ(find_family_by_name(f->name), f);
    EXPECT_EQ(family_name(f->id), f->name);
    ASSERT_FALSE(f->hf_model_types.empty()) << f->name;
    for (const auto& t : f->hf_model_types) EXPECT_EQ(find_family_by_hf_type(t), f);
    ASSERT_FALSE(f->presets.empty()) << f->name;
    for (const ModelConfig& p : f->presets) {
      EXPECT_EQ(find_family_by_preset(p.name), f);
      EXPECT_TRUE(is_preset(p.name));
    }
    EXPECT_TRUE(f->config_from_hf && f->config_to_hf && f->build_layout && f->make_model) << f->name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"llama", "opt", "qwen2"}));
  EXPECT_EQ(find_family_by_hf_type("gpt2"), nullptr);
  EXPECT_EQ(find_family_by_preset("gpt-5"), nullptr);
}

TEST(ModelFamilies, EveryPresetValidatesAndRoundTripsThroughConfigJson) {
  for (const std::string& name : preset_names()) {
    const ModelConfig c = preset_config(name);
    EXPECT_NO_THROW(c.validate(name)) << name;
    const nlohmann::json j = c.to_hf_json();
    ModelConfig back = config_from_hf_json(j, name);
    EXPECT_EQ(back.family, c.family) << name;
    // Written again, the same config.json: every field the family writes survives.
    EXPECT_EQ(back.to_hf_json(), j) << name;
    const ParamLayout L = ParamLayout::build(c);
    EXPECT_EQ(ParamLayout::build(back).total_numel(), L.total_numel()) << name;
    for (const ParamInfo& p : L.params()) {
      EXPECT_EQ(p.decay, !p.is_norm && !p.is_bias) << name << " " << p.name;
    }
    EXPECT_NE(L.find(family_of(c).token_embedding), nullptr) << name;
  }
}

TEST(ModelFamilies, UnknownModelTypeListsTheFamilies) {
  try {
    config_from_hf_json({{"model_type", "gpt2"}}, "x/config.json");
    ADD_FAILURE() << "gpt2 accepted";
  } catch (const InvalidInput& e) {
    EXPECT_THAT(e.what(), HasSubstr("\"llama\", \"opt\", \"qwen2\""));
  }
}

// The switch checks live in check_model_options: the trainer's plan input and make_model both
// refuse the same things with the same message.
TEST(ModelFamilies, SwitchChecksAreTheSameForThePlanAndTheModel) {
  auto expect_refused = [](const TrainOptions& o, const ModelOptions& mo, const std::string& what) {
    try {
      make_plan_input(o);
      ADD_FAILURE() << "make_plan_input accepted " << o.model;
    } catch (const InvalidInput& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
    const ModelConfig c = resolve_model(o.model);
    const ParamLayout L = ParamLayout::build(c);
    Tensor p = Tensor::zeros({L.total_numel()}, DType::kF32, testing::host_alloc());
    Tensor g = Tensor::zeros({L.total_numel()}, DType::kF32, testing::host_alloc());
    try {
      make_model(c, L, p, g, mo);
      ADD_FAILURE() << "make_model accepted " << o.model;
    } catch (const InvalidInput& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  for (const char* model : {"llama-tiny", "qwen2-tiny"}) {
    TrainOptions o;
    o.model = model;
    o.seq_len = 16;
    o.dropout = 0.1;
    ModelOptions mo;
    mo.dropout = 0.1;
    expect_refused(o, mo, std::string("family has no dropout"));
  }
  // OPT with GELU has no fused MLP.
  testing::ScratchDir dir;
  ModelConfig gelu = preset_config("opt-tiny");
  gelu.activation_function = "gelu";
  std::ofstream(dir / "config.json") << gelu.to_hf_json().dump();
  TrainOptions o;
  o.model = dir.str();
  o.seq_len = 16;
  o.fused_kernels = true;
  ModelOptions mo;
  mo.fused_kernels = true;
  expect_refused(o, mo, "the fused OPT MLP is bias+ReLU");
  // The resolved dropout: the flag, else the config's where the family has dropout.
  ModelConfig opt = preset_config("opt-125m");
  EXPECT_EQ(resolve_dropout(opt, -1), 0.1);
  EXPECT_EQ(resolve_dropout(opt, 0.0), 0.0);
  EXPECT_EQ(resolve_dropout(preset_config("qwen2-tiny"), -1), 0.0);
}

}  // namespace
}  // namespace scalelab
