// Python's view of the chat-template interpreter's values (jinja_internal.h): str(), repr(),
// truthiness, ==, <, json.dumps, and attribute / item lookup with the str and dict methods that
// chat templates call.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "model/tokenizer/jinja_internal.h"
#include "model/tokenizer/utf8.h"

namespace scalelab::jinja {

namespace {
// Nesting of the value being printed, compared or serialized (kMaxValueDepth).
thread_local int g_value_depth = 0;
thread_local std::int64_t g_items = 0, g_bytes = 0;
struct Nest {
  Nest() {
    if (++g_value_depth > kMaxValueDepth) {
      --g_value_depth;
      throw LimitExceeded{"values nested more than 500 deep"};
    }
  }
  ~Nest() { --g_value_depth; }
  Nest(const Nest&) = delete;
  Nest& operator=(const Nest&) = delete;
};
}  // namespace

void reset_budgets() {
  g_items = 0;
  g_bytes = 0;
}

void charge_bytes(std::size_t bytes) {
  g_bytes += static_cast<std::int64_t>(bytes);
  if (g_bytes > kMaxBytes) throw LimitExceeded{"the template builds more than 1 GiB of strings"};
}

namespace {
int deepest(const Value& v) { return v.kind == Value::Kind::kList || v.kind == Value::Kind::kDict ? v.depth : 0; }
void charge_items(std::size_t n, int depth) {
  g_items += static_cast<std::int64_t>(n);
  if (g_items > kMaxItems) throw LimitExceeded{"the template builds more than 4,000,000 list and dict items"};
  if (depth > kMaxValueDepth) throw LimitExceeded{"values nested more than 500 deep"};
}
}  // namespace

Value Value::of_list(List items, bool is_tuple) {
  Value v;
  v.kind = Kind::kList;
  int d = 0;
  for (const Value& x : items) d = std::max(d, deepest(x));
  v.depth = d + 1;
  charge_items(items.size(), v.depth);
  v.list = std::make_shared<List>(std::move(items));
  v.tuple = is_tuple;
  return v;
}

Value Value::of_dict(Dict dict) {
  Value v;
  v.kind = Kind::kDict;
  int d = 0;
  for (const auto& kv : dict.items) d = std::max(d, deepest(kv.second));
  v.depth = d + 1;
  charge_items(dict.items.size(), v.depth);
  v.dict = std::make_shared<Dict>(std::move(dict));
  return v;
}

bool contains_namespace(const Value& v) {
  if (v.kind == Value::Kind::kDict) {
    if (v.dict->is_namespace) return true;
    for (const auto& kv : v.dict->items)
      if (contains_namespace(kv.second)) return true;
  } else if (v.kind == Value::Kind::kList) {
    for (const Value& x : *v.list)
      if (contains_namespace(x)) return true;
  }
  return false;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

std::vector<std::uint32_t> code_points(const std::string& s) {
  const std::string clean = tok::is_valid_utf8(s) ? s : tok::sanitize_utf8(s);
  std::vector<std::uint32_t> out;
  out.reserve(clean.size());
  for (std::size_t i = 0; i < clean.size();) out.push_back(tok::next_code_point(clean, i));
  return out;
}

std::string from_code_points(const std::vector<std::uint32_t>& cps, std::size_t begin, std::size_t end) {
  std::string out;
  for (std::size_t k = begin; k < end && k < cps.size(); ++k) tok::append_utf8(out, cps[k]);
  return out;
}

bool is_py_space(std::uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<std::uint32_t> cps = code_points(s);
  std::vector<std::uint32_t> set;
  if (chars) set = code_points(*chars);
  auto strip_it = [&](std::uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_py_space(c);
  };
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.b;
    case Value::Kind::kInt: return v.i != 0;
    case Value::Kind::kFloat: return v.f != 0.0;
    case Value::Kind::kString: return !v.s.empty();
    case Value::Kind::kList: return !v.list->empty();
    case Value::Kind::kDict: return !v.dict->items.empty() || v.dict->is_namespace;
    case Value::Kind::kFunction: return true;
  }
  return false;
}

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  // Python's repr: the shortest digits that read back as x; positional for exponents in [-4, 16).
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const std::size_t epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
  } else {
    const std::size_t point = static_cast<std::size_t>(exp) + 1;
    if (digits.size() <= point) {
      out = digits + std::string(point - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, point) + "." + digits.substr(point);
    }
  }
  return neg ? "-" + out : out;
}

