#include "model/decoder/lora.h"

#include <utility>

#include "core/error.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"

namespace scalelab {

namespace {

thread_local bool adapters_off = false;

// A [rows, cols] sub-matrix at column `col` of the row-major matrix t [rows, ld].
const std::uint8_t* at_col(const Tensor& t, std::int64_t col) {
  return static_cast<const std::uint8_t*>(t.raw()) + static_cast<std::size_t>(col) * dtype_size(t.dtype());
}

// The dtype of z = x·Aᵀ (and of dz in backward): x's when the adapter shares it (bf16 or fp16
// weights, "full bf16"), as peft computes lora_B(lora_A(x)) in the module's dtype; fp32 otherwise
// (fp32 models, and mixed dtypes, where z keeps the fp32 product). With one dtype every adapter
// product is a same-type GEMM: on CUDA cuBLASLt runs it directly, where an fp32 z beside bf16
// tensors had the backend widen [T, in] / [T, n] operands and stage [T, n] results in fp32
// scratch (hundreds of MiB at llama-3.2-1b's micro-batch 8, and slower).
DType z_dtype(const Tensor& x, const LoraAdapter::Part& p) {
  return (x.dtype() == p.a.dtype() && x.dtype() == p.b.dtype()) ? x.dtype() : DType::kF32;
}

// The adapter's products are their own family in --profile and --trace ("lora"): kernels::gemm_ex
// is a raw-pointer entry that does not open a scope itself (the fused kernels call it inside
// theirs), so without this the adapters' time fell between the profiled ops.
template <class... Args>
void lora_gemm(ExecContext& ctx, Phase phase, Args&&... args) {
  ProfileScope prof(ctx, "lora", phase);
  kernels::gemm_ex(std::forward<Args>(args)..., ctx);
}

// A group of the adapter's independent products, run together (kernels::gemm_ex_group: the CPU
// runs them on its threads at once, each on one thread — rank-r products gain little from being
// split) and profiled as one "lora" scope.
struct LoraGroup {
  std::vector<kernels::GemmExArgs> products;
  void add(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a, DType at,
           std::int64_t lda, const void* b, DType bt, std::int64_t ldb, float beta, void* c, DType ct,
           std::int64_t ldc) {
    products.push_back({ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc});
  }
  void run(ExecContext& ctx, Phase phase) {
    if (products.empty()) return;
    ProfileScope prof(ctx, "lora", phase);
    kernels::gemm_ex_group(products, ctx);
    products.clear();
  }
};

}  // namespace

AdaptersOff::AdaptersOff() : previous_(adapters_off) { adapters_off = true; }
AdaptersOff::~AdaptersOff() { adapters_off = previous_; }
bool AdaptersOff::active() { return adapters_off; }

std::int64_t lora_dropout_site(const std::string& m) {
  if (m == "q_proj") return 2;
  if (m == "k_proj") return 3;
  if (m == "v_proj") return 4;
  if (m == "o_proj" || m == "out_proj") return 5;
  if (m == "gate_proj" || m == "fc1") return 6;
  if (m == "up_proj") return 7;
  if (m == "down_proj" || m == "fc2") return 8;
  return 9;
}

Tensor LoraAdapter::adapter_input(const Tensor& x, const Part& p, ExecContext& ctx) const {
  if (!dropping(ctx)) return x;
  Tensor xd = Tensor::empty(x.shape(), x.dtype(), *ctx.alloc, "lora dropout input");
  // dropout_backward is the out-of-place form: xd = x·mask/(1 − P) with the key's mask.
  kernels::dropout_backward(xd, x, dropout_, {ctx.train_seed, ctx.train_step, layer_, p.site}, ctx);
  return xd;
}

LoraAdapter::LoraAdapter(std::vector<Part> parts, std::int64_t out_features, float scale, float dropout,
                         std::int64_t layer)
    : parts_(std::move(parts)), out_(out_features), scale_(scale), dropout_(dropout), layer_(layer) {
  // Stacked: P > 1 parts of one rank, width and dtype whose A's (and, when trained, dA's) follow
  // each other in memory.
  stacked_ = parts_.size() > 1;
  for (std::size_t i = 1; stacked_ && i < parts_.size(); ++i) {
    const Part &p = parts_[i - 1], &q = parts_[i];
    stacked_ = q.a.dtype() == p.a.dtype() && q.a.dim(0) == p.a.dim(0) && q.a.dim(1) == p.a.dim(1) &&
               q.b.dtype() == p.b.dtype() && q.a.follows(p.a);
    if (stacked_ && (p.da.defined() || q.da.defined())) {
      stacked_ = p.da.defined() && q.da.defined() && q.da.dtype() == p.da.dtype() && q.da.follows(p.da);
    }
  }
  std::int64_t end = 0;
  covers_ = true;
  for (const Part& p : parts_) {
    covers_ = covers_ && p.col == end;
    end = p.col + p.b.dim(0);
  }
  covers_ = covers_ && end == out_;
}

void LoraAdapter::keep_z(std::vector<Tensor> z, const Tensor& x, const ExecContext& ctx) {
  saved_z_.clear();
  saved_step_ = -1;
  if (ctx.train_step < 0) return;  // evaluation / generation: no backward follows
  saved_z_ = std::move(z);
  saved_step_ = ctx.train_step;
  saved_x_numel_ = x.numel();
}

std::vector<Tensor> LoraAdapter::take_z(const Tensor& x, const ExecContext& ctx) {
  std::vector<Tensor> z;
  if (saved_step_ >= 0 && saved_step_ == ctx.train_step && saved_x_numel_ == x.numel()) z = std::move(saved_z_);
  saved_z_.clear();
  saved_step_ = -1;
  return z;
}

void LoraAdapter::forward_stacked(Tensor& y, const Tensor& x, ExecContext& ctx, bool assign) {
  const std::int64_t in = x.dim(x.rank() - 1), T = x.numel() / in;
  const Part& p0 = parts_.front();
  const std::int64_t r = p0.a.dim(0), R = r * static_cast<std::int64_t>(parts_.size());
  const DType zt = z_dtype(x, p0);
  Tensor z = Tensor::empty({T, R}, zt, *ctx.alloc, "lora z");
  // z = x·[A_1; ...; A_P]ᵀ  [T, R]
  lora_gemm(ctx, Phase::kForward, false, true, T, R, in, 1.0f, x.raw(), x.dtype(), in, p0.a.raw(), p0.a.dtype(), in,
            0.0f, z.raw(), zt, R);
  // y[:, col_i:col_i+n_i] (+)= s·z_i·B_iᵀ (z_i: columns [i·r, (i+1)·r) of z): disjoint column blocks
  LoraGroup up;
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    const Part& p = parts_[i];
    up.add(false, true, T, p.b.dim(0), r, scale_, at_col(z, static_cast<std::int64_t>(i) * r), zt, R, p.b.raw(),
           p.b.dtype(), r, assign ? 0.0f : 1.0f, const_cast<std::uint8_t*>(at_col(y, p.col)), y.dtype(), out_);
  }
  up.run(ctx, Phase::kForward);
  keep_z({std::move(z)}, x, ctx);
}

