// The filters and tests of the chat-template interpreter (jinja_internal.h), as jinja2 3.1 defines
// them, with transformers' tojson (no HTML escaping; ensure_ascii, indent, separators, sort_keys).
#include <algorithm>
#include <climits>
#include <cmath>
#include <set>

#include "model/tokenizer/jinja_internal.h"

namespace scalelab::jinja {

namespace {

const std::set<std::string> kFilters = {
    "abs",     "attr",  "capitalize", "count",  "d",     "default", "dictsort", "first",  "float",  "indent",
    "int",     "items", "join",       "last",   "length", "list",   "lower",    "map",    "max",    "min",
    "reject",  "rejectattr", "replace", "reverse", "round", "safe", "select",   "selectattr", "sort", "string",
    "sum",     "title", "tojson",     "trim",   "unique", "upper",
};

const std::set<std::string> kTests = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false", "float", "ge",
    "gt",      "in",       "integer", "iterable",    "le", "lower",   "lt",   "mapping", "ne", "none",
    "number",  "odd",      "sameas",  "sequence",    "string", "true", "undefined", "upper",
};

Value arg(std::vector<Value>& args, std::vector<Kwarg>& kw, std::size_t pos, const char* name, Value dflt) {
  if (args.size() > pos) return args[pos];
  for (auto& k : kw)
    if (k.name == name) return k.value;
  return dflt;
}

std::int64_t as_int(const Where& w, const Value& v, const std::string& what) {
  if (v.kind == Value::Kind::kInt) return v.i;
  if (v.kind == Value::Kind::kBool) return v.b;
  w.error(what + " needs an integer, not a " + type_name(v));
}

double as_num(const Where& w, const Value& v, const std::string& what) {
  if (v.kind == Value::Kind::kFloat) return v.f;
  return static_cast<double>(as_int(w, v, what));
}

// A dotted attribute path ("a.b", "0") as jinja2's make_attrgetter reads it.
Value attr_path(const Where& w, const Value& obj, const std::string& path) {
  Value cur = obj;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && part.size() <= 18 &&
                        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(w, cur, Value::integer(std::stoll(part))) : get_item(w, cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    if (cur.is_undefined()) return cur;
    start = dot + 1;
  }
}

// The case-insensitive sort key jinja2's sort / unique / dictsort / min / max use by default.
Value fold_case(const Value& v, bool case_sensitive) {
  if (case_sensitive || v.kind != Value::Kind::kString) return v;
  std::string s = v.s;
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return Value::string(s);
}

List select_items(const Where& w, const Value& seq, std::vector<Value>& args, bool by_attr, bool keep) {
  List out;
  std::size_t first_test_arg = 0;
  std::string attribute;
  if (by_attr) {
    if (args.empty() || args[0].kind != Value::Kind::kString) w.error("selectattr / rejectattr need an attribute name");
    attribute = args[0].s;
    first_test_arg = 1;
  }
  std::string test;
  std::vector<Value> test_args;
  if (args.size() > first_test_arg) {
    if (args[first_test_arg].kind != Value::Kind::kString) w.error("select / reject need a test name");
    test = args[first_test_arg].s;
    if (!known_test(test)) w.error("the test '" + test + "' is not supported");
    test_args.assign(args.begin() + static_cast<std::ptrdiff_t>(first_test_arg) + 1, args.end());
  }
  for (const Value& x : iterate(w, seq)) {
    const Value v = by_attr ? attr_path(w, x, attribute) : x;
    std::vector<Value> ta = test_args;
    const bool pass = test.empty() ? truthy(v) : call_test(w, test, v, ta);
    if (pass == keep) out.push_back(x);
  }
  return out;
}

// jinja2's do_indent: every line after the first gets `pad`, except empty lines unless `blank`;
// the first too with `first`.
std::string indent_text(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  std::size_t start = 0;
  bool is_first = true;
  while (true) {
    const std::size_t nl = s.find('\n', start);
    const std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (!is_first) {
      out += '\n';
      if (blank || !line.empty()) out += pad;
    }
    out += line;
    if (nl == std::string::npos) break;
    start = nl + 1;
    is_first = false;
  }
  return first ? pad + out : out;
}

}  // namespace

bool known_filter(const std::string& name) { return kFilters.count(name) > 0; }
bool known_test(const std::string& name) { return kTests.count(name) > 0; }

