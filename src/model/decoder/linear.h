#pragma once
// The pieces every decoder family is built from (src/model/decoder/): a Linear projection, a norm
// with its residual forms, the attention block. A family's model (src/model/<family>/model.cpp)
// binds them to views of the flat parameter and gradient buffers and calls them in its order;
// the pieces allocate exactly what the family would allocate by hand, with the same labels, so
// the memory plan and the allocation traces do not depend on the refactoring.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/context.h"
#include "core/tensor.h"
#include "model/params.h"

namespace scalelab {

// Where a model's step-local tensors come from: activations and activation gradients in the
// activation dtype, per-row statistics (norm rstd/mean, log-sum-exp) in fp32.
struct ActAlloc {
  DType dtype = DType::kF32;
  DeviceAllocator* alloc = nullptr;
  Tensor act(const Shape& s, const char* what) const { return Tensor::empty(s, dtype, *alloc, what); }
  Tensor f32(const Shape& s, const char* what) const { return Tensor::empty(s, DType::kF32, *alloc, what); }
};

// An adapter beside a Linear (LoRA attaches here): y += adapter(x) beside the base projection,
// and in backward dx += adapter's input gradient plus its own parameter gradients. LoRA
// (model/decoder/lora.h) is the one adapter; bind_linear attaches it.
//
// Order: where the adapter can write the whole output itself (assigns_output), Linear lets it
// write y first (assign = true) and adds the base product into it (beta = 1), and likewise lets
// it write dx first (assign_dx = true, when assigns_input_gradient) before the base adds dy·w:
// one pass over y and dx less than adding the adapter's small product afterwards. Otherwise the
// base writes first and the adapter adds (assign / assign_dx false).
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  virtual void forward(Tensor& y, const Tensor& x, ExecContext& ctx, bool assign = false) = 0;
  virtual void backward(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx, bool assign_dx = false) = 0;
  // Whether forward(..., assign = true) writes every element of y now.
  virtual bool assigns_output(const ExecContext&) const { return false; }
  // Whether backward(..., assign_dx = true) writes every element of dx now.
  virtual bool assigns_input_gradient(const ExecContext&) const { return false; }
};

// A frozen base weight held in another form than a dense tensor (QLoRA's NF4 base:
// model/decoder/nf4_linear.h): it computes the base products itself.
class QuantizedBase {
 public:
  virtual ~QuantizedBase() = default;
  virtual std::int64_t out_features() const = 0;
  // y = x·wᵀ (+ bias, when non-null).
  virtual void forward(Tensor& y, const Tensor& x, const Tensor* bias, ExecContext& ctx) const = 0;
  // dx = dy·w (assigned, or added when accumulate).
  virtual void backward_input(Tensor& dx, const Tensor& dy, ExecContext& ctx, bool accumulate) const = 0;
};

// Another form of the base product itself (QAT attaches here, model/decoder/qat.h): the Linear
// calls it instead of kernels::linear_forward / linear_backward, with the same arguments.
class LinearQuant {
 public:
  virtual ~LinearQuant() = default;
  virtual void forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, ExecContext& ctx) = 0;
  virtual void backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                        ExecContext& ctx, bool accumulate_dx) = 0;
};

// y = x · wᵀ (+ b): kernels::linear_forward / linear_backward over views of the flat buffers.
// w/dw: [out, in] (a fused projection is a contiguous run of the layout: q/k/v, gate/up);
// b/db: [out] or undefined. A frozen weight (--freeze) has frozen = true and dw undefined, a
// frozen bias db undefined: backward passes the undefined gradient to linear_backward, which
// skips that GEMM / column sum (no workspace either), and the input gradient still flows.
struct Linear {
  Tensor w, dw, b, db;
  std::shared_ptr<LinearAdapter> adapter;  // empty: no adapter
  std::shared_ptr<LinearQuant> quant;      // empty: the plain product (QAT: model/decoder/qat.h)
  bool frozen = false;  // the weight is frozen: dw is undefined
  std::shared_ptr<const QuantizedBase> quantized;  // QLoRA: the base weight (w undefined, frozen)

  bool has_bias() const { return b.defined(); }
  std::int64_t out_features() const { return quantized ? quantized->out_features() : w.dim(0); }
  // y = x·wᵀ (+ b when with_bias; a fused kernel may add the bias itself, e.g. OPT's bias+ReLU).
  void forward(Tensor& y, const Tensor& x, ExecContext& ctx, bool with_bias = true) const;
  // dx = dy·w (assigned, or added when accumulate_dx; dx may be null), dw += dyᵀ·x,
  // db += Σ_rows dy (when with_bias).
  void backward(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx, bool accumulate_dx = false,
                bool with_bias = true);
};

// Views of the flat buffers by HF name.
Tensor optional_view(const ParamLayout& layout, const Tensor& flat, const std::string& name);
// The parameters `names`, adjacent in this order in the layout, as one [rows, cols] matrix (cols
// 0: a vector); RuntimeError when they are not adjacent (a bug in the family's layout).
// gradients: `flat` is a gradient buffer (its offsets are ParamLayout::grad_offset's).
Tensor contiguous_view(const ParamLayout& layout, const Tensor& flat, const std::vector<std::string>& names,
                       std::int64_t cols, bool gradients = false);
// A Linear over `weights` (one name, or several adjacent ones fused) and optional `biases` (all
// present or all absent in the layout). Fused weights (and fused biases) must be all frozen or
// all trainable: InvalidInput naming --freeze otherwise (one GEMM computes their gradient).
Linear bind_linear(const ParamLayout& layout, const Tensor& params, const Tensor& grads,
                   const std::vector<std::string>& weights, const std::vector<std::string>& biases = {});
// [begin, end) in the gradient buffer of the trainable parameters whose name starts with `prefix`
// (a layer); {0, 0} when none trains. RuntimeError when they are not one run (a layout bug).
std::pair<std::int64_t, std::int64_t> param_range(const ParamLayout& layout, const std::string& prefix);
// The same over the trainable ones among `names` (absent names are skipped).
std::pair<std::int64_t, std::int64_t> param_range(const ParamLayout& layout, const std::vector<std::string>& names);

// The lowest decoder layer whose backward has to run: 0 when a parameter before the layers in the
// family's order trains (the embeddings, OPT's positions and project_in: their gradients need
// every layer's input gradient), else the first layer with a trainable parameter (adapters
// included), or num_layers when none has one. Below it nothing needs a gradient, as autograd sees
// it (requires_grad=False, or peft's frozen base): the models run no backward there and keep no
// activations, and the layer at it computes no input gradient unless its input norm trains. The
// memory plan's description asks the same function.
std::int64_t first_backward_layer(const ParamLayout& layout, const std::function<std::string(std::int64_t)>& layer_prefix,
                                  std::int64_t num_layers);

}  // namespace scalelab