void LoraAdapter::backward_stacked(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx,
                                   bool assign_dx) {
  const std::int64_t in = x.dim(x.rank() - 1), T = x.numel() / in;
  const Part& p0 = parts_.front();
  const std::int64_t r = p0.a.dim(0), R = r * static_cast<std::int64_t>(parts_.size());
  const DType zt = z_dtype(x, p0);
  std::vector<Tensor> kept = take_z(x, ctx);
  Tensor z;
  if (kept.size() == 1 && kept[0].dtype() == zt && kept[0].numel() == T * R) {
    z = std::move(kept[0]);
  } else {  // no forward kept it for this input: recompute
    z = Tensor::empty({T, R}, zt, *ctx.alloc, "lora z");
    lora_gemm(ctx, Phase::kBackward, false, true, T, R, in, 1.0f, x.raw(), x.dtype(), in, p0.a.raw(), p0.a.dtype(),
              in, 0.0f, z.raw(), zt, R);
  }
  Tensor dz = Tensor::empty({T, R}, zt, *ctx.alloc, "lora dz");
  LoraGroup bz;  // per part: dB_i (reads z_i) and dz_i (its own columns of dz)
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    Part& p = parts_[i];
    const std::int64_t n = p.b.dim(0), c = static_cast<std::int64_t>(i) * r;
    const std::uint8_t* dyp = at_col(dy, p.col);
    // dB_i += s·dy_iᵀ·z_i  [n, r]
    if (p.db.defined()) {
      bz.add(true, false, n, r, T, scale_, dyp, dy.dtype(), out_, at_col(z, c), zt, R, 1.0f, p.db.raw(), p.db.dtype(),
             r);
    }
    // dz_i = s·dy_i·B_i  [T, r]
    bz.add(false, false, T, r, n, scale_, dyp, dy.dtype(), out_, p.b.raw(), p.b.dtype(), r, 0.0f,
           const_cast<std::uint8_t*>(at_col(dz, c)), zt, R);
  }
  bz.run(ctx, Phase::kBackward);
  z = Tensor();
  LoraGroup ax;
  // [dA_1; ...; dA_P] += dzᵀ·x  [R, in]
  if (p0.da.defined()) {
    ax.add(true, false, R, in, T, 1.0f, dz.raw(), zt, R, x.raw(), x.dtype(), in, 1.0f, p0.da.raw(), p0.da.dtype(),
           in);
  }
  // dx (+)= dz·[A_1; ...; A_P]  [T, in]
  if (dx != nullptr && dx->defined()) {
    ax.add(false, false, T, in, R, 1.0f, dz.raw(), zt, R, p0.a.raw(), p0.a.dtype(), in, assign_dx ? 0.0f : 1.0f,
           dx->raw(), dx->dtype(), in);
  }
  ax.run(ctx, Phase::kBackward);
}