Value call_filter(const Where& w, const std::string& name, const Value& v, std::vector<Value>& args,
                  std::vector<Kwarg>& kw) {
  const std::string what = "the filter '" + name + "'";
  if (name == "default" || name == "d") {
    const Value dflt = arg(args, kw, 0, "default_value", Value::string(""));
    const bool boolean = truthy(arg(args, kw, 1, "boolean", Value::boolean(false)));
    if (v.is_undefined() || (boolean && !truthy(v))) return dflt;
    return v;
  }
  if (name == "safe") return v;
  if (name == "string") return Value::string(to_str(v));
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Value::Kind::kUndefined: return Value::integer(0);
      case Value::Kind::kString: return Value::integer(static_cast<std::int64_t>(code_points(v.s).size()));
      case Value::Kind::kList: return Value::integer(static_cast<std::int64_t>(v.list->size()));
      case Value::Kind::kDict: return Value::integer(static_cast<std::int64_t>(v.dict->items.size()));
      default: w.error(what + ": a " + type_name(v) + " has no length");
    }
  }
  if (name == "tojson") {
    const Value indent = arg(args, kw, 1, "indent", Value::none());
    for (const auto& k : kw)
      if (k.name == "separators" && k.value.kind != Value::Kind::kNone) w.error(what + ": separators= is not supported");
    return Value::string(to_json(w, v, truthy(arg(args, kw, 0, "ensure_ascii", Value::boolean(false))),
                                 indent.kind == Value::Kind::kNone ? -1 : static_cast<int>(as_int(w, indent, what)),
                                 truthy(arg(args, kw, 3, "sort_keys", Value::boolean(false)))));
  }
  if (v.is_undefined() && name != "list" && name != "join" && name != "items" && name != "trim" && name != "upper" &&
      name != "lower" && name != "title" && name != "capitalize") {
    undefined_error(w, v);
  }
  if (name == "trim") {
    const Value chars = arg(args, kw, 0, "chars", Value::none());
    const std::string s = to_str(v);
    return Value::string(chars.kind == Value::Kind::kString ? py_strip(s, &chars.s, true, true)
                                                           : py_strip(s, nullptr, true, true));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    std::vector<Value> none;
    std::vector<Kwarg> nokw;
    const Value m = get_attr(w, Value::string(to_str(v)), name);
    return (*m.fn)(none, nokw);
  }
  if (name == "replace") {
    const Value m = get_attr(w, Value::string(to_str(v)), "replace");
    std::vector<Value> a = args;
    std::vector<Kwarg> k = kw;
    return (*m.fn)(a, k);
  }
  if (name == "indent") {
    const Value width = arg(args, kw, 0, "width", Value::integer(4));
    const std::string pad =
        width.kind == Value::Kind::kString ? width.s : std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, as_int(w, width, what))), ' ');
    return Value::string(indent_text(to_str(v), pad, truthy(arg(args, kw, 1, "first", Value::boolean(false))),
                                     truthy(arg(args, kw, 2, "blank", Value::boolean(false)))));
  }
  if (name == "join") {
    const Value sep = arg(args, kw, 0, "d", Value::string(""));
    const Value attribute = arg(args, kw, 1, "attribute", Value::none());
    std::string out;
    bool first = true;
    for (const Value& x : iterate(w, v)) {
      if (!first) out += to_str(sep);
      first = false;
      out += to_str(attribute.kind == Value::Kind::kString ? attr_path(w, x, attribute.s) : x);
    }
    return Value::string(out);
  }
  if (name == "list") return Value::of_list(iterate(w, v));
  if (name == "items") {
    if (v.is_undefined()) return Value::of_list({});
    if (v.kind != Value::Kind::kDict) w.error(what + " needs a mapping, not a " + type_name(v));
    List out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::of_list({Value::string(k), x}, true));
    return Value::of_list(std::move(out));
  }
  if (name == "first" || name == "last") {
    List items = iterate(w, v);
    if (items.empty()) return Value::undefined(std::string("'") + type_name(v) + "' is empty (" + name + ")");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.kind == Value::Kind::kString) {
      std::vector<std::uint32_t> cps = code_points(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::string(from_code_points(cps, 0, cps.size()));
    }
    List items = iterate(w, v);
    std::reverse(items.begin(), items.end());
    return Value::of_list(std::move(items));
  }
  if (name == "int") {
    const Value dflt = arg(args, kw, 0, "default", Value::integer(0));
    switch (v.kind) {
      case Value::Kind::kInt: return v;
      case Value::Kind::kBool: return Value::integer(v.b);
      case Value::Kind::kFloat: return std::fabs(v.f) < 9.2e18 ? Value::integer(static_cast<std::int64_t>(v.f)) : dflt;
      case Value::Kind::kString: {
        const std::string s = py_strip(v.s, nullptr, true, true);
        try {
          std::size_t used = 0;
          const long long x = std::stoll(s, &used, 10);
          if (used == s.size()) return Value::integer(x);
          const double d = std::stod(s, &used);
          if (used == s.size() && std::fabs(d) < 9.2e18) return Value::integer(static_cast<std::int64_t>(d));
        } catch (const std::exception&) {
        }
        return dflt;
      }
      default: return dflt;
    }
  }
  if (name == "float") {
    const Value dflt = arg(args, kw, 0, "default", Value::real(0.0));
    if (v.is_number()) return Value::real(as_num(w, v, what));
    if (v.kind == Value::Kind::kString) {
      try {
        std::size_t used = 0;
        const std::string s = py_strip(v.s, nullptr, true, true);
        const double d = std::stod(s, &used);
        if (used == s.size()) return Value::real(d);
      } catch (const std::exception&) {
      }
    }
    return dflt;
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::kFloat) return Value::real(std::fabs(v.f));
    const std::int64_t x = as_int(w, v, what);
    if (x == INT64_MIN) w.error(what + ": integer overflow");
    return Value::integer(x < 0 ? -x : x);
  }
  if (name == "round") {
    const std::int64_t precision = as_int(w, arg(args, kw, 0, "precision", Value::integer(0)), what);
    const Value method = arg(args, kw, 1, "method", Value::string("common"));
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = as_num(w, v, what) * scale;
    // 'common' is Python's round(): halves to even (exact for precision 0; scaled otherwise).
    const double r = method.s == "ceil" ? std::ceil(x) : method.s == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value::real(r / scale);
  }
  if (name == "attr") {
    const Value n = arg(args, kw, 0, "name", Value::none());
    if (n.kind != Value::Kind::kString) w.error(what + " needs an attribute name");
    return get_attr(w, v, n.s);
  }
  if (name == "map") {
    List out;
    const Value attribute = arg(args, kw, 999, "attribute", Value::none());
    if (attribute.kind == Value::Kind::kString) {
      const Value dflt = arg(args, kw, 999, "default", Value::undefined());
      for (const Value& x : iterate(w, v)) {
        Value y = attr_path(w, x, attribute.s);
        out.push_back(y.is_undefined() && !dflt.is_undefined() ? dflt : y);
      }
      return Value::of_list(std::move(out));
    }
    if (args.empty() || args[0].kind != Value::Kind::kString) w.error(what + " needs a filter name or attribute=");
    const std::string f = args[0].s;
    if (!known_filter(f)) w.error("the filter '" + f + "' is not supported");
    for (const Value& x : iterate(w, v)) {
      std::vector<Value> rest(args.begin() + 1, args.end());
      std::vector<Kwarg> k2 = kw;
      out.push_back(call_filter(w, f, x, rest, k2));
    }
    return Value::of_list(std::move(out));
  }
  if (name == "select" || name == "reject") return Value::of_list(select_items(w, v, args, false, name == "select"));
  if (name == "selectattr" || name == "rejectattr") {
    return Value::of_list(select_items(w, v, args, true, name == "selectattr"));
  }
  if (name == "unique" || name == "sort" || name == "min" || name == "max" || name == "dictsort") {
    const bool cs = truthy(arg(args, kw, name == "sort" ? 1 : 0, "case_sensitive", Value::boolean(false)));
    const Value attribute = arg(args, kw, name == "sort" ? 2 : name == "unique" ? 1 : 1, "attribute", Value::none());
    auto key = [&](const Value& x) {
      return fold_case(attribute.kind == Value::Kind::kString ? attr_path(w, x, attribute.s) : x, cs);
    };
    if (name == "dictsort") {
      if (v.kind != Value::Kind::kDict) w.error(what + " needs a mapping");
      const Value by = arg(args, kw, 1, "by", Value::string("key"));
      const bool rev = truthy(arg(args, kw, 2, "reverse", Value::boolean(false)));
      List items;
      for (const auto& [k, x] : v.dict->items) items.push_back(Value::of_list({Value::string(k), x}, true));
      const std::size_t pos = by.s == "value" ? 1 : 0;
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        const bool lt = less(w, fold_case((*a.list)[pos], cs), fold_case((*b.list)[pos], cs));
        return rev ? less(w, fold_case((*b.list)[pos], cs), fold_case((*a.list)[pos], cs)) : lt;
      });
      return Value::of_list(std::move(items));
    }
    List items = iterate(w, v);
    if (name == "unique") {
      List out;
      List seen;
      for (const Value& x : items) {
        const Value k = key(x);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(x);
        }
      }
      return Value::of_list(std::move(out));
    }
    if (name == "sort") {
      const bool rev = truthy(arg(args, kw, 0, "reverse", Value::boolean(false)));
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        return rev ? less(w, key(b), key(a)) : less(w, key(a), key(b));
      });
      return Value::of_list(std::move(items));
    }
    if (items.empty()) return Value::undefined(std::string("'") + name + "' of an empty sequence");
    Value best = items[0];
    for (const Value& x : items) {
      if (name == "min" ? less(w, key(x), key(best)) : less(w, key(best), key(x))) best = x;
    }
    return best;
  }
  if (name == "sum") {
    const Value attribute = arg(args, kw, 0, "attribute", Value::none());
    Value total = arg(args, kw, 1, "start", Value::integer(0));
    for (const Value& x : iterate(w, v)) {
      const Value y = attribute.kind == Value::Kind::kString ? attr_path(w, x, attribute.s) : x;
      if (total.kind == Value::Kind::kFloat || y.kind == Value::Kind::kFloat) {
        total = Value::real(as_num(w, total, what) + as_num(w, y, what));
      } else {
        std::int64_t t = 0;
        if (__builtin_add_overflow(as_int(w, total, what), as_int(w, y, what), &t)) w.error(what + ": integer overflow");
        total = Value::integer(t);
      }
    }
    return total;
  }
  w.error(what + " is not supported");
}

