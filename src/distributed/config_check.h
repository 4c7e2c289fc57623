#pragma once
// Ranks of one job must run the same configuration: each hashes its resolved config (a JSON
// object) and the hashes are compared; on a mismatch every rank learns which keys differ on which
// ranks (an InvalidInput, exit 2).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/communicator.h"

namespace scalelab {

// FNV-1a 64 of the canonical dump (keys sorted, no whitespace): equal configs hash equal on every
// rank and machine.
std::uint64_t config_hash(const nlohmann::json& config);

struct ConfigDiff {
  std::string key;        // JSON pointer without the leading '/', e.g. "micro_batch_size"
  std::string reference;  // dumped value, or "(absent)"
  std::string other;
};
// Leaf-by-leaf differences between two configs (objects are walked; arrays and scalars compare
// whole), sorted by key.
std::vector<ConfigDiff> diff_configs(const nlohmann::json& reference, const nlohmann::json& other);

// Collective. Keys in `ignore` (top-level, e.g. a per-rank output path) are left out. Returns
// normally when every rank has the same config; otherwise throws InvalidInput on every rank with
// a message such as "rank 1 differs from rank 0 in micro_batch_size (rank 1: 8, rank 0: 4)".
void check_same_config(Communicator& comm, const nlohmann::json& config,
                       const std::vector<std::string>& ignore = {});

}  // namespace scalelab
