#pragma once
// The fuzz targets: one per parser of outside input. Each takes the bytes of one input, hands
// them to the parser exactly as the program would (through a file where the program reads a
// file) and then uses what was parsed as the program does next (reads the tensors, builds the
// parameter layout, expands the sweep, reads batches).
//
// The contract a target checks: an input is either accepted or rejected with InvalidInput whose
// message names the file (or source) it came from. Anything else is a finding: a crash, a
// sanitizer report, a hang, an allocation past the fuzzer's limit, another exception type, or
// a rejection that does not say which file was wrong (those two throw ContractViolation).
//
// The same functions serve the libFuzzer binaries (fuzz_main.cpp, `make fuzz`) and the
// GoogleTest suite (replay_test.cpp), which replays every committed corpus input in CI.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace scalelab::fuzz {

enum class Outcome { kAccepted, kRejected };

struct ContractViolation : std::logic_error {
  using std::logic_error::logic_error;
};

struct Target {
  const char* name;  // also the corpus folder: tests/fuzz/corpus/<name>/
  Outcome (*run)(const std::uint8_t* data, std::size_t size);
  // The message of the last rejection (for the regression tests' assertions).
};

const std::vector<Target>& targets();
// Throws std::invalid_argument for an unknown name.
const Target& target(std::string_view name);
// The InvalidInput message of the calling thread's last rejected input.
const std::string& last_rejection();

}  // namespace scalelab::fuzz