namespace {

// Python's repr of a str: single quotes unless the text has ' and no ", escapes for the
// backslash, the quote and control characters. (Python also escapes other non-printable code
// points, e.g. U+200B; those are rare in chat templates and printed as they are here.)
std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (std::uint32_t c : code_points(s)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<std::uint32_t>(q)) {
      out += '\\';
      out += q;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      tok::append_utf8(out, c);
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.b ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.i);
    case Value::Kind::kFloat: return py_float_repr(v.f);
    case Value::Kind::kString: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  const Nest nest;
  switch (v.kind) {
    case Value::Kind::kString: return repr_string(v.s);
    case Value::Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + repr(x);
      }
      return out + (v.dict->is_namespace ? "}>" : "}");
    }
    case Value::Kind::kFunction: return "<built-in function>";
    case Value::Kind::kUndefined: return "Undefined";
    default: return to_str(v);
  }
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool object";
    case Value::Kind::kInt: return "int object";
    case Value::Kind::kFloat: return "float object";
    case Value::Kind::kString: return "str object";
    case Value::Kind::kList: return v.tuple ? "tuple object" : "list object";
    case Value::Kind::kDict: return v.dict->is_namespace ? "Namespace object" : "dict object";
    case Value::Kind::kFunction: return "builtin_function_or_method object";
  }
  return "object";
}

namespace {
double as_double(const Value& v) {
  return v.kind == Value::Kind::kFloat ? v.f : v.kind == Value::Kind::kInt ? static_cast<double>(v.i) : (v.b ? 1.0 : 0.0);
}
}  // namespace

bool equals(const Value& a, const Value& b) {
  const Nest nest;
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      const std::int64_t x = a.kind == Value::Kind::kInt ? a.i : a.b, y = b.kind == Value::Kind::kInt ? b.i : b.b;
      return x == y;
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.s == b.s;
    case Value::Kind::kList: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict == b.dict) return true;
      if (a.dict->is_namespace || b.dict->is_namespace) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kFunction: return a.fn == b.fn;
    default: return false;
  }
}

bool less(const Where& w, const Value& a, const Value& b) {
  const Nest nest;
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::kInt && b.kind == Value::Kind::kInt) return a.i < b.i;
    return as_double(a) < as_double(b);
  }
  if (a.kind == Value::Kind::kString && b.kind == Value::Kind::kString) return a.s < b.s;  // UTF-8 order = code points
  if (a.kind == Value::Kind::kList && b.kind == Value::Kind::kList) {
    const List &x = *a.list, &y = *b.list;
    for (std::size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (equals(x[k], y[k])) continue;
      return less(w, x[k], y[k]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) undefined_error(w, a);
  if (b.is_undefined()) undefined_error(w, b);
  w.error("'<' is not supported between a " + type_name(a) + " and a " + type_name(b));
}

// ---- JSON -------------------------------------------------------------------------------------

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (std::uint32_t c : code_points(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char b[16];
        if (c < 0x20) {
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else if (ensure_ascii && c > 0x7e) {
          if (c > 0xffff) {
            const std::uint32_t v = c - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", c);
          }
          out += b;
        } else {
          tok::append_utf8(out, c);
        }
      }
    }
  }
  out += '"';
}

