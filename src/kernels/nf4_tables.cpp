// The NF4 value tables (nf4.h), data only: a translation unit of their own so that the parsers'
// fuzz build (tests/fuzz/) links the NF4 layout checks without the kernel dispatch.
#include "kernels/nf4.h"

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

}  // namespace scalelab::kernels
