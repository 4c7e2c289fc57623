#include "lab/log_tail.h"

#include <fstream>

namespace scalelab::lab {

std::string read_file_tail(const std::string& path, std::size_t max_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  f.seekg(0, std::ios::end);
  std::streamoff size = f.tellg();
  std::streamoff start = size > static_cast<std::streamoff>(max_bytes) ? size - static_cast<std::streamoff>(max_bytes) : 0;
  f.seekg(start);
  std::string text(static_cast<std::size_t>(size - start), '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(f.gcount()));
  if (start > 0) {  // drop the partial first line
    auto nl = text.find('\n');
    text = nl == std::string::npos ? std::string() : text.substr(nl + 1);
  }
  return text;
}

}  // namespace scalelab::lab
