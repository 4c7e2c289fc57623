// Checks of the embedding family (see kernels/selftest.h for how a check works): token lookup and
// its scatter-add gradient, and OPT's learned position embeddings.
//
// Tolerances: a gather and position adds are exact conversions and single adds: the defaults of
// Tolerance. The scatter-add gradients sum each table row's contributions in fp32 in position
// (batch) order on every backend and add once, so they agree to the bit; the fp32 tolerance is
// 1e-6 (bf16 1e-2, fp16 2e-3 as elsewhere: one rounding of the same sum).
// The gradients accumulate: dtable starts from the same random values on both sides.
#include <cstdint>

#include "kernels/embedding.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

// 64 tokens over a vocabulary of 40: every id repeats.
constexpr std::int64_t kTokens = 64, kVocab = 40, kWidth = 96;

std::vector<CheckResult> embedding_forward_check(const CheckEnv& env, DType dt, DType table_dt) {
  Sides s(env);
  const Tolerance tol;
  const Tensor ids = random_ids({kTokens}, kVocab, *env.host, env.seed * 7 + 1);
  const Tensor table = s.rnd({kVocab, kWidth}, table_dt, 2);
  Tensor y = s.host_out({kTokens, kWidth}, dt);
  embedding_forward(y, ids, table, s.host);
  Tensor yd = s.dev_out({kTokens, kWidth}, dt);
  embedding_forward(yd, s.on_dev(ids), s.on_dev(table), s.dev);
  return {compare("y", yd, y, tol, dt)};
}

std::vector<CheckResult> embedding_backward_check(const CheckEnv& env, DType dt, bool skip) {
  Sides s(env);
  Tolerance tol;
  tol.f32 = 1e-6;  // the same fp32 sums in the same order (see the top of the file)
  const Tensor ids = random_ids({kTokens}, kVocab, *env.host, env.seed * 7 + 3);
  // skip_id: an id that occurs (the first token's), as OPT's padding does.
  const std::int64_t skip_id = skip ? ids.data<std::int32_t>()[0] : -1;
  const Tensor dy = s.rnd({kTokens, kWidth}, dt, 4), dt0 = s.rnd({kVocab, kWidth}, dt, 5);
  Tensor dtable = s.host_copy(dt0);
  embedding_backward(dtable, dy, ids, s.host, skip_id);
  Tensor dtabled = s.on_dev(dt0);
  embedding_backward(dtabled, s.on_dev(dy), s.on_dev(ids), s.dev, skip_id);
  return {compare(skip ? "dtable (skip_id)" : "dtable", dtabled, dtable, tol, dt)};
}

std::vector<CheckResult> position_check(const CheckEnv& env, DType dt) {
  Sides s(env);
  const Tolerance tol;
  const std::int64_t seq = 16, offset = 2, rows = seq + offset + 3;  // 4 sequences of 16
  const Tensor table = s.rnd({rows, kWidth}, dt, 11), y0 = s.rnd({kTokens, kWidth}, dt, 12);
  Tensor y = s.host_copy(y0);
  position_embedding_add_forward(y, table, seq, offset, s.host);
  Tensor yd = s.on_dev(y0);
  position_embedding_add_forward(yd, s.on_dev(table), seq, offset, s.dev);
  Tolerance gtol;
  gtol.f32 = 1e-6;  // batch-order fp32 sums on both sides
  const Tensor dy = s.rnd({kTokens, kWidth}, dt, 13), dt0 = s.rnd({rows, kWidth}, dt, 14);
  Tensor dtable = s.host_copy(dt0);
  position_embedding_backward(dtable, dy, seq, offset, s.host);
  Tensor dtabled = s.on_dev(dt0);
  position_embedding_backward(dtabled, s.on_dev(dy), seq, offset, s.dev);
  return {compare("y (added in place)", yd, y, tol, dt), compare("dtable", dtabled, dtable, gtol, dt)};
}

}  // namespace

std::vector<OpCheck> embedding_checks() {
  return {
      {"embedding", "embedding", kAll,
       [](const CheckEnv& env, DType dt) { return embedding_forward_check(env, dt, dt); }},
      // An fp32 table (master weights) gathered into low-precision activations.
      {"embedding", "embedding (fp32 table)", kAll,
       [](const CheckEnv& env, DType dt) { return embedding_forward_check(env, dt, DType::kF32); }},
      {"embedding", "embedding_backward", kAll,
       [](const CheckEnv& env, DType dt) { return embedding_backward_check(env, dt, false); }},
      {"embedding", "embedding_backward (skip_id)", kAll,
       [](const CheckEnv& env, DType dt) { return embedding_backward_check(env, dt, true); }},
      {"embedding", "position_embedding", kAll, position_check},
  };
}

}  // namespace scalelab::kernels::selftest
