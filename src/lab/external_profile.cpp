#include "lab/external_profile.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "profile/readers.h"

namespace scalelab::lab {
namespace {

namespace fs = std::filesystem;

std::string basename_of(const std::string& word) {
  const auto slash = word.find_last_of('/');
  return slash == std::string::npos ? word : word.substr(slash + 1);
}

bool is_assignment(const std::string& word) {
  const auto eq = word.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  return std::all_of(word.begin(), word.begin() + static_cast<std::ptrdiff_t>(eq), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool is_launcher(const std::string& word) {
  const std::string b = basename_of(word);
  return b == "mpirun" || b == "mpiexec" || b == "orterun" || b == "srun";
}

bool is_mpi_launcher(const std::string& launcher) { return launcher == "mpirun" || launcher == "mpiexec" || launcher == "orterun"; }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The rank in "profile.rank3.nsys-rep"; -1 when the name has none (named by process id).
long rank_of(const std::string& file_name) {
  static const std::regex re(R"(\.rank([0-9]+)\.)");
  std::smatch m;
  if (std::regex_search(file_name, m, re)) return std::stol(m[1]);
  return -1;
}

// The last non-empty line, trimmed, at most 300 characters (nsys's own error message).
std::string last_message(const std::string& text) {
  std::string last;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find_first_not_of(" \t\r");
    if (a == std::string::npos) continue;
    const auto b = line.find_last_not_of(" \t\r");
    last = line.substr(a, b - a + 1);
  }
  return last.size() > 300 ? last.substr(0, 300) + "..." : last;
}

Json failed(Json p, const std::string& reason) {
  p["status"] = "failed";
  p["reason"] = reason;
  return p;
}

}  // namespace

const char* const kNsysStatsReports = "cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,nvtx_sum";

const char* profile_tool_name(ProfileTool tool) {
  switch (tool) {
    case ProfileTool::kNsys: return "nsys";
    case ProfileTool::kTorch: return "torch";
    default: return "none";
  }
}

std::string command_launcher(const Workload& workload) {
  std::vector<std::string> words;
  if (workload.shell_command) {
    std::istringstream in(workload.shell_command->text());
    std::string w;
    while (in >> w) words.push_back(w);
  } else {
    for (const auto& t : workload.argv_command) words.push_back(t.text());
  }
  for (const auto& w : words) {
    if (is_assignment(w) || w == "exec") continue;
    return is_launcher(w) ? basename_of(w) : "";
  }
  return "";
}

void validate_profile(const Workload& workload, const std::string& where) {
  if (workload.is_native()) return;
  for (const auto& t : workload.argv_command) {
    if (t.uses("profiler") && !t.is_single_placeholder()) {
      throw InvalidInput("[" + where + "] {profiler} is part of the word '" + t.text() +
                         "' of workload.command — in a list command it must be a word of its own "
                         "(\"mpirun\", \"-np\", \"4\", \"{profiler}\", \"python\", ...)");
    }
  }
  if (workload.profile.tool != ProfileTool::kNsys) return;
  bool has_placeholder = workload.shell_command ? workload.shell_command->uses("profiler") : false;
  for (const auto& t : workload.argv_command) has_placeholder = has_placeholder || t.uses("profiler");
  const std::string launcher = command_launcher(workload);
  if (!launcher.empty() && !has_placeholder) {
    throw InvalidInput("[" + where + "] profile = \"nsys\" with " + launcher +
                       " in front of the command: put {profiler} where each rank's program begins, e.g. '" +
                       launcher + " -np 4 {profiler} python train.py' — each rank then runs under nsys and "
                       "writes its own report (nsys around " + launcher +
                       " itself would profile the launcher, not the ranks on other nodes)");
  }
}

bool nsys_available(const Workload& workload) {
  if (workload.is_native() || workload.profile.tool != ProfileTool::kNsys) return false;
  if (!find_executable("nsys").empty()) return true;
  if (workload.profile.optional) return false;
  throw InvalidInput("[workload] profile = \"nsys\" but nsys (Nsight Systems) is not on PATH — install it (it comes "
                     "with the CUDA toolkit: add its bin directory, e.g. /usr/local/cuda/bin or "
                     "/opt/nvidia/nsight-systems/<version>/bin, to PATH), or write profile = \"nsys?\" to run the "
                     "trials unprofiled where nsys is missing");
}

std::vector<std::string> nsys_profile_words(const Workload& workload, const TrialContext& ctx, bool per_rank) {
  const std::string launcher = per_rank ? command_launcher(workload) : "";
  std::string out = ctx.profile_dir() + "/profile";
  if (per_rank) {
    std::string env = workload.profile.rank_env;
    if (env.empty() && is_mpi_launcher(launcher)) env = "OMPI_COMM_WORLD_RANK";
    if (env.empty() && launcher == "srun") env = "SLURM_PROCID";
    out += env.empty() ? ".%p" : ".rank%q{" + env + "}";
  }
  std::vector<std::string> w = {"nsys",    "profile", "-o", out, "--force-overwrite=true",
                                std::string("--trace=cuda,nvtx,osrt") + (is_mpi_launcher(launcher) ? ",mpi" : "")};
  w.insert(w.end(), workload.profile.args.begin(), workload.profile.args.end());
  return w;
}

std::string strip_nsys_lines(const std::string& log_text) {
  // What nsys prints around the application's output (2023-2024 versions).
  static const std::regex noise(
      R"(^\s*(Collecting data\.\.\.|Generating '.*'|Generated:|Processing events\.\.\.|Saving temporary .*|)"
      R"(Creating final output files\.\.\.|The target application (returned|terminated).*|)"
      R"(\S+\.(nsys-rep|qdrep|qdstrm)|\[[0-9]+/[0-9]+\] \[[=0-9% ]*\].*)\s*$)");
  std::string out;
  std::istringstream in(log_text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() < 512 && std::regex_match(line, noise)) continue;
    out += line;
    out += '\n';
  }
  return out;
}

namespace {

Json collect_nsys(const Workload& workload, const TrialContext& ctx, const SubprocessResult& proc,
                  const ProfileRun& options, bool& cancelled) {
  Json p{{"tool", "nsys"}, {"dir", ctx.profile_dir()}};
  if (!ctx.nsys) {
    p["status"] = "skipped";
    p["reason"] = "nsys was not on PATH (profile = \"nsys?\": the trial ran unprofiled)";
    return p;
  }
  (void)workload;
  std::vector<fs::path> reports;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ctx.profile_dir(), ec)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".nsys-rep" || ext == ".qdrep")) reports.push_back(e.path());
  }
  std::sort(reports.begin(), reports.end(), [](const fs::path& a, const fs::path& b) {
    const long ra = rank_of(a.filename().string()), rb = rank_of(b.filename().string());
    return ra != rb ? ra < rb : a.filename().string() < b.filename().string();
  });
  if (reports.empty()) {
    std::string why = "nsys wrote no report in " + ctx.profile_dir();
    if (proc.timed_out || proc.log_overflow) why += " (the trial was stopped: " + proc.describe() + ")";
    else if (!proc.started) why += " (the command did not start)";
    return failed(p, why + " — see nsys's messages in the trial's log");
  }
  Json files = Json::array(), stats = Json::array(), ranks = Json::array();
  std::string failure;
  for (const auto& rep : reports) {
    const std::string stem = rep.stem().string();
    const std::string csv = (fs::path(ctx.profile_dir()) / (stem + ".stats.csv")).string();
    const std::string err = (fs::path(ctx.profile_dir()) / (stem + ".stats.err")).string();
    files.push_back(rep.string());
    // stdout (the CSV, with nsys's "Processing ..." lines, which the reader skips) to its own
    // file, stderr to another: interleaved warnings must not land inside a table.
    SubprocessSpec s;
    s.argv = {"/bin/sh", "-c", "exec \"$@\" 2>" + shell_quote(err), "sh", "nsys", "stats", "--format=csv",
              std::string("--report=") + kNsysStatsReports, rep.string()};
    s.log_path = csv;
    s.timeout_s = options.timeout_s;
    s.kill_grace_s = options.kill_grace_s;
    const SubprocessResult r = run_subprocess(s, options.cancel, options.tick);
    if (r.cancelled) {
      cancelled = true;
      return p;
    }
    if (!r.ok()) {
      std::string detail = last_message(read_all(err));
      if (detail.empty()) detail = last_message(read_all(csv));
      if (failure.empty())
        failure = "nsys stats failed on " + rep.string() + ": " + r.describe() + (detail.empty() ? "" : ": " + detail);
      continue;
    }
    try {
      profile::Report report = profile::summarize_nsys_csv(read_all(csv), fs::path(csv).filename().string());
      report.file = csv;
      stats.push_back(csv);
      Json rank{{"report", rep.string()}, {"derived", report.derived}};
      if (const long n = rank_of(rep.filename().string()); n >= 0) rank["rank"] = n;
      ranks.push_back(rank);
      if (!p.contains("summary")) p["summary"] = profile::to_json(report);
    } catch (const Error& e) {
      if (failure.empty()) failure = "cannot read the nsys stats of " + rep.string() + ": " + e.what();
    }
  }
  p["reports"] = files;
  p["stats"] = stats;
  if (ranks.size() > 1 || reports.size() > 1) p["ranks"] = ranks;
  if (!failure.empty()) return failed(p, failure);
  p["status"] = "ok";
  return p;
}

