// One rank of a small MPI job that writes its result as JSON: what the launch tests (mpirun,
// SLURM's srun --mpi=pmix through src/lab/slurm) collect. Usage: rank_result --json PATH
// [--expect-world N]. It makes its communicators from the launcher's environment as
// `scalelab train` will (make_dist_context), checks the ranks agree on a config, all-reduces
// rank + 1 and records it.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "distributed/config_check.h"
#include "distributed/dist_context.h"

using namespace scalelab;

int main(int argc, char** argv) {
  std::string path;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--json")) path = argv[i + 1];
  if (path.empty()) {
    std::fprintf(stderr, "usage: rank_result --json PATH\n");
    return 2;
  }
  try {
    DistContext dist = make_dist_context(CommBackend::kAuto, false, CommOptions{});
    Communicator& c = dist.host();
    check_same_config(c, nlohmann::json{{"program", "rank_result"}});
    const double sum = c.all_reduce_value<double>(c.rank() + 1.0, ReduceOp::kSum);
    nlohmann::json j{{"status", "ok"},
                     {"rank", c.rank()},
                     {"world_size", c.world_size()},
                     {"local_rank", c.local_rank()},
                     {"launcher", launcher_name(dist.env().launcher)},
                     {"backend", c.backend()},
                     {"sum_of_rank_plus_one", sum}};
    std::ofstream(path) << j.dump() << "\n";
    std::printf("rank %d of %d: wrote %s\n", c.rank(), c.world_size(), path.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "rank_result: error: %s\n", e.what());
    return exit_code(e.kind());
  }
  return 0;
}
