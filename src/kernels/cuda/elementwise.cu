// Elementwise ops and MLP activations on CUDA (kernels/elementwise.h, activation.h, fused.h),
// with the expressions of the CPU oracle (cpu/elementwise.cpp, cpu/activation.cpp,
// cpu/fused_activation.cpp) evaluated in fp32:
//   add_ / add       out = a + b, any mix of float dtypes (a 16-byte vectorized path when all three
//                    share a dtype and are aligned); out may alias a.
//   swiglu           gu[T, 2I] = [gate | up] per row; h = silu(gate) · up with the CPU's own exp
//                    polynomial (rowops.cuh cpu_exp), so sigmoid matches it to the bit.
//   relu / gelu      transformers' ACT2FN: relu = v > 0 ? v : 0; gelu the exact erf form.
//   bias_add_        y[r, :] += b.
//   swiglu_backward_recompute / swiglu_down_backward_recompute (fused.h): one thread per (t, i)
//                    reads gate, up and dh before it writes act, dgate and dup, which is what lets
//                    act alias dh and dgu alias gu.
//   bias_relu        y = max(x + b, 0) keeping NaN (`v < 0 ? 0 : v`); backward's bias gradient is
//                    a deterministic column sum (rowops.cuh) launched before dx is written (dx may
//                    alias dy).
// Products are written with __fmul_rn/__fadd_rn where the CPU's expression has a fixed order, so
// nvcc does not contract them into fmas the CPU does not use.
#include <cstdint>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rowops.cuh"
#include "kernels/kernel_common.h"

namespace scalelab::kernels::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// add
// ---------------------------------------------------------------------------------------------

template <class O, class A, class B>
__global__ void add_kernel(O* out, const A* a, const B* b, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_f32<O>(__fadd_rn(to_f32<A>(a[i]), to_f32<B>(b[i])));
  }
}

// All three of one type T, 16-byte aligned: 16 bytes per thread and step, then the tail.
template <class T>
__global__ void add_vec_kernel(T* out, const T* a, const T* b, std::int64_t n) {
  constexpr int kV = 16 / sizeof(T);
  const std::int64_t nv = n / kV;
  const std::int64_t start = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t v = start; v < nv; v += step) {
    const uint4 ua = reinterpret_cast<const uint4*>(a)[v];
    const uint4 ub = reinterpret_cast<const uint4*>(b)[v];
    uint4 uo;
    const T* ea = reinterpret_cast<const T*>(&ua);
    const T* eb = reinterpret_cast<const T*>(&ub);
    T* eo = reinterpret_cast<T*>(&uo);
#pragma unroll
    for (int k = 0; k < kV; ++k) eo[k] = from_f32<T>(__fadd_rn(to_f32<T>(ea[k]), to_f32<T>(eb[k])));
    reinterpret_cast<uint4*>(out)[v] = uo;
  }
  for (std::int64_t i = nv * kV + start; i < n; i += step) {
    out[i] = from_f32<T>(__fadd_rn(to_f32<T>(a[i]), to_f32<T>(b[i])));
  }
}

