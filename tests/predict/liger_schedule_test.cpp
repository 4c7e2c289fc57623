// Liger-Kernel 0.8.5 in the hf-trainer schedule beyond the H200-measured case (Llama, bf16
// weights, no checkpointing: hf_predict_test.cpp LigerMatchesTheH200): Qwen2
// (apply_liger_kernel_to_qwen2) and gradient checkpointing. These are modelled from Liger's and
// transformers' sources, not measured; the tests pin the modelling so that a change to it shows.
//
// What autograd holds at the backward marker is the set of tensors saved for backward; the
// schedule's saved activations (Category::kActivations) live at that point are compared in
// allocation order with the list derived by hand below.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "predict/hf_predict.h"
#include "predict/hf_schedule.h"

namespace scalelab::predict {
namespace {

using Saved = std::vector<std::pair<std::string, std::size_t>>;

// A bf16-weights sdpa job of a preset.
HfJob job(const std::string& model, std::int64_t seq, std::int64_t micro_batch, const std::string& mixed) {
  HfJob j;
  j.model = preset_config(model);
  j.seq_len = seq;
  j.micro_batch = micro_batch;
  j.model_precision = "bf16";
  j.mixed_precision = mixed;
  j.attn = "sdpa";
  return j;
}

// qwen2-tiny: hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 kv heads, vocab 256; bf16
// weights without autocast, sdpa (the flash path), micro-batch 2 x seq 8: B*T = 16 rows.
HfJob tiny(bool liger, bool ckpt) {
  HfJob j = job("qwen2-tiny", 8, 2, "no");
  j.fused_kernels = liger;
  j.activation_checkpointing = ckpt;
  j.steps = 1;
  return j;
}

// The saved activations live when the first backward phase starts, in allocation order.
Saved saved_at_backward(const std::vector<ScheduleEvent>& ev) {
  std::map<std::uint32_t, std::pair<std::string, std::size_t>> live;  // ids grow with time
  for (const ScheduleEvent& e : ev) {
    if (e.kind == ScheduleEvent::kPhase && std::string(e.label) == "backward") break;
    if (e.kind == ScheduleEvent::kAlloc && e.category == Category::kActivations)
      live[e.tensor] = {e.label, e.bytes};
    if (e.kind == ScheduleEvent::kFree) live.erase(e.tensor);
  }
  Saved out;
  for (auto& [id, v] : live) out.push_back(v);
  return out;
}

std::size_t count_label(const std::vector<ScheduleEvent>& ev, const char* label) {
  std::size_t n = 0;
  for (const ScheduleEvent& e : ev)
    if (e.kind == ScheduleEvent::kAlloc && std::string(e.label) == label) ++n;
  return n;
}

std::uint64_t bytes_of(const std::vector<ScheduleEvent>& ev, Category c) {
  std::uint64_t n = 0;
  for (const ScheduleEvent& e : ev)
    if (e.kind == ScheduleEvent::kAlloc && e.category == c) n += e.bytes;
  return n;
}

// One decoder layer under Liger, bf16, sdpa, B*T = 16 (H 64, q 4x16 = 64, kv 2x16 = 32, I 128),
// derived from liger_kernel 0.8.5 and transformers 5.17's modeling_qwen2.py:
//   input_layernorm = LigerRMSNorm (monkey_patch.py:1783; in_place=True, casting_mode "llama"):
//     Y = torch.empty(X's shape, X.dtype) (ops/rms_norm.py:462): 16x64 bf16 = 2048 B, kept because
//     q/k/v_proj's addmm saves its input; RSTD (rms_norm.py:466, fp32 [rows]) = 64 B, saved with
//     X and W (rms_norm.py:674) — X is the layer's input, already counted as the previous output.
//   q_proj (addmm with its bias): 16x64 bf16 = 2048 B; liger_rotary_pos_emb (monkey_patch.py:1781)
//     rotates it in place and sdpa saves it; k_proj 16x32 bf16 = 1024 B, the same (until
//     2026-11-27 modelled as a contiguous copy, an inference from the H200 measurements that the
//     flash backward's one workspace, read off the H200 trace, made unnecessary).
//     v_proj: 1024 B, saved by sdpa. LigerRopeFunction saves only cos, sin (rope.py:289), which
//     the model holds anyway.
//   flash sdpa: its output 16x64 bf16 = 2048 B (o_proj's saved input) and the log-sum-exp, fp32
//     [B=2, heads=4, T=8] = 256 B.
//   h1 = residual + o_proj: 2048 B, saved by post_attention_layernorm (X in rms_norm.py:674).
//   post_attention_layernorm: Y 2048 B (saved by gate/up_proj), RSTD 64 B.
//   mlp = LigerSwiGLUMLP (monkey_patch.py:1797): gate_proj and up_proj outputs, 16x128 bf16 =
//     4096 B each, saved by LigerSiLUMulFunction (ops/swiglu.py:272, save_for_backward(a, b)); its
//     output c = torch.empty_like(a) (swiglu.py:165), 4096 B, saved by down_proj.
//   the layer's output (residual + mlp): 2048 B, saved by the next RMSNorm as X.
Saved liger_layer() {
  return {{"liger rmsnorm output", 2048},
          {"liger rmsnorm rstd", 64},
          {"q_proj output", 2048},
          {"k_proj output", 1024},
          {"v_proj output", 1024},
          {"flash attention philox seed", 8},
          {"flash attention philox offset", 8},
          {"flash attention output", 2048},
          {"flash attention log-sum-exp", 256},
          {"residual + attention", 2048},
          {"liger rmsnorm output", 2048},
          {"liger rmsnorm rstd", 64},
          {"gate_proj output", 4096},
          {"up_proj output", 4096},
          {"liger swiglu output", 4096},
          {"residual + mlp", 2048}};
}

TEST(LigerSchedule, Qwen2SavesLigersTensorsPerLayer) {
  const Saved got = saved_at_backward(hf_trainer_schedule(tiny(true, false)));
  Saved want = {{"embedding output", 2048}};
  for (int l = 0; l < 2; ++l)
    for (const auto& s : liger_layer()) want.push_back(s);
  // model.norm (LigerRMSNorm): Y and RSTD; the fused linear cross-entropy
  // (LigerForCausalLMLoss, model/qwen2.py) saves its gradients, not the logits.
  want.push_back({"liger rmsnorm output", 2048});
  want.push_back({"liger rmsnorm rstd", 64});
  EXPECT_EQ(got, want);
}

// Qwen2 differs from a Llama of the same shapes only by the q/k/v biases (Qwen2Attention's
// nn.Linear(bias=True); Liger patches none of the projections): the same saved tensors, three
// bias weights per layer and their gradients (bf16, out_features each), no logits in either.
TEST(LigerSchedule, Qwen2DiffersFromLlamaByTheBiasesOnly) {
  const HfJob q = tiny(true, false);
  HfJob l = q;
  l.model.family = ModelFamily::kLlama;
  l.model.qkv_bias = false;
  const auto eq = hf_trainer_schedule(q), el = hf_trainer_schedule(l);
  EXPECT_EQ(saved_at_backward(eq), saved_at_backward(el));
  const std::uint64_t biases = 2 /*layers*/ * (64 + 32 + 32) * 2 /*bf16*/;
  EXPECT_EQ(bytes_of(eq, Category::kWeights), bytes_of(el, Category::kWeights) + biases);
  EXPECT_EQ(bytes_of(eq, Category::kGradients), bytes_of(el, Category::kGradients) + biases);
  EXPECT_EQ(count_label(eq, "bias grad"), 2u * 3);
  EXPECT_EQ(count_label(el, "bias grad"), 0u);
  EXPECT_EQ(count_label(eq, "logits"), 0u);
  EXPECT_EQ(count_label(eq, "log_softmax (saved)"), 0u);
}

// Gradient checkpointing (transformers 5.17's gradient_checkpointing_enable: torch.utils.checkpoint
// with use_reentrant=False, modeling_utils.py:3132). The forward packs every saved tensor of a
// checkpointed layer into a handle and keeps only the frame's arguments: the layer's input. So
// at the backward marker: the embedding output (layer 0's input), layer 0's output (layer 1's
// input), layer 1's output — kept here, unlike without Liger, because model.norm is a LigerRMSNorm
// that saves X itself — and the final norm's Y and RSTD.
TEST(LigerSchedule, CheckpointedLayersKeepOnlyTheirInput) {
  for (const bool qwen : {true, false}) {
    HfJob j = tiny(true, true);
    if (!qwen) {
      j.model.family = ModelFamily::kLlama;
      j.model.qkv_bias = false;
    }
    const auto ev = hf_trainer_schedule(j);
    const Saved want = {{"embedding output", 2048},
                        {"residual + mlp", 2048},
                        {"residual + mlp", 2048},
                        {"liger rmsnorm output", 2048},
                        {"liger rmsnorm rstd", 64}};
    EXPECT_EQ(saved_at_backward(ev), want) << (qwen ? "qwen2" : "llama");
    // backward recomputes each layer's forward with Liger's kernels: its two norms, k_proj's
    // output (rotated in place) and the SwiGLU output appear again (forward: 2 per layer + the
    // final norm; recompute: 2 per layer), and the recomputed tensors are what the layer's
    // backward frees.
    EXPECT_EQ(count_label(ev, "liger rmsnorm rstd"), 2u * 2 + 1 + 2u * 2);
    EXPECT_EQ(count_label(ev, "k_proj output"), 2u * 2);
    EXPECT_EQ(count_label(ev, "liger swiglu output"), 2u * 2);
  }
  // In the recompute, h1 (residual + attention) is what LigerRMSNorm saved as X: it must still be
  // live when the recompute is over and the layer's backward starts (it goes in that backward), whereas the
  // plain bf16 norm saved its fp32 upcast and h1 goes at once.
  for (const bool liger : {true, false}) {
    const auto ev = hf_trainer_schedule(tiny(liger, true));
    bool backward = false;
    std::uint32_t h1 = 0;
    bool h1_live = false, after_out = false;
    std::size_t checked = 0;
    for (const ScheduleEvent& e : ev) {
      if (e.kind == ScheduleEvent::kPhase && std::string(e.label) == "backward") backward = true;
      if (!backward) continue;
      if (e.kind == ScheduleEvent::kAlloc && std::string(e.label) == "residual + attention") {
        h1 = e.tensor;
        h1_live = true;
      }
      if (e.kind == ScheduleEvent::kFree && e.tensor == h1) h1_live = false;
      if (e.kind != ScheduleEvent::kAlloc) continue;
      if (after_out) {  // the layer's backward begins: the recompute is over
        EXPECT_EQ(h1_live, liger) << "recompute " << checked;
        ++checked;
      }
      // the recompute stops early at down_proj (it packs the SwiGLU product: the last saved tensor)
      after_out = std::string(e.label) == "liger swiglu output" || std::string(e.label) == "silu(gate) * up";
    }
    EXPECT_EQ(checked, 2u);
  }
  // Without Liger the final norm saves its fp32 upcast, so the last layer's output goes.
  const Saved plain = saved_at_backward(hf_trainer_schedule(tiny(false, true)));
  std::size_t outs = 0;
  for (const auto& s : plain) outs += s.first == "residual + mlp";
  EXPECT_EQ(outs, 1u);
}

// On real shapes: Qwen2.5-0.5B at seq 1024, micro-batch 8, bf16, sdpa. Liger drops the logits and
// their fp32 copies (151936-entry vocabulary: the largest tensors of the step), and checkpointing
// drops the saved activations of every layer; the weights, their gradients and AdamW's states are
// the same in all three.
TEST(LigerSchedule, Qwen2PeaksOrderAsTheModellingSays) {
  HfJob j = job("qwen2.5-0.5b", 1024, 8, "bf16");
  HfPredictOptions o;
  o.device_memory = 150109880320;
  const HfPrediction plain = predict_hf(j, o);
  j.fused_kernels = true;
  const HfPrediction liger = predict_hf(j, o);
  j.activation_checkpointing = true;
  const HfPrediction both = predict_hf(j, o);
  ASSERT_FALSE(plain.oom);
  // the logits alone (8 x 1024 x 151936, bf16 then fp32) are over 7 GB
  EXPECT_LT(liger.max_allocated + (std::size_t{7} << 30), plain.max_allocated);
  EXPECT_LT(both.max_allocated, liger.max_allocated);
  for (const HfPrediction* p : {&liger, &both}) {
    EXPECT_EQ(p->breakdown[static_cast<int>(Category::kWeights)], plain.breakdown[static_cast<int>(Category::kWeights)]);
    EXPECT_GE(p->max_reserved, p->max_allocated);
  }
}

// Autocast over fp32 weights (--model-precision fp32 --mixed-precision bf16), qwen2-tiny, sdpa,
// B*T = 16. Liger's RMSNorm, RoPE and SwiGLU are plain autograd.Functions (no custom_fwd), so
// autocast casts nothing at them; it casts only at the projections (nn.Linear -> addmm/mm, on
// autocast's lower-precision list) and sdpa:
//   embedding output: fp32 16x64 = 4096 B (layer 0's X).
//   input_layernorm: Y = empty(X.dtype) fp32 4096 B — not saved: each of q/k/v_proj saves its own
//     autocast cast of it, 16x64 bf16 = 2048 B, allocated before its output; RSTD 64 B.
//   q_proj output bf16 2048 B (rotated in place by Liger's RoPE in its own dtype — the Triton kernel
//     stores into q, rope.py rope_forward — and saved by sdpa); k_proj's cast 2048 B and output
//     1024 B (rotated in place the same way); v_proj's cast 2048 B and output 1024 B.
//   sdpa: q, k, v already bf16, so no casts (unlike without Liger, where rope's fp32 cos/sin made q
//     and k fp32); output 2048 B, log-sum-exp 256 B.
//   h1 = fp32 residual + bf16 o_proj output: fp32 4096 B, LigerRMSNorm's X.
//   post_attention_layernorm: Y fp32 (not saved), RSTD 64 B; gate_proj's cast of Y 2048 B, its
//     bf16 output 4096 B; up_proj's the same; LigerSiLUMulFunction's c = empty_like(a): bf16 4096 B.
//   the layer's output: fp32 4096 B.
Saved liger_autocast_layer() {
  return {{"liger rmsnorm rstd", 64},
          {"autocast input cast", 2048},
          {"q_proj output", 2048},
          {"autocast input cast", 2048},
          {"k_proj output", 1024},
          {"autocast input cast", 2048},
          {"v_proj output", 1024},
          {"flash attention philox seed", 8},
          {"flash attention philox offset", 8},
          {"flash attention output", 2048},
          {"flash attention log-sum-exp", 256},
          {"residual + attention", 4096},
          {"liger rmsnorm rstd", 64},
          {"autocast input cast", 2048},
          {"gate_proj output", 4096},
          {"autocast input cast", 2048},
          {"up_proj output", 4096},
          {"liger swiglu output", 4096},
          {"residual + mlp", 4096}};
}

HfJob tiny_autocast(bool ckpt) {
  HfJob j = tiny(true, ckpt);
  j.model_precision = "fp32";
  j.mixed_precision = "bf16";
  return j;
}

TEST(LigerSchedule, AutocastOverFp32WeightsSavesPerLayer) {
  const auto ev = hf_trainer_schedule(tiny_autocast(false));
  Saved want = {{"embedding output", 4096}};
  for (int l = 0; l < 2; ++l)
    for (const auto& s : liger_autocast_layer()) want.push_back(s);
  want.push_back({"liger rmsnorm output", 4096});  // model.norm's Y: the fused loss's fp32 _input
  want.push_back({"liger rmsnorm rstd", 64});
  EXPECT_EQ(saved_at_backward(ev), want);
  // None of the non-Liger autocast path's casts of q / k / probs' inputs, nor their fp32 grads.
  for (const char* l : {"autocast cast of q", "autocast cast of k", "grad q to fp32", "grad k to fp32", "logits"})
    EXPECT_EQ(count_label(ev, l), 0u) << l;
}

// Eager attention under Liger: q comes back from Liger's RoPE as a transposed view, so
// torch.matmul's reshape hands bmm a contiguous copy, which is what is saved (one per layer, q's
// size: 16 x 64 bf16); the rotated q_proj buffer is not saved. Same with autocast (q stays bf16).
TEST(LigerSchedule, EagerSavesMatmulsCopyOfTheRotatedQ) {
  for (const bool autocast : {false, true}) {
    HfJob j = tiny(true, false);
    j.attn = "eager";
    if (autocast) {
      j.model_precision = "fp32";
      j.mixed_precision = "bf16";
    }
    std::size_t copies = 0, q_out = 0;
    for (const auto& [label, bytes] : saved_at_backward(hf_trainer_schedule(j))) {
      if (label == "q reshaped for bmm (copy of Liger's transposed q)") {
        ++copies;
        EXPECT_EQ(bytes, 16u * 64 * 2);
      }
      q_out += label == "q_proj output" || label == "autocast cast of q";
    }
    EXPECT_EQ(copies, 2u) << autocast;
    EXPECT_EQ(q_out, 0u) << autocast;
  }
}

// Against the measured Llama-bf16 Liger case (bf16 weights, no autocast): fp32 master weights
// (twice the bytes, gradients and AdamW states fp32 too), their bf16 autocast copies (7 per layer,
// the 3 biases', and lm_head's: cached once by the fused loss's `grad_logits_chunk @ weight`), the
// fused loss's per-chunk uncached cast of weight.t() (a view), and an fp32 grad_input.
TEST(LigerSchedule, AutocastDiffersFromBf16WeightsByTheCasts) {
  const auto ea = hf_trainer_schedule(tiny_autocast(false));
  const auto eb = hf_trainer_schedule(tiny(true, false));
  EXPECT_EQ(bytes_of(ea, Category::kWeights), 2 * bytes_of(eb, Category::kWeights));
  EXPECT_EQ(bytes_of(ea, Category::kOptimizerStates), 2 * bytes_of(eb, Category::kOptimizerStates));
  EXPECT_EQ(bytes_of(eb, Category::kAutocastCache), 0u);
  // weight casts: the layers' 7 matrices and 3 biases in bf16 = their bf16 bytes, plus lm_head
  // (tied: the embedding, 256 x 64 x 2)
  std::uint64_t layer_bf16 = 2 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 3 * 128 * 64 + 64 + 32 + 32) * 2;
  EXPECT_EQ(bytes_of(ea, Category::kAutocastCache), layer_bf16 + 256 * 64 * 2);
  // chunk rows: next_pow2(ceil(16 / ceil(256 / 64))) = 4, so 4 chunks, each casting weight.t()
  EXPECT_EQ(count_label(ea, "autocast cast of lm_head.weight.t() (a view: not cached)"), 4u);
  EXPECT_EQ(count_label(ea, "autocast cast of lm_head.weight (cached)"), 1u);
  EXPECT_EQ(count_label(eb, "autocast cast of lm_head.weight.t() (a view: not cached)"), 0u);
  for (const auto* ev : {&ea, &eb}) {
    for (const ScheduleEvent& e : *ev) {
      if (e.kind == ScheduleEvent::kAlloc && std::string(e.label) == "liger flce grad_input") {
        EXPECT_EQ(e.bytes, ev == &ea ? 16u * 64 * 4 : 16u * 64 * 2);
      }
    }
  }
}

// The fused loss's chunk loop per dtype (fused_linear_cross_entropy.py, forward): without
// autocast over fp32 weights _can_use_mm_out holds, so one logits_storage of chunk x V in the
// input's dtype (4 x 256) serves every chunk; fp32 weights without autocast take the legacy
// grad_weight path, a V x H fp32 product per chunk (4 chunks); bf16 weights accumulate by
// addmm(out=grad_weight) with no temporary.
TEST(LigerSchedule, FusedLossChunkLoopFollowsTheDtypes) {
  HfJob f = tiny(true, false);
  f.model_precision = "fp32";
  const auto ef = hf_trainer_schedule(f), eb = hf_trainer_schedule(tiny(true, false)),
             ea = hf_trainer_schedule(tiny_autocast(false));
  const char* legacy = "liger flce grad_logits.t() @ input chunk (fp32)";
  EXPECT_EQ(count_label(ef, legacy), 4u);
  EXPECT_EQ(count_label(eb, legacy), 0u);
  EXPECT_EQ(count_label(ea, legacy), 0u);
  for (const auto* ev : {&ef, &eb}) {
    EXPECT_EQ(count_label(*ev, "liger flce logits_storage"), 1u);
    EXPECT_EQ(count_label(*ev, "liger flce logits chunk"), 0u);
    for (const ScheduleEvent& e : *ev) {
      if (e.kind == ScheduleEvent::kAlloc && std::string(e.label) == "liger flce logits_storage") {
        EXPECT_EQ(e.bytes, 4u * 256 * (ev == &ef ? 4 : 2));
      }
    }
  }
  EXPECT_EQ(count_label(ea, "liger flce logits_storage"), 0u);
  EXPECT_EQ(count_label(ea, "liger flce logits chunk"), 4u);
}

// Checkpointed under autocast: the frames keep the fp32 layer inputs; autocast's cache (the
// checkpointed layers' weight and bias casts, lm_head's) is gone before backward begins.
TEST(LigerSchedule, AutocastCheckpointedKeepsInputsAndClearsTheCache) {
  const auto ev = hf_trainer_schedule(tiny_autocast(true));
  const Saved want = {{"embedding output", 4096},
                      {"residual + mlp", 4096},
                      {"residual + mlp", 4096},
                      {"liger rmsnorm output", 4096},
                      {"liger rmsnorm rstd", 64}};
  EXPECT_EQ(saved_at_backward(ev), want);
  std::map<std::uint32_t, bool> cache_live;
  for (const ScheduleEvent& e : ev) {
    if (e.kind == ScheduleEvent::kPhase && std::string(e.label) == "backward") break;
    if (e.kind == ScheduleEvent::kAlloc && e.category == Category::kAutocastCache) cache_live[e.tensor] = true;
    if (e.kind == ScheduleEvent::kFree) cache_live.erase(e.tensor);
  }
  EXPECT_TRUE(cache_live.empty()) << cache_live.size() << " autocast casts still live at backward";
  HfJob j = tiny_autocast(true);
  EXPECT_NO_THROW(validate_job(j));
  j.model = preset_config("opt-1.3b");
  EXPECT_THROW(validate_job(j), InvalidInput);  // Liger has no OPT patch
}

}  // namespace
}  // namespace scalelab::predict
