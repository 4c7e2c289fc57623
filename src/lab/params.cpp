#include "lab/params.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace scalelab::lab {

std::string param_name(const std::string& name_or_flag) {
  std::string s = name_or_flag;
  std::size_t start = 0;
  while (start < s.size() && s[start] == '-') ++start;
  s = s.substr(start);
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

std::string param_flag(const std::string& name) {
  std::string s = "--" + name;
  for (std::size_t i = 2; i < s.size(); ++i)
    if (s[i] == '_') s[i] = '-';
  return s;
}

std::string param_text(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_null()) return "";
  return value.dump();  // numbers: integers plainly, floats shortest round-trip
}

Json parse_param_word(const std::string& word) {
  if (word == "true") return true;
  if (word == "false") return false;
  if (word.empty()) return word;
  errno = 0;
  char* end = nullptr;
  long long i = std::strtoll(word.c_str(), &end, 10);
  if (errno == 0 && end == word.c_str() + word.size()) return i;
  errno = 0;
  double d = std::strtod(word.c_str(), &end);
  // Only plain decimal/scientific notation counts as a number ("inf", "0x10" stay words).
  bool numeric_chars = word.find_first_not_of("0123456789.eE+-") == std::string::npos;
  if (numeric_chars && errno == 0 && end == word.c_str() + word.size()) return d;
  return word;
}

ParamMap parse_flag_words(const std::vector<std::string>& words) {
  ParamMap params;
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.size() < 3 || w.rfind("--", 0) != 0) {
      throw InvalidInput("[lab] unexpected argument '" + w +
                         "' — train flags are written --name value or --name=value");
    }
    std::string name, value;
    bool has_value = false;
    auto eq = w.find('=');
    if (eq != std::string::npos) {
      name = w.substr(0, eq);
      value = w.substr(eq + 1);
      has_value = true;
    } else {
      name = w;
      if (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) {
        value = words[++i];
        has_value = true;
      }
    }
    std::string key = param_name(name);
    if (params.count(key)) {
      throw InvalidInput("[lab] flag " + name + " given twice — give it once");
    }
    params[key] = has_value ? parse_param_word(value) : Json(true);
  }
  return params;
}

std::string native_subcommand(const ParamMap& params) {
  auto it = params.find(kSubcommandParam);
  if (it == params.end()) return "train";
  const std::string v = param_text(it->second);
  if (v != "train" && v != "dpo") {
    throw InvalidInput("[lab] parameter subcommand = \"" + v +
                       "\" — a native trial runs `scalelab train` or `scalelab dpo`: use \"train\" or \"dpo\"");
  }
  return v;
}

std::vector<std::string> params_to_flags(const ParamMap& params, const std::vector<std::string>& skip) {
  std::vector<std::string> out;
  for (const auto& [name, value] : params) {
    bool skipped = false;
    for (const auto& s : skip) skipped = skipped || s == name;
    if (skipped) continue;
    if (value.is_boolean()) {
      if (value.get<bool>()) out.push_back(param_flag(name));
      continue;
    }
    out.push_back(param_flag(name));
    out.push_back(param_text(value));
  }
  return out;
}

std::string params_label(const ParamMap& params, const std::vector<std::string>& only) {
  std::string out;
  for (const auto& [name, value] : params) {
    if (!only.empty()) {
      bool wanted = false;
      for (const auto& o : only) wanted = wanted || o == name;
      if (!wanted) continue;
    }
    if (!out.empty()) out += ' ';
    out += name + "=" + param_text(value);
  }
  return out;
}

void append_item(std::string& list, const std::string& item, const char* sep) {
  if (!list.empty()) list += sep;
  list += item;
}

std::string fnv1a_hex(const std::string& text) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace scalelab::lab
