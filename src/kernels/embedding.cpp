// Front of the embedding family (embedding.h): validation, profiling, dispatch. The ids are
// checked against the table by the backend, which is where they can be read.
#include "kernels/embedding.h"

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx) {
  ProfileScope prof(ctx, "embedding", Phase::kForward);
  const char* op = "embedding_forward";
  require_dtype(ids, DType::kI32, op, "ids");
  require_numel(y, ids.numel() * table.dim(1), op, "output");
  backend_for(device_of(op, {&y, &ids, &table}), op).embedding_forward(y, ids, table, ctx);
}

void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx, std::int64_t skip_id) {
  ProfileScope prof(ctx, "embedding", Phase::kBackward);
  const char* op = "embedding_backward";
  require_dtype(ids, DType::kI32, op, "ids");
  require_numel(dy, ids.numel() * dtable.dim(1), op, "output gradient");
  backend_for(device_of(op, {&dtable, &dy, &ids}), op).embedding_backward(dtable, dy, ids, ctx, skip_id);
}

namespace {

using PositionMethod = void (Backend::*)(Tensor&, const Tensor&, std::int64_t, std::int64_t, ExecContext&);

// The learned positions' forward (y += rows of the table) and backward (table rows += dy) check
// the same fit of the tokens (the rows of `acts`, y or dy) to the table: one front serves both.
void positions(PositionMethod method, const char* op, Phase phase, Tensor& out, const Tensor& in,
               const Tensor& table, const Tensor& acts, std::int64_t seq, std::int64_t offset, ExecContext& ctx) {
  ProfileScope prof(ctx, "embedding", phase);
  const std::int64_t tokens = acts.numel() / table.dim(1);
  SCALELAB_CHECK(seq > 0 && tokens % seq == 0 && seq + offset <= table.dim(0),
                 std::string("[") + op + "] " + std::to_string(tokens) + " tokens of sequence length " +
                     std::to_string(seq) + " do not fit the table of " + std::to_string(table.dim(0)) + " rows");
  (backend_for(device_of(op, {&out, &in}), op).*method)(out, in, seq, offset, ctx);
}

}  // namespace

void position_embedding_add_forward(Tensor& y, const Tensor& table, std::int64_t seq, std::int64_t offset,
                                    ExecContext& ctx) {
  positions(&Backend::position_embedding_add_forward, "position_embedding_add_forward", Phase::kForward, y, table,
            /*table=*/table, /*acts=*/y, seq, offset, ctx);
}

void position_embedding_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq, std::int64_t offset,
                                 ExecContext& ctx) {
  positions(&Backend::position_embedding_backward, "position_embedding_backward", Phase::kBackward, dtable, dy,
            /*table=*/dtable, /*acts=*/dy, seq, offset, ctx);
}

}  // namespace scalelab::kernels