void add_any(void* out, DType ot, const void* a, DType at, const void* b, DType bt, std::int64_t n, const char* op) {
  if (n <= 0) return;
  if (ot == at && at == bt && aligned_to(out, 16) && aligned_to(a, 16) && aligned_to(b, 16)) {
    dispatch_float(ot, op, [&]<class T>() {
      const std::int64_t vecs = std::max<std::int64_t>(n / static_cast<std::int64_t>(16 / sizeof(T)), 1);
      add_vec_kernel<T><<<grid_for(vecs), 256, 0, stream()>>>(static_cast<T*>(out), static_cast<const T*>(a),
                                                                static_cast<const T*>(b), n);
    });
    check_launch(op);
    return;
  }
  dispatch_float(ot, op, [&]<class O>() {
    dispatch_float(at, op, [&]<class A>() {
      dispatch_float(bt, op, [&]<class B>() {
        add_kernel<O, A, B><<<grid_for(n), 256, 0, stream()>>>(static_cast<O*>(out), static_cast<const A*>(a),
                                                                static_cast<const B*>(b), n);
      });
    });
  });
  check_launch(op);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU
// ---------------------------------------------------------------------------------------------

// h[t, i] = (gate · s) · up, s = sigmoid(gate).
struct SwigluForward {
  Out h;
  In gu;
  std::int64_t I;
  __device__ void operator()(std::int64_t e) const {
    const std::int64_t t = e / I, i = e - t * I;
    const float x = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
    const float s = cpu_sigmoid(x);
    h.set(e, __fmul_rn(__fmul_rn(x, s), u));
  }
};

// The CPU's per-element SwiGLU gradient: dup = d · silu; dgate = d · u · s · (1 + x · (1 − s)).
__device__ __forceinline__ void swiglu_grad(float x, float u, float d, float& dgate, float& dup, float& act) {
  const float s = cpu_sigmoid(x);
  const float silu = __fmul_rn(x, s);
  act = __fmul_rn(silu, u);
  dup = __fmul_rn(d, silu);
  dgate = __fmul_rn(__fmul_rn(__fmul_rn(d, u), s), __fadd_rn(1.0f, __fmul_rn(x, __fsub_rn(1.0f, s))));
}

// dgu (and, with act present, act) for element (t, i); everything read before anything written.
struct SwigluBackward {
  Out dgu, act;
  In dh, gu;
  std::int64_t I;
  __device__ void operator()(std::int64_t e) const {
    const std::int64_t t = e / I, i = e - t * I;
    const std::int64_t g = t * 2 * I + i;
    const float x = gu[g], u = gu[g + I], d = dh[e];
    float dgate, dup, a;
    swiglu_grad(x, u, d, dgate, dup, a);
    if (act.present()) act.set(e, a);
    dgu.set(g + I, dup);
    dgu.set(g, dgate);
  }
};

// Packed forms (all tensors of one dtype T, every row a whole number of 16-byte packs, pointers
// aligned): thread k handles pack k of the [T, I] output, i.e. Pack<T>::kN consecutive elements
// of one row; its token and column come from one 32-bit division per pack (the element-wise
// functors above divide a 64-bit index per element, the bulk of their cost). The arithmetic per
// element is the functors' (the same bits). Everything a thread reads is loaded before it
// writes, so the same aliasing holds (act over dh, dgu over gu).
template <class T>
__global__ void swiglu_forward_packed(T* h, const T* gu, std::uint32_t packs,
                                      std::uint32_t row_packs) {
  for (std::uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < packs; k += gridDim.x * blockDim.x) {
    const std::uint32_t t = k / row_packs, j = k - t * row_packs;
    const std::int64_t g = static_cast<std::int64_t>(t) * 2 * row_packs + j;  // gate pack; up is row_packs later
    const Pack<T> x = load_pack(gu, g), u = load_pack(gu, g + row_packs);
    Pack<T> y;
#pragma unroll
    for (int e = 0; e < Pack<T>::kN; ++e) {
      const float xv = to_f32<T>(x.v[e]);
      const float s = cpu_sigmoid(xv);
      y.v[e] = from_f32<T>(__fmul_rn(__fmul_rn(xv, s), to_f32<T>(u.v[e])));
    }
    store_pack(h, k, y);
  }
}

template <class T, bool kAct>
__global__ void swiglu_backward_packed(T* dgu, T* act, const T* dh, const T* gu, std::uint32_t packs,
                                       std::uint32_t row_packs) {
  for (std::uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < packs; k += gridDim.x * blockDim.x) {
    const std::uint32_t t = k / row_packs, j = k - t * row_packs;
    const std::int64_t g = static_cast<std::int64_t>(t) * 2 * row_packs + j;
    const Pack<T> x = load_pack(gu, g), u = load_pack(gu, g + row_packs), d = load_pack(dh, k);
    Pack<T> dg, du, a;
#pragma unroll
    for (int e = 0; e < Pack<T>::kN; ++e) {
      float dgate, dup, av;
      swiglu_grad(to_f32<T>(x.v[e]), to_f32<T>(u.v[e]), to_f32<T>(d.v[e]), dgate, dup, av);
      dg.v[e] = from_f32<T>(dgate);
      du.v[e] = from_f32<T>(dup);
      a.v[e] = from_f32<T>(av);
    }
    if (kAct) store_pack(act, k, a);
    store_pack(dgu, g + row_packs, du);
    store_pack(dgu, g, dg);
  }
}

// The packed path applies: one dtype, rows of whole packs, 16-byte aligned, fewer than 2^31 packs
// (the kernels' 32-bit grid-stride index then never wraps).
bool swiglu_packed_ok(std::int64_t T, std::int64_t I, std::initializer_list<const Tensor*> ts) {
  if (cuda_kernels_v1()) return false;
  const DType dt = (*ts.begin())->dtype();
  const std::int64_t per = 16 / static_cast<std::int64_t>(dtype_size(dt));
  if (I % per != 0 || (T * I) / per >= (std::int64_t{1} << 31)) return false;
  for (const Tensor* t : ts) {
    if (t->dtype() != dt || !aligned_to(t->raw(), 16)) return false;
  }
  return true;
}

std::int64_t swiglu_tokens(const Tensor& h_like, const Tensor& gu, const char* op) {
  const std::int64_t I = h_like.dim(-1);
  SCALELAB_CHECK(I > 0, std::string("[") + op + "] empty rows");
  const std::int64_t T = h_like.numel() / I;
  require_numel(gu, T * 2 * I, op, "gate/up");
  return T;
}

// ---------------------------------------------------------------------------------------------
// Pointwise activations
// ---------------------------------------------------------------------------------------------

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

template <bool kGelu>
struct ActForward {
  Out y;
  In x;
  __device__ void operator()(std::int64_t e) const {
    const float v = x[e];
    if constexpr (kGelu) {
      y.set(e, __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, erff(__fmul_rn(v, kInvSqrt2)))));
    } else {
      y.set(e, v > 0.0f ? v : 0.0f);
    }
  }
};

