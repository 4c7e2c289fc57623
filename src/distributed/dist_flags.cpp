#include "distributed/dist_flags.h"

#include <algorithm>
#include <cmath>

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace scalelab {

CommBackend DistFlags::backend() const { return parse_comm_backend(comm_backend); }

CommOptions DistFlags::comm_options() const {
  SCALELAB_CHECK_INPUT(comm_timeout_s > 0 && std::isfinite(comm_timeout_s),
                       "[dist] --comm-timeout must be a positive number of seconds (got " +
                           std::to_string(comm_timeout_s) + ")");
  CommOptions o;
  o.timeout_s = comm_timeout_s;
  return o;
}

DataParallelOptions DistFlags::data_parallel_options() const {
  SCALELAB_CHECK_INPUT(ddp_bucket_mb > 0 && std::isfinite(ddp_bucket_mb),
                       "[dist] --ddp-bucket-mb must be a positive number of MiB (got " + std::to_string(ddp_bucket_mb) + ")");
  SCALELAB_CHECK_INPUT(zero == 0 || zero == 1, "[dist] --zero " + std::to_string(zero) +
                                                   " is not supported — use 0 (DDP) or 1 (sharded optimizer states)");
  DataParallelOptions o;
  o.ddp.bucket_mb = ddp_bucket_mb;
  o.ddp.first_bucket_mb = std::min(1.0, ddp_bucket_mb);
  o.zero_stage = zero;
  return o;
}

nlohmann::json DistFlags::to_json() const {
  return {{"ddp_bucket_mb", ddp_bucket_mb}, {"zero", zero}, {"comm_timeout", comm_timeout_s}, {"comm_backend", comm_backend}};
}

void add_dist_flags(CLI::App& app, DistFlags& f) {
  app.add_option("--ddp-bucket-mb", f.ddp_bucket_mb,
                 "Gradient all-reduce bucket size in MiB (the first bucket is 1 MiB), as PyTorch DDP's bucket_cap_mb")
      ->capture_default_str();
  app.add_option("--zero", f.zero, "ZeRO stage: 0 = DDP, 1 = optimizer states sharded over the ranks")
      ->capture_default_str();
  app.add_option("--comm-timeout", f.comm_timeout_s,
                 "Seconds a collective may take before the run fails, naming the ranks that did not arrive")
      ->capture_default_str();
  app.add_option("--comm-backend", f.comm_backend,
                 "auto (one process: none; mpirun/srun: MPI; with --device cuda: NCCL), single, mpi or nccl")
      ->capture_default_str();
}

}  // namespace scalelab