void LoraAdapter::forward(Tensor& y, const Tensor& x, ExecContext& ctx, bool assign) {
  SCALELAB_CHECK(!assign || assigns_output(ctx), "[lora] asked to write an output its parts do not cover (a bug)");
  if (AdaptersOff::active()) return;  // the base model alone (DPO's reference forward)
  if (stacked(ctx)) return forward_stacked(y, x, ctx, assign);
  const std::int64_t in = x.dim(x.rank() - 1), T = x.numel() / in;
  std::vector<Tensor> zs;
  for (const Part& p : parts_) {
    const std::int64_t r = p.a.dim(0), n = p.b.dim(0);
    const Tensor xin = adapter_input(x, p, ctx);  // x, or dropout(x) while training
    const DType zt = z_dtype(xin, p);
    Tensor z = Tensor::empty({T, r}, zt, *ctx.alloc, "lora z");
    // z = x·Aᵀ
    lora_gemm(ctx, Phase::kForward, false, true, T, r, in, 1.0f, xin.raw(), xin.dtype(), in, p.a.raw(), p.a.dtype(), in,
              0.0f, z.raw(), zt, r);
    // y[:, col:col+n] (+)= s·z·Bᵀ
    lora_gemm(ctx, Phase::kForward, false, true, T, n, r, scale_, z.raw(), zt, r, p.b.raw(), p.b.dtype(), r,
              assign ? 0.0f : 1.0f, const_cast<std::uint8_t*>(at_col(y, p.col)), y.dtype(), out_);
    zs.push_back(std::move(z));
  }
  keep_z(std::move(zs), x, ctx);
}

