// `scalelab sweep SPEC.toml`: runs every combination of a sweep spec as isolated trials, records
// them in the results database (resumable), and prints the sweep's table.
#include <cstdio>
#include <set>

#include "cli/command.h"
#include "cli/lab_common.h"
#include "core/subprocess.h"
#include "lab/external_profile.h"
#include "lab/oom_search.h"
#include "lab/runner.h"
#include "lab/spec.h"
#include "lab/sweep.h"
#include "lab/views.h"

namespace scalelab::cli {

Subcommand add_sweep_command(CLI::App& root) {
  auto* app = root.add_subcommand("sweep", "Run every combination of a sweep spec (TOML) as isolated, recorded, resumable trials");
  struct Flags {
    LabFlags lab;
    std::string spec;
    std::string name;
    std::string format = "md";
    bool dry_run = false;
  };
  auto f = std::make_shared<Flags>();
  app->add_option("spec", f->spec, "Sweep spec file (see examples/batch-sweep.toml)")->required();
  add_lab_flags(app, f->lab);
  app->add_option("--name", f->name, "Record under this sweep name [default: the spec's name]");
  app->add_option("--format", f->format, "Table format at the end: md, csv or json")->capture_default_str();
  app->add_flag("--dry-run", f->dry_run, "Print the trials and their commands; run and record nothing");

  return {app, [f, app] {
            lab::TableFormat format = lab::parse_table_format(f->format);
            lab::SweepSpec spec = lab::load_sweep_spec(f->spec);
            if (!f->name.empty()) spec.name = f->name;
            InterruptFlag interrupt;
            lab::LabOptions options = lab_options(f->lab, interrupt.get());
            // --timeout on the command line beats the spec's timeout, which beats the default.
            if (app->get_option("--timeout")->count() == 0 && spec.timeout_s) options.timeout_s = *spec.timeout_s;

            const bool nsys_wanted = !spec.workload.is_native() && spec.workload.profile.tool == lab::ProfileTool::kNsys;
            if (f->dry_run) {
              auto combos = spec.expand();
              std::printf("sweep '%s': %zu configurations x %d repeats = %zu trials\n", spec.name.c_str(), combos.size(),
                          spec.repeats, combos.size() * static_cast<std::size_t>(spec.repeats));
              lab::TrialContext ctx;
              ctx.sweep = spec.name;
              ctx.dir = "<log-dir>";
              ctx.key = "<trial>";
              ctx.log_path = "<log-dir>/<trial>.log";
              ctx.record_path = "<log-dir>/<trial>.json";
              if (nsys_wanted) {
                const bool found = !find_executable("nsys").empty();
                ctx.nsys = found || !spec.workload.profile.optional;
                if (!found)
                  std::printf("# nsys is not on PATH: %s\n", spec.workload.profile.optional
                                                                 ? "the trials would run unprofiled (profile = \"nsys?\")"
                                                                 : "a real run refuses (exit 2)");
              }
              for (const auto& p : combos) {
                std::printf("%s\n", lab::build_launch(spec.workload, options.engine, p, ctx).display.c_str());
              }
              if (spec.oom_search.enabled) {
                std::set<std::string> keys;
                for (const auto& p : combos) keys.insert(lab::oom_search_key(p));
                std::printf("# then %zu OOM search(es), one per configuration without micro_batch_size (up to "
                            "micro-batch %d%s)\n",
                            keys.size(), spec.oom_search.max_micro_batch,
                            spec.workload.is_native() && spec.oom_search.use_plan ? ", from the engine's plan" : "");
              }
              return 0;
            }

            // Before the runner opens the database: a spec that needs nsys where there is none is
            // refused (exit 2) without a trace in the results.
            lab::nsys_available(spec.workload);
            lab::Runner runner(options, "sweep", spec.name);
            lab::SweepRunSummary summary;
            if (runner.run([&] { summary = lab::run_sweep(spec, runner.store(), options, runner.progress()); },
                           "run the same command again to resume where it stopped.") ==
                lab::RunnerOutcome::kInterrupted)
              return kExitInterrupted;
            runner.print_table(lab::sweep_summary_table(*runner.store().find_sweep(spec.name), runner.store(), {}),
                               format);
            std::fprintf(stderr,
                         "\nsweep '%s': %d trials (%d run now: %d ok, %d oom, %d failed; %d already recorded)%s\n",
                         spec.name.c_str(), summary.total, summary.ran, summary.ok, summary.oom, summary.failed,
                         summary.already_done,
                         summary.oom_searches
                             ? (", then " + std::to_string(summary.oom_searches) + " OOM search(es)").c_str()
                             : "");
            runner.print_footer(false);
            return 0;
          }};
}

}  // namespace scalelab::cli
