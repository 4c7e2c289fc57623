#include "model/decoder/linear.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "kernels/matmul.h"
#include "model/decoder/lora.h"
#include "model/decoder/nf4_linear.h"
#include "model/decoder/qat.h"

namespace scalelab {

void Linear::forward(Tensor& y, const Tensor& x, ExecContext& ctx, bool with_bias) const {
  const Tensor* bias = with_bias && b.defined() ? &b : nullptr;
  if (adapter && !quantized && !quant && bias == nullptr && x.dtype() == w.dtype() && y.dtype() == w.dtype() &&
      adapter->assigns_output(ctx)) {
    // The adapter writes y, then y += x·wᵀ (LinearAdapter: one pass over y less). One dtype: the
    // base is then a plain GEMM on every backend, no workspace, as kernels::linear_forward's.
    adapter->forward(y, x, ctx, /*assign=*/true);
    ProfileScope prof(ctx, "matmul", Phase::kForward);
    const std::int64_t in = w.dim(1), out = w.dim(0);
    kernels::gemm_ex(false, true, x.numel() / in, out, in, 1.0f, x.raw(), x.dtype(), in, w.raw(), w.dtype(), in, 1.0f,
                     y.raw(), y.dtype(), out, ctx);
    return;
  }
  if (quantized) {
    quantized->forward(y, x, bias, ctx);
  } else if (quant) {
    quant->forward(y, x, w, bias, ctx);
  } else {
    kernels::linear_forward(y, x, w, bias, ctx);
  }
  if (adapter) adapter->forward(y, x, ctx);
}

void Linear::backward(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx, bool accumulate_dx,
                      bool with_bias) {
  Tensor* dbias = with_bias && db.defined() ? &db : nullptr;
  const bool adapter_first = adapter && dx != nullptr && dx->defined() && adapter->assigns_input_gradient(ctx);
  if (adapter_first) {
    // The adapter first (writing dx, or adding to it when accumulating), then the base adds dy·w.
    adapter->backward(dx, dy, x, ctx, /*assign_dx=*/!accumulate_dx);
    accumulate_dx = true;
  }
  if (quantized) {  // frozen: no weight or bias gradient
    SCALELAB_CHECK(dbias == nullptr || !dbias->defined(), "[model] a quantized base with a trained bias");
    if (dx != nullptr) quantized->backward_input(*dx, dy, ctx, accumulate_dx);
  } else if (quant) {
    quant->backward(dx, dw, dbias, dy, x, w, ctx, accumulate_dx);
  } else {
    kernels::linear_backward(dx, dw, dbias, dy, x, w, ctx, accumulate_dx);  // dw undefined when frozen
  }
  if (adapter && !adapter_first) adapter->backward(dx, dy, x, ctx);
}

Tensor optional_view(const ParamLayout& layout, const Tensor& flat, const std::string& name) {
  const ParamInfo* p = layout.find(name);
  return p ? layout.view(flat, *p) : Tensor();
}

Tensor contiguous_view(const ParamLayout& layout, const Tensor& flat, const std::vector<std::string>& names,
                       std::int64_t cols, bool gradients) {
  SCALELAB_CHECK(!names.empty(), "[model] contiguous_view of no parameters");
  const ParamInfo& first = layout.at(names.front());
  std::int64_t end = first.offset;
  for (const auto& n : names) {
    const ParamInfo& p = layout.at(n);
    SCALELAB_CHECK(p.offset == end, "[model] " + n + " does not follow " + names.front() +
                                        "'s run in the parameter layout — the fused view needs them adjacent");
    end += p.numel;
  }
  // A gradient buffer may be laid out apart from the parameters (ParamLayout::share_layer_gradients):
  // the run's gradients must then be one contiguous piece of it too.
  const std::int64_t begin = gradients ? layout.grad_offset(first.offset) : first.offset;
  if (gradients) {
    SCALELAB_CHECK(layout.grad_offset(end - 1) == begin + (end - 1 - first.offset),
                   "[model] the gradients of " + names.front() + "'s fused run are not contiguous (a bug)");
  }
  Tensor v = flat.view({flat.numel()}).slice(begin, begin + (end - first.offset));
  return cols > 0 ? v.view({(end - first.offset) / cols, cols}) : v;
}

namespace {

// Whether the fused parameters `names` train (all of them) or are frozen (all of them).
bool trains_together(const ParamLayout& layout, const std::vector<std::string>& names) {
  const bool first = layout.at(names.front()).trainable;
  for (const auto& n : names) {
    if (layout.at(n).trainable != first) {
      throw InvalidInput("[--freeze] " + names.front() + " and " + n +
                         " are one fused projection here (one GEMM computes their gradient) — freeze all of " +
                         std::to_string(names.size()) + " or none");
    }
  }
  return first;
}

std::pair<std::int64_t, std::int64_t> trainable_run(const ParamLayout& layout,
                                                    const std::function<bool(const ParamInfo&)>& pick) {
  std::int64_t begin = layout.trainable_numel(), end = 0, numel = 0;
  for (const ParamInfo& p : layout.params()) {
    if (!p.trainable || !pick(p)) continue;
    begin = std::min(begin, p.offset);
    end = std::max(end, p.offset + p.numel);
    numel += p.numel;
  }
  if (numel == 0) return {0, 0};
  SCALELAB_CHECK(end - begin == numel, "[model] the trainable parameters of a grad-ready range are not adjacent in "
                                       "the layout");
  return {begin, end};
}

}  // namespace

Linear bind_linear(const ParamLayout& layout, const Tensor& params, const Tensor& grads,
                   const std::vector<std::string>& weights, const std::vector<std::string>& biases) {
  Linear l;
  const std::int64_t in = layout.at(weights.front()).shape[1];
  l.frozen = !trains_together(layout, weights);
  l.quantized = bind_nf4(layout, weights);  // QLoRA (--quantize-base): the base in NF4, else none
  if (!l.quantized) {
    l.w = weights.size() == 1 ? layout.view(params, weights.front()) : contiguous_view(layout, params, weights, in);
  }
  if (!l.frozen) {
    l.dw = weights.size() == 1 ? layout.grad_view(grads, weights.front())
                                : contiguous_view(layout, grads, weights, in, /*gradients=*/true);
  }
  if (!biases.empty() && layout.find(biases.front()) != nullptr) {
    const bool bias_trains = trains_together(layout, biases);
    l.b = contiguous_view(layout, params, biases, 0);
    if (bias_trains) l.db = contiguous_view(layout, grads, biases, 0, /*gradients=*/true);
  }
  l.adapter = bind_lora(layout, params, grads, weights);  // LoRA (--lora-rank), else none
  l.quant = bind_qat(layout, weights);                    // QAT (--qat), else none
  return l;
}

std::pair<std::int64_t, std::int64_t> param_range(const ParamLayout& layout, const std::string& prefix) {
  return trainable_run(layout, [&](const ParamInfo& p) { return p.name.compare(0, prefix.size(), prefix) == 0; });
}

std::pair<std::int64_t, std::int64_t> param_range(const ParamLayout& layout, const std::vector<std::string>& names) {
  return trainable_run(layout,
                       [&](const ParamInfo& p) { return std::find(names.begin(), names.end(), p.name) != names.end(); });
}

std::int64_t first_backward_layer(const ParamLayout& layout, const std::function<std::string(std::int64_t)>& layer_prefix,
                                  std::int64_t num_layers) {
  const std::string first_layer = layer_prefix(0);
  for (const ParamInfo& p : layout.params()) {  // the family's order: what comes before the layers first
    if (p.name.rfind(first_layer, 0) == 0) break;
    if (p.trainable) return 0;
  }
  for (std::int64_t l = 0; l < num_layers; ++l) {
    const auto r = param_range(layout, layer_prefix(l));
    if (r.second > r.first) return l;
  }
  return num_layers;
}

}  // namespace scalelab
