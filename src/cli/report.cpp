// `scalelab report`: the analysis of a sweep (or a CSV of runs) as one self-contained HTML page
// that opens offline: analysis.json embedded and drawn by Vega (compiled into scalelab).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

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
#include "report/report.h"

namespace scalelab::cli {

Subcommand add_report_command(CLI::App& root) {
  auto* app = root.add_subcommand("report", "One offline HTML page with the analysis of a sweep (charts drawn by Vega)");
  struct Flags {
    std::string db = "results/scalelab.db";
    std::string sweep, csv, out = "report.html";
    std::vector<std::string> targets, features;
    std::string baseline;
    double price_per_gpu_hour = 0;
    int bootstrap = 50;
    int cv = 0;
    std::uint64_t seed = 0;
  };
  auto f = std::make_shared<Flags>();
  app->add_option("--sweep", f->sweep, "The sweep to report on (from --db) [default: the most recently updated]");
  app->add_option("--db", f->db, "Results database")->capture_default_str();
  app->add_option("--baseline", f->baseline, "Another sweep of the database to compare with, joined on the configuration (ratios with intervals, regressions flagged)");
  app->add_option("--csv", f->csv, "Report on a CSV table of runs instead");
  app->add_option("--target", f->targets, "Target column(s), comma-separated [default as analyze]")->delimiter(',');
  app->add_option("--features", f->features, "auto or a,b,c [default: auto]")->delimiter(',');
  app->add_option("--cv", f->cv, "Folds for the cross-validated R² of the regressions");
  app->add_option("--seed", f->seed, "Seed of the folds")->capture_default_str();
  app->add_option("--price-per-gpu-hour", f->price_per_gpu_hour,
                  "Price of one GPU-hour (any currency) for the cost per token of a scaling sweep [default: the scale study's stored price]");
  app->add_option("--bootstrap", f->bootstrap, "Bootstrap resamples for the stability of the tree importances (0: none)")->capture_default_str();
  app->add_option("-o,--out", f->out, "The HTML file to write")->capture_default_str();

  return {app, [f] {
            if (!report::have_vega())
              throw InvalidInput("[report] this scalelab was built without Vega (libjs-vega) — run scripts/deps.sh and rebuild");
            if (!f->baseline.empty() && !f->csv.empty())
              throw InvalidInput("[report] --baseline compares two sweeps of the database; it does not apply to --csv");
            if (!f->sweep.empty() && !f->csv.empty())
              throw InvalidInput("[report] give one of --sweep NAME (with --db) or --csv FILE, not both");
            analysis::Frame frame;
            std::string title;
            if (!f->csv.empty()) {
              frame = analysis::build_frame_from_csv(f->csv);
              title = "scalelab report: " + std::filesystem::path(f->csv).filename().string();
            } else {
              lab::ResultsStore store(f->db, lab::ResultsStore::Mode::kReadOnly);
              if (f->sweep.empty()) f->sweep = latest_sweep(store, "report");
              frame = analysis::build_frame_from_sweep(store, f->sweep);
              title = "scalelab report: " + f->sweep;
            }
            analysis::AnalyzeOptions opt;
            opt.targets = f->targets;
            if (!(f->features.size() == 1 && f->features[0] == "auto")) opt.features = f->features;
            if (f->cv) opt.cv = f->cv;
            opt.seed = f->seed;
            if (f->price_per_gpu_hour < 0 || !std::isfinite(f->price_per_gpu_hour))
              throw InvalidInput("[report] --price-per-gpu-hour must be a positive number (e.g. 2.5)");
            if (f->bootstrap < 0 || f->bootstrap > 10000) throw InvalidInput("[report] --bootstrap must be 0..10000 resamples");
            opt.bootstrap = f->bootstrap;
            analysis::Analysis a = analysis::analyze(frame, opt);
            if (!f->csv.empty()) {
              // A CSV with ranks and tokens_per_s gets the scaling curves too (no telemetry: no energy).
              analysis::ScalingCurveInputs in;
              if (f->price_per_gpu_hour > 0) in.price_per_gpu_hour = f->price_per_gpu_hour, in.price_source = "--price-per-gpu-hour";
              analysis::add_scaling_curves(a, frame, in);
            } else {
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
            const std::string html = report::render_report(a.json, title);
            std::filesystem::path out(f->out);
            if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
            const std::string tmp = f->out + ".tmp";
            {
              std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
              if (!o) throw InvalidInput("[report] cannot write '" + f->out + "' — check the directory (-o)");
              o << html;
              if (!o) throw RuntimeError("[report] writing '" + tmp + "' failed (disk full?)");
            }
            std::filesystem::rename(tmp, f->out);
            std::printf("%s\n", f->out.c_str());
            std::fprintf(stderr, "report: %zu KB (Vega %zu KB), opens offline in a browser\n", html.size() / 1024,
                         report::vega_bundle_bytes() / 1024);
            return 0;
          }};
}

}  // namespace scalelab::cli
