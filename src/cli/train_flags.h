#pragma once
// The flags of `scalelab train`, shared with the commands that take the same flags (plan).
#include <CLI/CLI.hpp>

#include "distributed/dist_context.h"
#include "train/trainer.h"

namespace scalelab::cli {

void add_train_flags(CLI::App* app, TrainOptions& o);
// DPO's own flags (scalelab dpo): --pairs, --beta, --label-smoothing.
void add_dpo_flags(CLI::App* app, TrainOptions& o);

// Runs the training (`train`, `dpo`) on this rank and, on rank 0 with --json, writes the run
// record — also when the run fails: status "error", the message, the configuration, the world
// size and the launcher; the failure is then rethrown for the command's exit code.
TrainResult run_and_record(const TrainOptions& o, DistContext& dist);

}  // namespace scalelab::cli
