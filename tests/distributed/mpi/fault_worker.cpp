// A two-rank DDP job that fails on purpose, for tests/distributed/mpi_launch_test.cpp (run under mpirun):
//   --mode ok     both ranks finish (the job must end cleanly, exit 0)
//   --mode throw  rank 1 raises an error in the middle of backward (after rank 0 launched buckets)
//   --mode exit   rank 1 exits abruptly (_exit(3)) in the middle of backward, telling no one
//   --mode kill   rank 1 is killed (SIGKILL) in the middle of backward
//   --mode stall  rank 1 stops responding in backward (sleeps 120 s) while its process lives
// Errors are reported as the CLI does: "rank R: error: ...", then linger_after_failure(), exit code.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "distributed/ddp.h"
#include "distributed/mpi_communicator.h"

using namespace scalelab;

int main(int argc, char** argv) {
  std::string mode = "ok";
  double timeout_s = 60;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mode")) mode = argv[i + 1];
    if (!std::strcmp(argv[i], "--comm-timeout")) timeout_s = std::stod(argv[i + 1]);
  }
  CommOptions options;
  options.timeout_s = timeout_s;
  std::unique_ptr<MpiCommunicator> comm;
  int rank = -1;
  // The gradients outlive the failure path: a collective the communicator abandons may still be
  // read or written by MPI until the process exits (as the trainer keeps its buffers, trainer.cpp).
  const std::int64_t n = 1 << 20;
  std::vector<float> grads(static_cast<std::size_t>(n), 1.0f);
  try {
    comm = MpiCommunicator::create(options);
    rank = comm->rank();
    with_failure_notice(*comm, [&] {
      GradReducer red(*comm, grads.data(), n, DdpOptions{1.0, 0.25, true});
      for (int step = 0; step < 3; ++step) {
        red.begin_step(true);
        for (int l = 7; l >= 0; --l) {
          if (step == 1 && l == 3 && rank == 1) {
            if (mode == "throw") throw InvalidInput("injected failure: data file unreadable");
            if (mode == "exit") _exit(3);
            if (mode == "kill") raise(SIGKILL);
            if (mode == "stall") std::this_thread::sleep_for(std::chrono::seconds(120));
          }
          red.mark_ready(n * l / 8, n * (l + 1) / 8);
        }
        red.finish();
      }
      return 0;
    });
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    linger_after_failure();  // as the CLI does after printing: the peers report it too
    return exit_code(e.kind());
  }
  std::printf("rank %d: ok\n", rank);
  comm.reset();
  return 0;
}