template <bool kGelu>
struct ActBackward {
  Out dx;
  In dy, x;
  __device__ void operator()(std::int64_t e) const {
    const float g = dy[e], v = x[e];
    if constexpr (kGelu) {
      const float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erff(__fmul_rn(v, kInvSqrt2))));
      const float pdf = __fmul_rn(kInvSqrt2Pi, expf(__fmul_rn(__fmul_rn(-0.5f, v), v)));
      dx.set(e, __fmul_rn(g, __fadd_rn(cdf, __fmul_rn(v, pdf))));
    } else {
      dx.set(e, v > 0.0f ? g : 0.0f);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Bias
// ---------------------------------------------------------------------------------------------

struct BiasAdd {
  Out y;
  In b;
  std::int64_t F;
  __device__ void operator()(std::int64_t e) const { y.set(e, __fadd_rn(y[e], b[e % F])); }
};

// y = v < 0 ? 0 : v, v = x (+ b).
struct BiasRelu {
  Out y;
  In x, b;
  std::int64_t F;
  __device__ void operator()(std::int64_t e) const {
    const float v = b.present() ? __fadd_rn(x[e], b[e % F]) : x[e];
    y.set(e, v < 0.0f ? 0.0f : v);
  }
};

struct ReluMask {
  Out dx;
  In dy, y;
  __device__ void operator()(std::int64_t e) const { dx.set(e, y[e] > 0.0f ? dy[e] : 0.0f); }
};

// db column term: dy where y > 0.
struct ReluMaskTerm {
  In dy, y;
  std::int64_t F;
  __device__ float operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t e = r * F + c;
    return y[e] > 0.0f ? dy[e] : 0.0f;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Methods
// ---------------------------------------------------------------------------------------------

void CudaBackend::add_(Tensor& a, const Tensor& b, ExecContext& ctx) {
  require_numel(b, a.numel(), "add_", "b");
  add_any(a.raw(), a.dtype(), a.raw(), a.dtype(), b.raw(), b.dtype(), a.numel(), "add_");
}

void CudaBackend::add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx) {
  require_numel(b, a.numel(), "add", "b");
  require_numel(out, a.numel(), "add", "out");
  add_any(out.raw(), out.dtype(), a.raw(), a.dtype(), b.raw(), b.dtype(), a.numel(), "add");
}

void CudaBackend::swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx) {
  const char* op = "swiglu_forward";
  const std::int64_t T = swiglu_tokens(h, gu, op), I = h.dim(-1);
  if (T * I > 0 && swiglu_packed_ok(T, I, {&h, &gu})) {
    dispatch_float(h.dtype(), op, [&]<class E>() {
      const auto row_packs = static_cast<std::uint32_t>(I / Pack<E>::kN);
      const auto packs = static_cast<std::uint32_t>(T * row_packs);
      swiglu_forward_packed<E><<<pack_grid(packs), 256, 0, stream()>>>(static_cast<E*>(h.raw()),
                                                                       static_cast<const E*>(gu.raw()), packs, row_packs);
    });
    check_launch(op);
    return;
  }
  launch_map(SwigluForward{out_of(h), in_of(gu), I}, T * I, op);
}