void LoraAdapter::backward(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx, bool assign_dx) {
  SCALELAB_CHECK(!assign_dx || assigns_input_gradient(ctx), "[lora] asked to write dx under dropout (a bug)");
  if (stacked(ctx)) return backward_stacked(dx, dy, x, ctx, assign_dx);
  const std::int64_t in = x.dim(x.rank() - 1), T = x.numel() / in;
  std::vector<Tensor> kept = take_z(x, ctx);
  if (kept.size() != parts_.size()) kept.clear();
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    Part& p = parts_[i];
    const std::int64_t r = p.a.dim(0), n = p.b.dim(0);
    const std::uint8_t* dyp = at_col(dy, p.col);
    Tensor xin = adapter_input(x, p, ctx);  // the forward's dropout(x), regenerated from its key
    const DType zt = z_dtype(xin, p);
    Tensor z;
    if (!kept.empty() && kept[i].dtype() == zt && kept[i].numel() == T * r) {
      z = std::move(kept[i]);
    } else {  // no forward kept it for this input: recompute
      z = Tensor::empty({T, r}, zt, *ctx.alloc, "lora z");
      lora_gemm(ctx, Phase::kBackward, false, true, T, r, in, 1.0f, xin.raw(), xin.dtype(), in, p.a.raw(),
                p.a.dtype(), in, 0.0f, z.raw(), zt, r);
    }
    Tensor dz = Tensor::empty({T, r}, zt, *ctx.alloc, "lora dz");
    LoraGroup bz;
    // dB += s·dy_partᵀ·z  [n, r]
    if (p.db.defined()) {
      bz.add(true, false, n, r, T, scale_, dyp, dy.dtype(), out_, z.raw(), zt, r, 1.0f, p.db.raw(), p.db.dtype(), r);
    }
    // dz = s·dy_part·B  [T, r]
    bz.add(false, false, T, r, n, scale_, dyp, dy.dtype(), out_, p.b.raw(), p.b.dtype(), r, 0.0f, dz.raw(), zt, r);
    bz.run(ctx, Phase::kBackward);
    z = Tensor();
    const bool plain_dx = dx != nullptr && dx->defined() && !dropping(ctx);
    LoraGroup ax;
    // dA += dzᵀ·x  [r, in]
    if (p.da.defined()) {
      ax.add(true, false, r, in, T, 1.0f, dz.raw(), zt, r, xin.raw(), xin.dtype(), in, 1.0f, p.da.raw(), p.da.dtype(),
             in);
    }
    // dx (+)= dz·A  [T, in]: the first part writes it when assigning
    if (plain_dx) {
      ax.add(false, false, T, in, r, 1.0f, dz.raw(), zt, r, p.a.raw(), p.a.dtype(), in,
             assign_dx && i == 0 ? 0.0f : 1.0f, dx->raw(), dx->dtype(), in);
    }
    ax.run(ctx, Phase::kBackward);
    xin = Tensor();  // freed (when it is dropout's) before the input gradient's buffer is taken
    // dx += dropout(dz·A): the same mask and 1/(1 − P) on the input gradient
    if (dx != nullptr && dx->defined() && dropping(ctx)) {
      Tensor gx = Tensor::empty(x.shape(), dx->dtype(), *ctx.alloc, "lora dropout gradient");
      lora_gemm(ctx, Phase::kBackward, false, false, T, in, r, 1.0f, dz.raw(), zt, r, p.a.raw(), p.a.dtype(), in, 0.0f,
                gx.raw(), gx.dtype(), in);
      kernels::dropout_backward(gx, gx, dropout_, {ctx.train_seed, ctx.train_step, layer_, p.site}, ctx);
      kernels::add_(*dx, gx, ctx, Phase::kBackward);
    }
  }
}

std::shared_ptr<LinearAdapter> bind_lora(const ParamLayout& layout, const Tensor& params, const Tensor& grads,
                                         const std::vector<std::string>& weights) {
  if (!layout.lora().enabled()) return nullptr;
  std::vector<LoraAdapter::Part> parts;
  std::int64_t col = 0;
  for (const auto& w : weights) {
    const std::string module = w.substr(0, w.size() - 7);  // drop ".weight"
    const ParamInfo* a = layout.find(module + ".lora_A.weight");
    if (a != nullptr) {
      LoraAdapter::Part p;
      p.a = layout.view(params, *a);
      p.da = layout.grad_view(grads, a->name);
      p.b = layout.view(params, module + ".lora_B.weight");
      p.db = layout.grad_view(grads, module + ".lora_B.weight");
      p.col = col;
      p.site = lora_dropout_site(module.substr(module.rfind('.') + 1));
      parts.push_back(std::move(p));
    }
    col += layout.at(w).shape[0];
  }
  if (parts.empty()) return nullptr;
  // The decoder layer: the number after ".layers." in the module path.
  std::int64_t layer = 0;
  const std::string& first = weights.front();
  const std::size_t at = first.find(".layers.");
  if (at != std::string::npos) layer = std::stoll(first.substr(at + 8));
  return std::make_shared<LoraAdapter>(std::move(parts), col, static_cast<float>(layout.lora().scale()),
                                       static_cast<float>(layout.lora().dropout), layer);
}

}  // namespace scalelab
