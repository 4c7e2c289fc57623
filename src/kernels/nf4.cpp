// Front of the nf4 family (nf4.h): validation, profiling, dispatch to the weight's backend.
#include "kernels/nf4.h"

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void nf4_dequantize(Tensor& out, const Nf4View& w, std::int64_t row0, ExecContext& ctx, Phase phase) {
  ProfileScope prof(ctx, "nf4", phase);
  const char* op = "nf4_dequantize";
  SCALELAB_CHECK(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16 || out.dtype() == DType::kF16,
                 std::string("[") + op + "] the output tile must be fp32, bf16 or fp16, got " +
                     std::string(dtype_name(out.dtype())));
  SCALELAB_CHECK(out.rank() == 2 && out.dim(1) == w.cols,
                 std::string("[") + op + "] tile " + out.shape().str() + " does not have the weight's " +
                     std::to_string(w.cols) + " columns");
  SCALELAB_CHECK(row0 >= 0 && row0 + out.dim(0) <= w.rows,
                 std::string("[") + op + "] rows [" + std::to_string(row0) + ", " + std::to_string(row0 + out.dim(0)) +
                     ") outside the weight's " + std::to_string(w.rows));
  SCALELAB_CHECK(w.flavor == Nf4Flavor::kTorchao || w.dynamic_map != nullptr || out.device() == DeviceType::kMeta,
                 std::string("[") + op + "] a bitsandbytes weight needs its dynamic map");
  SCALELAB_CHECK(out.device() == w.device, std::string("[") + op + "] the tile is on " +
                                               std::string(device_type_name(out.device())) + ", the weight on " +
                                               std::string(device_type_name(w.device)));
  switch (out.device()) {
    case DeviceType::kCPU: cpu::nf4_dequantize(out, w, row0, ctx); break;
    case DeviceType::kMeta: break;  // the tile is the caller's; the kernel allocates nothing
    default:
      backend_for(out.device(), op);  // throws BackendUnavailable (with the reason) when not usable
      cuda::nf4_dequantize(out, w, row0, ctx);
  }
}

}  // namespace scalelab::kernels