Json collect_torch(const TrialContext& ctx) {
  const std::string path = ctx.profile_dir() + "/torch_trace.json";
  Json p{{"tool", "torch"}, {"dir", ctx.profile_dir()}, {"trace", path}};
  if (!fs::exists(path)) {
    return failed(p, std::string("the workload wrote no trace at $") + kTorchTraceEnv + " (" + path +
                         ") — add the snippet of docs/profiling.md (prof.export_chrome_trace(os.environ[\"" +
                         kTorchTraceEnv + "\"])) to the script");
  }
  try {
    profile::Report report = profile::summarize_file(path);
    if (report.source != "pytorch") return failed(p, path + " is not a PyTorch profiler trace");
    p["summary"] = profile::to_json(report);
    p["status"] = "ok";
  } catch (const Error& e) {
    return failed(p, std::string("cannot read the trace: ") + e.what());
  }
  return p;
}

}  // namespace

Json collect_external_profile(const Workload& workload, const TrialContext& ctx, const SubprocessResult& proc,
                              const ProfileRun& options, bool& cancelled) {
  cancelled = false;
  if (workload.profile.tool == ProfileTool::kNsys) return collect_nsys(workload, ctx, proc, options, cancelled);
  if (workload.profile.tool == ProfileTool::kTorch) return collect_torch(ctx);
  return Json();
}

}  // namespace scalelab::lab
