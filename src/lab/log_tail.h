#pragma once
// The end of a trial's log: what a trial's reason and the launchers read back.
#include <cstddef>
#include <string>

namespace scalelab::lab {

// The last `max_bytes` of a file (whole lines), "" when unreadable.
std::string read_file_tail(const std::string& path, std::size_t max_bytes);

}  // namespace scalelab::lab
