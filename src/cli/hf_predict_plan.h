#pragma once
// --predict hf-trainer for `oom-search` and `ladder`: the largest micro-batch that
// `plan --stack hf-trainer` predicts (src/predict/) for a search's parameters (model, seq_len,
// device_memory; model_precision, mixed_precision, attn, activation_checkpointing, dropout,
// torch_version, transformers_version when given), as the search's first guess. The search then proves a right prediction with two trials
// (b fits, b+1 runs out of memory). Parameters it cannot predict for give no estimate (the search
// falls back to doubling and bisection) with the reason in the note.
#include "lab/oom_search.h"

namespace scalelab::cli {

lab::PlanFn hf_trainer_plan();

}  // namespace scalelab::cli
