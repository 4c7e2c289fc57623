// Front of the nf4 family (nf4.h): validation, profiling, dispatch to the weight's backend.
#include "kernels/nf4.h"

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

// QLoRA's NormalFloat4 values as bitsandbytes writes them (get_4bit_type("nf4")), cast to fp32;
// torchao's NF4Tensor.from_tensor rounds them to four decimals (kNf4TableTorchao).
const float kNf4Table[16] = {-1.0f,
                             -0.6961928009986877f,
                             -0.5250730514526367f,
                             -0.39491748809814453f,
                             -0.28444138169288635f,
                             -0.18477343022823334f,
                             -0.09105003625154495f,
                             0.0f,
                             0.07958029955625534f,
                             0.16093020141124725f,
                             0.24611230194568634f,
                             0.33791524171829224f,
                             0.44070982933044434f,
                             0.5626170039176941f,
                             0.7229568362236023f,
                             1.0f};

const float kNf4TableTorchao[16] = {-1.0f,   -0.6962f, -0.5251f, -0.3949f, -0.2844f, -0.1848f, -0.0911f, 0.0f,
                                    0.0796f, 0.1609f,  0.2461f,  0.3379f,  0.4407f,  0.5626f,  0.7230f,  1.0f};

void nf4_dequantize(Tensor& out, const Nf4View& w, std::int64_t row0, ExecContext& ctx) {
  ProfileScope prof(ctx, "nf4", Phase::kForward);
  const char* op = "nf4_dequantize";
  require_dtype(out, DType::kF32, op, "output tile");
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
