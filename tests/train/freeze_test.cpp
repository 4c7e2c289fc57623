// The trainable/frozen seam (--freeze REGEX): the layout puts trainable parameters first, frozen
// parameters get no gradient and no optimizer state, the kernels skip their weight gradients, the
// plan shrinks by exactly those buffers and still equals the measured peak, and frozen weights
// leave training exactly as they came in. (The losses against PyTorch with requires_grad=False
// are tests/model/golden_test.cpp's LlamaFrozen case.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/allocator.h"
#include "core/error.h"
#include "kernels/matmul.h"
#include "model/config.h"
#include "model/init.h"
#include "model/params.h"
#include "model/safetensors.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

TEST(FreezeLayout, TrainableFirstInTheFamilysOrder) {
  const ModelConfig c = preset_config("llama-tiny");
  const ParamLayout all = ParamLayout::build(c);
  const ParamLayout L = ParamLayout::build(c, "layers\\.0\\.");
  ASSERT_EQ(L.params().size(), all.params().size());
  EXPECT_EQ(L.total_numel(), all.total_numel());
  EXPECT_EQ(all.trainable_numel(), all.total_numel());
  std::int64_t frozen = 0;
  for (const ParamInfo& p : all.params())
    if (p.name.find("layers.0.") != std::string::npos) frozen += p.numel;
  ASSERT_GT(frozen, 0);
  EXPECT_EQ(L.frozen_numel(), frozen);
  EXPECT_EQ(L.trainable_numel() + L.frozen_numel(), L.total_numel());
  // Trainable ones tile [0, Pt) and frozen ones [Pt, P), each in the family's order.
  std::int64_t next_trainable = 0, next_frozen = L.trainable_numel();
  for (const ParamInfo& p : L.params()) {
    EXPECT_EQ(p.trainable, p.name.find("layers.0.") == std::string::npos) << p.name;
    std::int64_t& next = p.trainable ? next_trainable : next_frozen;
    EXPECT_EQ(p.offset, next) << p.name;
    next += p.numel;
  }
  EXPECT_EQ(next_trainable, L.trainable_numel());
  EXPECT_EQ(next_frozen, L.total_numel());
}

TEST(FreezeLayout, BadRegexNothingOrEverythingIsInvalidInput) {
  const ModelConfig c = preset_config("llama-tiny");
  EXPECT_THROW(ParamLayout::build(c, "layers\\.(0"), InvalidInput);
  EXPECT_THROW(ParamLayout::build(c, "no_such_parameter"), InvalidInput);
  EXPECT_THROW(ParamLayout::build(c, "weight"), InvalidInput);  // every parameter: nothing would train
  TrainOptions o;
  o.model = "llama-tiny";
  o.seq_len = 16;
  o.freeze = "nothing_matches_this";
  EXPECT_THROW(make_plan_input(o), InvalidInput);
  // Half of a fused q/k/v projection cannot be frozen: one GEMM computes all three gradients.
  o.freeze = "q_proj";
  EXPECT_THROW(plan_memory(make_plan_input(o)), InvalidInput);
  // A frozen (tied) head with the fused linear + cross-entropy: planned, without its weight gradient.
  o.freeze = "embed_tokens";
  o.fused_kernels = true;
  EXPECT_NO_THROW(plan_memory(make_plan_input(o)));
}

