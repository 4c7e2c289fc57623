#pragma once
// Embedding lookup.
//   embedding_forward:  y[t, :] = table[ids[t], :]
//   embedding_backward: dtable[ids[t], :] += dy[t, :]   (parameter gradient: accumulates)
//     skip_id >= 0 leaves that row without gradient, as torch.nn.Embedding(padding_idx=skip_id)
//     does (OPT's pad_token_id 1); -1 skips nothing.
// ids are int32 in [0, rows); an id out of range throws InvalidInput naming it.
//
// Learned positional embeddings (OPT): token t of a [batch, seq] micro-batch sits at position
// t % seq, which reads row (t % seq) + offset of the table (OPT's offset is 2).
//   position_embedding_add_forward:  y[t, :] += table[t % seq + offset, :]   (added in place)
//   position_embedding_backward:     dtable[p + offset, :] += Σ_b dy[b·seq + p, :]
#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx);
void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx,
                        std::int64_t skip_id = -1);

void position_embedding_add_forward(Tensor& y, const Tensor& table, std::int64_t seq, std::int64_t offset,
                                    ExecContext& ctx);
void position_embedding_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq, std::int64_t offset,
                                 ExecContext& ctx);

}  // namespace scalelab::kernels
