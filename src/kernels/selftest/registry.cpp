#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

const std::vector<OpCheck>& all_op_checks() {
  static const std::vector<OpCheck> checks = [] {
    std::vector<OpCheck> all;
    for (auto family : {matmul_checks, norm_checks, elementwise_checks, embedding_checks, rope_checks,
                        dropout_checks, attention_checks, loss_checks, adamw_checks, qat_checks, nf4_checks}) {
      for (auto& c : family()) all.push_back(std::move(c));
    }
    return all;
  }();
  return checks;
}

}  // namespace scalelab::kernels::selftest
