#pragma once
// --predict hf-trainer for `oom-search` and `ladder`: the largest micro-batch that
// `plan --stack hf-trainer` predicts (src/predict/) for a search's parameters (model, seq_len,
// device_memory; model_precision, mixed_precision, attn, activation_checkpointing, dropout,
// torch_version, transformers_version, launcher when given), as the search's first guess. The search then proves a right prediction with two trials
// (b fits, b+1 runs out of memory). Parameters it cannot predict for give no estimate (the search
// falls back to doubling and bisection) with the reason in the note.
#include "lab/oom_search.h"

namespace scalelab::cli {

// `launcher`: how the user's command starts the training when the parameters do not say
// (launcher_of_command): under torchrun accelerate wraps even one process in DDP.
lab::PlanFn hf_trainer_plan(const std::string& launcher = "python");

// "torchrun" when an external workload's command (Workload::identity()'s "command": a shell line
// or argv words) runs torchrun or python -m torch.distributed.run / .launch anywhere in it (behind
// srun, say), else "python".
std::string launcher_of_command(const lab::Json& identity);

}  // namespace scalelab::cli
