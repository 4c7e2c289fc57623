#include "distributed/communicator.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace scalelab {

std::size_t comm_dtype_size(CommDType t) {
  switch (t) {
    case CommDType::kF32: return 4;
    case CommDType::kF64: return 8;
    case CommDType::kI32: return 4;
    case CommDType::kI64: return 8;
    case CommDType::kU64: return 8;
    case CommDType::kU8: return 1;
  }
  return 1;
}

const char* comm_dtype_name(CommDType t) {
  switch (t) {
    case CommDType::kF32: return "fp32";
    case CommDType::kF64: return "fp64";
    case CommDType::kI32: return "int32";
    case CommDType::kI64: return "int64";
    case CommDType::kU64: return "uint64";
    case CommDType::kU8: return "uint8";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

std::vector<std::int64_t> even_counts(std::int64_t n, int world_size, std::int64_t align) {
  SCALELAB_CHECK(n >= 0 && world_size >= 1 && align >= 1,
                 "[dist] even_counts: bad arguments (n=" + std::to_string(n) + ", world=" +
                     std::to_string(world_size) + ", align=" + std::to_string(align) + ")");
  std::int64_t per = (n + world_size - 1) / world_size;
  per = (per + align - 1) / align * align;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::int64_t b = std::min<std::int64_t>(n, per * r);
    const std::int64_t e = std::min<std::int64_t>(n, per * (r + 1));
    counts[static_cast<std::size_t>(r)] = e - b;
  }
  return counts;
}

std::int64_t segment_offset(std::span<const std::int64_t> counts, int r) {
  std::int64_t off = 0;
  for (int i = 0; i < r; ++i) off += counts[static_cast<std::size_t>(i)];
  return off;
}

void check_counts(const char* what, std::span<const std::int64_t> counts, int world_size) {
  SCALELAB_CHECK(static_cast<int>(counts.size()) == world_size,
                 std::string("[dist] ") + what + ": " + std::to_string(counts.size()) +
                     " counts for a world of " + std::to_string(world_size) +
                     " ranks — pass one count per rank");
  for (std::int64_t c : counts)
    SCALELAB_CHECK(c >= 0, std::string("[dist] ") + what + ": negative count " + std::to_string(c));
}

void check_reduce(const char* what, CommDType dtype, ReduceOp op) {
  SCALELAB_CHECK(op != ReduceOp::kAvg || dtype == CommDType::kF32 || dtype == CommDType::kF64,
                 std::string("[dist] ") + what + ": average of " + comm_dtype_name(dtype) +
                     " is not defined — use sum for integer types");
}

std::vector<std::string> Communicator::all_gather_strings(const std::string& mine) {
  const std::vector<std::int64_t> sizes = all_gather_value<std::int64_t>(static_cast<std::int64_t>(mine.size()));
  std::int64_t total = 0;
  for (std::int64_t s : sizes) total += s;
  std::string all(static_cast<std::size_t>(total), '\0');
  const std::int64_t off = segment_offset(sizes, rank());
  if (!mine.empty()) std::memcpy(all.data() + off, mine.data(), mine.size());
  all_gather(all.data(), sizes, CommDType::kU8);
  std::vector<std::string> out;
  out.reserve(sizes.size());
  std::int64_t at = 0;
  for (std::int64_t s : sizes) {
    out.push_back(all.substr(static_cast<std::size_t>(at), static_cast<std::size_t>(s)));
    at += s;
  }
  return out;
}

std::string Communicator::broadcast_string(const std::string& s, int root) {
  std::int64_t size = static_cast<std::int64_t>(s.size());
  broadcast(&size, 1, CommDType::kI64, root);
  std::string out = rank() == root ? s : std::string(static_cast<std::size_t>(size), '\0');
  if (size > 0) broadcast(out.data(), size, CommDType::kU8, root);
  return out;
}

}  // namespace scalelab
