// `scalelab ladder [train flags]`: climbs the optimization ladder (baseline, its OOM limit, bf16
// mixed precision, full bf16, flash attention, fused kernels, each reinvested in a larger
// micro-batch) with real trials, records them, and prints the seeds' table.
#include <cstdio>

#include "cli/command.h"
#include "cli/lab_common.h"
#include "lab/ladder.h"
#include "lab/views.h"

namespace scalelab::cli {

Subcommand add_ladder_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "ladder",
      "Climb the optimization ladder (baseline -> OOM limit -> bf16 mixed -> full bf16 -> flash attention -> fused "
      "kernels, re-searching the micro-batch) and print the table. Flags it does not know are train flags (native) "
      "or placeholder values (--command/--spec)");
  app->allow_extras();
  struct Flags {
    LabFlags lab;
    WorkloadFlags workload;
    std::string name;
    std::string json;
    std::string format = "md";
    int max_micro_batch = 4096;
    bool no_plan = false;
  };
  auto f = std::make_shared<Flags>();
  add_lab_flags(app, f->lab);
  add_workload_flags(app, f->workload);
  app->add_option("--name", f->name, "Record under this name [default: ladder-<model>-<hash of the config>]");
  app->add_option("--max-micro-batch", f->max_micro_batch, "Never try a larger micro-batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_flag("--no-plan", f->no_plan, "Do not ask the engine's memory plan (`scalelab plan`) for first guesses");
  app->add_option("--json", f->json, "Also write the ladder (rungs with their trials' metrics) to this file");
  app->add_option("--format", f->format, "Table format: md, csv or json")->capture_default_str();

  return {app, [f, app] {
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

            lab::Progress progress(stderr, lab::Progress::is_terminal(stderr));
            if (!w.notes.empty()) progress.note(w.notes.substr(0, w.notes.size() - 1));
            lab::RunnerLock lock(options.db_path, "ladder " + name, options.wait_for_lock, options.cancel,
                                 [&](const std::string& m) { progress.note(m); });
            lab::ResultsStore store(options.db_path, lab::ResultsStore::Mode::kReadWrite);
            lab::Json spec{{"workload", w.workload.describe()},
                           {"params", lab::Json(w.params)},
                           {"start_micro_batch", start},
                           {"max_micro_batch", f->max_micro_batch},
                           {"use_plan", !f->no_plan}};
            std::int64_t sweep_id = store.ensure_sweep(name, "ladder", spec);
            store.set_sweep_result(sweep_id, lab::Json());
            lab::TrialExecutor exec(store, sweep_id, name, w.workload, options, progress);

            lab::LadderRequest req;
            req.base = w.params;
            req.start_micro_batch = start;
            req.max_micro_batch = f->max_micro_batch;
            req.use_plan = !f->no_plan && w.workload.is_native();
            req.on_rung = [&](const lab::LadderResult& partial) { store.set_sweep_result(sweep_id, partial.to_json()); };
            lab::LadderResult ladder;
            try {
              ladder = lab::run_ladder(exec, req, lab::native_plan(exec));
            } catch (const lab::Interrupted& e) {
              return report_interrupted(e, options.db_path,
                                        "run the same command again to resume (recorded trials are reused).");
            }
            progress.finish();
            store.set_sweep_result(sweep_id, ladder.to_json());

            lab::Table table = lab::ladder_table(ladder, store);
            std::fputs(lab::render(table, format).c_str(), stdout);
            if (format != lab::TableFormat::kMarkdown)
              for (const auto& n : table.notes) std::fprintf(stderr, "%s\n", n.c_str());
            if (!f->json.empty()) {
              lab::Json out{{"sweep", name}, {"db", store.path()}, {"rungs", table.rows}, {"notes", table.notes}};
              write_text_file(f->json, out.dump(2) + "\n", "--json");
            }
            std::fprintf(stderr, "\nResults: %s (scalelab results --db %s --sweep %s); logs in %s\n",
                         store.path().c_str(), store.path().c_str(), name.c_str(), exec.log_dir().c_str());
            bool any_ok = false;
            for (const auto& r : ladder.rungs) any_ok = any_ok || r.status == "ok";
            return any_ok ? 0 : 1;
          }};
}

}  // namespace scalelab::cli
