// Front of the fused ops (fused.h): validation, profiling, dispatch; the chunking of the fused
// linear + cross-entropy (host arithmetic every backend follows). The LayerNorm residual forms
// are in layernorm.cpp beside the plain LayerNorm.
#include "kernels/fused.h"

#include <algorithm>

#include "core/allocator.h"
#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

namespace {

// Rows of an RMSNorm over w's width H whose input is `h`; y and rstd match them.
std::int64_t check_rms(const Tensor& h, const Tensor& y, const Tensor& rstd, const Tensor& w, const char* op) {
  const std::int64_t H = w.numel(), rows = H > 0 ? h.numel() / H : 0;
  SCALELAB_CHECK(H > 0 && h.dim(-1) == H,
                 std::string("[") + op + "] input " + h.shape().str() + " does not end in the weight's " +
                     std::to_string(H));
  require_numel(y, rows * H, op, "output");
  require_numel(rstd, rows, op, "rstd");
  return rows;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Residual add fused into RMSNorm
// ---------------------------------------------------------------------------------------------

void rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta,
                              const Tensor& w, float eps, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kForward);
  const char* op = "rmsnorm_residual_forward";
  const std::int64_t rows = check_rms(x, y, rstd, w, op), H = w.numel();
  require_numel(delta, rows * H, op, "residual delta");
  require_numel(h, rows * H, op, "residual output");
  require_dtype(rstd, DType::kF32, op, "rstd");
  backend_for(device_of(op, {&h, &y, &rstd, &x, &delta, &w}), op)
      .rmsnorm_residual_forward(h, y, rstd, x, delta, w, eps, ctx);
}

void rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h, const Tensor& rstd,
                               const Tensor& w, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const char* op = "rmsnorm_residual_backward";
  const std::int64_t rows = check_rms(h, dy, rstd, w, op), H = w.numel();
  require_numel(dh, rows * H, op, "residual gradient");
  if (dw.defined()) require_numel(dw, H, op, "weight gradient");  // undefined: frozen, skipped
  backend_for(device_of(op, {&dh, &dw, &dy, &h, &rstd, &w}), op).rmsnorm_residual_backward(dh, dw, dy, h, rstd, w, ctx);
}

void rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const char* op = "rmsnorm_recompute";
  check_rms(h, y, rstd, w, op);
  backend_for(device_of(op, {&y, &h, &rstd, &w}), op).rmsnorm_recompute(y, h, rstd, w, ctx);
}

// ---------------------------------------------------------------------------------------------
// MLP activations
// ---------------------------------------------------------------------------------------------

void swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  const char* op = "swiglu_backward_recompute";
  const std::int64_t I = dh.dim(-1), T = dh.numel() / I;
  require_numel(gu, T * 2 * I, op, "gate/up");
  require_numel(dgu, T * 2 * I, op, "gate/up gradient");
  require_numel(act, T * I, op, "recomputed activation");
  backend_for(device_of(op, {&dgu, &act, &dh, &gu}), op).swiglu_backward_recompute(dgu, act, dh, gu, ctx);
}

// No profile scope of its own: the backend books its GEMMs as matmul and the activation as
// activation, as the unfused MLP backward would be booked.
void swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                    const Tensor& wdown, ExecContext& ctx) {
  const char* op = "swiglu_down_backward_recompute";
  SCALELAB_CHECK(wdown.rank() == 2, std::string("[") + op + "] down weight must be 2-D, got " + wdown.shape().str());
  const std::int64_t H = wdown.dim(0), I = wdown.dim(1), T = dout.numel() / H;
  require_numel(dout, T * H, op, "output gradient");
  if (dwdown.defined()) require_numel(dwdown, H * I, op, "down weight gradient");  // undefined: frozen, skipped
  require_numel(gu, T * 2 * I, op, "gate/up");
  require_numel(dgu, T * 2 * I, op, "gate/up gradient");
  backend_for(device_of(op, {&dgu, &dwdown, &dout, &gu, &wdown}), op)
      .swiglu_down_backward_recompute(dgu, dwdown, dout, gu, wdown, ctx);
}

void bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kForward);
  const char* op = "bias_relu_forward";
  const std::int64_t F = x.dim(-1), rows = x.numel() / F;
  require_numel(y, rows * F, op, "output");
  if (b.defined()) require_numel(b, F, op, "bias");
  backend_for(device_of(op, {&y, &x, &b}), op).bias_relu_forward(y, x, b, ctx);
}

void bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  const char* op = "bias_relu_backward";
  const std::int64_t F = y.dim(-1), rows = y.numel() / F;
  require_numel(dy, rows * F, op, "output gradient");
  require_numel(dx, rows * F, op, "input gradient");
  if (db != nullptr && db->defined()) require_numel(*db, F, op, "bias gradient");
  backend_for(device_of(op, {&dx, db, &dy, &y}), op).bias_relu_backward(dx, db, dy, y, ctx);
}

// ---------------------------------------------------------------------------------------------
// Linear + cross-entropy over chunks of tokens
// ---------------------------------------------------------------------------------------------

