#pragma once
// One function per op family, each defined in selftest/<family>.cpp.
#include <vector>

#include "core/context.h"
#include "kernels/selftest.h"

namespace scalelab::kernels::selftest {

// Host and device contexts of a check, and the tensor makers the checks use.
struct Sides {
  const CheckEnv& env;
  ExecContext host;
  ExecContext dev;
  explicit Sides(const CheckEnv& e) : env(e), host{e.host, nullptr}, dev{e.device, nullptr} {}
  // Random values (never all zeros) on the host; k distinguishes the tensors of one check.
  Tensor rnd(const Shape& s, DType dt, std::uint64_t k, float lo = -1.0f, float hi = 1.0f) const {
    return random_tensor(s, dt, *env.host, env.seed * 1000003u + k, lo, hi);
  }
  Tensor on_dev(const Tensor& t) const { return to_device(t, *env.device); }
  Tensor host_copy(const Tensor& t) const { return t.to(*env.host); }
  // An output to be written: NaN-filled on its side, so an unwritten element fails the compare.
  Tensor host_out(const Shape& s, DType dt) const { return poisoned(s, dt, *env.host); }
  Tensor dev_out(const Shape& s, DType dt) const { return poisoned(s, dt, *env.device); }
};

// Every float storage dtype.
inline const std::vector<DType> kAll = {DType::kF32, DType::kBF16, DType::kF16};

std::vector<OpCheck> matmul_checks();
std::vector<OpCheck> norm_checks();
std::vector<OpCheck> elementwise_checks();
std::vector<OpCheck> embedding_checks();
std::vector<OpCheck> rope_checks();
std::vector<OpCheck> dropout_checks();
std::vector<OpCheck> attention_checks();
std::vector<OpCheck> loss_checks();
std::vector<OpCheck> adamw_checks();
std::vector<OpCheck> qat_checks();
std::vector<OpCheck> nf4_checks();

}  // namespace scalelab::kernels::selftest
