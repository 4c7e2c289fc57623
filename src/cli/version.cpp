// `scalelab version`: what this binary is and what it was built with.
#include <cstdio>

#include "cli/command.h"
#include "core/parallel.h"
#include "scalelab/version.h"

extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);

namespace scalelab::cli {

Subcommand add_version_command(CLI::App& root) {
  auto* app = root.add_subcommand("version", "Print the version, git revision and build configuration");
  return {app, [] {
            std::printf("scalelab %s (git %s)\n", SCALELAB_VERSION, SCALELAB_GIT_REV);
            std::printf("BLAS: OpenBLAS %s, core %s\n", openblas_get_config(), openblas_get_corename());
            std::printf("threads: %d\n", num_threads());
            return 0;
          }};
}

}  // namespace scalelab::cli
