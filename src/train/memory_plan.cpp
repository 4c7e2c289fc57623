#include "train/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>

#include "core/allocator.h"
#include "core/error.h"
#include "distributed/zero.h"
#include "kernels/fused.h"
#include "model/decoder/linear.h"
#include "model/family.h"
#include "model/nf4.h"
#include "model/params.h"
#include "train/data.h"
#include "train/dpo.h"
#include "train/step_buffers.h"

namespace scalelab {

namespace {

// Categories of the plan, in display order.
const char* const kCategories[] = {"weights",          "gradients",        "optimizer states",     "reference model",
                                   "batch",            "reference forward",
                                   "activations",      "attention scores", "logits",               "fused loss chunk",
                                   "head buffers",     "recomputed layer", "backward temporaries", "workspace",
                                   "other"};

// The category of one allocation: what its label says for the buffers a label identifies, else
// the region (AllocRegion) the model was in when it allocated.
std::string category_of(const AllocEvent& e) {
  static const std::map<std::string, std::string, std::less<>> by_label = {
      {"weights", "weights"},
      {"weights (compute copy)", "weights"},
      {"weights (nf4)", "weights"},
      {"gradients", "gradients"},
      {"gradient shard (ZeRO-1)", "gradients"},
      {"optimizer exp_avg", "optimizer states"},
      {"optimizer exp_avg_sq", "optimizer states"},
      {"reference model", "reference model"},
      {"batch inputs", "batch"},
      {"batch targets", "batch"},
      {"logits", "logits"},
      {kernels::kFusedLossChunkLabel, "fused loss chunk"},
      {"attention workspace", "workspace"},
      {"matmul workspace", "workspace"},
      {"workspace", "workspace"},
      {"nf4 tile", "workspace"},
  };
  auto it = by_label.find(e.what);
  if (it != by_label.end()) return it->second;
  // The S×S probabilities are "attention scores" where the forward keeps them; a layer rebuilt
  // under checkpointing counts whole as the recomputed layer.
  if (e.what == "attention scores" && e.region != "recomputed layer") return "attention scores";
  return e.region.empty() ? "other" : e.region;
}

// What one measured step held: per category the most it held at once, what it held at the peak,
// and per label the same (for the details).
struct Measure {
  std::size_t peak_reserved = 0, cached_at_peak = 0, rounding = 0;
  std::map<std::string, std::size_t> most, at_peak;                 // by category
  std::map<std::string, std::map<std::string, std::size_t>> labels;  // category -> label -> bytes at peak

