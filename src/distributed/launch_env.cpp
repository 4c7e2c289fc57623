#include "distributed/launch_env.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace scalelab {
namespace {

int parse_int(const EnvLookup& env, const std::string& name, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end == nullptr || *end != '\0' || errno != 0 || v < 0 || v > 1'000'000'000)
    throw InvalidInput("[dist] environment variable " + name + "='" + value +
                       "' is not a non-negative integer — fix or unset it (it tells scalelab its "
                       "rank in a parallel launch)");
  return static_cast<int>(v);
}

std::optional<int> get_int(const EnvLookup& env, const std::string& name) {
  const std::optional<std::string> v = env(name);
  if (!v) return std::nullopt;
  return parse_int(env, name, *v);
}

int require_int(const EnvLookup& env, const std::string& name, Launcher l) {
  const std::optional<int> v = get_int(env, name);
  if (!v)
    throw InvalidInput(std::string("[dist] launched by ") + launcher_name(l) + " but " + name +
                       " is not set — launch with the launcher's own command (mpirun, srun, "
                       "torchrun) rather than setting its variables by hand");
  return *v;
}

void validate(const LaunchEnv& e, const std::string& vars) {
  if (e.world_size < 1 || e.rank >= e.world_size)
    throw InvalidInput("[dist] " + std::string(launcher_name(e.launcher)) + " environment gives rank " +
                       std::to_string(e.rank) + " of a world of " + std::to_string(e.world_size) +
                       " (" + vars + ") — the rank must be in [0, world size)");
  if (e.local_world_size < 1 || e.local_rank >= e.local_world_size || e.local_world_size > e.world_size)
    throw InvalidInput("[dist] " + std::string(launcher_name(e.launcher)) + " environment gives local rank " +
                       std::to_string(e.local_rank) + " of " + std::to_string(e.local_world_size) +
                       " on this node in a world of " + std::to_string(e.world_size) + " (" + vars +
                       ") — inconsistent launcher variables");
}

}  // namespace

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::kNone: return "none";
    case Launcher::kOpenMpi: return "openmpi";
    case Launcher::kSlurm: return "slurm";
    case Launcher::kTorchrun: return "torchrun";
  }
  return "?";
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

LaunchEnv detect_launch_env(const EnvLookup& env) {
  LaunchEnv e;
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = Launcher::kOpenMpi;
    e.rank = require_int(env, "OMPI_COMM_WORLD_RANK", e.launcher);
    e.world_size = require_int(env, "OMPI_COMM_WORLD_SIZE", e.launcher);
    e.local_rank = get_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    e.local_world_size = get_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(e.local_rank + 1);
    validate(e, "OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE");
    return e;
  }
  if (env("SLURM_PROCID") && env("SLURM_STEP_ID")) {
    e.launcher = Launcher::kSlurm;
    e.rank = require_int(env, "SLURM_PROCID", e.launcher);
    if (const std::optional<int> n = get_int(env, "SLURM_STEP_NUM_TASKS")) {
      e.world_size = *n;
    } else {
      e.world_size = require_int(env, "SLURM_NTASKS", e.launcher);
    }
    e.local_rank = get_int(env, "SLURM_LOCALID").value_or(0);
    // SLURM_STEP_TASKS_PER_NODE is a compressed list ("2(x3),1"); the local count is not needed
    // for anything but validation, so only the plain form is read.
    e.local_world_size = e.local_rank + 1;
    if (const std::optional<std::string> tpn = env("SLURM_STEP_TASKS_PER_NODE")) {
      const std::string first = tpn->substr(0, tpn->find_first_of("(,"));
      if (!first.empty() && first.find_first_not_of("0123456789") == std::string::npos)
        e.local_world_size = std::max(e.local_world_size, parse_int(env, "SLURM_STEP_TASKS_PER_NODE", first));
    }
    validate(e, "SLURM_PROCID/SLURM_STEP_NUM_TASKS/SLURM_LOCALID");
    return e;
  }
  if (env("RANK") && env("WORLD_SIZE")) {
    e.launcher = Launcher::kTorchrun;
    e.rank = require_int(env, "RANK", e.launcher);
    e.world_size = require_int(env, "WORLD_SIZE", e.launcher);
    e.local_rank = get_int(env, "LOCAL_RANK").value_or(0);
    e.local_world_size = get_int(env, "LOCAL_WORLD_SIZE").value_or(e.local_rank + 1);
    e.master_addr = env("MASTER_ADDR").value_or("");
    e.master_port = get_int(env, "MASTER_PORT").value_or(0);
    validate(e, "RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE");
    return e;
  }
  return e;
}

}  // namespace scalelab