void json_value(const Where& w, std::string& out, const Value& v, bool ascii, int indent, bool sort_keys, int depth) {
  const Nest nest;
  if (out.size() > kMaxOutput) w.error("tojson: the text would be longer than 64 MiB");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out += std::string(static_cast<std::size_t>(indent * d), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.b ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.i); return;
    case Value::Kind::kFloat:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float_repr(v.f);
      return;
    case Value::Kind::kString: json_string(out, v.s, ascii); return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_value(w, out, (*v.list)[k], ascii, indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->is_namespace) w.error("tojson: a namespace is not JSON serializable");
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        json_string(out, kv->first, ascii);
        out += ": ";
        json_value(w, out, kv->second, ascii, indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined: w.error("tojson: an undefined value ('" + v.s + "') is not JSON serializable");
    case Value::Kind::kFunction: w.error("tojson: a function is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Where& w, const Value& v, bool ensure_ascii, int indent, bool sort_keys) {
  std::string out;
  json_value(w, out, v, ensure_ascii, indent, sort_keys, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  const Nest nest;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(static_cast<std::int64_t>(j.get<std::uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& x : j) l.push_back(from_json(x));
      return Value::of_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json(it.value()));
      return Value::of_dict(std::move(d));
    }
    default: return Value::none();
  }
}

// ---- lookups ------------------------------------------------------------------------------------

void undefined_error(const Where& w, const Value& v) {
  w.error((v.s.empty() ? std::string("a value is undefined") : v.s) +
          " — the template uses a variable or key that the conversation does not have");
}

namespace {

std::int64_t int_arg(const Where& w, const Value& v, const char* what) {
  if (v.kind == Value::Kind::kInt) return v.i;
  if (v.kind == Value::Kind::kBool) return v.b;
  w.error(std::string(what) + " needs an integer, not a " + type_name(v));
}

std::string str_arg(const Where& w, const Value& v, const char* what) {
  if (v.kind != Value::Kind::kString) w.error(std::string(what) + " needs a string, not a " + type_name(v));
  return v.s;
}

Value kwarg_or(std::vector<Value>& args, std::vector<Kwarg>& kw, std::size_t pos, const char* name, Value dflt) {
  if (args.size() > pos) return args[pos];
  for (auto& k : kw)
    if (k.name == name) return k.value;
  return dflt;
}

// str.split / rsplit (sep None: runs of whitespace, no empty parts).
List split(const Where& w, const std::string& s, const Value& sep, std::int64_t maxsplit, bool from_right) {
  List out;
  if (sep.kind == Value::Kind::kNone || sep.is_undefined()) {
    std::vector<std::uint32_t> cps = code_points(s);
    std::vector<std::string> parts;
    if (!from_right) {
      std::size_t k = 0;
      while (true) {
        while (k < cps.size() && is_py_space(cps[k])) ++k;
        if (k >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) == maxsplit) {
          std::size_t e = cps.size();
          while (e > k && is_py_space(cps[e - 1])) --e;
          parts.push_back(from_code_points(cps, k, e));
          break;
        }
        std::size_t e = k;
        while (e < cps.size() && !is_py_space(cps[e])) ++e;
        parts.push_back(from_code_points(cps, k, e));
        k = e;
      }
    } else {
      std::size_t k = cps.size();
      while (true) {
        while (k > 0 && is_py_space(cps[k - 1])) --k;
        if (k == 0) break;
        if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) == maxsplit) {
          std::size_t b = 0;
          while (b < k && is_py_space(cps[b])) ++b;
          parts.push_back(from_code_points(cps, b, k));
          break;
        }
        std::size_t b = k;
        while (b > 0 && !is_py_space(cps[b - 1])) --b;
        parts.push_back(from_code_points(cps, b, k));
        k = b;
      }
      std::reverse(parts.begin(), parts.end());
    }
    for (auto& p : parts) out.push_back(Value::string(std::move(p)));
    return out;
  }
  const std::string d = str_arg(w, sep, "split");
  if (d.empty()) w.error("split: empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    std::size_t start = 0;
    while (true) {
      if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) == maxsplit) break;
      const std::size_t at = s.find(d, start);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(start, at - start));
      start = at + d.size();
    }
    parts.push_back(s.substr(start));
  } else {
    std::size_t end = s.size();
    while (true) {
      if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) == maxsplit) break;
      if (end < d.size()) break;
      const std::size_t at = s.rfind(d, end - d.size());
      if (at == std::string::npos) break;
      parts.push_back(s.substr(at + d.size(), end - at - d.size()));
      end = at;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::string map_ascii(const std::string& s, int (*f)(int)) {
  std::string out = s;
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(f(static_cast<unsigned char>(c)));
  return out;
}

// str.title() and capitalize() on ASCII letters (other scripts are left as they are).
std::string title_case(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    const bool alpha = u < 0x80 && std::isalpha(u);
    if (alpha) c = static_cast<char>(prev_cased ? std::tolower(u) : std::toupper(u));
    prev_cased = alpha || u >= 0x80;
  }
  return out;
}

