#pragma once
// The communicators of one rank, made from the launcher's environment. This is what a command
// (`scalelab train`) creates once, at the start, and keeps until it returns:
//
//   DistContext dist = make_dist_context(CommBackend::kAuto, /*cuda=*/false, comm_options);
//   check_same_config(dist.host(), resolved_config_json, {"json", "save"});
//   ... DataParallel dp(dist.grads(), ...);
//
// One process (no launcher variables) gets a SingleCommunicator; `mpirun -np N` and
// `srun --mpi=pmix` get MPI; with --device cuda, NCCL over device memory is added (bootstrapped
// over MPI) and grads() returns it. A torchrun launch is refused with a clear message: scalelab's
// engine runs under mpirun or srun (torchrun is for the external commands the lab drives).
#include <memory>
#include <string_view>

#include "distributed/communicator.h"
#include "distributed/launch_env.h"

namespace scalelab {

enum class CommBackend { kAuto, kSingle, kMpi, kNccl };
// "auto", "single", "mpi", "nccl"; throws InvalidInput naming the flag.
CommBackend parse_comm_backend(std::string_view name);
const char* comm_backend_name(CommBackend b);

class DistContext {
 public:
  DistContext() = default;
  DistContext(DistContext&&) = default;
  DistContext& operator=(DistContext&&) = default;
  ~DistContext();

  const LaunchEnv& env() const { return env_; }
  // Host-memory collectives: config check, metrics, CPU gradients.
  Communicator& host() { return *host_; }
  // The communicator for gradients: NCCL when there is one, else host().
  Communicator& grads() { return device_ ? *device_ : *host_; }
  bool has_device_comm() const { return device_ != nullptr; }
  int rank() const { return host_->rank(); }
  int world_size() const { return host_->world_size(); }

 private:
  friend DistContext make_dist_context(CommBackend, bool, const CommOptions&, const LaunchEnv&);
  LaunchEnv env_;
  std::unique_ptr<Communicator> host_;    // destroyed last: device_ was bootstrapped over it
  std::unique_ptr<Communicator> device_;
};

// Throws InvalidInput for a launch it cannot serve (torchrun; backend "single" with several
// ranks; "nccl" without --device cuda) and RuntimeError when the backend is not built in or the
// launcher's world disagrees with MPI's.
DistContext make_dist_context(CommBackend backend, bool device_is_cuda, const CommOptions& options,
                              const LaunchEnv& env);
inline DistContext make_dist_context(CommBackend backend, bool device_is_cuda, const CommOptions& options) {
  return make_dist_context(backend, device_is_cuda, options, detect_launch_env());
}

}  // namespace scalelab
