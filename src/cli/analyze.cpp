// `scalelab analyze`: statistics over a whole sweep (or any CSV table of runs): the data table,
// descriptive statistics, correlations, ranked pairs, OLS, per-parameter fits, distributions and
// group tests, written as analysis.json plus one CSV per table, with Markdown on stdout.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "analysis/analyze.h"
#include "analysis/agreement.h"
#include "analysis/baseline.h"
#include "analysis/scale_study.h"
#include "analysis/scaling_curves.h"
#include "analysis/memory.h"
#include "analysis/profile.h"
#include "analysis/telemetry.h"
#include "cli/command.h"
#include "core/error.h"
#include "lab/store.h"

namespace scalelab::cli {

std::string latest_sweep(const lab::ResultsStore& store, const char* command) {
  auto sweeps = store.sweeps();
  if (sweeps.empty())
    throw InvalidInput(std::string("[") + command + "] no sweep in " + store.path() + " — run a sweep, ladder or scale first, or give --csv FILE");
  const lab::SweepRow* latest = &sweeps.front();
  for (const auto& s : sweeps)
    if (s.updated_at > latest->updated_at) latest = &s;
  std::fprintf(stderr, "%s: no --sweep given; using the most recently updated one, '%s'\n", command, latest->name.c_str());
  return latest->name;
}

Subcommand add_analyze_command(CLI::App& root) {
  auto* app = root.add_subcommand("analyze", "Statistics over a sweep or a CSV of runs: analysis.json, CSV tables, Markdown");
  struct Flags {
    std::string db = "results/scalelab.db";
    std::string sweep, csv, out_dir, format = "md";
    std::vector<std::string> targets, features;
    std::string baseline;
    double price_per_gpu_hour = 0;
    int bootstrap = 50;
    double split = 0;
    std::uint64_t seed = 0;
    int cv = 0;
    int bins = 20;
  };
  auto f = std::make_shared<Flags>();
  app->add_option("--sweep", f->sweep, "The sweep to analyze (from --db) [default: the most recently updated]");
  app->add_option("--db", f->db, "Results database")->capture_default_str();
  app->add_option("--baseline", f->baseline, "Another sweep of the database to compare with, joined on the configuration (ratios with intervals, regressions flagged)");
  app->add_option("--csv", f->csv, "Analyze a CSV table of runs instead (header row, one run per row)");
  app->add_option("--target", f->targets, "Target column(s), comma-separated [default: val_loss, else tokens_per_s_per_device]")
      ->delimiter(',');
  app->add_option("--features", f->features, "auto (the sweep's parameters; for a CSV every non-target column) or a,b,c")
      ->delimiter(',');
  app->add_option("--split", f->split, "Training fraction for train/test statistics, e.g. 0.75");
  app->add_option("--seed", f->seed, "Seed of the split and the folds")->capture_default_str();
  app->add_option("--cv", f->cv, "Folds for the cross-validated R² of the regressions, e.g. 5");
  app->add_option("--bins", f->bins, "Histogram bins")->capture_default_str();
  app->add_option("--format", f->format, "What goes to stdout: md, json (analysis.json) or csv (the data table)")
      ->capture_default_str()
      ->check(CLI::IsMember({"md", "json", "csv"}));
  app->add_option("--price-per-gpu-hour", f->price_per_gpu_hour,
                  "Price of one GPU-hour (any currency) for the cost per token of a scaling sweep [default: the scale study's stored price]");
  app->add_option("--bootstrap", f->bootstrap, "Bootstrap resamples for the stability of the tree importances (0: none)")->capture_default_str();
  app->add_option("-o,--out", f->out_dir, "Directory for analysis.json and the CSVs [default: results/analysis/NAME]");

  return {app, [f] {
            if (!f->baseline.empty() && !f->csv.empty())
              throw InvalidInput("[analyze] --baseline compares two sweeps of the database; it does not apply to --csv");
            if (!f->sweep.empty() && !f->csv.empty())
              throw InvalidInput("[analyze] give one of --sweep NAME (with --db) or --csv FILE, not both");
            if (f->bins < 1 || f->bins > 1000) throw InvalidInput("[analyze] --bins must be 1..1000");
            analysis::Frame frame;
            std::string name;
            if (!f->csv.empty()) {
              frame = analysis::build_frame_from_csv(f->csv);
              name = std::filesystem::path(f->csv).stem().string();
            } else {
              lab::ResultsStore store(f->db, lab::ResultsStore::Mode::kReadOnly);
              if (f->sweep.empty()) f->sweep = latest_sweep(store, "analyze");
              frame = analysis::build_frame_from_sweep(store, f->sweep);
              name = f->sweep;
            }
            analysis::AnalyzeOptions opt;
            opt.targets = f->targets;
            if (!(f->features.size() == 1 && f->features[0] == "auto")) opt.features = f->features;
            if (f->split != 0) opt.split = f->split;
            opt.seed = f->seed;
            if (f->cv != 0) opt.cv = f->cv;
            opt.bins = f->bins;
            if (f->price_per_gpu_hour < 0 || !std::isfinite(f->price_per_gpu_hour))
              throw InvalidInput("[analyze] --price-per-gpu-hour must be a positive number (e.g. 2.5)");
            if (f->bootstrap < 0 || f->bootstrap > 10000) throw InvalidInput("[analyze] --bootstrap must be 0..10000 resamples");
            opt.bootstrap = f->bootstrap;
            analysis::Analysis a = analysis::analyze(frame, opt);
            if (f->csv.empty()) {
              lab::ResultsStore store(f->db, lab::ResultsStore::Mode::kReadOnly);
              analysis::add_telemetry(a, store, f->sweep);
              analysis::add_profile(a, store, f->sweep);
              analysis::add_memory(a, store, f->sweep);
              analysis::add_agreement(a, store, f->sweep);
              analysis::add_scale_study(a, store, f->sweep);
              analysis::add_scaling_curves(a, frame, store, f->sweep,
                                           f->price_per_gpu_hour > 0 ? std::optional<double>(f->price_per_gpu_hour) : std::nullopt);
              if (!f->baseline.empty()) analysis::add_baseline(a, store, f->sweep, f->baseline, a.json["options"]["targets"].get<std::vector<std::string>>());
            }
            const std::string dir = f->out_dir.empty() ? "results/analysis/" + analysis::sanitize_name(name) : f->out_dir;
            auto paths = analysis::write_analysis(a, dir);
            if (f->format == "json") std::fputs((a.json.dump(1) + "\n").c_str(), stdout);
            else if (f->format == "csv") std::fputs(lab::render_csv(a.tables.front().second).c_str(), stdout);
            else std::fputs(a.markdown.c_str(), stdout);
            std::fprintf(stderr, "analyze: wrote %zu files to %s (analysis.json and one CSV per table)\n", paths.size(), dir.c_str());
            return 0;
          }};
}

}  // namespace scalelab::cli
