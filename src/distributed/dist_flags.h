#pragma once
// The data-parallel flags of `scalelab train` (and of `scalelab scale`, which passes them on), in
// one place: `--ddp-bucket-mb`, `--zero`, `--comm-timeout`, `--comm-backend`.
//
//   DistFlags dist_flags;
//   add_dist_flags(*train_app, dist_flags);            // when declaring the command's flags
//   ... after parsing:
//   DistContext dist = make_dist_context(dist_flags.backend(), device_is_cuda, dist_flags.comm_options());
//   DataParallel dp(dist.grads(), params, grads, n, dist_flags.data_parallel_options(), update);
//   config["ddp_bucket_mb"] = ...  (dist_flags.to_json() gives all four for the run record)
#include <string>

#include <nlohmann/json.hpp>

#include "distributed/communicator.h"
#include "distributed/data_parallel.h"
#include "distributed/dist_context.h"

namespace CLI {
class App;  // CLI11; declared only, so that TrainOptions can hold DistFlags without it
}

namespace scalelab {

struct DistFlags {
  double ddp_bucket_mb = 25.0;
  int zero = 0;
  double comm_timeout_s = 300.0;
  std::string comm_backend = "auto";

  // Throw InvalidInput naming the flag for a bad value.
  CommBackend backend() const;
  CommOptions comm_options() const;
  DataParallelOptions data_parallel_options() const;
  nlohmann::json to_json() const;  // {"ddp_bucket_mb", "zero", "comm_timeout", "comm_backend"}
};

void add_dist_flags(CLI::App& app, DistFlags& flags);

}  // namespace scalelab
