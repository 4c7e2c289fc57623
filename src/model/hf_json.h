#pragma once
// Reading Hugging Face config.json values with errors that name the file and the key: shared by
// the families' config_from_hf (src/model/<family>/family.cpp).
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace scalelab::hf_json {

// A required integer; InvalidInput naming `source` when absent or not an integer.
std::int64_t require_int(const nlohmann::json& j, const char* key, const std::string& source);

// `key`'s value, or `fallback` when absent or null; InvalidInput when of the wrong type.
template <class T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InvalidInput("[config] " + source + ": \"" + key + "\" has the wrong type: " + j.at(key).dump());
  }
}

// InvalidInput "[config] <source>: <what>".
[[noreturn]] void fail(const std::string& source, const std::string& what);

}  // namespace scalelab::hf_json
