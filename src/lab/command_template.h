#pragma once
// Command templates of external workloads: text with {placeholder}s, e.g.
//   "torchrun --nproc_per_node {nproc} benchmark.py --batch_size {micro_batch_size}"
// "{{" and "}}" stand for literal braces (so a shell's ${HOME} is written ${{HOME}}).
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace scalelab::lab {

class CommandTemplate {
 public:
  CommandTemplate() = default;
  // Parses `text`; `where` names it in errors (e.g. "spec.toml: workload.command").
  // Throws InvalidInput on an unclosed or empty placeholder or a stray '}'.
  CommandTemplate(const std::string& text, const std::string& where);

  // Placeholder names, in order of first appearance.
  const std::vector<std::string>& placeholders() const { return names_; }
  bool uses(const std::string& name) const;
  const std::string& text() const { return text_; }
  // True when the whole template is exactly one placeholder ("{fused_flag}").
  bool is_single_placeholder() const;

  // Substitutes each placeholder with value(name).
  std::string render(const std::function<std::string(const std::string&)>& value) const;

 private:
  struct Segment {
    bool placeholder;
    std::string text;  // literal text, or the placeholder name
  };
  std::string text_;
  std::vector<Segment> segments_;
  std::vector<std::string> names_;
};

// Quotes a word for /bin/sh when it holds anything but [A-Za-z0-9_./:=,+@%-]; "" becomes ''.
std::string shell_quote(const std::string& word);

}  // namespace scalelab::lab
