// libFuzzer entry point of one target (SCALELAB_FUZZ_TARGET, set per binary by CMakeLists.txt).
// Accepted and InvalidInput-rejected inputs return 0; a ContractViolation or any other exception
// aborts, which libFuzzer reports as a crash and saves as crash-<sha1>.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const scalelab::fuzz::Target& t = scalelab::fuzz::target(SCALELAB_FUZZ_TARGET);
  try {
    t.run(data, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz[%s]: finding: %s\n", t.name, e.what());
    std::abort();
  }
  return 0;
}
