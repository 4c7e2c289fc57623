// `scalelab scale --ranks 1,2,4 [train flags]`: the scaling study. Runs the training
// configuration at each rank count as lab trials (this machine: mpirun; a cluster: a SLURM batch
// job per rank count), records them in the results database, and prints the reference practice's
// table (per-device and total throughput, speedup, parallel efficiency, cost efficiency, cost per
// 1M tokens, J/token, Karp–Flatt) and a recommendation per purpose for a token budget.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/command.h"
#include "cli/lab_common.h"
#include "core/error.h"
#include "core/subprocess.h"
#include "lab/launchers.h"
#include "lab/runner.h"
#include "lab/scale.h"
#include "lab/slurm.h"
#include "lab/views.h"

namespace scalelab::cli {
Subcommand add_scale_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "scale",
      "Scaling study: run a train configuration at 1, 2, 4, ... data-parallel ranks (per-rank micro-batch fixed), "
      "record the trials and print throughput, speedup, efficiency, cost, energy and a recommendation. Flags it "
      "does not know are train flags");
  app->allow_extras();
  struct Flags {
    LabFlags lab;
    std::vector<int> ranks;
    std::string launcher = "local";
    int repeats = 1;
    double price = 0;
    double token_budget = 1e9;
    bool dry_run = false;
    std::string name, json, format = "md";
    std::string mpirun = "mpirun";
    std::vector<std::string> mpirun_args;
    int tasks_per_node = 0, gpus_per_node = 0, cpus_per_task = 0;
    std::string time, partition, account, srun_mpi = "pmix";
    std::vector<std::string> sbatch_args;
  };
  auto f = std::make_shared<Flags>();
  add_lab_flags(app, f->lab);
  app->add_option("--ranks", f->ranks, "Rank (device) counts to run, e.g. 1,2,4,8")->required()->delimiter(',');
  app->add_option("--launcher", f->launcher,
                  "local: mpirun on this machine; slurm: an sbatch job per rank count (srun --mpi=pmix)")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "slurm"}));
  app->add_option("--repeats", f->repeats, "Trials per rank count (averaged)")->capture_default_str()->check(CLI::PositiveNumber);
  auto* price = app->add_option("--price-per-device-hour", f->price,
                                "Price of one device for one hour (any currency): adds cost per 1M tokens")
                    ->check(CLI::NonNegativeNumber);
  app->add_option("--token-budget", f->token_budget, "Tokens to train, for the recommendations")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_flag("--dry-run", f->dry_run, "Print the commands (local) or batch scripts (slurm) without running them");
  app->add_option("--name", f->name, "Record under this name [default: scale-<model>-<hash of the config>]");
  app->add_option("--json", f->json, "Also write the table (rows and notes) to this file");
  app->add_option("--format", f->format, "Table format: md, csv or json")->capture_default_str();
  app->add_option("--mpirun", f->mpirun, "local: the mpirun to use")->capture_default_str();
  app->add_option("--mpirun-arg", f->mpirun_args, "local: an extra mpirun argument (repeat for more)")
      ->allow_extra_args(false);
  app->add_option("--tasks-per-node", f->tasks_per_node,
                  "slurm: ranks per node [default: --gpus-per-node, else all ranks on one node]");
  app->add_option("--gpus-per-node", f->gpus_per_node, "slurm: GPUs to request per node (one per rank)");
  app->add_option("--cpus-per-task", f->cpus_per_task, "slurm: CPUs per rank [default: the cluster's]");
  app->add_option("--time", f->time, "slurm: the job's time limit [default: --timeout, rounded up]");
  app->add_option("--partition", f->partition, "slurm: partition");
  app->add_option("--account", f->account, "slurm: account");
  app->add_option("--sbatch-arg", f->sbatch_args, "slurm: an extra #SBATCH option, e.g. --exclusive (repeat for more)")
      ->allow_extra_args(false);
  app->add_option("--srun-mpi", f->srun_mpi, "slurm: srun --mpi plugin")->capture_default_str();

  return {app, [f, app, price] {
            const lab::TableFormat format = lab::parse_table_format(f->format);
            lab::ScaleSpec spec;
            spec.ranks = lab::parse_rank_list(f->ranks);
            spec.repeats = f->repeats;
            spec.launcher = f->launcher == "slurm" ? "slurm" : "mpirun";
            if (price->count()) spec.price_per_device_hour = f->price;
            spec.token_budget = f->token_budget;
            ResolvedWorkload w = resolve_workload(WorkloadFlags{}, app->remaining(), {});
            for (const char* own : {lab::kRanksParam, lab::kLauncherParam}) {
              if (w.params.count(own))
                throw InvalidInput(std::string("[scale] '") + own + "' is the study's own parameter — use --ranks / --launcher");
            }
            spec.params = w.params;

            const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
            spec.threads_per_rank = lab::scale_threads_per_rank(spec, cores);

            InterruptFlag interrupt;
            lab::LabOptions options = lab_options(f->lab, interrupt.get());
            if (spec.launcher == "mpirun") {
              lab::MpirunOptions mo;
              mo.mpirun = f->mpirun;
              mo.extra_args = f->mpirun_args;
              mo.cores = cores;
              mo.threads_per_rank = std::max(1, spec.threads_per_rank);
              mo.as_root = ::geteuid() == 0;
              options.launcher = std::make_shared<lab::MpirunLauncher>(mo);
            } else {
              lab::SlurmOptions so;
              so.tasks_per_node = f->tasks_per_node;
              so.gpus_per_node = f->gpus_per_node;
              so.cpus_per_task = f->cpus_per_task;
              so.time = f->time.empty() ? lab::slurm_time_limit(options.timeout_s) : f->time;
              so.partition = f->partition;
              so.account = f->account;
              so.mpi = f->srun_mpi;
              so.extra_sbatch = f->sbatch_args;
              options.launcher = std::make_shared<lab::SlurmLauncher>(so);
            }
            const std::string name =
                f->name.empty() ? default_sweep_name("scale", w, {{"launcher", spec.launcher}}) : f->name;

            if (f->dry_run) {
              const std::string base = options.log_dir.empty() ? lab::default_log_dir_for(options.db_path) : options.log_dir;
              lab::TrialContext ctx;
              ctx.sweep = name;
              ctx.dir = (std::filesystem::path(base) / lab::safe_file_name(name)).string();
              std::printf("# scalelab scale --dry-run: %s, %zu rank count(s); nothing is run or recorded\n",
                          name.c_str(), spec.ranks.size());
              for (int n : spec.ranks) {
                ctx.key = "dry-run-" + std::to_string(n);
                ctx.log_path = ctx.dir + "/" + ctx.key + ".log";
                ctx.record_path = ctx.dir + "/" + ctx.key + ".json";
                const lab::ParamMap params = lab::scale_trial_params(spec, n);
                std::printf("\n# %d %s\n", n, n == 1 ? "rank" : "ranks");
                if (spec.launcher == "mpirun") {
                  std::printf("%s\n", options.launcher->launch(w.workload, options.engine, params, ctx).display.c_str());
                } else {
                  const auto& sl = static_cast<const lab::SlurmLauncher&>(*options.launcher);
                  const lab::SlurmJob job = sl.job(w.workload, options.engine, params, ctx);
                  std::printf("# %s\n%s", job.script_path().c_str(), lab::render_sbatch_script(job).c_str());
                }
              }
              return 0;
            }

            const std::string tool = spec.launcher == "mpirun" ? f->mpirun : std::string("sbatch");
            if (find_executable(tool).empty()) {
              throw InvalidInput("[scale] '" + tool + "' not found" +
                                 (spec.launcher == "mpirun"
                                      ? " — install OpenMPI (scripts/deps.sh) or pass --mpirun PATH"
                                      : " on PATH — run on a SLURM submit host, or use --launcher local"));
            }
            lab::Runner runner(options, "scale", name);
            lab::Json stored = spec.to_json();
            stored["workload"] = w.workload.describe();
            lab::TrialExecutor& exec = runner.open_sweep(lab::kScaleKind, stored, w.workload, false);
            std::vector<lab::TrialRow> rows;
            if (runner.run([&] { rows = lab::run_scale(exec, spec); }) == lab::RunnerOutcome::kInterrupted)
              return kExitInterrupted;

            // The table comes from the database, as `scalelab results --sweep NAME` prints it.
            const std::optional<lab::SweepRow> sweep = runner.store().find_sweep(name);
            SCALELAB_CHECK(sweep.has_value(), "[scale] the sweep '" + name + "' vanished from " + runner.store().path());
            const lab::Table table = lab::scale_sweep_table(*sweep, runner.store());
            runner.print_table(table, format, f->json, runner.table_json(table, "rows"));
            runner.print_footer();

            const lab::ScaleVerdict verdict = lab::scale_verdict(spec, rows);
            if (verdict.refused) {
              std::fprintf(stderr, "scalelab scale: the engine refused the configuration (exit code %d); see the reason above\n",
                           exit_code(ErrorKind::kInvalidInput));
              return exit_code(ErrorKind::kInvalidInput);
            }
            if (!verdict.missing_ranks.empty()) {
              std::fprintf(stderr, "scalelab scale: no successful trial at %d ranks; see the reason in the table\n",
                           verdict.missing_ranks.front());
              return exit_code(ErrorKind::kRuntime);
            }
            return 0;
          }};
}

}  // namespace scalelab::cli
