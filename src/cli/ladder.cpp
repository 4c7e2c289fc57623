// `scalelab ladder [train flags]`: climbs the optimization ladder (baseline, its OOM limit, bf16
// mixed precision, full bf16, flash attention, fused kernels, each reinvested in a larger
// micro-batch) with real trials, records them, and prints the seeds' table.
#include <cstdio>

#include "cli/command.h"
#include "cli/hf_predict_plan.h"
#include "cli/lab_common.h"
#include "core/error.h"
#include "lab/ladder.h"
#include "lab/runner.h"
#include "lab/views.h"

namespace scalelab::cli {

Subcommand add_ladder_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "ladder",
      "Climb the optimization ladder (baseline -> OOM limit -> bf16 mixed -> full bf16 -> flash attention -> fused "
      "kernels, re-searching the micro-batch) and print the table. Flags it does not know are train flags (native) "
      "or placeholder values (--command/--spec)");
  app->allow_extras();
  struct Flags : SearchFlags {
    LabFlags lab;
    WorkloadFlags workload;
    std::string predict;
  };
  auto f = std::make_shared<Flags>();
  add_lab_flags(app, f->lab);
  add_workload_flags(app, f->workload);
  add_search_flags(app, *f, "ladder", "the ladder (rungs with their trials' metrics)");

  app->add_option("--predict", f->predict,
                  "Start each rung's search at the micro-batch predicted for this stack (hf-trainer: PyTorch + Hugging "
                  "Face Trainer, docs/predict.md; rungs it cannot predict fall back to doubling)");
  return {app, [f, app] {
            if (!f->predict.empty() && f->predict != "hf-trainer")
              throw InvalidInput("[ladder] --predict " + f->predict + " is not supported — supported: hf-trainer");
            lab::TableFormat format = lab::parse_table_format(f->format);
            ResolvedWorkload w = resolve_workload(f->workload, app->remaining(), lab::kLadderParameters);
            int start = 1;
            if (auto it = w.params.find("micro_batch_size"); it != w.params.end()) {
              if (!it->second.is_number_integer() || it->second.get<long long>() < 1) {
                throw InvalidInput("[ladder] --micro-batch-size (the baseline's) must be a positive integer");
              }
              start = static_cast<int>(it->second.get<long long>());
              w.params.erase(it);
            }
            apply_default_steps(w);
            InterruptFlag interrupt;
            lab::LabOptions options = lab_options(f->lab, interrupt.get());
            const std::string name =
                f->name.empty() ? default_sweep_name("ladder", w, {{"start", start}, {"max", f->max_micro_batch}})
                                : f->name;

            lab::Runner runner(options, "ladder", name, w.notes);
            const lab::Json spec{{"workload", w.workload.describe()},
                                 {"params", lab::Json(w.params)},
                                 {"start_micro_batch", start},
                                 {"max_micro_batch", f->max_micro_batch},
                                 {"use_plan", !f->no_plan}};
            lab::TrialExecutor& exec = runner.open_sweep("ladder", spec, w.workload);

            lab::LadderRequest req;
            req.base = w.params;
            req.start_micro_batch = start;
            req.max_micro_batch = f->max_micro_batch;
            req.use_plan = !f->no_plan && (w.workload.is_native() || !f->predict.empty());
            const lab::PlanFn plan =
                f->predict.empty() ? lab::native_plan(exec) : hf_trainer_plan(launcher_of_command(w.workload.identity()));
            req.on_rung = [&](const lab::LadderResult& partial) { runner.set_result(partial.to_json()); };
            lab::LadderResult ladder;
            if (runner.run([&] { ladder = lab::run_ladder(exec, req, plan); }) ==
                lab::RunnerOutcome::kInterrupted)
              return kExitInterrupted;
            runner.set_result(ladder.to_json());

            const lab::Table table = lab::ladder_table(ladder, runner.store());
            runner.print_table(table, format, f->json, runner.table_json(table, "rungs"));
            runner.print_footer();
            bool any_ok = false;
            for (const auto& r : ladder.rungs) any_ok = any_ok || r.status == lab::RungStatus::kOk;
            return any_ok ? 0 : exit_code(ErrorKind::kRuntime);
          }};
}

}  // namespace scalelab::cli
