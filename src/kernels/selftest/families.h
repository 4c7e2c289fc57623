#pragma once
// One function per op family, each defined in selftest/<family>.cpp.
#include <vector>

#include "kernels/selftest.h"

namespace scalelab::kernels::selftest {

std::vector<OpCheck> matmul_checks();
std::vector<OpCheck> norm_checks();
std::vector<OpCheck> elementwise_checks();
std::vector<OpCheck> embedding_checks();
std::vector<OpCheck> rope_checks();
std::vector<OpCheck> dropout_checks();
std::vector<OpCheck> attention_checks();
std::vector<OpCheck> loss_checks();
std::vector<OpCheck> adamw_checks();

}  // namespace scalelab::kernels::selftest
