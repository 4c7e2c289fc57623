// Flash attention through cuDNN's fused SDPA (see attention_cudnn.h). Compiled by the host
// compiler: the cuDNN frontend is host C++ (header-only, fetched by scripts/cudnn-frontend.sh);
// without it, or without cuDNN, this file only says why (SCALELAB_WITH_CUDNN is 0).
//
// cuDNN is opened on first use, not linked: the frontend's own dynamic loading
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, set by src/CMakeLists.txt for this file) resolves every
// cuDNN, CUDA runtime and NVRTC call through dlsym, and cudnn() below opens libcudnn.so.<major>.
// Linked, the frontend's NVRTC references alone mapped libnvrtc into every process (29 MB of
// resident memory in each CPU run); a machine without cuDNN now runs scalelab's own kernels.
#include "kernels/cuda/attention_cudnn.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

#if SCALELAB_WITH_CUDNN
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "kernels/cuda/runtime.h"

// The handle the frontend's shims read (cudnn_frontend_shim.h declares it extern).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace scalelab::kernels::cuda {

namespace {

// SCALELAB_CUDA_FLASH=own forces scalelab's kernels (to compare); "cudnn" or unset: cuDNN first.
bool cudnn_wanted() {
  const char* v = std::getenv("SCALELAB_CUDA_FLASH");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "cudnn") == 0) return true;
  if (std::strcmp(v, "own") == 0) return false;
  throw InvalidInput(std::string("[SCALELAB_CUDA_FLASH] '") + v + "' is not one of: cudnn (the default), own");
}

}  // namespace

#if !SCALELAB_WITH_CUDNN

bool cudnn_flash_forward(Tensor&, Tensor&, const Tensor&, const AttentionShape&, float, ExecContext&) {
  (void)cudnn_wanted();
  return false;
}
bool cudnn_flash_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionShape&,
                          float, ExecContext&) {
  return false;
}
std::string cudnn_flash_status() {
  return "scalelab's kernel (this build has no cuDNN frontend: run scripts/cudnn-frontend.sh and reconfigure)";
}

#else

namespace fe = cudnn_frontend;

namespace {

#define SCALELAB_CUDNN_STR2(x) #x
#define SCALELAB_CUDNN_STR(x) SCALELAB_CUDNN_STR2(x)
// The soname of the cuDNN major version this was compiled against (another major is another ABI).
constexpr const char* kCudnnSoname = "libcudnn.so." SCALELAB_CUDNN_STR(CUDNN_MAJOR);

// Tensor uids of the variant packs.
enum : std::int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

struct Key {
  bool backward;
  std::int64_t b, s, nh, nkv, hd;
  int dtype;
  std::uint32_t scale_bits;
  bool operator<(const Key& o) const {
    return std::tie(backward, b, s, nh, nkv, hd, dtype, scale_bits) <
           std::tie(o.backward, o.b, o.s, o.nh, o.nkv, o.hd, o.dtype, o.scale_bits);
  }
};

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN refused this case
  std::int64_t workspace = 0;
  std::string error;
};

struct Cudnn {
  cudnnHandle_t handle = nullptr;
  std::string error;  // why cuDNN is unusable in this process
  std::mutex mu;
  std::map<Key, Entry> graphs;
};

Cudnn& cudnn() {
  static Cudnn c;
  static std::once_flag once;
  std::call_once(once, [] {
    // The frontend would pick libcudart.so.12 over .13 when both are on the search path: name ours
    // (a user's own setting wins).
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", ("libcudart.so." + std::to_string(CUDART_VERSION / 1000)).c_str(), 0);
    fe::cudnn_dlhandle = dlopen(kCudnnSoname, RTLD_NOW | RTLD_LOCAL);  // kept for the process
    if (fe::cudnn_dlhandle == nullptr) {
      const char* why = dlerror();
      c.error = std::string("cuDNN could not be loaded: ") + (why ? why : kCudnnSoname);
      return;
    }
    try {
      const cudnnStatus_t st = fe::detail::create_handle(&c.handle);
      if (st != CUDNN_STATUS_SUCCESS) {
        c.error = std::string("cudnnCreate failed: ") + fe::detail::get_error_string(st);
        c.handle = nullptr;
      }
    } catch (const std::exception& e) {  // a symbol the shims could not resolve
      c.error = e.what();
      c.handle = nullptr;
    }
  });
  return c;
}

