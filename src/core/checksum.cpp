#include "core/checksum.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <limits>

namespace scalelab {

std::uint32_t crc32_bytes(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  // crc32_z takes a z_size_t; feed it in pieces anyway so that a 32-bit zlib build works too.
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  while (n > 0) {
    const std::size_t k = std::min(n, kPiece);
    c = crc32_z(c, p, static_cast<z_size_t>(k));
    p += k;
    n -= k;
  }
  return static_cast<std::uint32_t>(c);
}

std::string crc32_hex(std::uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(crc));
  return buf;
}

}  // namespace scalelab