namespace {
// dgu (and act when given) through the packed kernel; false when it does not apply.
bool swiglu_backward_packed_launch(Tensor& dgu, Tensor* act, const Tensor& dh, const Tensor& gu, std::int64_t T,
                                   std::int64_t I, const char* op) {
  if (T * I == 0) return false;
  const bool ok = act != nullptr ? swiglu_packed_ok(T, I, {&dgu, act, &dh, &gu}) : swiglu_packed_ok(T, I, {&dgu, &dh, &gu});
  if (!ok) return false;
  dispatch_float(dgu.dtype(), op, [&]<class E>() {
    const auto row_packs = static_cast<std::uint32_t>(I / Pack<E>::kN);
    const auto packs = static_cast<std::uint32_t>(T * row_packs);
    if (act != nullptr) {
      swiglu_backward_packed<E, true><<<pack_grid(packs), 256, 0, stream()>>>(
          static_cast<E*>(dgu.raw()), static_cast<E*>(act->raw()), static_cast<const E*>(dh.raw()),
          static_cast<const E*>(gu.raw()), packs, row_packs);
    } else {
      swiglu_backward_packed<E, false><<<pack_grid(packs), 256, 0, stream()>>>(
          static_cast<E*>(dgu.raw()), nullptr, static_cast<const E*>(dh.raw()), static_cast<const E*>(gu.raw()),
          packs, row_packs);
    }
  });
  check_launch(op);
  return true;
}
}  // namespace

void CudaBackend::swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) {
  const char* op = "swiglu_backward";
  const std::int64_t T = swiglu_tokens(dh, gu, op), I = dh.dim(-1);
  require_numel(dgu, T * 2 * I, op, "gate/up gradient");
  if (swiglu_backward_packed_launch(dgu, nullptr, dh, gu, T, I, op)) return;
  launch_map(SwigluBackward{out_of(dgu), Out{}, in_of(dh), in_of(gu), I}, T * I, op);
}

void CudaBackend::swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu,
                                            ExecContext& ctx) {
  const char* op = "swiglu_backward_recompute";
  const std::int64_t T = swiglu_tokens(dh, gu, op), I = dh.dim(-1);
  require_numel(dgu, T * 2 * I, op, "gate/up gradient");
  require_numel(act, T * I, op, "recomputed activation");
  if (swiglu_backward_packed_launch(dgu, &act, dh, gu, T, I, op)) return;
  launch_map(SwigluBackward{out_of(dgu), out_of(act), in_of(dh), in_of(gu), I}, T * I, op);
}

