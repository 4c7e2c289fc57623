#pragma once
// The flags of `scalelab train`, shared with the commands that take the same flags (plan).
#include <CLI/CLI.hpp>

#include "train/trainer.h"

namespace scalelab::cli {

void add_train_flags(CLI::App* app, TrainOptions& o);
// DPO's own flags (scalelab dpo): --pairs, --beta, --label-smoothing.
void add_dpo_flags(CLI::App* app, TrainOptions& o);

}  // namespace scalelab::cli
