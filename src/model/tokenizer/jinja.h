#pragma once
// The Jinja subset that Hugging Face chat templates are written in, rendered as transformers'
// apply_chat_template renders them (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks and the loopcontrols extension; its raise_exception, tojson and strftime_now).
//
// Hand-written: no C++ Jinja engine is packaged in Debian (apt-cache search jinja finds only the
// Python, Emacs and R ones), and chat templates use a small, stable part of the language. What it
// covers:
//   text with {{ }}, {% %}, {# #}, the whitespace controls {%- -%} {{- -}} {%+ +%}, trim_blocks,
//   lstrip_blocks, and the source's newline handling (\r\n and \r read as \n, one trailing
//   newline dropped);
//   statements: if / elif / else, for (tuple targets, `if` filter, else, loop.index, index0,
//   revindex, revindex0, first, last, length, previtem, nextitem, cycle), set (a name, names,
//   namespace attributes, and the {% set x %}...{% endset %} block), break, continue,
//   {% generation %} (transformers' assistant-mask block, rendered as its body);
//   expressions: literals (strings with Python escapes, integers, floats, true/false/none in both
//   cases, lists, tuples, dicts), names, .attr, [key], slices, calls, the operators + - * / // %
//   ** ~, comparisons (chained), in / not in, and / or / not, `x if c else y`, filters and tests;
//   Python's semantics for them (int vs float, truthiness, undefined values: printed as nothing,
//   an error when used in arithmetic or looked into);
//   globals: range, namespace, raise_exception, strftime_now, dict;
//   methods: str strip/lstrip/rstrip/split/rsplit/startswith/endswith/upper/lower/title/
//   capitalize/replace/find/count/splitlines/join/isdigit/isspace..., dict items/keys/values/get;
//   filters and tests: see kFilters / kTests in jinja_eval.cpp (unknown ones are refused when the
//   template is parsed).
// Anything else (macros, call blocks, includes, extends, raw, with, filter blocks, ...) throws
// InvalidInput naming the template (`origin`), the line and the construct.
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace scalelab::jinja {

struct Program;

class Template {
 public:
  // Parses `source`; `origin` names the template in every message (e.g. "model.gguf
  // tokenizer.chat_template"). Throws InvalidInput for a syntax error or a construct outside the
  // subset: "[chat template] ORIGIN line N: ... — ...".
  static Template parse(std::string_view source, const std::string& origin);

  // Renders with the top-level keys of `context` (a JSON object) as variables: objects become
  // dicts (key order kept), arrays lists. Throws InvalidInput for raise_exception (its message)
  // and for errors of evaluation (an undefined value used, a type error), naming the origin and
  // the line.
  std::string render(const nlohmann::ordered_json& context) const;

  const std::string& origin() const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace scalelab::jinja