void CudaBackend::swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                                 const Tensor& wdown, ExecContext& ctx) {
  const char* op = "swiglu_down_backward_recompute";
  SCALELAB_CHECK(wdown.rank() == 2, std::string("[") + op + "] down weight must be 2-D, got " + wdown.shape().str());
  const std::int64_t H = wdown.dim(0), I = wdown.dim(1);
  SCALELAB_CHECK(H > 0 && I > 0, std::string("[") + op + "] empty down weight");
  const std::int64_t T = dout.numel() / H;
  require_numel(dout, T * H, op, "output gradient");
  if (dwdown.defined()) require_numel(dwdown, H * I, op, "down weight gradient");
  require_numel(gu, T * 2 * I, op, "gate/up");
  require_numel(dgu, T * 2 * I, op, "gate/up gradient");
  if (T == 0) return;
  // As the CPU: one [T, I] scratch in the activation dtype holds dact, then the recomputed act.
  Tensor scratch = Tensor::empty({T, I}, dout.dtype(), *ctx.alloc, "mlp activation (recomputed)");
  gemm_ex(false, false, T, I, H, 1.0f, dout.raw(), dout.dtype(), H, wdown.raw(), wdown.dtype(), I, 0.0f,
          scratch.raw(), scratch.dtype(), I, ctx);  // dact = dout · Wdown
  swiglu_backward_recompute(dgu, scratch, scratch, gu, ctx);  // scratch: dact -> act
  if (!dwdown.defined()) return;  // a frozen down_proj: no weight gradient
  gemm_ex(true, false, H, I, T, 1.0f, dout.raw(), dout.dtype(), H, scratch.raw(), scratch.dtype(), I, 1.0f,
          dwdown.raw(), dwdown.dtype(), I, ctx);  // dWdown += doutᵀ · act
}

void CudaBackend::activation_forward(Tensor& y, const Tensor& x, Activation act, ExecContext& ctx) {
  const char* op = "activation_forward";
  require_numel(y, x.numel(), op, "output");
  if (act == Activation::kGELU) {
    launch_map(ActForward<true>{out_of(y), in_of(x)}, x.numel(), op);
  } else {
    launch_map(ActForward<false>{out_of(y), in_of(x)}, x.numel(), op);
  }
}

void CudaBackend::activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Activation act,
                                      ExecContext& ctx) {
  const char* op = "activation_backward";
  require_numel(dx, dy.numel(), op, "output");
  require_numel(x, dy.numel(), op, "input");
  if (act == Activation::kGELU) {
    launch_map(ActBackward<true>{out_of(dx), in_of(dy), in_of(x)}, dy.numel(), op);
  } else {
    launch_map(ActBackward<false>{out_of(dx), in_of(dy), in_of(x)}, dy.numel(), op);
  }
}

void CudaBackend::bias_add_(Tensor& y, const Tensor& b, ExecContext& ctx) {
  const char* op = "bias_add_";
  const std::int64_t F = b.numel();
  SCALELAB_CHECK(F > 0 && y.numel() % F == 0,
                 std::string("[") + op + "] bias of " + std::to_string(F) + " does not divide " + y.shape().str());
  launch_map(BiasAdd{out_of(y), in_of(b), F}, y.numel(), op);
}

void CudaBackend::bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext& ctx) {
  const char* op = "bias_relu_forward";
  const std::int64_t F = x.dim(-1);
  SCALELAB_CHECK(F > 0, std::string("[") + op + "] empty rows");
  require_numel(y, x.numel(), op, "output");
  if (b.defined()) require_numel(b, F, op, "bias");
  launch_map(BiasRelu{out_of(y), in_of(x), in_of(b), F}, x.numel(), op);
}

void CudaBackend::bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext& ctx) {
  const char* op = "bias_relu_backward";
  const std::int64_t F = y.dim(-1);
  SCALELAB_CHECK(F > 0, std::string("[") + op + "] empty rows");
  const std::int64_t rows = y.numel() / F;
  require_numel(dy, rows * F, op, "output gradient");
  require_numel(dx, rows * F, op, "input gradient");
  Out dbo = out_of(db);
  if (dbo.present()) {
    require_numel(*db, F, op, "bias gradient");
    // Before dx is written: dx may alias dy.
    column_sum_into(dbo, ReluMaskTerm{in_of(dy), in_of(y), F}, rows, F, ctx, op);
  }
  launch_map(ReluMask{out_of(dx), in_of(dy), in_of(y)}, rows * F, op);
}

}  // namespace scalelab::kernels::cuda
