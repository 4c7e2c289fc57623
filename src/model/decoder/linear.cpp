#include "model/decoder/linear.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/matmul.h"

namespace scalelab {

void Linear::forward(Tensor& y, const Tensor& x, ExecContext& ctx, bool with_bias) const {
  kernels::linear_forward(y, x, w, with_bias && b.defined() ? &b : nullptr, ctx);
  if (adapter) adapter->forward(y, x, ctx);
}

void Linear::backward(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx, bool accumulate_dx,
                      bool with_bias) {
  Tensor* dbias = with_bias && db.defined() ? &db : nullptr;
  if (frozen) {
    Tensor scratch = Tensor::zeros(w.shape(), DType::kF32, *ctx.alloc, "frozen weight gradient (discarded)");
    kernels::linear_backward(dx, scratch, nullptr, dy, x, w, ctx, accumulate_dx);
  } else {
    kernels::linear_backward(dx, dw, dbias, dy, x, w, ctx, accumulate_dx);
  }
  if (adapter) adapter->backward(dx, dy, x, ctx);
}

Tensor optional_view(const ParamLayout& layout, const Tensor& flat, const std::string& name) {
  const ParamInfo* p = layout.find(name);
  return p ? layout.view(flat, *p) : Tensor();
}

Tensor contiguous_view(const ParamLayout& layout, const Tensor& flat, const std::vector<std::string>& names,
                       std::int64_t cols) {
  SCALELAB_CHECK(!names.empty(), "[model] contiguous_view of no parameters");
  const ParamInfo& first = layout.at(names.front());
  std::int64_t end = first.offset;
  for (const auto& n : names) {
    const ParamInfo& p = layout.at(n);
    SCALELAB_CHECK(p.offset == end, "[model] " + n + " does not follow " + names.front() +
                                        "'s run in the parameter layout — the fused view needs them adjacent");
    end += p.numel;
  }
  Tensor v = flat.view({flat.numel()}).slice(first.offset, end);
  return cols > 0 ? v.view({(end - first.offset) / cols, cols}) : v;
}

Linear bind_linear(const ParamLayout& layout, const Tensor& params, const Tensor& grads,
                   const std::vector<std::string>& weights, const std::vector<std::string>& biases) {
  Linear l;
  const std::int64_t in = layout.at(weights.front()).shape[1];
  l.w = weights.size() == 1 ? layout.view(params, weights.front()) : contiguous_view(layout, params, weights, in);
  l.dw = weights.size() == 1 ? layout.view(grads, weights.front()) : contiguous_view(layout, grads, weights, in);
  if (!biases.empty() && layout.find(biases.front()) != nullptr) {
    l.b = contiguous_view(layout, params, biases, 0);
    l.db = contiguous_view(layout, grads, biases, 0);
  }
  return l;
}

std::pair<std::int64_t, std::int64_t> param_range(const ParamLayout& layout, const std::string& prefix) {
  std::int64_t begin = layout.total_numel(), end = 0;
  for (const ParamInfo& p : layout.params()) {
    if (p.name.compare(0, prefix.size(), prefix) != 0) continue;
    begin = std::min(begin, p.offset);
    end = std::max(end, p.offset + p.numel);
  }
  return {begin, end};
}

}  // namespace scalelab