Value str_method(const Where& w, const std::string& s, const std::string& name) {
  auto fn = [&](auto body) { return Value::function(body); };
  const std::string self = s;
  const std::string& origin = w.origin;
  const int line = w.line;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return fn([self, l, r](std::vector<Value>& a, std::vector<Kwarg>&) {
      if (!a.empty() && a[0].kind == Value::Kind::kString) return Value::string(py_strip(self, &a[0].s, l, r));
      return Value::string(py_strip(self, nullptr, l, r));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return fn([self, right, &origin, line](std::vector<Value>& a, std::vector<Kwarg>& kw) {
      const Where w2{origin, line};
      const Value sep = kwarg_or(a, kw, 0, "sep", Value::none());
      const Value maxsplit = kwarg_or(a, kw, 1, "maxsplit", Value::integer(-1));
      return Value::of_list(split(w2, self, sep, int_arg(w2, maxsplit, "split"), right));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return fn([self, start, &origin, line](std::vector<Value>& a, std::vector<Kwarg>&) {
      const Where w2{origin, line};
      if (a.empty()) w2.error(std::string(start ? "startswith" : "endswith") + " needs an argument");
      List options = a[0].kind == Value::Kind::kList ? *a[0].list : List{a[0]};
      for (const Value& o : options) {
        const std::string p = str_arg(w2, o, start ? "startswith" : "endswith");
        if (p.size() <= self.size() &&
            (start ? self.compare(0, p.size(), p) == 0 : self.compare(self.size() - p.size(), p.size(), p) == 0)) {
          return Value::boolean(true);
        }
      }
      return Value::boolean(false);
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return fn([self, name](std::vector<Value>&, std::vector<Kwarg>&) {
      if (name == "upper") return Value::string(map_ascii(self, [](int c) { return std::toupper(c); }));
      if (name == "lower") return Value::string(map_ascii(self, [](int c) { return std::tolower(c); }));
      if (name == "title") return Value::string(title_case(self));
      std::string out = map_ascii(self, [](int c) { return std::tolower(c); });
      if (!out.empty() && static_cast<unsigned char>(out[0]) < 0x80) out[0] = static_cast<char>(std::toupper(out[0]));
      return Value::string(out);
    });
  }
  if (name == "replace") {
    return fn([self, &origin, line](std::vector<Value>& a, std::vector<Kwarg>& kw) {
      const Where w2{origin, line};
      if (a.size() < 2) w2.error("replace needs the old and the new text");
      const std::string from = str_arg(w2, a[0], "replace"), to = str_arg(w2, a[1], "replace");
      std::int64_t count = int_arg(w2, kwarg_or(a, kw, 2, "count", Value::integer(-1)), "replace");
      if (from.empty()) w2.error("replace with an empty old text is not supported");
      std::string out;
      std::size_t start = 0;
      while (count != 0) {
        const std::size_t at = self.find(from, start);
        if (at == std::string::npos) break;
        out += self.substr(start, at - start) + to;
        start = at + from.size();
        if (count > 0) --count;
      }
      return Value::string(out + self.substr(start));
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return fn([self, name, &origin, line](std::vector<Value>& a, std::vector<Kwarg>&) {
      const Where w2{origin, line};
      if (a.empty()) w2.error(name + " needs an argument");
      const std::string sub = str_arg(w2, a[0], name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<std::int64_t>(code_points(self).size()) + 1);
        std::int64_t n = 0;
        for (std::size_t at = self.find(sub); at != std::string::npos; at = self.find(sub, at + sub.size())) ++n;
        return Value::integer(n);
      }
      const std::size_t at = name == "find" ? self.find(sub) : self.rfind(sub);
      if (at == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<std::int64_t>(code_points(self.substr(0, at)).size()));
    });
  }
  if (name == "splitlines") {
    return fn([self](std::vector<Value>&, std::vector<Kwarg>&) {
      List out;
      std::string cur;
      for (std::size_t k = 0; k < self.size(); ++k) {
        const char c = self[k];
        if (c == '\n' || c == '\r') {
          out.push_back(Value::string(cur));
          cur.clear();
          if (c == '\r' && k + 1 < self.size() && self[k + 1] == '\n') ++k;
        } else {
          cur += c;
        }
      }
      if (!cur.empty()) out.push_back(Value::string(cur));
      return Value::of_list(std::move(out));
    });
  }
  if (name == "join") {
    return fn([self, &origin, line](std::vector<Value>& a, std::vector<Kwarg>&) {
      const Where w2{origin, line};
      if (a.empty()) w2.error("join needs an iterable");
      std::string out;
      bool first = true;
      for (const Value& x : iterate(w2, a[0])) {
        if (!first) out += self;
        first = false;
        out += str_arg(w2, x, "str.join");
      }
      return Value::string(out);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return fn([self, prefix, &origin, line](std::vector<Value>& a, std::vector<Kwarg>&) {
      const Where w2{origin, line};
      if (a.empty()) w2.error("removeprefix/removesuffix needs an argument");
      const std::string p = str_arg(w2, a[0], "removeprefix");
      if (p.size() <= self.size()) {
        if (prefix && self.compare(0, p.size(), p) == 0) return Value::string(self.substr(p.size()));
        if (!prefix && self.compare(self.size() - p.size(), p.size(), p) == 0)
          return Value::string(self.substr(0, self.size() - p.size()));
      }
      return Value::string(self);
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "isupper" ||
      name == "islower") {
    return fn([self, name](std::vector<Value>&, std::vector<Kwarg>&) {
      if (self.empty()) return Value::boolean(false);
      const std::vector<std::uint32_t> cps = code_points(self);
      bool any_cased = false, ok = true;
      for (std::uint32_t c : cps) {
        const bool ascii = c < 0x80;
        if (name == "isspace") ok = ok && is_py_space(c);
        else if (name == "isdigit") ok = ok && ascii && std::isdigit(static_cast<int>(c));
        else if (name == "isalpha") ok = ok && ascii && std::isalpha(static_cast<int>(c));
        else if (name == "isalnum") ok = ok && ascii && std::isalnum(static_cast<int>(c));
        else if (ascii && std::isalpha(static_cast<int>(c))) {
          any_cased = true;
          ok = ok && (name == "isupper" ? std::isupper(static_cast<int>(c)) : std::islower(static_cast<int>(c)));
        }
      }
      if (name == "isupper" || name == "islower") ok = ok && any_cased;
      return Value::boolean(ok);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Value::function([d, name](std::vector<Value>&, std::vector<Kwarg>&) {
      List out;
      for (const auto& [k, v] : d.dict->items) {
        if (name == "items") out.push_back(Value::of_list({Value::string(k), v}, true));
        else if (name == "keys") out.push_back(Value::string(k));
        else out.push_back(v);
      }
      return Value::of_list(std::move(out));
    });
  }
  if (name == "get") {
    return Value::function([d](std::vector<Value>& a, std::vector<Kwarg>& kw) {
      const Value dflt = kwarg_or(a, kw, 1, "default", Value::none());
      if (a.empty() || a[0].kind != Value::Kind::kString) return dflt;
      const Value* v = d.dict->find(a[0].s);
      return v ? *v : dflt;
    });
  }
  return Value::undefined();
}

}  // namespace

namespace {
// "'dict object' has no attribute 'x'" (built by appending: GCC 12 misreads "'" + std::string as
// an overlapping copy under -Wrestrict).
Value missing(const Value& obj, const std::string& what) {
  std::string m(1, '\'');
  m += type_name(obj);
  m += "' has no ";
  m += what;
  return Value::undefined(m);
}
}  // namespace

Value get_attr(const Where& w, const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Kind::kUndefined: undefined_error(w, obj);
    case Value::Kind::kString: return str_method(w, obj.s, name);
    case Value::Kind::kDict: {
      if (!obj.dict->is_namespace) {
        Value m = dict_method(obj, name);
        if (!m.is_undefined()) return m;
      }
      if (const Value* v = obj.dict->find(name)) return *v;
      return missing(obj, "attribute '" + name + "'");
    }
    default: return missing(obj, "attribute '" + name + "'");
  }
}

Value get_item(const Where& w, const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Value::Kind::kUndefined: undefined_error(w, obj);
    case Value::Kind::kDict: {
      if (key.kind == Value::Kind::kString) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        if (!obj.dict->is_namespace) {
          Value m = dict_method(obj, key.s);
          if (!m.is_undefined()) return m;
        }
      }
      return missing(obj, "attribute '" + to_str(key) + "'");
    }
    case Value::Kind::kList:
    case Value::Kind::kString: {
      if (key.kind == Value::Kind::kString) return get_attr(w, obj, key.s);
      if (key.kind != Value::Kind::kInt && key.kind != Value::Kind::kBool) {
        w.error(type_name(obj) + " indices must be integers, not " + type_name(key));
      }
      std::int64_t i = key.kind == Value::Kind::kInt ? key.i : key.b;
      if (obj.kind == Value::Kind::kList) {
        const auto n = static_cast<std::int64_t>(obj.list->size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return missing(obj, "element " + std::to_string(key.i));
        return (*obj.list)[static_cast<std::size_t>(i)];
      }
      const std::vector<std::uint32_t> cps = code_points(obj.s);
      const auto n = static_cast<std::int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("'str object' has no element " + std::to_string(key.i));
      return Value::string(from_code_points(cps, static_cast<std::size_t>(i), static_cast<std::size_t>(i) + 1));
    }
    default:
      if (key.kind == Value::Kind::kString) return get_attr(w, obj, key.s);
      return missing(obj, "element " + to_str(key));
  }
}

List iterate(const Where& w, const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return *v.list;
    case Value::Kind::kDict: {
      List out;
      for (const auto& kv : v.dict->items) out.push_back(Value::string(kv.first));
      return out;
    }
    case Value::Kind::kString: {
      List out;
      const std::vector<std::uint32_t> cps = code_points(v.s);
      for (std::size_t k = 0; k < cps.size(); ++k) out.push_back(Value::string(from_code_points(cps, k, k + 1)));
      return out;
    }
    default: w.error("a " + type_name(v) + " is not iterable");
  }
}

}  // namespace scalelab::jinja
