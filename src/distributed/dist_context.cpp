#include "distributed/dist_context.h"

#include "core/error.h"
#include "distributed/mpi_communicator.h"
#include "distributed/nccl_communicator.h"
#include "distributed/single_communicator.h"

namespace scalelab {

CommBackend parse_comm_backend(std::string_view name) {
  if (name == "auto") return CommBackend::kAuto;
  if (name == "single") return CommBackend::kSingle;
  if (name == "mpi") return CommBackend::kMpi;
  if (name == "nccl") return CommBackend::kNccl;
  throw InvalidInput("[dist] --comm-backend '" + std::string(name) + "' is not one of auto, single, mpi, nccl");
}

const char* comm_backend_name(CommBackend b) {
  switch (b) {
    case CommBackend::kAuto: return "auto";
    case CommBackend::kSingle: return "single";
    case CommBackend::kMpi: return "mpi";
    case CommBackend::kNccl: return "nccl";
  }
  return "?";
}

DistContext::~DistContext() {
  device_.reset();  // before the host communicator it was bootstrapped over
  host_.reset();
}

DistContext make_dist_context(CommBackend backend, bool device_is_cuda, const CommOptions& options,
                              const LaunchEnv& env) {
  SCALELAB_CHECK_INPUT(env.launcher != Launcher::kTorchrun,
                       "[dist] launched by torchrun (RANK/WORLD_SIZE set): scalelab's engine runs its ranks "
                       "under MPI — use `mpirun -np " + std::to_string(env.world_size) +
                           " scalelab train ...` or `srun --mpi=pmix scalelab train ...` (the lab drives "
                           "torchrun for external commands)");
  SCALELAB_CHECK_INPUT(backend != CommBackend::kNccl || device_is_cuda,
                       "[dist] --comm-backend nccl needs --device cuda (NCCL communicates device memory)");
  SCALELAB_CHECK_INPUT(backend != CommBackend::kSingle || env.world_size == 1,
                       "[dist] --comm-backend single, but the launcher started " + std::to_string(env.world_size) +
                           " ranks — use auto or mpi");
  DistContext ctx;
  ctx.env_ = env;
  const bool want_mpi = backend == CommBackend::kMpi || backend == CommBackend::kNccl ||
                        (backend == CommBackend::kAuto && env.world_size > 1);
  if (!want_mpi) {
    ctx.host_ = std::make_unique<SingleCommunicator>(options);
    return ctx;
  }
  auto mpi = MpiCommunicator::create(options);
  if (env.launcher != Launcher::kNone && mpi->world_size() != env.world_size)
    throw RuntimeError("[dist] the " + std::string(launcher_name(env.launcher)) + " environment says " +
                       std::to_string(env.world_size) + " ranks but MPI has " + std::to_string(mpi->world_size()) +
                       " — with srun use --mpi=pmix; do not nest launchers");
  ctx.host_ = std::move(mpi);
  const bool want_nccl = backend == CommBackend::kNccl || (backend == CommBackend::kAuto && device_is_cuda);
  if (want_nccl) ctx.device_ = NcclCommunicator::create(*ctx.host_);
  return ctx;
}

}  // namespace scalelab
