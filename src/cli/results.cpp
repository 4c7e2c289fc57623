// `scalelab results`: tables from the results database alone — the sweeps, a sweep's summary,
// its trials, an OOM search, a ladder, telemetry samples, or profiles side by side — as Markdown,
// CSV or JSON.
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "lab/scale.h"
#include "lab/store.h"
#include "lab/views.h"

namespace scalelab::cli {

Subcommand add_results_command(CLI::App& root) {
  auto* app = root.add_subcommand("results", "Print results from the database as Markdown, CSV or JSON tables");
  struct Flags {
    std::string db = "results/scalelab.db";
    std::string sweep;
    std::string view = "auto";
    std::string format = "md";
    std::vector<std::string> where;
    bool all = false;
  };
  auto f = std::make_shared<Flags>();
  app->add_option("--db", f->db, "Results database")->capture_default_str();
  app->add_option("--sweep", f->sweep, "The sweep (or oom-search / ladder) to show [default: list the sweeps]");
  app->add_option("--view", f->view,
                  "auto (the sweep's own table), sweeps, summary (one row per configuration, repeats as "
                  "median/min/max), trials, oom, ladder, scale (a scaling study's table and recommendations), "
                  "telemetry (samples, long format), profile (profiled trials: op families or GPU kernels side by side), "
                  "profile-compare (every trial's profile figures side by side: launch / sync API time, host-to-device "
                  "copies, NCCL kernels, ...; without --sweep, the trials of every sweep), memory (each trial's measured and "
                  "planned peak split by part: weights, gradients, optimizer states, activations, ... — fine-tuning "
                  "methods side by side)")
      ->capture_default_str()
      ->check(CLI::IsMember(
          {"auto", "sweeps", "summary", "trials", "oom", "ladder", "scale", "telemetry", "profile", "profile-compare", "memory"}));
  app->add_option("--format", f->format, "md, csv or json")->capture_default_str();
  app->add_option("--where", f->where,
                  "Keep rows where KEY OP VALUE (OP: = != < <= > >=), e.g. status=ok or micro_batch_size>=4; "
                  "repeat to combine");
  app->add_flag("--all", f->all, "trials view: include trials superseded by a re-run");

  return {app, [f] {
            lab::TableFormat format = lab::parse_table_format(f->format);
            std::vector<lab::Filter> filters;
            for (const auto& w : f->where) filters.push_back(lab::parse_filter(w));
            lab::ResultsStore store(f->db, lab::ResultsStore::Mode::kReadOnly);

            std::optional<lab::SweepRow> sweep;
            if (!f->sweep.empty()) {
              sweep = store.find_sweep(f->sweep);
              if (!sweep) {
                std::string names;
                for (const auto& s : store.sweeps()) lab::append_item(names, s.name, ", ");
                throw InvalidInput("[results] no sweep '" + f->sweep + "' in " + f->db +
                                   " — sweeps: " + (names.empty() ? "none" : names));
              }
            }
            std::string view = f->view;
            if (view == "auto") {
              if (!sweep) view = filters.empty() ? "sweeps" : "trials";
              else if (sweep->kind == "ladder") view = "ladder";
              else if (sweep->kind == "oom-search") view = "oom";
              else if (sweep->kind == lab::kScaleKind) view = "scale";
              else view = "summary";
            }
            if ((view == "ladder" || view == "oom" || view == "scale") && !sweep) {
              throw InvalidInput("[results] --view " + view + " needs --sweep NAME");
            }
            if (view == "ladder" && sweep->kind != "ladder") {
              throw InvalidInput("[results] '" + sweep->name + "' is a " + sweep->kind + ", not a ladder — use --view summary or trials");
            }
            if (view == "oom" && sweep->kind != "oom-search") {
              throw InvalidInput("[results] '" + sweep->name + "' is a " + sweep->kind + ", not an oom-search — use --view summary or trials");
            }
            if (view == "sweeps" && !filters.empty()) {
              throw InvalidInput("[results] --where filters trials; use it with --sweep or --view trials");
            }

            lab::Table table;
            const std::int64_t id = sweep ? sweep->sweep_id : 0;
            const std::vector<std::string> order = sweep ? lab::parameter_order(*sweep) : std::vector<std::string>{};
            if (view == "sweeps") table = lab::sweeps_table(store);
            else if (view == "summary") table = sweep ? lab::sweep_summary_table(*sweep, store, filters)
                                                      : lab::summary_table(store.trials(), filters);
            else if (view == "trials") table = lab::trials_table(store.trials(id, f->all), filters, order);
            else if (view == "profile") table = lab::profile_table(store.trials(id, false), filters, order);
            else if (view == "profile-compare")
              table = lab::profile_compare_table(store.trials(id, false), filters, order, !sweep);
            else if (view == "memory") table = lab::memory_table(store.trials(id, false), filters, order);
            else if (view == "oom") table = lab::oom_search_table(*sweep, store, filters);
            else if (view == "ladder") table = lab::ladder_sweep_table(*sweep, store, filters);
            else if (view == "scale") {
              table = lab::scale_sweep_table(*sweep, store);
              table.rows = lab::apply_filters(table.rows, filters);
            }
            else {
              auto samples = store.telemetry_samples(0, id);
              lab::Table t = lab::telemetry_table(samples);
              t.rows = lab::apply_filters(t.rows, filters);
              table = t;
            }
            // A sweep with [presets.NAME]: its label column stands for the parameters it sets.
            if (sweep) lab::fold_preset_columns(table, *sweep);
            std::fputs(lab::render(table, format).c_str(), stdout);
            if (format != lab::TableFormat::kMarkdown)
              for (const auto& n : table.notes) std::fprintf(stderr, "%s\n", n.c_str());
            return 0;
          }};
}

}  // namespace scalelab::cli