  explicit Measure(const std::vector<AllocEvent>& events) {
    struct Live {
      std::size_t bytes;
      std::string category, label;
    };
    std::map<const void*, Live> live;
    std::map<std::string, std::size_t> current;
    std::size_t live_bytes = 0;
    for (const AllocEvent& e : events) {
      if (e.alloc) {
        Live l{e.bytes, category_of(e), e.what};
        current[l.category] += l.bytes;
        most[l.category] = std::max(most[l.category], current[l.category]);
        rounding += e.bytes - e.requested;
        live_bytes += l.bytes;
        live[e.ptr] = std::move(l);
        if (e.reserved > peak_reserved) {
          peak_reserved = e.reserved;
          cached_at_peak = e.reserved - live_bytes;
          at_peak.clear();
          labels.clear();
          for (const auto& [p, v] : live) {
            at_peak[v.category] += v.bytes;
            labels[v.category][v.label.empty() ? "(unlabelled)" : v.label] += v.bytes;
          }
        }
      } else {
        auto it = live.find(e.ptr);
        if (it == live.end()) continue;
        current[it->second.category] -= it->second.bytes;
        live_bytes -= it->second.bytes;
        live.erase(it);
      }
    }
  }
};

// One run of the real engine on the meta device: the step buffers, the model, and two training
// micro-steps (the second shows what the caching allocator reuses). Nothing is computed; every
// allocation the run would make is made, in the same order, through the same allocator. With a
// capacity the allocator flushes its cache and fails as the real one does (OutOfMemory).
//
// Data-dependent values are fixed explicitly on meta: every target token counts (the loss's
// divisor), the loss and the gradient norm are 0. Neither changes what is allocated.
std::size_t measure_step(const PlanInput& in, std::size_t capacity, std::vector<AllocEvent>* events) {
  // The allocator first: the layout (declared after it, so destroyed before it) ends up holding
  // QLoRA's NF4 store, whose tensors are freed into this allocator (ASan: stack-use-after-scope
  // when the allocator went first).
  DeviceAllocator alloc(make_meta_backend(), capacity == 0 ? std::numeric_limits<std::size_t>::max() / 4 : capacity);
  ParamLayout layout = build_layout(in);
  const std::int64_t P = layout.dense_numel(), Pt = layout.trainable_numel();  // QLoRA: the dense part
  alloc.set_trace(events);
  {
    StepBuffers b = allocate_step_buffers(alloc, in.precision, P, Pt, optimizer_state_numel(in, Pt),
                                          in.zero_stage == 1 && in.world_size > 1, layout.grad_numel());
    if (layout.quantized_numel() > 0) {  // QLoRA: the NF4 store, where the trainer allocates it
      layout.attach_nf4(std::make_shared<Nf4Store>(layout, *parse_quantize_base(in.lora.quantize_base), alloc));
    }
    std::unique_ptr<Model> model = make_model(in.config, layout, b.compute_weights, b.grads, in.options);
    // DPO without LoRA: the frozen reference copy, allocated where the trainer allocates it.
    Tensor ref_params;
    std::unique_ptr<Model> ref_model;
    if (in.dpo && !layout.lora().enabled()) {
      ref_params = Tensor::empty({P}, in.precision.compute_weights, alloc, "reference model");
      ref_model = make_model(in.config, layout, ref_params, b.grads, in.options);
    }
    const Batch batch = make_batch((in.dpo ? 2 : 1) * in.micro_batch, in.seq_len, alloc);
    ExecContext ctx{&alloc, nullptr};
    ctx.options.planned_device = in.device;
    for (int step = 0; step < 2; ++step) {
      model->set_step(step);
      ctx.train_step = step;  // LoRA dropout allocates what it does in training
      if (in.dpo) {
        dpo_micro_step(*model, ref_model.get(), batch, 0.1, 0.0, 1.0f, ctx);
      } else {
        model->forward_backward(batch, 1.0f, ctx);
      }
    }
  }
  alloc.set_trace(nullptr);
  return alloc.stats().peak_reserved;
}

std::string describe_labels(const std::map<std::string, std::size_t>& labels, std::size_t per) {
  std::vector<std::pair<std::size_t, std::string>> v;
  for (const auto& [k, b] : labels) v.push_back({b, k});
  std::sort(v.rbegin(), v.rend());
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < 6; ++i) {
    if (i) s += ", ";
    s += v[i].second + " " + format_bytes(v[i].first / std::max<std::size_t>(per, 1));
  }
  if (v.size() > 6) s += ", ...";
  return s;
}

std::vector<PlanItem> items_of(const Measure& m, const PlanInput& in) {
  const ParamLayout layout = build_layout(in);
  const std::int64_t P = layout.total_numel(), Pt = layout.trainable_numel(), Pq = layout.quantized_numel();
  const PrecisionPlan& pr = in.precision;
  // Layers that keep activations for backward (a frozen prefix runs none), and how the per-layer
  // figures say so.
  const std::int64_t first =
      first_backward_layer(layout, family_of(in.config).layer_prefix, in.config.num_hidden_layers);
  const std::size_t kept = static_cast<std::size_t>(std::max<std::int64_t>(1, in.config.num_hidden_layers - first));
  const std::int64_t nl = in.config.num_hidden_layers;
  auto span = [](std::int64_t a, std::int64_t b) {
    return a == b ? "layer " + std::to_string(a) : "layers " + std::to_string(a) + " to " + std::to_string(b);
  };
  std::string kept_note;
  if (first >= nl) {
    kept_note = " (no layer runs backward: every layer is frozen with the embeddings)";
  } else if (first > 0) {
    kept_note = " (" + span(first, nl - 1) + "; " + span(0, first - 1) + (first == 1 ? " is" : " are") +
                " frozen with the embeddings: no backward, nothing kept)";
  }
  const std::int64_t shard = optimizer_state_numel(in, Pt);
  const std::string zero_note = in.zero_stage == 1 && in.world_size > 1
                                    ? ", ZeRO-1 shard of rank " + std::to_string(in.rank) + ": " +
                                          std::to_string(shard) + " of " + std::to_string(Pt) + " parameters"
                                    : "";
  const std::string frozen_note =
      Pt < P ? " (the " + std::to_string(Pt) + " trainable; " + std::to_string(P - Pt) + " frozen have none)" : "";
  auto labels_at_peak = [&](const std::string& cat) {
    auto it = m.labels.find(cat);
    return it == m.labels.end() ? std::map<std::string, std::size_t>{} : it->second;
  };
  auto detail = [&](const std::string& cat) -> std::string {
    if (cat == "weights")
      return std::to_string(P) + " parameters, " + std::string(dtype_name(pr.param)) +
             (pr.weight_copy ? " master + " + std::string(dtype_name(pr.compute_weights)) + " compute copy" : "") +
             (Pq > 0 ? " (QLoRA: " + std::to_string(Pq) + " of them in " + in.lora.quantize_base + ", " +
                           format_bytes(labels_at_peak("weights")["weights (nf4)"]) + ")"
                     : "");
    if (cat == "gradients" && layout.shares_layer_gradients()) {
      std::int64_t outside = 0;
      for (const auto& s : layout.grad_segments(0, Pt))
        if (!s.shared) outside += s.end - s.begin;
      return std::string(dtype_name(pr.grad)) + ", --optimizer-in-backward: one decoder layer's slot (" +
             std::to_string(layout.grad_numel() - outside) + " parameters) shared by every layer + the " +
             std::to_string(outside) + " outside the layers, of " + std::to_string(Pt) + " trainable";
    }
    if (cat == "gradients")
      return std::string(dtype_name(pr.grad)) + ", same layout as the weights" + frozen_note +
             (zero_note.empty() ? "" : " (+ the fp32 reduce-scatter output" + zero_note + ")");
    if (cat == "optimizer states")
      return "AdamW exp_avg and exp_avg_sq, " + std::string(dtype_name(pr.optim_state)) + frozen_note + zero_note;
    if (cat == "batch") return in.dpo ? "input and target token ids, [chosen; rejected]: 2 x micro-batch rows" : "input and target token ids";
    if (cat == "reference model")
      return "DPO: a frozen copy of the initial weights (" + std::string(dtype_name(pr.compute_weights)) + "), forward only";
    if (cat == "reference forward") {
      const auto l = labels_at_peak(cat);
      return std::string("DPO: the reference log-probabilities' forward") +
             (in.lora.enabled() ? " (the policy with its adapters off)" : "") + (l.empty() ? "" : ", at the peak: " + describe_labels(l, 1));
    }
    if (cat == "activations") {
      const auto l = labels_at_peak(cat);
      if (in.options.activation_checkpointing)
        return "checkpointing keeps each layer's input only: " + describe_labels(l, kept) + " per layer" + kept_note;
      const std::string per = describe_labels(l, kept);
      return "kept for backward, per layer" + kept_note + (per.empty() ? "" : ": " + per);
    }
    if (cat == "attention scores")
      return "eager softmax(QK^T) [B, heads, S, S] per layer" + kept_note + ": " +
             describe_labels(labels_at_peak(cat), kept);
    if (cat == "logits") return "[tokens, vocab] " + std::string(dtype_name(pr.activation)) + "; the loss gradient is written in place";
    if (cat == "fused loss chunk") {
      // The chunk the kernel takes: --fused-loss-chunk, else the planned device's default.
      const std::int64_t T = (in.dpo ? 2 : 1) * in.micro_batch * in.seq_len;
      const std::int64_t c = kernels::fused_linear_cross_entropy_chunk(T, in.options.fused_loss_chunk,
                                                                       in.config.vocab_size, in.device);
      return "fused linear + cross-entropy: the logits of " + std::to_string(c) + " of the " + std::to_string(T) +
             " tokens at a time (--fused-loss-chunk; the full logits never exist)";
    }
    if (cat == "workspace") return "kernel scratch at the peak (attention blocks, GEMM conversion panels)";
    if (cat == "recomputed layer") return "one layer rebuilt in backward under checkpointing";
    const auto l = labels_at_peak(cat);
    return l.empty() ? "" : "at the peak: " + describe_labels(l, 1);
  };
  std::vector<PlanItem> items;
  for (const char* cat : kCategories) {
    auto it = m.most.find(cat);
    if (it == m.most.end() || it->second == 0) continue;
    auto at = m.at_peak.find(cat);
    items.push_back({cat, it->second, at == m.at_peak.end() ? 0 : at->second, detail(cat)});
  }
  items.push_back({"allocator cache", m.cached_at_peak, m.cached_at_peak,
                   "freed blocks the caching allocator keeps reserved at the peak (reused next step)"});
  items.push_back({"allocator rounding", m.rounding, 0, "requests rounded up to 512 bytes (already counted in the lines above)"});
  return items;
}

bool fits_capacity(const PlanInput& in, std::size_t capacity) {
  try {
    measure_step(in, capacity, nullptr);
    return true;
  } catch (const OutOfMemory&) {
    return false;
  }
}

}  // namespace

