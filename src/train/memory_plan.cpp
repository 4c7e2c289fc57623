#include "train/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/allocator.h"
#include "kernels/attention.h"
#include "model/params.h"

namespace scalelab {

namespace {

// One allocation as the allocator counts it (rounded), and the rounding it adds.
struct Acc {
  std::size_t bytes = 0, rounding = 0;
  void add(std::size_t raw) {
    const std::size_t r = DeviceAllocator::round_size(std::max<std::size_t>(raw, 1));
    bytes += r;
    rounding += r - raw;
  }
};

struct Breakdown {
  std::vector<PlanItem> items;
  std::size_t total = 0;
};

Breakdown compute(const PlanInput& in) {
  const ModelConfig& c = in.config;
  const ParamLayout layout = ParamLayout::build(c);
  const std::size_t P = static_cast<std::size_t>(layout.total_numel());
  const std::size_t f = 4;  // fp32
  const std::size_t B = static_cast<std::size_t>(in.micro_batch), S = static_cast<std::size_t>(in.seq_len);
  const std::size_t T = B * S, H = static_cast<std::size_t>(c.hidden_size), I = static_cast<std::size_t>(c.intermediate_size);
  const std::size_t Q = static_cast<std::size_t>(c.q_dim()), KV = static_cast<std::size_t>(c.kv_dim());
  const std::size_t V = static_cast<std::size_t>(c.vocab_size), NH = static_cast<std::size_t>(c.num_attention_heads);
  const std::size_t L = static_cast<std::size_t>(c.num_hidden_layers);
  std::size_t rounding = 0;
  auto one = [&](std::size_t raw) {
    Acc a;
    a.add(raw);
    rounding += a.rounding;
    return a.bytes;
  };

  Breakdown b;
  auto item = [&](std::string name, std::size_t bytes, std::string detail) {
    b.items.push_back({std::move(name), bytes, std::move(detail)});
    b.total += bytes;
  };
  item("weights", one(P * f), std::to_string(P) + " parameters, fp32");
  item("gradients", one(P * f), "fp32, same layout as the weights");
  item("optimizer states", 2 * one(P * f), "AdamW exp_avg and exp_avg_sq, fp32");
  item("batch", 2 * one(T * 4), "input and target token ids");

  // Saved per layer for backward (what the layer keeps between forward and backward).
  const bool ckpt = in.options.activation_checkpointing;
  Acc layer;
  for (std::size_t n : {T * H, T, T * H, T * (Q + 2 * KV), T * Q, T * H, T, T * H, T * 2 * I, T * I}) layer.add(n * f);
  Acc scores;
  scores.add(B * NH * S * S * f);
  const std::size_t x_only = one(T * H * f);
  if (ckpt) {
    item("activations", L * x_only, "checkpointing: each layer keeps only its input [T, H]");
    // One layer is rebuilt in backward.
    item("recomputed layer", layer.bytes - x_only + scores.bytes + one(T * H * f),
         "the layer being recomputed in backward, with its scores and output");
    rounding += layer.rounding + scores.rounding;
  } else {
    item("activations", L * layer.bytes,
         std::to_string(layer.bytes) + " bytes per layer: input, norms, qkv, attention output, residual, gate/up, "
                                       "activation");
    item("attention scores", L * scores.bytes, "eager attention keeps softmax(QK^T) [B, heads, S, S] per layer");
    rounding += L * (layer.rounding + scores.rounding);
  }

  // Head: last residual, final norm output and rstd, logits, lse, and the final-norm gradient
  // allocated while the logits are alive.
  const std::size_t head_small = one(T * H * f) * 3 + one(T * f) * 2;
  item("logits", one(T * V * f), "[T, vocab] fp32; the loss gradient is written in place");
  item("head buffers", head_small, "final residual, final norm output and its gradient, rstd, lse");

  // Backward temporaries of one layer, allocated while the logits block stays cached (reserved).
  const std::size_t temps = one(T * H * f) /* dx */ + one(T * I * f) + one(T * 2 * I * f) + one(T * H * f) +
                            one(T * Q * f) + one(T * (Q + 2 * KV) * f);
  item("backward temporaries", temps, "residual gradient and one layer's activation gradients");
  kernels::AttentionShape as{static_cast<std::int64_t>(B), static_cast<std::int64_t>(S), c.num_attention_heads,
                             c.num_key_value_heads, c.head_dim};
  item("workspace", one(kernels::attention_eager_workspace_bytes(as, std::max(1, in.threads))),
       "attention backward scratch, one block per thread");
  item("allocator rounding", rounding, "requests rounded up to 512 bytes (already inside the lines above)");
  b.total -= rounding;  // rounding is inside the rounded sizes; shown for information only
  return b;
}

}  // namespace

std::size_t plan_total_bytes(const PlanInput& in) { return compute(in).total; }

MemoryPlan plan_memory(const PlanInput& in) {
  MemoryPlan p;
  const Breakdown b = compute(in);
  p.items = b.items;
  p.total = b.total;
  p.capacity = in.capacity;
  p.micro_batch = in.micro_batch;
  p.fits = in.capacity == 0 || p.total <= in.capacity;
  if (in.capacity > 0) {
    PlanInput probe = in;
    auto fits = [&](std::int64_t mb) {
      probe.micro_batch = mb;
      return plan_total_bytes(probe) <= in.capacity;
    };
    std::int64_t lo = 0, hi = 1;
    while (fits(hi) && hi < (std::int64_t{1} << 20)) {
      lo = hi;
      hi *= 2;
    }
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    p.max_micro_batch = lo;
  }
  return p;
}

nlohmann::json MemoryPlan::to_json() const {
  nlohmann::json j;
  j["micro_batch_size"] = micro_batch;
  j["total_bytes"] = total;
  j["capacity_bytes"] = capacity;
  j["fits"] = fits;
  j["max_micro_batch_size"] = max_micro_batch;
  nlohmann::json items_j = nlohmann::json::array();
  for (const auto& it : items) items_j.push_back({{"name", it.name}, {"bytes", it.bytes}, {"detail", it.detail}});
  j["items"] = items_j;
  return j;
}

std::string MemoryPlan::to_table() const {
  std::string out;
  char line[512];
  for (const auto& it : items) {
    std::snprintf(line, sizeof line, "  %-22s %12s  %s\n", it.name.c_str(), format_bytes(it.bytes).c_str(),
                  it.detail.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-22s %12s  (predicted peak reserved, micro-batch %lld)\n", "total",
                format_bytes(total).c_str(), static_cast<long long>(micro_batch));
  out += line;
  if (capacity > 0) {
    std::snprintf(line, sizeof line, "  %-22s %12s  %s; largest micro-batch that fits: %lld\n", "device memory",
                  format_bytes(capacity).c_str(), fits ? "fits" : "does NOT fit",
                  static_cast<long long>(max_micro_batch));
    out += line;
  }
  return out;
}

}  // namespace scalelab