// linear_backward with an undefined weight gradient: the same input gradient, and on meta (the
// plan's device) no weight-gradient GEMM workspace either.
TEST(FreezeKernels, LinearBackwardSkipsAnUndefinedWeightGradient) {
  DeviceAllocator host(make_host_backend(), std::size_t{1} << 30);
  ExecContext ctx{&host, nullptr};
  const std::int64_t T = 6, in = 5, out = 3;
  Tensor x = Tensor::empty({T, in}, DType::kF32, host), w = Tensor::empty({out, in}, DType::kF32, host);
  Tensor dy = Tensor::empty({T, out}, DType::kF32, host);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (std::int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy.f32()[i] = 0.2f * static_cast<float>(i % 3) - 0.2f;
  Tensor dx1 = Tensor::zeros({T, in}, DType::kF32, host), dx2 = Tensor::zeros({T, in}, DType::kF32, host);
  Tensor dw = Tensor::zeros({out, in}, DType::kF32, host), none;
  kernels::linear_backward(&dx1, dw, nullptr, dy, x, w, ctx);
  kernels::linear_backward(&dx2, none, nullptr, dy, x, w, ctx);
  for (std::int64_t i = 0; i < dx1.numel(); ++i) EXPECT_EQ(dx1.f32()[i], dx2.f32()[i]) << i;  // same GEMM, same bits
  double dw_sum = 0;
  for (std::int64_t i = 0; i < dw.numel(); ++i) dw_sum += std::fabs(dw.f32()[i]);
  EXPECT_GT(dw_sum, 0.0);

  // Meta, bf16 operands: the weight-gradient GEMM takes fp32 conversion panels; without a weight
  // gradient (and no input gradient) nothing is allocated at all.
  auto workspace = [](bool with_dw) {
    DeviceAllocator meta(make_meta_backend(), std::numeric_limits<std::size_t>::max() / 4);
    ExecContext mctx{&meta, nullptr};
    const std::int64_t Tm = 512, H = 64;
    Tensor mx = Tensor::empty({Tm, H}, DType::kBF16, meta), mw = Tensor::empty({H, H}, DType::kBF16, meta);
    Tensor mdy = Tensor::empty({Tm, H}, DType::kBF16, meta);
    Tensor mdw = with_dw ? Tensor::empty({H, H}, DType::kBF16, meta) : Tensor();
    const std::size_t live = meta.stats().peak_allocated;
    kernels::linear_backward(nullptr, mdw, nullptr, mdy, mx, mw, mctx);
    return meta.stats().peak_allocated - live;
  };
  EXPECT_GT(workspace(true), 0u);
  EXPECT_EQ(workspace(false), 0u);
}

struct Case {
  std::string model, freeze;
  std::string attn = "eager";
  bool fused = false, ckpt = false;
  std::string model_precision = "fp32", mixed = "no";
};

std::string describe(const Case& c) {
  return c.model + " --freeze '" + c.freeze + "' " + c.attn + (c.fused ? " fused" : "") + (c.ckpt ? " ckpt" : "") +
         " " + c.model_precision + "/" + c.mixed;
}

TrainOptions options_of(const Case& c) {
  TrainOptions o;
  o.model = c.model;
  o.freeze = c.freeze;
  o.micro_batch_size = 2;
  o.seq_len = 64;
  o.attn = c.attn;
  o.fused_kernels = c.fused;
  o.activation_checkpointing = c.ckpt;
  o.model_precision = c.model_precision;
  o.mixed_precision = c.mixed;
  o.max_steps = 2;
  o.threads = 2;
  o.quiet = true;
  return o;
}

TEST(FreezePlan, PredictsMeasuredPeakExactly) {
  const std::vector<Case> cases = {
      {"llama-tiny", "layers\\.0\\."},
      {"llama-tiny", "layers\\.0\\.", "flash", true, true},
      {"llama-tiny", "layers\\.1\\.mlp", "eager", true, false, "fp32", "bf16"},
      {"llama-tiny", "embed_tokens"},  // tied: the LM head is frozen with it
      {"llama-tiny", "norm|embed", "flash", false, true, "bf16"},
      {"llama-tiny", "embed|layers\\.0\\.", "flash", true, true},  // layer 0 runs no backward
      {"llama-tiny", "embed|layers"},  // only the final norm trains: no layer runs backward
      {"opt-tiny", "embed|layers", "flash", false, true},
      {"opt-tiny", "embed|layers\\.0\\."},
      {"opt-tiny", "layers\\.1\\.", "eager", true, false, "fp32", "bf16"},
      {"opt-tiny", "layer_norm|bias", "flash", false, true},
  };
  for (const Case& c : cases) {
    const TrainResult r = run_training(options_of(c));
    ASSERT_EQ(r.status, RunStatus::kOk) << describe(c) << ": " << r.error;
    EXPECT_GT(r.frozen_params, 0) << describe(c);
    EXPECT_EQ(r.trainable_params + r.frozen_params, r.params) << describe(c);
    const nlohmann::json j = r.to_json();
    EXPECT_EQ(j["trainable_params"].get<std::int64_t>(), r.trainable_params);
    EXPECT_EQ(j["frozen_params"].get<std::int64_t>(), r.frozen_params);
    EXPECT_EQ(j["status"], "ok");
    EXPECT_EQ(r.plan["total_bytes"].get<std::size_t>(), r.max_reserved_bytes)
        << describe(c) << ": the plan runs the engine's allocations";
  }
}

double item_bytes(const nlohmann::json& plan, const char* name) {
  for (const auto& it : plan["items"])
    if (it["name"] == name) return it["bytes"].get<double>();
  return 0.0;
}

TEST(FreezePlan, ShrinksByExactlyTheFrozenGradientsAndStates) {
  // Small models (not tiny: the reserved total moves in 2 MiB segments), planned only.
  for (const char* model : {"llama-small", "opt-small"}) {
    for (const std::string mixed : {"no", "bf16"}) {
      Case c{model, "embed_tokens|layers\\.[0-3]\\."};
      c.mixed = mixed;
      TrainOptions with = options_of(c), without = with;
      without.freeze.clear();
      const PlanInput pin = make_plan_input(with);
      const ParamLayout layout = build_layout(pin);
      const auto a = plan_memory(make_plan_input(without)).to_json(), b = plan_memory(pin).to_json();
      auto bytes = [](std::int64_t n, DType t) {
        return static_cast<double>(DeviceAllocator::round_size(static_cast<std::size_t>(n) * dtype_size(t)));
      };
      const std::int64_t P = layout.total_numel(), Pt = layout.trainable_numel();
      const std::string what = std::string(model) + " mixed " + mixed;
      EXPECT_EQ(b["trainable_params"].get<std::int64_t>(), Pt) << what;
      EXPECT_EQ(b["frozen_params"].get<std::int64_t>(), P - Pt) << what;
      EXPECT_EQ(item_bytes(a, "weights"), item_bytes(b, "weights")) << what;
      EXPECT_EQ(item_bytes(a, "gradients") - item_bytes(b, "gradients"),
                bytes(P, pin.precision.grad) - bytes(Pt, pin.precision.grad))
          << what;
      EXPECT_EQ(item_bytes(a, "optimizer states") - item_bytes(b, "optimizer states"),
                2 * (bytes(P, pin.precision.optim_state) - bytes(Pt, pin.precision.optim_state)))
          << what;
      EXPECT_LT(b["total_bytes"].get<double>(), a["total_bytes"].get<double>()) << what;
    }
  }
}

TEST(FreezeTrain, FrozenWeightsLeaveTrainingAsTheyCameIn) {
  const std::string dir = testing::TempDir() + "freeze_save";
  std::filesystem::remove_all(dir);
  Case c{"llama-tiny", "layers\\.0\\."};
  TrainOptions o = options_of(c);
  o.lr = 1e-2;
  o.save = dir;
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.status, RunStatus::kOk) << r.error;
  const ModelConfig cfg = preset_config("llama-tiny");
  const ParamLayout layout = ParamLayout::build(cfg);
  DeviceAllocator host(make_host_backend(), std::size_t{1} << 30);
  Tensor init = Tensor::empty({layout.total_numel()}, DType::kF32, host);
  init_params(init, layout, cfg, o.seed);
  const SafetensorsFile saved = SafetensorsFile::open(dir + "/model.safetensors");
  int frozen = 0, moved = 0;
  for (const ParamInfo& p : layout.params()) {
    const SafetensorsTensor* t = saved.find(p.name);
    ASSERT_NE(t, nullptr) << p.name;
    std::vector<float> got(static_cast<std::size_t>(p.numel));
    saved.read(*t, got.data(), DType::kF32);
    const float* want = init.f32() + p.offset;
    bool same = true;
    for (std::int64_t i = 0; i < p.numel; ++i) same = same && got[static_cast<std::size_t>(i)] == want[i];
    if (p.name.find("layers.0.") != std::string::npos) {
      EXPECT_TRUE(same) << p.name << " is frozen and changed";
      ++frozen;
    } else if (!p.is_norm) {
      EXPECT_FALSE(same) << p.name << " trains and did not change";
      ++moved;
    }
  }
  EXPECT_GT(frozen, 0);
  EXPECT_GT(moved, 0);
}

