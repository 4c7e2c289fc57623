#pragma once
// Internals of the chat-template interpreter (jinja.h): the values (Python's, as Jinja sees them),
// the syntax tree that jinja_parse.cpp builds and jinja_eval.cpp runs.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/tokenizer/jinja.h"

namespace scalelab::jinja {

struct Value;
using List = std::vector<Value>;
struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as a Python dict
  bool is_namespace = false;                          // namespace(...): attributes may be set
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};
struct Kwarg;
// A builtin function or bound method: positional and keyword arguments in, a value out.
using Function = std::function<Value(std::vector<Value>&, std::vector<Kwarg>&)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };
  Kind kind = Kind::kUndefined;
  bool b = false;
  std::int64_t i = 0;
  double f = 0.0;
  std::string s;                   // a string; for an undefined value, what was looked up (messages)
  std::shared_ptr<List> list;      // lists and tuples
  bool tuple = false;              // printed (a, b) rather than [a, b]
  std::shared_ptr<Dict> dict;      // dicts and namespaces
  std::shared_ptr<Function> fn;
  int depth = 0;                   // lists / dicts: 1 + the deepest item's depth

  static Value undefined(std::string what = "") { Value v; v.s = std::move(what); return v; }
  static Value none() { Value v; v.kind = Kind::kNone; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::kBool; v.b = x; return v; }
  static Value integer(std::int64_t x) { Value v; v.kind = Kind::kInt; v.i = x; return v; }
  static Value real(double x) { Value v; v.kind = Kind::kFloat; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::kString; v.s = std::move(x); return v; }
  // Lists and dicts count against the rendering's limits (LimitExceeded past them).
  static Value of_list(List items, bool is_tuple = false);
  static Value of_dict(Dict d);
  static Value function(Function f) {
    Value v;
    v.kind = Kind::kFunction;
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }
  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
};

struct Kwarg {
  std::string name;
  Value value;
};

// ---- the syntax tree --------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kAttr,       // a[0].name
    kItem,       // a[0][a[1]]
    kSlice,      // a[0][a[1]:a[2]:a[3]] (null parts absent)
    kCall,       // a[0](a[1..]) with kwargs
    kFilter,     // a[0] | name(a[1..], kwargs); a[0] null inside a filter block (not supported)
    kTest,       // a[0] is [not] name(a[1..])
    kNeg,        // -a[0]
    kPos,        // +a[0]
    kNot,        // not a[0]
    kBinary,     // a[0] op a[1]: + - * / // % ** ~
    kCompare,    // a[0] ops[0] a[1] ops[1] a[2] ... : == != < > <= >= in notin
    kAnd,        // a[0] and a[1]
    kOr,         // a[0] or a[1]
    kCond,       // a[1] if a[0] else a[2] (a[2] null: undefined)
    kList,       // [a...]
    kTuple,      // (a...)
    kDict,       // {a[0]: a[1], a[2]: a[3], ...}
  };
  Kind kind;
  int line = 0;
  Value value;                      // kLiteral
  std::string name;                 // kName, kAttr, kFilter, kTest, kBinary (the operator)
  std::vector<ExprPtr> a;           // operands
  std::vector<std::string> ops;     // kCompare
  std::vector<std::string> kwnames; // kCall / kFilter / kTest: names of the last kwnames.size() operands
  bool negated = false;             // kTest: `is not`
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kGeneration };
  Kind kind;
  int line = 0;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput, kSet (value), kFor (iterable)
  std::vector<ExprPtr> conds;        // kIf: the if and elif tests
  std::vector<Body> bodies;          // kIf: one per cond, then else (optional); kFor: body, else
  std::vector<std::string> targets;  // kFor / kSet: names (several: unpacking)
  std::string ns_attr;               // kSet: `set ns.attr = ...` (targets[0] is ns)
  ExprPtr filter;                    // kFor: `for x in xs if cond`
};