// The packed layouts as cuDNN's [batch, heads, seq, head_dim] dims and strides.
struct Layout {
  std::vector<std::int64_t> q_dim, kv_dim, qkv_stride, o_dim, o_stride, stats_dim, stats_stride;
};

Layout layout_of(const AttentionShape& s) {
  const std::int64_t W = s.qkv_width(), O = s.out_width();
  Layout l;
  l.q_dim = {s.batch, s.n_heads, s.seq, s.head_dim};
  l.kv_dim = {s.batch, s.n_kv_heads, s.seq, s.head_dim};
  l.qkv_stride = {s.seq * W, s.head_dim, W, 1};
  l.o_dim = l.q_dim;
  l.o_stride = {s.seq * O, s.head_dim, O, 1};
  l.stats_dim = {s.batch, s.n_heads, s.seq, 1};
  l.stats_stride = {s.n_heads * s.seq, s.seq, 1, 1};
  return l;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, std::int64_t uid,
                                                    const std::vector<std::int64_t>& dim,
                                                    const std::vector<std::int64_t>& stride) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

Entry build(const Key& k, const AttentionShape& s, float scale, DType dt, cudnnHandle_t handle) {
  const Layout l = layout_of(s);
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dt == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto Q = input(*g, "Q", kQ, l.q_dim, l.qkv_stride);
  auto K = input(*g, "K", kK, l.kv_dim, l.qkv_stride);
  auto V = input(*g, "V", kV, l.kv_dim, l.qkv_stride);
  if (!k.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("scalelab_flash_forward")
                    .set_generate_stats(true)
                    .set_attn_scale(scale)
                    .set_causal_mask(true);
    auto [O, Stats] = g->sdpa(Q, K, V, opts);
    O->set_output(true).set_uid(kO).set_dim(l.o_dim).set_stride(l.o_stride);
    Stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(l.stats_dim)
        .set_stride(l.stats_stride);
  } else {
    auto O = input(*g, "O", kO, l.o_dim, l.o_stride);
    auto dO = input(*g, "dO", kdO, l.o_dim, l.o_stride);
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim(l.stats_dim)
                               .set_stride(l.stats_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("scalelab_flash_backward")
                    .set_attn_scale(scale)
                    .set_causal_mask(true);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
    dQ->set_output(true).set_uid(kdQ).set_dim(l.q_dim).set_stride(l.qkv_stride);
    dK->set_output(true).set_uid(kdK).set_dim(l.kv_dim).set_stride(l.qkv_stride);
    dV->set_output(true).set_uid(kdV).set_dim(l.kv_dim).set_stride(l.qkv_stride);
  }
  Entry e;
  auto st = g->build(handle, {fe::HeurMode_t::A});
  if (!st.is_good()) {
    e.error = st.get_message();
    return e;
  }
  if (!g->get_workspace_size(e.workspace).is_good()) {
    e.error = "cuDNN did not report a workspace size";
    return e;
  }
  e.graph = std::move(g);
  return e;
}

// The cached graph for this case, or null (after saying once why) when cuDNN cannot run it.
const Entry* graph_for(bool backward, const Tensor& qkv, const AttentionShape& s, float scale) {
  if (!cudnn_wanted()) return nullptr;
  const DType dt = qkv.dtype();
  if (dt != DType::kBF16 && dt != DType::kF16) return nullptr;  // cuDNN's SDPA has no fp32 path
  Cudnn& c = cudnn();
  if (c.handle == nullptr) return nullptr;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &scale, sizeof bits);
  const Key k{backward, s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim, static_cast<int>(dt), bits};
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.graphs.find(k);
  if (it == c.graphs.end()) {
    it = c.graphs.emplace(k, build(k, s, scale, dt, c.handle)).first;
    if (!it->second.graph) {
      std::fprintf(stderr,
                   "scalelab: cuDNN's SDPA %s refused batch %lld, seq %lld, heads %lld/%lld, head_dim %lld (%s); "
                   "using scalelab's flash kernel\n",
                   backward ? "backward" : "forward", static_cast<long long>(s.batch),
                   static_cast<long long>(s.seq), static_cast<long long>(s.n_heads),
                   static_cast<long long>(s.n_kv_heads), static_cast<long long>(s.head_dim),
                   it->second.error.c_str());
    }
  }
  return it->second.graph ? &it->second : nullptr;
}