// A frozen prefix (the embeddings and layer 0 here) gets no backward, as autograd gives none to
// what needs no gradient: its layers keep no activations and run no backward, and the layers
// above get the same gradients bit for bit as when the whole backward runs (checked after one
// step, without clipping, against the same run with the embeddings trainable: that changes no
// gradient of layers 1+). tests/model/golden_test.cpp's LlamaFrozen case holds the trajectory
// against PyTorch with requires_grad=False.
TEST(FreezeTrain, AFrozenPrefixRunsNoBackwardAndTheLayersAboveGetTheSameGradients) {
  for (const std::string model : {"llama-tiny", "opt-tiny"}) {
    auto run = [&](const std::string& freeze, const std::string& tag) {
      Case c{model, freeze};
      TrainOptions o = options_of(c);
      o.max_steps = 1;
      o.max_grad_norm = 0.0;
      o.lr = 1e-2;
      o.save = testing::TempDir() + "freeze_prefix_" + model + "_" + tag;
      o.trace = o.save + ".trace.json";
      std::filesystem::remove_all(o.save);
      const TrainResult r = run_training(o);
      EXPECT_EQ(r.status, RunStatus::kOk) << model << " " << freeze << ": " << r.error;
      return std::make_pair(o, r);
    };
    const auto [skip_o, skip] = run("embed|layers\\.0\\.", "skip");
    const auto [full_o, full] = run("layers\\.0\\.", "full");
    // Layer scopes per phase in the trace: forward runs every layer, backward only layer 1.
    auto layers = [](const std::string& trace, const std::string& phase) {
      std::ifstream in(trace);
      const nlohmann::json t = nlohmann::json::parse(in);
      int n = 0;
      for (const auto& e : t["traceEvents"])
        if (e.value("ph", "") == "X" && e.value("name", "").rfind("layer", 0) == 0 && e.contains("args") &&
            e["args"].value("phase", "") == phase)
          ++n;
      return n;
    };
    EXPECT_EQ(layers(skip_o.trace, "forward"), 2) << model;
    EXPECT_EQ(layers(skip_o.trace, "backward"), 1) << model;
    EXPECT_EQ(layers(full_o.trace, "backward"), 2) << model;
    // Layer 0's saved activations are gone from the peak; the plan still equals the measured peak.
    EXPECT_LT(item_bytes(skip.plan, "activations"), item_bytes(full.plan, "activations")) << model;
    EXPECT_EQ(skip.plan["total_bytes"].get<std::size_t>(), skip.max_reserved_bytes) << model;
    // The plan says so, and its per-layer figures count the one layer that keeps activations.
    for (const auto& it : skip.plan["items"]) {
      if (it["name"] != "activations") continue;
      EXPECT_NE(it["detail"].get<std::string>().find("(layer 1; layer 0 is frozen with the embeddings"), std::string::npos)
          << it["detail"];
    }
    for (const auto& it : full.plan["items"]) {
      if (it["name"] == "activations") {
        EXPECT_EQ(it["detail"].get<std::string>().find("frozen"), std::string::npos);
      }
    }
    // Every parameter of layers 1+ and the final norm leaves the step with the same bits.
    const SafetensorsFile a = SafetensorsFile::open(skip_o.save + "/model.safetensors");
    const SafetensorsFile b = SafetensorsFile::open(full_o.save + "/model.safetensors");
    const ParamLayout layout = ParamLayout::build(preset_config(model));
    int compared = 0;
    for (const ParamInfo& p : layout.params()) {
      const bool above = p.name.find("layers.1.") != std::string::npos || p.name == "model.norm.weight" ||
                         p.name.rfind("model.decoder.final_layer_norm.", 0) == 0;
      if (!above) continue;
      const SafetensorsTensor* ta = a.find(p.name);
      const SafetensorsTensor* tb = b.find(p.name);
      ASSERT_TRUE(ta != nullptr && tb != nullptr) << p.name;
      std::vector<float> va(static_cast<std::size_t>(p.numel)), vb(va.size());
      a.read(*ta, va.data(), DType::kF32);
      b.read(*tb, vb.data(), DType::kF32);
      EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0) << model << " " << p.name;
      ++compared;
    }
    EXPECT_GE(compared, 8) << model;
  }
}

}  // namespace
}  // namespace scalelab
