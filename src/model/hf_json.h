#pragma once
// Reading Hugging Face config.json values with errors that name the file and the key: shared by
// the families' config_from_hf (src/model/<family>/family.cpp).
#include <cstdint>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace scalelab::hf_json {

// A required integer; InvalidInput naming `source` when absent or not an integer.
std::int64_t require_int(const nlohmann::json& j, const char* key, const std::string& source);

// `key`'s value, or `fallback` when absent or null; InvalidInput when of the wrong type.
template <class T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  // nlohmann converts a float to an integer with a cast, undefined beyond the integer's range
  // (found by fuzzing config.json: "num_key_value_heads": 1e300).
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!j.at(key).is_number_integer()) {
      throw InvalidInput("[config] " + source + ": \"" + key + "\" must be an integer, got " + j.at(key).dump());
    }
  }
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InvalidInput("[config] " + source + ": \"" + key + "\" has the wrong type: " + j.at(key).dump());
  }
}

// InvalidInput "[config] <source>: <what>".
[[noreturn]] void fail(const std::string& source, const std::string& what);

}  // namespace scalelab::hf_json
