#include "lab/slurm.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/subprocess.h"

namespace scalelab::lab {
namespace {

namespace fs = std::filesystem;

// 'it'\''s' — safe for any byte string in a POSIX shell.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

// #SBATCH lines are not parsed by a shell: values must not need quoting.
void check_sbatch_value(const std::string& field, const std::string& v) {
  static const std::regex ok(R"([A-Za-z0-9_.,:=+@%/\-\[\]]+)");
  SCALELAB_CHECK_INPUT(std::regex_match(v, ok), "[slurm] " + field + " '" + v +
                                                    "' has characters an #SBATCH line cannot carry (spaces, quotes) — "
                                                    "use letters, digits and _.,:=+@%/-");
}

std::string read_tail(const fs::path& p, std::size_t max_bytes) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > static_cast<std::streamoff>(max_bytes) ? size - static_cast<std::streamoff>(max_bytes) : 0;
  in.seekg(start);
  std::string s(static_cast<std::size_t>(size - start), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

}  // namespace

void validate_slurm_job(const SlurmJob& job) {
  SCALELAB_CHECK_INPUT(job.nodes >= 1, "[slurm] nodes must be at least 1 (got " + std::to_string(job.nodes) + ")");
  SCALELAB_CHECK_INPUT(job.tasks_per_node >= 1,
                       "[slurm] tasks per node must be at least 1 (got " + std::to_string(job.tasks_per_node) + ")");
  SCALELAB_CHECK_INPUT(job.gpus_per_node >= 0 && job.cpus_per_task >= 0,
                       "[slurm] GPUs per node and CPUs per task must not be negative");
  SCALELAB_CHECK_INPUT(!job.command.empty(), "[slurm] no command to run in the job");
  SCALELAB_CHECK_INPUT(!job.work_dir.empty() && job.work_dir.front() == '/',
                       "[slurm] the job's work directory must be an absolute path (got '" + job.work_dir + "')");
  check_sbatch_value("job name", job.job_name);
  check_sbatch_value("time", job.time);
  if (!job.partition.empty()) check_sbatch_value("partition", job.partition);
  if (!job.account.empty()) check_sbatch_value("account", job.account);
  check_sbatch_value("mpi", job.mpi);
  check_sbatch_value("work directory", job.work_dir);
  for (const std::string& o : job.extra_sbatch) {
    SCALELAB_CHECK_INPUT(o.rfind("--", 0) == 0, "[slurm] extra sbatch option '" + o + "' must start with --");
    check_sbatch_value("extra sbatch option", o);
  }
  static const std::regex name(R"([A-Za-z_][A-Za-z0-9_]*)");
  for (const auto& [k, v] : job.env)
    SCALELAB_CHECK_INPUT(std::regex_match(k, name), "[slurm] '" + k + "' is not an environment variable name");
}

std::string render_sbatch_script(const SlurmJob& job) {
  validate_slurm_job(job);
  std::ostringstream s;
  s << "#!/bin/bash\n";
  s << "#SBATCH --job-name=" << job.job_name << "\n";
  s << "#SBATCH --nodes=" << job.nodes << "\n";
  s << "#SBATCH --ntasks-per-node=" << job.tasks_per_node << "\n";
  if (job.gpus_per_node > 0) s << "#SBATCH --gpus-per-node=" << job.gpus_per_node << "\n";
  if (job.cpus_per_task > 0) s << "#SBATCH --cpus-per-task=" << job.cpus_per_task << "\n";
  s << "#SBATCH --time=" << job.time << "\n";
  if (!job.partition.empty()) s << "#SBATCH --partition=" << job.partition << "\n";
  if (!job.account.empty()) s << "#SBATCH --account=" << job.account << "\n";
  s << "#SBATCH --output=" << job.work_dir << "/slurm-%j.out\n";
  for (const std::string& o : job.extra_sbatch) s << "#SBATCH " << o << "\n";
  s << "# Written by scalelab: " << job.tasks() << " ranks (" << job.nodes << " nodes x " << job.tasks_per_node
    << " tasks), one task per rank.\n";
  if (!job.result_flag.empty())
    s << "# Each rank writes its result to " << job.work_dir << "/rank-<rank>.json.\n";
  s << "set -euo pipefail\n";
  s << "export SCALELAB_RESULT_DIR=" << shell_quote(job.work_dir) << "\n";
  for (const auto& [k, v] : job.env) s << "export " << k << "=" << shell_quote(v) << "\n";
  // --kill-on-bad-exit: a rank that fails ends the step at once (the others stop instead of
  // waiting in a collective). The per-task shell appends the result path with the task's rank.
  s << "srun --mpi=" << job.mpi << " --kill-on-bad-exit=1 ";
  if (!job.result_flag.empty()) {
    s << "sh -c 'exec \"$@\" " << job.result_flag << " \"$SCALELAB_RESULT_DIR/rank-$SLURM_PROCID.json\"' scalelab-task";
  }
  for (std::size_t i = 0; i < job.command.size(); ++i) {
    if (i || !job.result_flag.empty()) s << " ";
    s << shell_quote(job.command[i]);
  }
  s << "\n";
  return s.str();
}

bool SlurmJobResult::ok() const {
  if (timed_out || exit_code != 0) return false;
  for (const SlurmRankResult& r : ranks) {
    if (!r.record) return false;
    if (r.record->is_object() && r.record->contains("status") && (*r.record)["status"] != "ok") return false;
  }
  return true;
}

std::string SlurmJobResult::describe() const {
  std::string why;
  if (timed_out) why = "job " + job_id + " timed out and was cancelled";
  else if (exit_code != 0) why = "job " + job_id + " exited with code " + std::to_string(exit_code);
  for (const SlurmRankResult& r : ranks) {
    std::string w;
    if (!r.record) w = "rank " + std::to_string(r.rank) + ": " + r.error;
    else if (r.record->is_object() && r.record->contains("status") && (*r.record)["status"] != "ok")
      w = "rank " + std::to_string(r.rank) + ": status " + (*r.record)["status"].dump() +
          (r.record->contains("error") ? " (" + (*r.record)["error"].dump() + ")" : "");
    if (!w.empty()) why += (why.empty() ? "" : "; ") + w;
  }
  return why.empty() ? "ok" : why;
}

std::vector<SlurmRankResult> collect_rank_results(const SlurmJob& job) {
  std::vector<SlurmRankResult> out;
  for (int r = 0; r < job.tasks(); ++r) {
    SlurmRankResult rr;
    rr.rank = r;
    const std::string path = job.rank_result_path(r);
    std::ifstream in(path);
    if (!in) {
      rr.error = "wrote no result (" + path + " missing)";
    } else {
      try {
        rr.record = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        rr.error = "result " + path + " is not JSON (" + e.what() + ")";
      }
    }
    out.push_back(std::move(rr));
  }
  return out;
}

SlurmJobResult submit_slurm_job(const SlurmJob& job, const SlurmSubmitOptions& options) {
  const std::string script = render_sbatch_script(job);
  std::error_code ec;
  fs::create_directories(job.work_dir, ec);
  SCALELAB_CHECK_INPUT(!ec, "[slurm] cannot create the job directory " + job.work_dir + ": " + ec.message());
  for (int r = 0; r < job.tasks(); ++r) fs::remove(job.rank_result_path(r), ec);  // no stale results
  {
    std::ofstream out(job.script_path());
    out << script;
    SCALELAB_CHECK_INPUT(static_cast<bool>(out), "[slurm] cannot write " + job.script_path());
  }

  SubprocessSpec po;
  po.argv = {options.sbatch, "--parsable", "--wait", job.script_path()};
  po.timeout_s = options.timeout_s;
  po.kill_grace_s = 3;
  po.env = options.env;
  const SubprocessResult p = run_subprocess(po);
  SlurmJobResult res;
  res.sbatch_output = p.output;
  // --parsable prints "<id>[;cluster]" at submission, before waiting.
  std::smatch m;
  if (std::regex_search(p.output, m, std::regex(R"((^|\n)([0-9]+)(;[^\n]*)?\n)"))) res.job_id = m[2];
  if (res.job_id.empty()) {
    throw RuntimeError("[slurm] sbatch did not submit the job (" + p.describe() + "): " + p.output +
                       " — check the partition, time and resources of the job (script: " + job.script_path() + ")");
  }
  if (p.timed_out) {
    res.timed_out = true;
    SubprocessSpec co;
    co.argv = {options.scancel, res.job_id};
    co.timeout_s = 30;
    co.kill_grace_s = 3;
    co.env = options.env;
    run_subprocess(co);
  } else {
    res.exit_code = p.term_signal() ? 128 + p.term_signal() : p.exit_code();
  }
  res.log_tail = read_tail(fs::path(job.work_dir) / ("slurm-" + res.job_id + ".out"), 4096);
  res.ranks = collect_rank_results(job);
  return res;
}

}  // namespace scalelab::lab
