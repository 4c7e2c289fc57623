#include "lab/command_template.h"

#include <algorithm>

#include "core/error.h"

namespace scalelab::lab {

CommandTemplate::CommandTemplate(const std::string& text, const std::string& where) : text_(text) {
  std::string literal;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '{' && i + 1 < text.size() && text[i + 1] == '{') {
      literal += '{';
      ++i;
    } else if (c == '}' && i + 1 < text.size() && text[i + 1] == '}') {
      literal += '}';
      ++i;
    } else if (c == '{') {
      auto close = text.find('}', i + 1);
      if (close == std::string::npos) {
        throw InvalidInput("[" + where + "] unclosed placeholder at character " + std::to_string(i + 1) +
                           " of '" + text + "' — close it with '}' (write '{{' for a literal brace)");
      }
      std::string name = text.substr(i + 1, close - i - 1);
      bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               ch == '_';
      });
      if (!valid) {
        throw InvalidInput("[" + where + "] placeholder '{" + name + "}' in '" + text +
                           "' is not a name — placeholders are {letters_digits_underscores}; write "
                           "'{{' and '}}' for literal braces");
      }
      if (!literal.empty()) segments_.push_back({false, literal});
      literal.clear();
      segments_.push_back({true, name});
      if (!uses(name)) names_.push_back(name);
      i = close;
    } else if (c == '}') {
      throw InvalidInput("[" + where + "] stray '}' at character " + std::to_string(i + 1) + " of '" +
                         text + "' — write '}}' for a literal brace");
    } else {
      literal += c;
    }
  }
  if (!literal.empty()) segments_.push_back({false, literal});
}

bool CommandTemplate::uses(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

bool CommandTemplate::is_single_placeholder() const {
  return segments_.size() == 1 && segments_[0].placeholder;
}

std::string CommandTemplate::render(const std::function<std::string(const std::string&)>& value) const {
  std::string out;
  for (const auto& s : segments_) out += s.placeholder ? value(s.text) : s.text;
  return out;
}

std::string shell_quote(const std::string& word) {
  if (word.empty()) return "''";
  bool safe = std::all_of(word.begin(), word.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string("_./:=,+@%-").find(c) != std::string::npos;
  });
  if (safe) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

}  // namespace scalelab::lab