namespace {

constexpr std::int64_t kMaxChunkBytes = std::int64_t{64} << 20;
constexpr std::int64_t kMinChunk = 256, kDefaultChunk = 512;

// Returns the token count T = x.numel() / H.
std::int64_t check_linear_loss(const Tensor& x, const Tensor& w, const Tensor& targets, const char* op) {
  SCALELAB_CHECK(is_float_type(x.dtype()) && is_float_type(w.dtype()),
                 std::string("[") + op + "] input and weight must be fp32, bf16 or fp16");
  require_dtype(targets, DType::kI32, op, "targets");
  SCALELAB_CHECK(w.rank() == 2, std::string("[") + op + "] weight must be 2-D [vocab, hidden], got " + w.shape().str());
  const std::int64_t H = w.dim(1);
  SCALELAB_CHECK(x.rank() >= 1 && x.dim(-1) == H,
                 std::string("[") + op + "] input " + x.shape().str() + " does not end in the hidden size " +
                     std::to_string(H));
  const std::int64_t T = x.numel() / H;
  require_numel(targets, T, op, "targets");
  return T;
}

}  // namespace

std::int64_t fused_linear_cross_entropy_default_chunk(std::int64_t vocab) {
  std::int64_t c = kDefaultChunk;
  while (c > kMinChunk && c * std::max<std::int64_t>(vocab, 1) * 4 > kMaxChunkBytes) c /= 2;
  return c;
}

std::int64_t fused_linear_cross_entropy_default_chunk(std::int64_t vocab, DeviceType device) {
  if (device != DeviceType::kCUDA) return fused_linear_cross_entropy_default_chunk(vocab);
  constexpr std::int64_t kGpuChunk = 4096, kGpuMinChunk = 128, kGpuMaxChunkBytes = std::int64_t{1} << 30;
  std::int64_t c = kGpuChunk;
  while (c > kGpuMinChunk && c * std::max<std::int64_t>(vocab, 1) * 4 > kGpuMaxChunkBytes) c /= 2;
  return c;
}

namespace {
// The chunk a call without one uses: the default of the device the tensors are on (on meta, of
// the device the plan is for).
std::int64_t resolve_chunk(std::int64_t chunk_tokens, std::int64_t vocab, const Tensor& w, const ExecContext& ctx) {
  if (chunk_tokens > 0) return chunk_tokens;
  const DeviceType d = ctx.options.run_device(w.device());
  return fused_linear_cross_entropy_default_chunk(vocab, d);
}
}  // namespace

std::int64_t fused_linear_cross_entropy_chunk(std::int64_t tokens, std::int64_t chunk_tokens, std::int64_t vocab,
                                              DeviceType device) {
  const std::int64_t c = chunk_tokens > 0 ? chunk_tokens : fused_linear_cross_entropy_default_chunk(vocab, device);
  return std::max<std::int64_t>(1, std::min(c, tokens));
}

std::size_t fused_linear_cross_entropy_workspace_bytes(std::int64_t chunk_tokens, std::int64_t vocab) {
  return DeviceAllocator::round_size(static_cast<std::size_t>(chunk_tokens) * static_cast<std::size_t>(vocab) *
                                     sizeof(float));
}

std::vector<std::size_t> fused_linear_cross_entropy_workspace_blocks(std::int64_t tokens, std::int64_t chunk_tokens,
                                                                     std::int64_t hidden, std::int64_t vocab,
                                                                     DType x_type, DType w_type, DType dx_type,
                                                                     DType dw_type, bool backward) {
  const std::int64_t c = fused_linear_cross_entropy_chunk(tokens, chunk_tokens, vocab);
  const bool lowp = x_type != DType::kF32 || w_type != DType::kF32 ||
                    (backward && (dx_type != DType::kF32 || dw_type != DType::kF32));
  std::vector<std::size_t> blocks = {static_cast<std::size_t>(c * vocab) * sizeof(float)};
  if (lowp) blocks.push_back(static_cast<std::size_t>(c * hidden) * sizeof(float));
  return blocks;
}

std::int64_t count_target_tokens(const Tensor& targets, ExecContext& ctx) {
  const char* op = "count_target_tokens";
  require_dtype(targets, DType::kI32, op, "targets");
  return backend_for(device_of(op, {&targets}), op).count_target_tokens(targets, ctx);
}

std::int64_t count_target_tokens(const Tensor& targets) {
  ExecContext ctx;  // no allocator: counting needs no workspace (see fused.h)
  return count_target_tokens(targets, ctx);
}

LossSum fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& targets,
                                   float grad_scale_per_token, std::int64_t chunk_tokens, ExecContext& ctx) {
  const char* op = "fused_linear_cross_entropy";
  const std::int64_t T = check_linear_loss(x, w, targets, op), V = w.dim(0), H = w.dim(1);
  require_numel(dx, T * H, op, "input gradient");
  if (dw.defined()) require_numel(dw, V * H, op, "weight gradient");  // undefined: a frozen head
  if (T == 0) return {};
  ProfileScope prof(ctx, "loss", Phase::kBackward);
  return backend_for(dw.defined() ? device_of(op, {&dx, &dw, &x, &w, &targets}) : device_of(op, {&dx, &x, &w, &targets}),
                     op)
      .fused_linear_cross_entropy(dx, dw, x, w, targets, grad_scale_per_token, resolve_chunk(chunk_tokens, V, w, ctx),
                                  ctx);
}

LossSum fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                           std::int64_t chunk_tokens, ExecContext& ctx) {
  ProfileScope prof(ctx, "loss", Phase::kForward);
  const char* op = "fused_linear_cross_entropy_forward";
  if (check_linear_loss(x, w, targets, op) == 0) return {};
  return backend_for(device_of(op, {&x, &w, &targets}), op)
      .fused_linear_cross_entropy_forward(x, w, targets, resolve_chunk(chunk_tokens, w.dim(0), w, ctx), ctx);
}

}  // namespace scalelab::kernels
