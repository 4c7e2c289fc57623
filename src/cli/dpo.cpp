// `scalelab dpo`: Direct Preference Optimization with the native trainer (train/dpo.h): the flags of
// `scalelab train` (LoRA, QLoRA, --save-every / --resume included; --val-data names held-out
// preference pairs) plus --pairs, --beta and --label-smoothing.
#include <cstdio>
#include <memory>

#include "cli/dpo.h"
#include "cli/train_flags.h"
#include "core/allocator.h"
#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/dist_context.h"
#include "train/device_setup.h"
#include "train/trainer.h"

namespace scalelab::cli {

Subcommand add_dpo_command(CLI::App& root) {
  auto opts = std::make_shared<TrainOptions>();
  auto* app = root.add_subcommand(
      "dpo",
      "Direct Preference Optimization on {prompt, chosen, rejected} pairs (the train flags, LoRA included; "
      "docs/finetuning.md)");
  add_train_flags(app, *opts);
  add_dpo_flags(app, *opts);
  return {app, [opts, app] {
            TrainOptions o = *opts;
            o.dpo.enabled = true;
            if (o.dpo.pairs.empty()) {
              throw InvalidInput("[--pairs] is required: a JSONL file with one {\"prompt\", \"chosen\", \"rejected\"} "
                                 "object per line");
            }
            if (app->count("--data") > 0) {
              throw InvalidInput("[--data] dpo reads preference pairs from --pairs (and held-out pairs from "
                                 "--val-data); --data has no meaning here — drop it");
            }
            validate_train_options(o);
            validate_dpo_options(o.dpo);
            parse_train_device(o.device);
            DistContext dist = make_dist_context(o.dist.backend(), o.device == "cuda", o.dist.comm_options());
            const bool leader = dist.rank() == 0;
            const TrainResult r = run_and_record(o, dist);  // the run record, also of a failed run
            if (r.status == RunStatus::kOom) {
              std::fprintf(stderr, "scalelab dpo: out of device memory: %s\n", r.error.c_str());
              std::fprintf(stderr, "Memory plan for this configuration (scalelab plan --dpo ... shows it whole): "
                                   "%s predicted, largest micro-batch that fits: %lld\n",
                           format_bytes(r.plan["total_bytes"].get<std::size_t>()).c_str(),
                           static_cast<long long>(r.plan["max_micro_batch_size"].get<std::int64_t>()));
              linger_after_failure();
              return exit_code(ErrorKind::kOutOfMemory);
            }
            if (!leader) return 0;
            std::printf("Training throughput: %.2f tokens/s/device (chosen and rejected sequences)\n",
                        r.tokens_per_s_per_device);
            std::printf("Max reserved memory: %.2f GiB\n", static_cast<double>(r.max_reserved_bytes) / (1u << 30));
            std::printf("Step time (median): %.3f s over %lld measured steps\n", r.step_time_s,
                        static_cast<long long>(r.measured_steps));
            if (!r.steps.empty() && r.steps.back().dpo) {
              const DpoStats& d = *r.steps.back().dpo;
              std::printf("Final DPO loss: %.4f\n", r.steps.back().loss);
              std::printf("Final rewards: chosen %.4f, rejected %.4f, margin %.4f, accuracy %.3f\n", d.rewards_chosen,
                          d.rewards_rejected, d.margin, d.accuracy);
            }
            if (!r.evals.empty() && r.evals.back().dpo) {
              const DpoStats& d = *r.evals.back().dpo;
              std::printf("Validation (%lld held-out pairs): loss %.4f, rewards chosen %.4f, rejected %.4f, "
                          "margin %.4f, accuracy %.3f\n",
                          static_cast<long long>(d.pairs), d.loss, d.rewards_chosen, d.rewards_rejected, d.margin,
                          d.accuracy);
            }
            std::printf("Reference: %s\n", r.config.value("dpo_reference", std::string("?")).c_str());
            if (!o.json.empty()) std::printf("Run record: %s\n", o.json.c_str());
            return 0;
          }};
}

}  // namespace scalelab::cli