ParamLayout build_layout(const PlanInput& in) {
  ParamLayout layout = ParamLayout::build(in.config, in.freeze, in.lora);
  layout.set_qat(in.qat);  // InvalidInput: a group size that does not divide a module's input features
  if (in.optimizer_in_backward) {
    // The layers' trainable runs are the model's grad-ready ranges (each family's model fires its
    // hook with param_range of the same prefix).
    const ModelFamilySpec& fam = family_of(in.config);
    std::vector<std::pair<std::int64_t, std::int64_t>> layers;
    for (std::int64_t l = 0; l < in.config.num_hidden_layers; ++l) layers.push_back(param_range(layout, fam.layer_prefix(l)));
    layout.share_layer_gradients(layers);
  }
  return layout;
}

std::int64_t optimizer_state_numel(const PlanInput& in, std::int64_t trainable_params) {
  if (in.zero_stage != 1 || in.world_size <= 1) return trainable_params;
  SCALELAB_CHECK(in.rank >= 0 && in.rank < in.world_size, "[plan] rank outside the world");
  return ZeroOptimizer::shard_counts(trainable_params, in.world_size)[static_cast<std::size_t>(in.rank)];
}

std::size_t plan_total_bytes(const PlanInput& in) { return measure_step(in, 0, nullptr); }

