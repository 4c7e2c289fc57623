// The chat-template interpreter's evaluator (jinja.h): runs a parsed Program over a context, with
// jinja2's scoping (a for loop's body is its own scope: a `set` inside it is not seen after the
// loop, which is why templates use namespace()), Python's operators, and the globals transformers
// gives chat templates.
#include <climits>
#include <cmath>
#include <ctime>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "model/tokenizer/jinja_internal.h"

namespace scalelab::jinja {

namespace {

constexpr std::int64_t kMaxRange = 100000;  // jinja2's sandbox MAX_RANGE

class Interp {
 public:
  explicit Interp(const Program& p) : p_(p) {}

  std::string run(const nlohmann::ordered_json& context) {
    reset_budgets();
    scopes_.emplace_back(globals());
    scopes_.emplace_back();
    if (context.is_object()) {
      for (auto it = context.begin(); it != context.end(); ++it) scopes_.back()[it.key()] = from_json(it.value());
    }
    std::string out;
    exec(p_.body, out);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;

  Where at(int line) const { return Where{p_.origin, line}; }

  Scope globals() {
    Scope g;
    const std::string& origin = p_.origin;
    g["range"] = Value::function([&origin](std::vector<Value>& a, std::vector<Kwarg>&) {
      const Where w{origin, 0};
      std::int64_t start = 0, stop = 0, step = 1;
      auto num = [&](const Value& v) {
        if (v.kind != Value::Kind::kInt) w.error("range() needs integers, not a " + type_name(v));
        return v.i;
      };
      if (a.size() == 1) {
        stop = num(a[0]);
      } else if (a.size() == 2 || a.size() == 3) {
        start = num(a[0]);
        stop = num(a[1]);
        if (a.size() == 3) step = num(a[2]);
      } else {
        w.error("range() takes 1 to 3 integers");
      }
      if (step == 0) w.error("range() step must not be zero");
      List out;
      for (std::int64_t x = start; step > 0 ? x < stop : x > stop;) {
        if (static_cast<std::int64_t>(out.size()) >= kMaxRange) w.error("range() is too large (at most 100000 items)");
        out.push_back(Value::integer(x));
        if (__builtin_add_overflow(x, step, &x)) break;
      }
      return Value::of_list(std::move(out));
    });
    g["namespace"] = Value::function([&origin](std::vector<Value>& a, std::vector<Kwarg>& kw) {
      Dict d;
      d.is_namespace = true;
      for (const Value& x : a) {
        if (x.kind != Value::Kind::kDict) Where{origin, 0}.error("namespace() takes a mapping or key=value arguments");
        for (const auto& [k, v] : x.dict->items) d.set(k, v);
      }
      for (const Kwarg& k : kw) d.set(k.name, k.value);
      for (const auto& kv : d.items)
        if (contains_namespace(kv.second)) Where{origin, 0}.error("namespace() cannot hold a namespace ('" + kv.first + "')");
      return Value::of_dict(std::move(d));
    });
    g["dict"] = Value::function([](std::vector<Value>& a, std::vector<Kwarg>& kw) {
      Dict d;
      for (const Value& x : a)
        if (x.kind == Value::Kind::kDict)
          for (const auto& [k, v] : x.dict->items) d.set(k, v);
      for (const Kwarg& k : kw) d.set(k.name, k.value);
      return Value::of_dict(std::move(d));
    });
    g["raise_exception"] = Value::function([this](std::vector<Value>& a, std::vector<Kwarg>&) -> Value {
      const std::string msg = a.empty() ? std::string("(no message)") : to_str(a[0]);
      throw InvalidInput("[chat template] " + p_.origin + " line " + std::to_string(line_) +
                         " refuses the conversation: " + msg + " — give the messages the template expects");
    });
    g["strftime_now"] = Value::function([](std::vector<Value>& a, std::vector<Kwarg>&) {
      const std::string fmt = a.empty() ? std::string() : to_str(a[0]);
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      const std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value::string(std::string(buf, n));
    });
    return g;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined(std::string("'") + name + "' is undefined");
  }

  // ---- statements

  Flow exec(const Body& body, std::string& out) {
    for (const auto& st : body) {
      const Flow f = exec(*st, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  void step(const Where& w, const std::string& out) {
    if (++steps_ > kMaxSteps) w.error("the template runs more than 5,000,000 statements and loop iterations — it does not end");
    if (out.size() > kMaxOutput) w.error("the rendered text is longer than 64 MiB");
  }

  Flow exec(const Stmt& st, std::string& out) {
    line_ = st.line;
    step(at(st.line), out);
    switch (st.kind) {
      case Stmt::Kind::kText: out += st.text; return Flow::kNormal;
      case Stmt::Kind::kOutput: out += to_str(eval(*st.expr)); return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (std::size_t k = 0; k < st.conds.size(); ++k) {
          if (truthy(eval(*st.conds[k]))) return exec(st.bodies[k], out);
        }
        if (st.bodies.size() > st.conds.size()) return exec(st.bodies.back(), out);
        return Flow::kNormal;
      case Stmt::Kind::kFor: return exec_for(st, out);
      case Stmt::Kind::kSet: assign(st, eval(*st.expr)); return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        exec(st.bodies[0], captured);
        assign(st, Value::string(captured));
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kGeneration: return exec(st.bodies[0], out);
    }
    return Flow::kNormal;
  }

  void assign(const Stmt& st, const Value& v) {
    const Where w = at(st.line);
    if (!st.ns_attr.empty()) {
      const Value ns = lookup(st.targets[0]);
      if (ns.kind != Value::Kind::kDict || !ns.dict->is_namespace) {
        w.error("'{% set " + st.targets[0] + "." + st.ns_attr + " = ... %}' needs " + st.targets[0] +
                " to be a namespace() (it is a " + type_name(ns) + ")");
      }
      // Namespaces hold plain values only: a namespace inside a namespace could form a cycle (a
      // leak) or a chain too deep to free recursively; chat templates never need one.
      if (contains_namespace(v)) w.error("a namespace attribute cannot hold a namespace ('" + st.ns_attr + "')");
      ns.dict->set(st.ns_attr, v);
      return;
    }
    bind(w, st.targets, v, scopes_.back());
  }

  void bind(const Where& w, const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
      scope[targets[0]] = v;
      return;
    }
    const List items = iterate(w, v);
    if (items.size() != targets.size()) {
      w.error("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) + " names");
    }
    for (std::size_t k = 0; k < targets.size(); ++k) scope[targets[k]] = items[k];
  }

  Flow exec_for(const Stmt& st, std::string& out) {
    const Where w = at(st.line);
    List items = iterate(w, eval(*st.expr));
    if (st.filter) {
      List kept;
      for (const Value& x : items) {
        scopes_.emplace_back();
        bind(w, st.targets, x, scopes_.back());
        const bool keep = truthy(eval(*st.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(x);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (st.bodies.size() > 1) return exec(st.bodies[1], out);
      return Flow::kNormal;
    }
    const auto n = static_cast<std::int64_t>(items.size());
    for (std::int64_t k = 0; k < n; ++k) {
      step(w, out);
      Scope scope;
      bind(w, st.targets, items[static_cast<std::size_t>(k)], scope);
      Dict loop;
      loop.set("index", Value::integer(k + 1));
      loop.set("index0", Value::integer(k));
      loop.set("revindex", Value::integer(n - k));
      loop.set("revindex0", Value::integer(n - k - 1));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == n - 1));
      loop.set("length", Value::integer(n));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", k > 0 ? items[static_cast<std::size_t>(k - 1)] : Value::undefined("'loop.previtem' is undefined (the first item)"));
      loop.set("nextitem", k + 1 < n ? items[static_cast<std::size_t>(k + 1)] : Value::undefined("'loop.nextitem' is undefined (the last item)"));
      loop.set("cycle", Value::function([k, w](std::vector<Value>& a, std::vector<Kwarg>&) {
        if (a.empty()) w.error("loop.cycle() needs at least one value");
        return a[static_cast<std::size_t>(k) % a.size()];
      }));
      Value lv;  // not charged to the item budget: one per iteration, freed with it
      lv.kind = Value::Kind::kDict;
      lv.depth = 1;
      lv.dict = std::make_shared<Dict>(std::move(loop));
      scope["loop"] = std::move(lv);
      scopes_.push_back(std::move(scope));
      const Flow f = exec(st.bodies[0], out);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  // ---- expressions

  void call_args(const Expr& e, std::size_t first, std::vector<Value>& args, std::vector<Kwarg>& kwargs) {
    const std::size_t nkw = e.kwnames.size();
    const std::size_t npos = e.a.size() - first - nkw;
    for (std::size_t k = 0; k < npos; ++k) args.push_back(eval(*e.a[first + k]));
    for (std::size_t k = 0; k < nkw; ++k) kwargs.push_back({e.kwnames[k], eval(*e.a[first + npos + k])});
  }

  Value eval(const Expr& e) {
    line_ = e.line;
    const Where w = at(e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kAttr: return get_attr(w, eval(*e.a[0]), e.name);
      case Expr::Kind::kItem: {
        const Value obj = eval(*e.a[0]);
        return get_item(w, obj, eval(*e.a[1]));
      }
      case Expr::Kind::kSlice: return slice(w, e);
      case Expr::Kind::kCall: {
        const Value f = eval(*e.a[0]);
        std::vector<Value> args;
        std::vector<Kwarg> kwargs;
        call_args(e, 1, args, kwargs);
        if (f.is_undefined()) undefined_error(w, f);
        if (f.kind != Value::Kind::kFunction) w.error("a " + type_name(f) + " is not callable");
        line_ = e.line;
        return (*f.fn)(args, kwargs);
      }
      case Expr::Kind::kFilter: {
        const Value v = eval(*e.a[0]);
        std::vector<Value> args;
        std::vector<Kwarg> kwargs;
        call_args(e, 1, args, kwargs);
        return call_filter(w, e.name, v, args, kwargs);
      }
      case Expr::Kind::kTest: {
        const Value v = eval(*e.a[0]);
        std::vector<Value> args;
        std::vector<Kwarg> kwargs;
        call_args(e, 1, args, kwargs);
        const bool r = call_test(w, e.name, v, args);
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        const Value v = eval(*e.a[0]);
        if (v.is_undefined()) undefined_error(w, v);
        if (v.kind == Value::Kind::kFloat) return Value::real(e.kind == Expr::Kind::kNeg ? -v.f : v.f);
        if (v.kind == Value::Kind::kInt || v.kind == Value::Kind::kBool) {
          const std::int64_t x = v.kind == Value::Kind::kInt ? v.i : v.b;
          if (e.kind == Expr::Kind::kNeg && x == INT64_MIN) w.error("integer overflow in unary -");
          return Value::integer(e.kind == Expr::Kind::kNeg ? -x : x);
        }
        w.error("bad operand type for unary " + std::string(e.kind == Expr::Kind::kNeg ? "-" : "+") + ": " + type_name(v));
      }
      case Expr::Kind::kNot: return Value::boolean(!truthy(eval(*e.a[0])));
      case Expr::Kind::kAnd: {
        Value l = eval(*e.a[0]);
        return truthy(l) ? eval(*e.a[1]) : l;
      }
      case Expr::Kind::kOr: {
        Value l = eval(*e.a[0]);
        return truthy(l) ? l : eval(*e.a[1]);
      }
      case Expr::Kind::kCond:
        if (truthy(eval(*e.a[0]))) return eval(*e.a[1]);
        return e.a[2] ? eval(*e.a[2]) : Value::undefined("the else branch of an inline if is undefined");
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& x : e.a) items.push_back(eval(*x));
        return Value::of_list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (std::size_t k = 0; k + 1 < e.a.size(); k += 2) {
          const Value key = eval(*e.a[k]);
          if (key.kind != Value::Kind::kString) w.error("dict keys other than strings are not supported (" + repr(key) + ")");
          d.set(key.s, eval(*e.a[k + 1]));
        }
        return Value::of_dict(std::move(d));
      }
      case Expr::Kind::kBinary: return binary(w, e.name, eval(*e.a[0]), eval(*e.a[1]));
      case Expr::Kind::kCompare: {
        Value left = eval(*e.a[0]);
        for (std::size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.a[k + 1]);
          if (!compare(w, e.ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
    }
    w.error("an expression scalelab cannot evaluate");
  }

  Value slice(const Where& w, const Expr& e) {
    const Value obj = eval(*e.a[0]);
    if (obj.is_undefined()) undefined_error(w, obj);
    std::optional<std::int64_t> part[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.a[1 + k]) continue;
      const Value v = eval(*e.a[1 + k]);
      if (v.kind == Value::Kind::kNone) continue;
      if (v.kind != Value::Kind::kInt) w.error("slice indices must be integers, not a " + type_name(v));
      part[k] = v.i;
    }
    const std::int64_t step = part[2].value_or(1);
    if (step == 0) w.error("slice step cannot be zero");
    std::vector<std::uint32_t> cps;
    std::int64_t n = 0;
    if (obj.kind == Value::Kind::kString) {
      cps = code_points(obj.s);
      n = static_cast<std::int64_t>(cps.size());
    } else if (obj.kind == Value::Kind::kList) {
      n = static_cast<std::int64_t>(obj.list->size());
    } else {
      w.error("a " + type_name(obj) + " cannot be sliced");
    }
    // Python's slice.indices().
    auto clamp = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
      if (!v) return dflt;
      std::int64_t x = *v;
      if (x < 0) x += n;
      if (step > 0) return std::min(std::max<std::int64_t>(x, 0), n);
      return std::min(std::max<std::int64_t>(x, -1), n - 1);
    };
    const std::int64_t start = clamp(part[0], step > 0 ? 0 : n - 1), stop = clamp(part[1], step > 0 ? n : -1);
    std::vector<std::int64_t> idx;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop;) {
      idx.push_back(i);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    if (obj.kind == Value::Kind::kString) {
      std::string s;
      for (auto i : idx) s += from_code_points(cps, static_cast<std::size_t>(i), static_cast<std::size_t>(i) + 1);
      return Value::string(s);
    }
    List out;
    for (auto i : idx) out.push_back((*obj.list)[static_cast<std::size_t>(i)]);
    return Value::of_list(std::move(out), obj.tuple);
  }

  bool compare(const Where& w, const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in" || op == "notin") {
      bool found = false;
      if (r.kind == Value::Kind::kString) {
        if (l.kind != Value::Kind::kString) w.error("'in <string>' needs a string on the left, not a " + type_name(l));
        found = r.s.find(l.s) != std::string::npos;
      } else if (r.kind == Value::Kind::kList || r.kind == Value::Kind::kDict || r.is_undefined()) {
        for (const Value& x : iterate(w, r)) {
          if (equals(x, l)) {
            found = true;
            break;
          }
        }
      } else {
        w.error("'in' needs a string, list or mapping on the right, not a " + type_name(r));
      }
      return op == "in" ? found : !found;
    }
    if (op == "<") return less(w, l, r);
    if (op == ">") return less(w, r, l);
    if (op == "<=") return less(w, l, r) || equals(l, r);
    return less(w, r, l) || equals(l, r);  // >=
  }

  static Value checked(const Where& w, std::string s) {
    if (s.size() > kMaxOutput) w.error("a string longer than 64 MiB");
    charge_bytes(s.size());
    return Value::string(std::move(s));
  }

  static double num(const Value& v) {
    return v.kind == Value::Kind::kFloat ? v.f : v.kind == Value::Kind::kInt ? static_cast<double>(v.i) : (v.b ? 1.0 : 0.0);
  }
  static std::int64_t ival(const Value& v) { return v.kind == Value::Kind::kInt ? v.i : v.b; }

  Value binary(const Where& w, const std::string& op, const Value& l, const Value& r) {
    if (op == "~") return checked(w, to_str(l) + to_str(r));
    if (l.is_undefined()) undefined_error(w, l);
    if (r.is_undefined()) undefined_error(w, r);
    const bool nums = l.is_number() && r.is_number();
    const bool ints = nums && l.kind != Value::Kind::kFloat && r.kind != Value::Kind::kFloat;
    auto type_error = [&]() -> Value {
      w.error("unsupported operand types for " + op + ": " + type_name(l) + " and " + type_name(r));
    };
    auto overflow = [&]() -> Value { w.error("integer overflow in " + op); };
    if (op == "+") {
      if (ints) {
        std::int64_t x;
        if (__builtin_add_overflow(ival(l), ival(r), &x)) return overflow();
        return Value::integer(x);
      }
      if (nums) return Value::real(num(l) + num(r));
      if (l.kind == Value::Kind::kString && r.kind == Value::Kind::kString) return checked(w, l.s + r.s);
      if (l.kind == Value::Kind::kList && r.kind == Value::Kind::kList && l.tuple == r.tuple) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::of_list(std::move(out), l.tuple);
      }
      return type_error();
    }
    if (op == "-") {
      if (ints) {
        std::int64_t x;
        if (__builtin_sub_overflow(ival(l), ival(r), &x)) return overflow();
        return Value::integer(x);
      }
      if (nums) return Value::real(num(l) - num(r));
      return type_error();
    }
    if (op == "*") {
      if (ints) {
        std::int64_t x;
        if (__builtin_mul_overflow(ival(l), ival(r), &x)) return overflow();
        return Value::integer(x);
      }
      if (nums) return Value::real(num(l) * num(r));
      const Value* seq = l.kind == Value::Kind::kString || l.kind == Value::Kind::kList ? &l : &r;
      const Value* count = seq == &l ? &r : &l;
      if ((seq->kind == Value::Kind::kString || seq->kind == Value::Kind::kList) &&
          (count->kind == Value::Kind::kInt || count->kind == Value::Kind::kBool)) {
        const std::int64_t times = ival(*count);
        const std::size_t unit = seq->kind == Value::Kind::kString ? seq->s.size() : seq->list->size() * 16;
        if (times > 0 && unit > 0 && static_cast<std::size_t>(times) > kMaxOutput / unit) {
          w.error("a repetition longer than 64 MiB");
        }
        if (seq->kind == Value::Kind::kString) {
          std::string s;
          for (std::int64_t k = 0; k < times; ++k) s += seq->s;
          return checked(w, std::move(s));
        }
        List out;
        for (std::int64_t k = 0; k < times; ++k) out.insert(out.end(), seq->list->begin(), seq->list->end());
        return Value::of_list(std::move(out), seq->tuple);
      }
      return type_error();
    }
    if (op == "/") {
      if (!nums) return type_error();
      if (num(r) == 0.0) w.error("division by zero");
      return Value::real(num(l) / num(r));
    }
    if (op == "//" || op == "%") {
      if (l.kind == Value::Kind::kString && op == "%") {
        w.error("'%' string formatting is not supported — use ~ or + to join strings");
      }
      if (!nums) return type_error();
      if (num(r) == 0.0) w.error(op == "//" ? "integer division by zero" : "modulo by zero");
      if (ints) {
        const std::int64_t a = ival(l), b = ival(r);
        if (a == INT64_MIN && b == -1) return overflow();
        std::int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          --q;
          m += b;
        }
        return Value::integer(op == "//" ? q : m);
      }
      const double a = num(l), b = num(r);
      if (op == "//") return Value::real(std::floor(a / b));
      double m = std::fmod(a, b);
      if (m != 0.0 && ((m < 0) != (b < 0))) m += b;
      return Value::real(m);
    }
    if (op == "**") {
      if (!nums) return type_error();
      if (ints && ival(r) >= 0) {
        std::int64_t result = 1, base = ival(l);
        if (base == 0 || base == 1) return Value::integer(ival(r) == 0 ? 1 : base);
        if (base == -1) return Value::integer(ival(r) % 2 ? -1 : 1);
        if (ival(r) > 64) return overflow();
        for (std::int64_t k = 0; k < ival(r); ++k) {
          if (__builtin_mul_overflow(result, base, &result)) return overflow();
        }
        return Value::integer(result);
      }
      return Value::real(std::pow(num(l), num(r)));
    }
    return type_error();
  }

  const Program& p_;
  std::vector<Scope> scopes_;
  int line_ = 0;
  std::int64_t steps_ = 0;
};

}  // namespace

std::string Template::render(const nlohmann::ordered_json& context) const {
  Interp in(*program_);
  try {
    return in.run(context);
  } catch (const LimitExceeded& e) {
    fail(program_->origin, 0, std::string(e.what) + " — a chat template should not need that");
  }
}

}  // namespace scalelab::jinja
