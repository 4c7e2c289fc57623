// `scalelab oom-search [train flags]`: the largest micro-batch that fits, verified with real
// trials (b fits, b+1 runs out of memory), for the native engine or an external command.
#include <cstdio>

#include "cli/command.h"
#include "cli/lab_common.h"
#include "core/error.h"
#include "lab/oom_search.h"
#include "lab/runner.h"
#include "lab/views.h"
#include "cli/hf_predict_plan.h"

namespace scalelab::cli {


Subcommand add_oom_search_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "oom-search",
      "Find the largest micro-batch that fits, with real trials (b fits, b+1 runs out of memory). Flags it does not "
      "know are train flags (native) or placeholder values (--command/--spec)");
  app->allow_extras();
  struct Flags : SearchFlags {
    LabFlags lab;
    WorkloadFlags workload;
    int start = 1;
    std::string predict;
  };
  auto f = std::make_shared<Flags>();
  add_lab_flags(app, f->lab);
  add_workload_flags(app, f->workload);
  add_search_flags(app, *f, "oom-search", "the result (limit, probes, best trial's metrics)");
  app->add_option("--start", f->start, "First micro-batch to try when there is no memory plan")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  app->add_option("--predict", f->predict,
                  "Start at the largest micro-batch predicted for this stack (hf-trainer: PyTorch + Hugging Face "
                  "Trainer, docs/predict.md); a right prediction is proven with two trials");
  return {app, [f, app] {
            if (!f->predict.empty() && f->predict != "hf-trainer")
              throw InvalidInput("[oom-search] --predict " + f->predict + " is not supported — supported: hf-trainer");
            lab::TableFormat format = lab::parse_table_format(f->format);
            std::vector<std::string> forwarded = app->remaining();
            ResolvedWorkload w = resolve_workload(f->workload, forwarded, {"micro_batch_size"});
            if (w.params.count("micro_batch_size")) {
              throw InvalidInput("[oom-search] --micro-batch-size is what the search finds — use --start N for "
                                 "the first micro-batch to try");
            }
            apply_default_steps(w);
            InterruptFlag interrupt;
            lab::LabOptions options = lab_options(f->lab, interrupt.get());
            const std::string name =
                f->name.empty() ? default_sweep_name("oom-search", w, {{"max", f->max_micro_batch}}) : f->name;

            lab::Runner runner(options, "oom-search", name, w.notes);
            const lab::Json spec{{"workload", w.workload.describe()},
                                 {"params", lab::Json(w.params)},
                                 {"start", f->start},
                                 {"max_micro_batch", f->max_micro_batch},
                                 {"use_plan", !f->no_plan}};
            lab::TrialExecutor& exec = runner.open_sweep("oom-search", spec, w.workload);

            lab::OomSearchRequest req;
            req.base = w.params;
            req.settings.hint = f->start;
            req.settings.max_micro_batch = f->max_micro_batch;
            req.use_plan = !f->no_plan && (w.workload.is_native() || !f->predict.empty());
            const lab::PlanFn plan =
                f->predict.empty() ? lab::native_plan(exec) : hf_trainer_plan(launcher_of_command(w.workload.identity()));
            lab::OomSearchResult result;
            if (runner.run([&] { result = lab::run_oom_search(exec, req, plan); }) ==
                lab::RunnerOutcome::kInterrupted)
              return kExitInterrupted;
            runner.set_result(result.to_json());

            lab::Json out = result.to_json();
            out["sweep"] = name;
            out["db"] = runner.store().path();
            if (result.best) out["best_metrics"] = result.best->metrics;
            runner.print_table(lab::oom_search_table(*runner.store().find_sweep(name), runner.store(), {}), format,
                               f->json, out);
            runner.print_footer(false);
            if (result.failed) return exit_code(result.refused ? ErrorKind::kInvalidInput : ErrorKind::kRuntime);
            if (result.max_micro_batch_size == 0) return exit_code(ErrorKind::kOutOfMemory);  // not even 1 fits
            return 0;
          }};
}

}  // namespace scalelab::cli