MemoryPlan plan_memory(const PlanInput& in) {
  MemoryPlan p;
  std::vector<AllocEvent> events;
  p.total = measure_step(in, 0, &events);
  p.items = items_of(Measure(events), in);
  p.capacity = in.capacity;
  p.micro_batch = in.micro_batch;
  p.world_size = in.world_size;
  p.rank = in.rank;
  p.zero_stage = in.zero_stage;
  {
    const ParamLayout layout = build_layout(in);
    p.params = layout.total_numel();
    p.trainable_params = layout.trainable_numel();
    p.frozen_params = layout.frozen_numel();
  }
  // Above the capacity it may still fit: the allocator releases its cached blocks under pressure.
  p.fits = in.capacity == 0 || p.total <= in.capacity || fits_capacity(in, in.capacity);
  if (in.capacity > 0) {
    PlanInput probe = in;
    auto fits = [&](std::int64_t mb) {
      probe.micro_batch = mb;
      return fits_capacity(probe, in.capacity);
    };
    std::int64_t lo = 0, hi = 1;
    while (fits(hi) && hi < (std::int64_t{1} << 16)) {
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
  j["params"] = params;
  j["trainable_params"] = trainable_params;
  j["frozen_params"] = frozen_params;
  if (world_size > 1) {
    j["world_size"] = world_size;
    j["rank"] = rank;
    j["zero_stage"] = zero_stage;
  }
  nlohmann::json items_j = nlohmann::json::array();
  for (const auto& it : items)
    items_j.push_back({{"name", it.name}, {"bytes", it.bytes}, {"at_peak_bytes", it.at_peak}, {"detail", it.detail}});
  j["items"] = items_j;
  return j;
}

std::string MemoryPlan::to_table() const {
  std::string out;
  char line[640];
  std::snprintf(line, sizeof line, "  %-22s %12s %12s\n", "part", "needs", "at peak");
  out += line;
  for (const auto& it : items) {
    std::snprintf(line, sizeof line, "  %-22s %12s %12s  %s\n", it.name.c_str(), format_bytes(it.bytes).c_str(),
                  it.name == "allocator rounding" ? "" : format_bytes(it.at_peak).c_str(), it.detail.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-22s %12s %12s  predicted peak reserved at micro-batch %lld\n", "total", "",
                format_bytes(total).c_str(), static_cast<long long>(micro_batch));
  out += line;
  if (capacity > 0) {
    const char* verdict = !fits ? "does NOT fit"
                          : total > capacity ? "fits once the allocator releases its cached blocks"
                                             : "fits";
    std::snprintf(line, sizeof line, "  %-22s %12s  %s; largest micro-batch that fits: %lld\n", "device memory",
                  format_bytes(capacity).c_str(), verdict, static_cast<long long>(max_micro_batch));
    out += line;
  }
  return out;
}

}  // namespace scalelab
