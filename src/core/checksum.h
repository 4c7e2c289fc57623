#pragma once
// CRC-32 of bytes (zlib's crc32_z): what a resumed run rebuilds instead of reading it from the
// checkpoint (a DPO run's frozen reference model, a QLoRA run's NF4 base) is checked against the
// checksum the checkpointed run recorded. A change detector, not a cryptographic hash.
#include <cstddef>
#include <cstdint>
#include <string>

namespace scalelab {

// The CRC-32 of n bytes, continuing `crc` (0 to start).
std::uint32_t crc32_bytes(const void* data, std::size_t n, std::uint32_t crc = 0);

// As 8 lowercase hex digits (the form the trainer state records).
std::string crc32_hex(std::uint32_t crc);

}  // namespace scalelab
