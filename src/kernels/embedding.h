#pragma once
// Embedding lookup.
//   embedding_forward:  y[t, :] = table[ids[t], :]
//   embedding_backward: dtable[ids[t], :] += dy[t, :]   (parameter gradient: accumulates)
// ids are int32 in [0, rows); an id out of range throws InvalidInput naming it.
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx);
void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx);

}  // namespace scalelab::kernels
