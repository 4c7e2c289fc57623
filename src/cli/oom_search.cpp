// `scalelab oom-search [train flags]`: the largest micro-batch that fits, verified with real
// trials (b fits, b+1 runs out of memory), for the native engine or an external command.
#include <cstdio>

#include "cli/command.h"
#include "cli/lab_common.h"
#include "lab/oom_search.h"
#include "lab/views.h"

namespace scalelab::cli {

Subcommand add_oom_search_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "oom-search",
      "Find the largest micro-batch that fits, with real trials (b fits, b+1 runs out of memory). Flags it does not "
      "know are train flags (native) or placeholder values (--command/--spec)");
  app->allow_extras();
  struct Flags {
    LabFlags lab;
    WorkloadFlags workload;
    std::string name;
    std::string json;
    std::string format = "md";
    int start = 1;
    int max_micro_batch = 4096;
    bool no_plan = false;
  };
  auto f = std::make_shared<Flags>();
  add_lab_flags(app, f->lab);
  add_workload_flags(app, f->workload);
  app->add_option("--name", f->name, "Record under this name [default: oom-search-<model>-<hash of the config>]");
  app->add_option("--start", f->start, "First micro-batch to try when there is no memory plan")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--max-micro-batch", f->max_micro_batch, "Never try a larger micro-batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_flag("--no-plan", f->no_plan, "Do not ask the engine's memory plan (`scalelab plan`) for a first guess");
  app->add_option("--json", f->json, "Also write the result (limit, probes, best trial's metrics) to this file");
  app->add_option("--format", f->format, "Table format: md, csv or json")->capture_default_str();

  return {app, [f, app] {
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

            lab::Progress progress(stderr, lab::Progress::is_terminal(stderr));
            if (!w.notes.empty()) progress.note(w.notes.substr(0, w.notes.size() - 1));
            lab::RunnerLock lock(options.db_path, "oom-search " + name, options.wait_for_lock, options.cancel,
                                 [&](const std::string& m) { progress.note(m); });
            lab::ResultsStore store(options.db_path, lab::ResultsStore::Mode::kReadWrite);
            lab::Json spec{{"workload", w.workload.describe()},
                           {"params", lab::Json(w.params)},
                           {"start", f->start},
                           {"max_micro_batch", f->max_micro_batch},
                           {"use_plan", !f->no_plan}};
            std::int64_t sweep_id = store.ensure_sweep(name, "oom-search", spec);
            store.set_sweep_result(sweep_id, lab::Json());
            lab::TrialExecutor exec(store, sweep_id, name, w.workload, options, progress);

            lab::OomSearchRequest req;
            req.base = w.params;
            req.settings.hint = f->start;
            req.settings.max_micro_batch = f->max_micro_batch;
            req.use_plan = !f->no_plan && w.workload.is_native();
            lab::OomSearchResult result;
            try {
              result = lab::run_oom_search(exec, req, lab::native_plan(exec));
            } catch (const lab::Interrupted& e) {
              return report_interrupted(e, options.db_path, "run the same command again to resume (recorded trials are reused).");
            }
            progress.finish();
            store.set_sweep_result(sweep_id, result.to_json());

            auto sweep = store.find_sweep(name);
            lab::Table table = lab::oom_search_table(*sweep, store, {});
            std::fputs(lab::render(table, format).c_str(), stdout);
            if (format != lab::TableFormat::kMarkdown)
              for (const auto& n : table.notes) std::fprintf(stderr, "%s\n", n.c_str());
            if (!f->json.empty()) {
              lab::Json out = result.to_json();
              out["sweep"] = name;
              out["db"] = store.path();
              if (result.best) out["best_metrics"] = result.best->metrics;
              write_text_file(f->json, out.dump(2) + "\n", "--json");
            }
            std::fprintf(stderr, "Results: %s (scalelab results --db %s --sweep %s); logs in %s\n", store.path().c_str(),
                         store.path().c_str(), name.c_str(), exec.log_dir().c_str());
            if (result.failed) return result.refused ? 2 : 1;
            if (result.max_micro_batch_size == 0) return 3;
            return 0;
          }};
}

}  // namespace scalelab::cli