bool call_test(const Where& w, const std::string& name, const Value& v, std::vector<Value>& args) {
  auto need = [&](std::size_t n) {
    if (args.size() < n) w.error("the test '" + name + "' needs an argument");
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == Value::Kind::kNone;
  if (name == "boolean") return v.kind == Value::Kind::kBool;
  if (name == "true") return v.kind == Value::Kind::kBool && v.b;
  if (name == "false") return v.kind == Value::Kind::kBool && !v.b;
  if (name == "integer") return v.kind == Value::Kind::kInt;
  if (name == "float") return v.kind == Value::Kind::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.kind == Value::Kind::kString;
  if (name == "mapping") return v.kind == Value::Kind::kDict;
  if (name == "iterable") return v.kind == Value::Kind::kList || v.kind == Value::Kind::kDict || v.kind == Value::Kind::kString || v.is_undefined();
  if (name == "sequence") return v.kind == Value::Kind::kList || v.kind == Value::Kind::kDict || v.kind == Value::Kind::kString;
  if (name == "callable") return v.kind == Value::Kind::kFunction;
  if (name == "lower" || name == "upper") {
    if (v.kind != Value::Kind::kString) return false;
    std::vector<Value> none;
    std::vector<Kwarg> nokw;
    return truthy((*get_attr(w, v, name == "lower" ? "islower" : "isupper").fn)(none, nokw));
  }
  if (name == "odd" || name == "even") {
    if (v.is_undefined()) undefined_error(w, v);
    const std::int64_t x = v.kind == Value::Kind::kInt ? v.i : v.kind == Value::Kind::kBool ? v.b : 0;
    if (v.kind != Value::Kind::kInt && v.kind != Value::Kind::kBool) w.error("the test '" + name + "' needs an integer");
    return ((x % 2) != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    need(1);
    if (v.kind != Value::Kind::kInt || args[0].kind != Value::Kind::kInt || args[0].i == 0) {
      w.error("the test 'divisibleby' needs non-zero integers");
    }
    return args[0].i == -1 || v.i % args[0].i == 0;
  }
  if (name == "eq" || name == "equalto") {
    need(1);
    return equals(v, args[0]);
  }
  if (name == "ne") {
    need(1);
    return !equals(v, args[0]);
  }
  if (name == "lt" || name == "le" || name == "gt" || name == "ge") {
    need(1);
    if (name == "lt") return less(w, v, args[0]);
    if (name == "gt") return less(w, args[0], v);
    if (name == "le") return !less(w, args[0], v);
    return !less(w, v, args[0]);
  }
  if (name == "sameas") {
    need(1);
    const Value& o = args[0];
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case Value::Kind::kNone:
      case Value::Kind::kUndefined: return true;
      case Value::Kind::kBool: return v.b == o.b;
      case Value::Kind::kList: return v.list == o.list;
      case Value::Kind::kDict: return v.dict == o.dict;
      default: return equals(v, o);
    }
  }
  if (name == "in") {
    need(1);
    const Value& c = args[0];
    if (c.kind == Value::Kind::kString) {
      if (v.kind != Value::Kind::kString) w.error("'in <string>' needs a string on the left, not a " + type_name(v));
      return c.s.find(v.s) != std::string::npos;
    }
    for (const Value& x : iterate(w, c))
      if (equals(x, v)) return true;
    return false;
  }
  w.error("the test '" + name + "' is not supported");
}

}  // namespace scalelab::jinja