struct Program {
  std::string origin;
  Body body;
};

// Throws InvalidInput "[chat template] ORIGIN line N: what — hint".
[[noreturn]] void fail(const std::string& origin, int line, const std::string& what);

// Whether a filter / test of this name exists (the parser refuses the others).
bool known_filter(const std::string& name);
bool known_test(const std::string& name);

// ---- limits (a template is outside input: a GGUF's metadata, a downloaded tokenizer_config.json) --

inline constexpr int kMaxSyntaxDepth = 200;         // nested expressions / blocks (the parser's recursion)
inline constexpr int kMaxValueDepth = 500;          // nested lists / dicts printed, compared, serialized
inline constexpr std::int64_t kMaxSteps = 5000000;  // statements and loop iterations of one rendering
inline constexpr std::size_t kMaxOutput = std::size_t{64} << 20;  // bytes of one rendering or string

inline constexpr std::int64_t kMaxItems = 4000000;  // list / dict items created by one rendering
inline constexpr std::int64_t kMaxBytes = std::int64_t{1} << 30;  // bytes of strings built by one rendering

// Thrown past a limit where no position is at hand; Template::render reports it with the origin.
struct LimitExceeded {
  const char* what;
};
// Resets the per-rendering budgets (items, bytes) of the calling thread.
void reset_budgets();
// Charges `bytes` of a string the template builds (concatenation, repetition) to the budget.
void charge_bytes(std::size_t bytes);
// Whether a value holds a namespace (namespaces may not: see Interp::assign).
bool contains_namespace(const Value& v);

// ---- Python's view of values (jinja_value.cpp) --------------------------------------------------

// Where an evaluation is, for messages.
struct Where {
  const std::string& origin;
  int line;
  [[noreturn]] void error(const std::string& what) const { ::scalelab::jinja::fail(origin, line, what); }
};

bool truthy(const Value& v);
std::string to_str(const Value& v);           // str(v); undefined -> ""
std::string repr(const Value& v);             // repr(v), as lists and dicts print their items
std::string type_name(const Value& v);        // "str object", "dict object", ... (jinja2's wording)
bool equals(const Value& a, const Value& b);  // ==
// a < b for numbers, strings (by code point) and lists; a type error otherwise.
bool less(const Where& w, const Value& a, const Value& b);
std::string py_float_repr(double x);
// json.dumps(v, ensure_ascii, indent (< 0: None), sort_keys) with Python's default separators.
std::string to_json(const Where& w, const Value& v, bool ensure_ascii, int indent, bool sort_keys);
Value from_json(const nlohmann::ordered_json& j);
// Unicode code points of a UTF-8 string (invalid bytes read as U+FFFD) and back.
std::vector<std::uint32_t> code_points(const std::string& s);
std::string from_code_points(const std::vector<std::uint32_t>& cps, std::size_t begin, std::size_t end);
bool is_py_space(std::uint32_t cp);  // str.isspace()
// str.strip / lstrip / rstrip: `chars` null for whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
// Throws the error of using an undefined value (its recorded lookup) in `what`.
[[noreturn]] void undefined_error(const Where& w, const Value& v);
// obj.name (a method, a dict key, a namespace attribute) and obj[key], as jinja2's getattr /
// getitem (missing: an undefined value that remembers what was looked up; looking into an
// undefined value: an error).
Value get_attr(const Where& w, const Value& obj, const std::string& name);
Value get_item(const Where& w, const Value& obj, const Value& key);
// Items of an iterable (lists, tuples, dict keys, string characters; undefined: none).
List iterate(const Where& w, const Value& v);

// ---- filters and tests (jinja_filters.cpp) ---------------------------------------------------

Value call_filter(const Where& w, const std::string& name, const Value& v, std::vector<Value>& args,
                  std::vector<Kwarg>& kwargs);
bool call_test(const Where& w, const std::string& name, const Value& v, std::vector<Value>& args);

}  // namespace scalelab::jinja
