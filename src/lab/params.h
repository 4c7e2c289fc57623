#pragma once
// Trial parameters: the named values one trial runs with (micro_batch_size = 8, attn = "flash",
// fused_kernels = true, ...), their canonical JSON, the config hash that identifies a trial, and
// the conversions between parameters and `scalelab train` flags.
//
// Names are snake_case (micro_batch_size); the matching train flag is kebab case
// (--micro-batch-size). Values are JSON scalars: string, integer, float or bool.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab::lab {

using Json = nlohmann::json;
// Sorted by name, so iteration order (and hence the canonical JSON) is deterministic.
using ParamMap = std::map<std::string, Json>;

// "micro-batch-size" and "micro_batch_size" -> "micro_batch_size".
std::string param_name(const std::string& name_or_flag);
// "micro_batch_size" -> "--micro-batch-size".
std::string param_flag(const std::string& name);

// The value as a word: strings as they are, integers without a decimal point, floats in the
// shortest form that round-trips, bools as "true"/"false".
std::string param_text(const Json& value);

// A word from the command line as a JSON scalar: "8" -> 8, "1e-3" -> 0.001, "true" -> true,
// anything else a string. Used for flags forwarded to the engine, so that tables and filters
// compare numbers as numbers.
Json parse_param_word(const std::string& word);

// Parses forwarded train flags ("--seq-len 1024 --fused-kernels --device-memory=4GiB") into
// parameters. A flag followed by a word that does not start with "--" takes it as its value;
// otherwise it is a switch (true). Throws InvalidInput on a word that is not a flag.
ParamMap parse_flag_words(const std::vector<std::string>& words);

// `scalelab train` flags for parameters: a true bool is a bare switch, a false bool is left out,
// anything else is "--flag value". Parameters named in `skip` are left out.
// The native workload's engine subcommand: parameter "subcommand" ("train", the default, or "dpo":
// a preference-optimization trial takes the same flags and writes the same run record), which
// becomes the subcommand rather than a flag; InvalidInput for another value.
inline constexpr const char* kSubcommandParam = "subcommand";
std::string native_subcommand(const ParamMap& params);

std::vector<std::string> params_to_flags(const ParamMap& params,
                                         const std::vector<std::string>& skip = {});

// "micro_batch_size=8 attn=flash" for progress lines and logs.
std::string params_label(const ParamMap& params, const std::vector<std::string>& only = {});

// Appends `item` to `list`, with `sep` before it when `list` is not empty ("a, b, c").
void append_item(std::string& list, const std::string& item, const char* sep = ", ");

// 64-bit FNV-1a of a string, as 16 hex digits. Hand-written (5 lines) because it only names a
// configuration in the database (not security) and SQLite/nlohmann have no hash to offer.
std::string fnv1a_hex(const std::string& text);

}  // namespace scalelab::lab