void run(const Entry& e, std::unordered_map<std::int64_t, void*>& pack, ExecContext& ctx, const char* op) {
  Cudnn& c = cudnn();
  Tensor ws;
  if (e.workspace > 0) {
    ws = Tensor::empty({(e.workspace + 3) / 4}, DType::kF32, *ctx.alloc, "attention workspace");
  }
  const cudnnStatus_t st = fe::detail::set_stream(c.handle, stream());
  if (st != CUDNN_STATUS_SUCCESS) {
    throw RuntimeError(std::string("[") + op + "] cudnnSetStream: " + fe::detail::get_error_string(st));
  }
  auto r = e.graph->execute(c.handle, pack, ws.defined() ? ws.raw() : nullptr);
  if (!r.is_good()) throw RuntimeError(std::string("[") + op + "] cuDNN SDPA failed: " + r.get_message());
  check(cudaGetLastError(), op);
}

void* ptr(const Tensor& t, std::int64_t element_offset = 0) {
  return static_cast<char*>(t.raw()) + element_offset * static_cast<std::int64_t>(dtype_size(t.dtype()));
}

}  // namespace

bool cudnn_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s, float scale,
                         ExecContext& ctx) {
  const Entry* e = graph_for(false, qkv, s, scale);
  if (e == nullptr) return false;
  std::unordered_map<std::int64_t, void*> pack = {{kQ, ptr(qkv)},
                                                  {kK, ptr(qkv, s.n_heads * s.head_dim)},
                                                  {kV, ptr(qkv, (s.n_heads + s.n_kv_heads) * s.head_dim)},
                                                  {kO, ptr(out)},
                                                  {kStats, ptr(lse)}};
  run(*e, pack, ctx, "attention_flash_forward");
  return true;
}

bool cudnn_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                          const AttentionShape& s, float scale, ExecContext& ctx) {
  const Entry* e = graph_for(true, qkv, s, scale);
  if (e == nullptr) return false;
  const std::int64_t k_off = s.n_heads * s.head_dim, v_off = (s.n_heads + s.n_kv_heads) * s.head_dim;
  std::unordered_map<std::int64_t, void*> pack = {{kQ, ptr(qkv)},   {kK, ptr(qkv, k_off)},   {kV, ptr(qkv, v_off)},
                                                  {kO, ptr(out)},   {kdO, ptr(dout)},        {kStats, ptr(lse)},
                                                  {kdQ, ptr(dqkv)}, {kdK, ptr(dqkv, k_off)}, {kdV, ptr(dqkv, v_off)}};
  run(*e, pack, ctx, "attention_flash_backward");
  return true;
}

std::string cudnn_flash_status() {
  if (!cudnn_wanted()) return "scalelab's kernel (SCALELAB_CUDA_FLASH=own)";
  Cudnn& c = cudnn();
  if (c.handle == nullptr) return "scalelab's kernel (" + c.error + ")";
  const std::size_t v = fe::detail::get_backend_version();
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         " SDPA for bf16/fp16 (SCALELAB_CUDA_FLASH=own: scalelab's kernel)";
}

#endif

}  // namespace scalelab::kernels::cuda
