#include "lab/launchers.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "core/error.h"
#include "core/subprocess.h"
#include "lab/command_template.h"
#include "lab/log_tail.h"

namespace scalelab::lab {
namespace {

namespace fs = std::filesystem;

std::string join_display(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) append_item(out, shell_quote(a), " ");
  return out;
}

Launch native_command(const Workload& workload, const std::string& engine, const ParamMap& params,
                      const TrialContext& ctx) {
  SCALELAB_CHECK_INPUT(workload.is_native(),
                       "[scale] the scaling study runs the native engine's train command; an external command "
                       "(--command/--spec) sets its own process count — sweep it with `scalelab sweep` instead");
  return build_launch(workload, engine, train_params(params), ctx);
}

std::string job_dir(const TrialContext& ctx) { return (fs::path(ctx.dir) / (ctx.key + ".slurm")).string(); }

}  // namespace

int trial_ranks(const ParamMap& params) {
  auto it = params.find(kRanksParam);
  if (it == params.end() || !it->second.is_number_integer() || it->second.get<long long>() < 1) {
    throw InvalidInput("[scale] a scaling trial needs a positive integer parameter 'ranks'" +
                       std::string(it == params.end() ? "" : " (got " + it->second.dump() + ")"));
  }
  return static_cast<int>(it->second.get<long long>());
}

ParamMap train_params(const ParamMap& params) {
  ParamMap p = params;
  p.erase(kRanksParam);
  p.erase(kLauncherParam);
  return p;
}

MpirunLauncher::MpirunLauncher(MpirunOptions options) : options_(std::move(options)) {
  if (options_.cores <= 0) options_.cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

Launch MpirunLauncher::launch(const Workload& workload, const std::string& engine, const ParamMap& params,
                              const TrialContext& ctx) const {
  const int n = trial_ranks(params);
  Launch inner = native_command(workload, engine, params, ctx);
  int threads = options_.threads_per_rank;
  if (auto it = params.find("threads"); it != params.end() && it->second.is_number_integer() && it->second.get<int>() > 0)
    threads = it->second.get<int>();
  Launch l;
  l.argv = {options_.mpirun};
  if (options_.as_root) l.argv.push_back("--allow-run-as-root");
  // mpirun refuses more ranks than cores (slots) unless told; each rank's threads get a core of
  // their own when there are enough (binding keeps them from migrating), else float freely.
  if (n > options_.cores) l.argv.push_back("--oversubscribe");
  l.argv.push_back("--bind-to");
  l.argv.push_back(threads == 1 && n <= options_.cores ? "core" : "none");
  for (const auto& a : options_.extra_args) l.argv.push_back(a);
  l.argv.push_back("-np");
  l.argv.push_back(std::to_string(n));
  l.argv.insert(l.argv.end(), inner.argv.begin(), inner.argv.end());
  l.env = inner.env;
  l.cwd = inner.cwd;
  l.display = join_display(l.argv);
  return l;
}

SubprocessResult MpirunLauncher::run(const SubprocessSpec& spec, const ParamMap&, const TrialContext&,
                                     const std::atomic<bool>* cancel, const std::function<void()>& tick) const {
  return run_subprocess(spec, cancel, tick);
}

SlurmLauncher::SlurmLauncher(SlurmOptions options) : options_(std::move(options)) {
  SCALELAB_CHECK_INPUT(options_.tasks_per_node >= 0 && options_.gpus_per_node >= 0 && options_.cpus_per_task >= 0,
                       "[scale] --tasks-per-node, --gpus-per-node and --cpus-per-task must not be negative");
}

SlurmJob SlurmLauncher::job(const Workload& workload, const std::string& engine, const ParamMap& params,
                            const TrialContext& ctx) const {
  const int n = trial_ranks(params);
  int per_node = options_.tasks_per_node > 0 ? options_.tasks_per_node
                 : options_.gpus_per_node > 0 ? options_.gpus_per_node
                                              : n;
  per_node = std::min(per_node, n);
  SCALELAB_CHECK_INPUT(n % per_node == 0, "[scale] " + std::to_string(n) + " ranks do not fill nodes of " +
                                              std::to_string(per_node) +
                                              " tasks — use rank counts that are multiples of --tasks-per-node");
  SlurmJob job;
  job.job_name = "scalelab-scale";
  job.nodes = n / per_node;
  job.tasks_per_node = per_node;
  job.gpus_per_node = options_.gpus_per_node > 0 ? std::min(options_.gpus_per_node, per_node) : 0;
  job.cpus_per_task = options_.cpus_per_task;
  job.time = options_.time;
  job.partition = options_.partition;
  job.account = options_.account;
  job.extra_sbatch = options_.extra_sbatch;
  job.mpi = options_.mpi;
  job.command = native_command(workload, engine, params, ctx).argv;
  job.result_flag = "";  // the command has --json <record>: rank 0 writes it
  job.work_dir = fs::absolute(job_dir(ctx)).lexically_normal().string();
  job.env = options_.env;
  return job;
}

Launch SlurmLauncher::launch(const Workload& workload, const std::string& engine, const ParamMap& params,
                             const TrialContext& ctx) const {
  const SlurmJob j = job(workload, engine, params, ctx);
  const std::string script = render_sbatch_script(j);
  std::error_code ec;
  fs::create_directories(j.work_dir, ec);
  SCALELAB_CHECK_INPUT(!ec, "[scale] cannot create the job directory " + j.work_dir + ": " + ec.message());
  {
    std::ofstream out(j.script_path());
    out << script;
    SCALELAB_CHECK_INPUT(static_cast<bool>(out), "[scale] cannot write the batch script " + j.script_path());
  }
  Launch l;
  l.argv = {options_.sbatch, "--parsable", "--wait", j.script_path()};
  l.display = join_display(l.argv) + "  # srun --mpi=" + j.mpi + " " + join_display(j.command);
  return l;
}

SubprocessResult SlurmLauncher::run(const SubprocessSpec& spec, const ParamMap&, const TrialContext& ctx,
                                    const std::atomic<bool>* cancel, const std::function<void()>& tick) const {
  SubprocessResult r = run_subprocess(spec, cancel, tick);
  // sbatch --parsable printed "<job id>[;cluster]" when it submitted, before waiting.
  std::string out = read_file_tail(spec.log_path, 1 << 16);
  if (out.rfind(spec.log_header, 0) == 0) out = out.substr(spec.log_header.size());
  std::smatch m;
  std::string job_id;
  if (std::regex_search(out, m, std::regex(R"((^|\n)([0-9]+)(;[^\n]*)?\n)"))) job_id = m[2];
  std::ofstream log(spec.log_path, std::ios::app);
  if (!job_id.empty() && (r.timed_out || r.cancelled || !r.started)) {
    // Killing sbatch does not end the job: cancel it so that it frees the nodes.
    SubprocessSpec co;
    co.argv = {options_.scancel, job_id};
    co.timeout_s = 30;
    co.kill_grace_s = 3;
    co.env = spec.env;
    const SubprocessResult c = run_subprocess(co);
    log << "# scancel " << job_id << ": " << c.describe() << (c.output.empty() ? "" : "\n" + c.output) << "\n";
  }
  // Without a job id sbatch refused the job: its own message stays the log's last line (the
  // trial's reason).
  if (!job_id.empty()) {
    const std::string job_out = (fs::path(job_dir(ctx)) / ("slurm-" + job_id + ".out")).string();
    log << "# --- output of SLURM job " << job_id << " (" << job_out << ")\n" << read_file_tail(job_out, 4u << 20);
  }
  return r;
}

}  // namespace scalelab::lab
