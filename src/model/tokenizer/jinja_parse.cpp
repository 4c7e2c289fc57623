// The chat-template interpreter's lexer and parser (jinja.h): source text to Program, following
// jinja2's lexer (its whitespace rules under trim_blocks and lstrip_blocks) and parser (operator
// precedence, filters and tests binding tighter than arithmetic).
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "core/error.h"
#include "model/tokenizer/jinja_internal.h"
#include "model/tokenizer/utf8.h"

namespace scalelab::jinja {

[[noreturn]] void fail(const std::string& origin, int line, const std::string& what) {
  throw InvalidInput("[chat template] " + origin + (line > 0 ? " line " + std::to_string(line) : std::string()) + ": " +
                     what);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type = Type::kEnd;
  std::string text;  // name, operator, or the decoded string
  std::int64_t i = 0;
  double f = 0.0;
  int line = 0;
};

// A run of template text, or one tag with its tokens (ending with a kEnd token).
struct Segment {
  enum class Type { kText, kVariable, kBlock } type;
  std::string text;
  std::vector<Token> tokens;
  int line = 0;
};

const char* const kUnsupported =
    " — scalelab's chat templates support if/elif/else, for, set, break/continue, generation, "
    "filters and tests (docs/data.md, \"Chat templates\"); rewrite the template without it or pass token ids";

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& origin) : origin_(origin) {
    // jinja2 reads \r\n and \r as \n and drops one trailing newline (keep_trailing_newline=False).
    src_.reserve(src.size());
    for (std::size_t k = 0; k < src.size(); ++k) {
      if (src[k] == '\r') {
        src_ += '\n';
        if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
      } else {
        src_ += src[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Segment> run() {
    std::vector<Segment> out;
    bool line_starting = true;
    while (pos_ < src_.size()) {
      std::size_t idx = pos_;
      char kind = 0;
      while (true) {
        idx = src_.find('{', idx);
        if (idx == std::string::npos || idx + 1 >= src_.size()) {
          idx = std::string::npos;
          break;
        }
        const char c = src_[idx + 1];
        if (c == '{' || c == '%' || c == '#') {
          kind = c;
          break;
        }
        ++idx;
      }
      if (idx == std::string::npos) {
        emit_text(out, src_.substr(pos_));
        break;
      }
      std::string text = src_.substr(pos_, idx - pos_);
      const char sign = idx + 2 < src_.size() && (src_[idx + 2] == '-' || src_[idx + 2] == '+') ? src_[idx + 2] : 0;
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: blocks and comments, not variables
        const std::size_t nl = text.rfind('\n');
        const std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool blank = true;
          for (std::size_t k = l_pos; k < text.size(); ++k) blank = blank && is_space(text[k]);
          if (blank) text.resize(l_pos);
        }
      }
      line_ += count_newlines(src_, pos_, idx);
      emit_text(out, text);
      pos_ = idx + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        line_starting = skip_comment();
      } else {
        Segment seg;
        seg.type = kind == '{' ? Segment::Type::kVariable : Segment::Type::kBlock;
        seg.line = line_;
        line_starting = lex_tag(seg, kind == '%');
        out.push_back(std::move(seg));
      }
    }
    return out;
  }

 private:
  static int count_newlines(const std::string& s, std::size_t a, std::size_t b) {
    int n = 0;
    for (std::size_t k = a; k < b && k < s.size(); ++k) n += s[k] == '\n';
    return n;
  }

  void emit_text(std::vector<Segment>& out, std::string text) {
    if (text.empty()) return;
    Segment s;
    s.type = Segment::Type::kText;
    s.text = std::move(text);
    s.line = line_;
    out.push_back(std::move(s));
  }

  // After an end marker: `-` strips all following whitespace, `+` nothing, else (blocks and
  // comments) trim_blocks removes one newline. Returns whether what was consumed ended in '\n'
  // (jinja2's line_starting).
  bool after_end(char sign, bool block_like, char last) {
    if (sign == '-') {
      const std::size_t start = pos_;
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      line_ += count_newlines(src_, start, pos_);
      return pos_ > start ? src_[pos_ - 1] == '\n' : last == '\n';
    }
    if (sign != '+' && block_like && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      return true;
    }
    return false;
  }

  bool skip_comment() {
    const std::size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail(origin_, line_, "a comment {# is never closed with #}");
    char sign = 0;
    if (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    line_ += count_newlines(src_, pos_, end);
    pos_ = end + 2;
    return after_end(sign, true, '}');
  }

  // Tokens of a {{ }} or {% %} tag up to its end marker (outside brackets), then the whitespace rules.
  bool lex_tag(Segment& seg, bool block) {
    std::vector<char> brackets;
    const char close = block ? '%' : '}';
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) fail(origin_, seg.line, std::string("a tag is never closed with ") + (block ? "%}" : "}}"));
      if (brackets.empty()) {
        char sign = 0;
        std::size_t at = pos_;
        if ((src_[at] == '-' || (block && src_[at] == '+')) && at + 2 < src_.size() && src_[at + 1] == close &&
            src_[at + 2] == '}') {
          sign = src_[at];
          ++at;
        }
        if (at + 1 < src_.size() && src_[at] == close && src_[at + 1] == '}') {
          Token end;
          end.line = line_;
          seg.tokens.push_back(end);
          pos_ = at + 2;
          return after_end(sign, block, '}');
        }
      }
      Token t = next_token();
      if (t.type == Token::Type::kOp) {
        const std::string& o = t.text;
        if (o == "(" || o == "[" || o == "{") {
          brackets.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
        } else if (o == ")" || o == "]" || o == "}") {
          if (brackets.empty() || brackets.back() != o[0]) fail(origin_, line_, "unexpected '" + o + "'");
          brackets.pop_back();
        }
      }
      seg.tokens.push_back(std::move(t));
    }
  }

  Token next_token() {
    Token t;
    t.line = line_;
    const char c = src_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) return number(t);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const std::size_t start = pos_;
      while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      t.type = Token::Type::kName;
      t.text = src_.substr(start, pos_ - start);
      return t;
    }
    if (c == '\'' || c == '"') return quoted(t, c);
    static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                       ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOps) {
      const std::size_t n = std::char_traits<char>::length(op);
      if (src_.compare(pos_, n, op) == 0) {
        t.type = Token::Type::kOp;
        t.text = op;
        pos_ += n;
        return t;
      }
    }
    fail(origin_, line_, std::string("unexpected character '") + c + "' in a tag");
  }

  Token number(Token& t) {
    const std::size_t start = pos_;
    std::string digits;
    auto take_digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
        if (src_[pos_] != '_') digits += src_[pos_];
        ++pos_;
      }
    };
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() && std::strchr("xXoObB", src_[pos_ + 1])) {
      const int base = std::tolower(src_[pos_ + 1]) == 'x' ? 16 : std::tolower(src_[pos_ + 1]) == 'o' ? 8 : 2;
      pos_ += 2;
      while (pos_ < src_.size() && (std::isxdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
        if (src_[pos_] != '_') digits += src_[pos_];
        ++pos_;
      }
      t.type = Token::Type::kInt;
      t.i = std::strtoll(digits.c_str(), nullptr, base);
      return t;
    }
    take_digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      digits += '.';
      ++pos_;
      take_digits();
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      std::size_t k = pos_ + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        digits += 'e';
        if (src_[pos_ + 1] == '-') digits += '-';
        pos_ = k;
        take_digits();
        is_float = true;
      }
    }
    (void)start;
    if (is_float) {
      t.type = Token::Type::kFloat;
      t.f = std::strtod(digits.c_str(), nullptr);
    } else {
      t.type = Token::Type::kInt;
      errno = 0;
      t.i = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(origin_, line_, "the integer " + digits + " does not fit in 64 bits");
    }
    return t;
  }

  // A quoted string with Python's escapes (jinja2 decodes them with unicode-escape).
  Token quoted(Token& t, char quote) {
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) fail(origin_, t.line, "a string is never closed");
      const char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) fail(origin_, t.line, "a string ends in a backslash");
      const char e = src_[pos_ + 1];
      pos_ += 2;
      auto hex = [&](int n) {
        if (pos_ + n > src_.size()) fail(origin_, t.line, "a truncated \\x/\\u escape in a string");
        std::uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = src_[pos_ + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail(origin_, t.line, "a bad \\x/\\u escape in a string");
          v = v * 16 + static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
        }
        pos_ += static_cast<std::size_t>(n);
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '0': out += '\0'; break;
        case '\n': ++line_; break;  // a line continuation
        case 'x': tok::append_utf8(out, hex(2)); break;
        case 'u': tok::append_utf8(out, hex(4)); break;
        case 'U': tok::append_utf8(out, hex(8)); break;
        default:  // Python keeps an unknown escape as it is
          out += '\\';
          out += e;
      }
    }
    t.type = Token::Type::kString;
    t.text = std::move(out);
    return t;
  }

  std::string src_;
  const std::string& origin_;
  std::size_t pos_ = 0;
  int line_ = 1;
};

// ---- the parser ------------------------------------------------------------------------------

class Parser {
  // Counts the parser's recursion (nested expressions and blocks): a template is outside input,
  // and a stack overflow is no answer to "(((((...".
  struct Depth {
    Parser& p;
    Depth(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > kMaxSyntaxDepth) {
        --p.depth_;
        fail(p.origin_, line, "expressions or blocks nested more than " + std::to_string(kMaxSyntaxDepth) + " deep");
      }
    }
    ~Depth() { --p.depth_; }
  };

 public:
  Parser(std::vector<Segment> segs, const std::string& origin) : segs_(std::move(segs)), origin_(origin) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  // Statements until a block tag whose keyword is in `ends` (returned in `end`, its tokens left
  // current), or the end of the template when `ends` is empty.
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    while (seg_ < segs_.size()) {
      Segment& s = segs_[seg_];
      if (s.type == Segment::Type::kText) {
        auto st = std::make_unique<Stmt>();
        st->kind = Stmt::Kind::kText;
        st->line = s.line;
        st->text = s.text;
        body.push_back(std::move(st));
        ++seg_;
        continue;
      }
      toks_ = &s.tokens;
      tk_ = 0;
      if (s.type == Segment::Type::kVariable) {
        auto st = std::make_unique<Stmt>();
        st->kind = Stmt::Kind::kOutput;
        st->line = s.line;
        st->expr = parse_tuple(true);
        expect_end("}}");
        body.push_back(std::move(st));
        continue;
      }
      const Token& kw = cur();
      if (kw.type != Token::Type::kName) fail(origin_, kw.line, "a block tag {% %} must start with a statement name");
      if (ends.count(kw.text)) {
        end = kw.text;
        return body;
      }
      body.push_back(parse_statement(ends));
    }
    if (!ends.empty()) {
      std::string want;
      for (const auto& e : ends) want += (want.empty() ? "" : " or ") + std::string("{% ") + e + " %}";
      fail(origin_, 0, "the template ends before " + want);
    }
    return body;
  }

  std::unique_ptr<Stmt> parse_statement(const std::set<std::string>& outer_ends) {
    const Depth depth(*this, cur().line);
    const Token kw = next();
    auto st = std::make_unique<Stmt>();
    st->line = kw.line;
    const std::string& k = kw.text;
    if (k == "if") {
      st->kind = Stmt::Kind::kIf;
      st->conds.push_back(parse_tuple(true));
      expect_end("%}");
      while (true) {
        std::string end;
        st->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
        next();  // the keyword
        if (end == "elif") {
          st->conds.push_back(parse_tuple(true));
          expect_end("%}");
        } else if (end == "else") {
          expect_end("%}");
          std::string e2;
          st->bodies.push_back(parse_body({"endif"}, e2));
          next();
          expect_end("%}");
          break;
        } else {
          expect_end("%}");
          break;
        }
      }
    } else if (k == "for") {
      st->kind = Stmt::Kind::kFor;
      parse_targets(st->targets, "for");
      if (!(cur().type == Token::Type::kName && cur().text == "in")) fail(origin_, cur().line, "expected 'in' in {% for %}");
      next();
      st->expr = parse_tuple(false);
      if (cur().type == Token::Type::kName && cur().text == "if") {
        next();
        st->filter = parse_expression(true);
      }
      if (cur().type == Token::Type::kName && cur().text == "recursive") {
        fail(origin_, cur().line, std::string("'{% for ... recursive %}' is not supported") + kUnsupported);
      }
      expect_end("%}");
      std::string end;
      ++loop_depth_;
      st->bodies.push_back(parse_body({"else", "endfor"}, end));
      --loop_depth_;
      next();
      expect_end("%}");
      if (end == "else") {
        std::string e2;
        st->bodies.push_back(parse_body({"endfor"}, e2));
        next();
        expect_end("%}");
      }
    } else if (k == "set") {
      const Token name = next();
      if (name.type != Token::Type::kName) fail(origin_, name.line, "expected a name after {% set");
      st->targets.push_back(name.text);
      if (cur().type == Token::Type::kOp && cur().text == ".") {
        next();
        const Token attr = next();
        if (attr.type != Token::Type::kName) fail(origin_, attr.line, "expected an attribute name in {% set ns.attr = ... %}");
        st->ns_attr = attr.text;
      } else {
        while (cur().type == Token::Type::kOp && cur().text == ",") {
          next();
          const Token more = next();
          if (more.type != Token::Type::kName) fail(origin_, more.line, "expected a name in {% set a, b = ... %}");
          st->targets.push_back(more.text);
        }
      }
      if (cur().type == Token::Type::kOp && cur().text == "=") {
        next();
        st->kind = Stmt::Kind::kSet;
        st->expr = parse_tuple(true);
        expect_end("%}");
      } else {
        if (cur().type == Token::Type::kOp && cur().text == "|") {
          fail(origin_, cur().line, std::string("a filtered {% set x | filter %} block is not supported") + kUnsupported);
        }
        if (st->targets.size() != 1 || !st->ns_attr.empty()) fail(origin_, st->line, "{% set %} blocks take one name");
        expect_end("%}");
        st->kind = Stmt::Kind::kSetBlock;
        std::string end;
        st->bodies.push_back(parse_body({"endset"}, end));
        next();
        expect_end("%}");
      }
    } else if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail(origin_, kw.line, "{% " + k + " %} outside a {% for %} loop");
      st->kind = k == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_end("%}");
    } else if (k == "generation") {
      st->kind = Stmt::Kind::kGeneration;
      expect_end("%}");
      std::string end;
      st->bodies.push_back(parse_body({"endgeneration"}, end));
      next();
      expect_end("%}");
    } else {
      static const std::set<std::string> kEnds = {"endif", "endfor", "endset", "endgeneration", "elif", "else"};
      if (kEnds.count(k)) {
        fail(origin_, kw.line, "'{% " + k + " %}' does not close anything open here" +
                                   (outer_ends.empty() ? std::string() : " (check the nesting)"));
      }
      fail(origin_, kw.line, "'{% " + k + " %}' is not supported" + kUnsupported);
    }
    return st;
  }

  void parse_targets(std::vector<std::string>& out, const char* what) {
    const bool paren = cur().type == Token::Type::kOp && cur().text == "(";
    if (paren) next();
    while (true) {
      const Token n = next();
      if (n.type != Token::Type::kName) fail(origin_, n.line, std::string("expected a loop variable name in {% ") + what + " %}");
      out.push_back(n.text);
      if (cur().type == Token::Type::kOp && cur().text == ",") {
        next();
        continue;
      }
      break;
    }
    if (paren) expect_op(")");
  }

  // ---- expressions (jinja2's Parser: parse_tuple > parse_expression > or > and > not > compare >
  // math1 (+ -) > concat (~) > math2 (* / // %) > pow > unary > primary, postfix, filters/tests)

  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  ExprPtr parse_tuple(bool with_cond) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty() && !starts_expression()) break;
      items.push_back(parse_expression(with_cond));
      if (cur().type == Token::Type::kOp && cur().text == ",") {
        comma = true;
        next();
        continue;
      }
      break;
    }
    if (!comma) return std::move(items[0]);
    auto t = make(Expr::Kind::kTuple, line);
    t->a = std::move(items);
    return t;
  }

  bool starts_expression() const {
    const Token& t = cur();
    if (t.type == Token::Type::kEnd) return false;
    if (t.type == Token::Type::kOp) return t.text == "(" || t.text == "[" || t.text == "{" || t.text == "-" || t.text == "+";
    if (t.type == Token::Type::kName) return t.text != "in" && t.text != "if" && t.text != "else";
    return true;
  }

  ExprPtr parse_expression(bool with_cond) {
    ExprPtr e = parse_or();
    if (!with_cond) return e;
    while (cur().type == Token::Type::kName && cur().text == "if") {
      const int line = next().line;
      auto c = make(Expr::Kind::kCond, line);
      ExprPtr test = parse_or();
      ExprPtr other;
      if (cur().type == Token::Type::kName && cur().text == "else") {
        next();
        other = parse_expression(true);
      }
      c->a.push_back(std::move(test));
      c->a.push_back(std::move(e));
      c->a.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      auto e = make(Expr::Kind::kOr, line);
      e->a.push_back(std::move(l));
      e->a.push_back(parse_and());
      l = std::move(e);
    }
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      auto e = make(Expr::Kind::kAnd, line);
      e->a.push_back(std::move(l));
      e->a.push_back(parse_not());
      l = std::move(e);
    }
    return l;
  }

  ExprPtr parse_not() {
    const Depth depth(*this, cur().line);
    if (is_name("not")) {
      const int line = next().line;
      auto e = make(Expr::Kind::kNot, line);
      e->a.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> rest;
    std::vector<std::string> ops;
    while (true) {
      const Token& t = cur();
      if (t.type == Token::Type::kOp &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">=")) {
        ops.push_back(next().text);
      } else if (is_name("in")) {
        next();
        ops.push_back("in");
      } else if (is_name("not") && peek_is_name("in")) {
        next();
        next();
        ops.push_back("notin");
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::Kind::kCompare, line);
    e->a.push_back(std::move(first));
    for (auto& r : rest) e->a.push_back(std::move(r));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr binary_chain(ExprPtr (Parser::*sub)(), const std::set<std::string>& ops) {
    ExprPtr l = (this->*sub)();
    while (cur().type == Token::Type::kOp && ops.count(cur().text)) {
      const Token op = next();
      auto e = make(Expr::Kind::kBinary, op.line);
      e->name = op.text;
      e->a.push_back(std::move(l));
      e->a.push_back((this->*sub)());
      l = std::move(e);
    }
    return l;
  }
  ExprPtr parse_math1() { return binary_chain(&Parser::parse_concat, {"+", "-"}); }
  ExprPtr parse_concat() { return binary_chain(&Parser::parse_math2, {"~"}); }
  ExprPtr parse_math2() { return binary_chain(&Parser::parse_pow, {"*", "/", "//", "%"}); }
  ExprPtr parse_pow() { return binary_chain(&Parser::parse_unary_filtered, {"**"}); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    const Depth depth(*this, cur().line);
    ExprPtr node;
    if (cur().type == Token::Type::kOp && (cur().text == "-" || cur().text == "+")) {
      const Token op = next();
      node = make(op.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, op.line);
      node->a.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = next();
    switch (t.type) {
      case Token::Type::kName: {
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = make(Expr::Kind::kLiteral, t.line);
          e->value = Value::boolean(t.text == "true" || t.text == "True");
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = make(Expr::Kind::kLiteral, t.line);
          e->value = Value::none();
          return e;
        }
        auto e = make(Expr::Kind::kName, t.line);
        e->name = t.text;
        return e;
      }
      case Token::Type::kString: {
        std::string s = t.text;
        while (cur().type == Token::Type::kString) s += next().text;  // adjacent strings join
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Token::Type::kInt: {
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->value = Value::integer(t.i);
        return e;
      }
      case Token::Type::kFloat: {
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->value = Value::real(t.f);
        return e;
      }
      case Token::Type::kOp: {
        if (t.text == "(") {
          if (cur().type == Token::Type::kOp && cur().text == ")") {
            next();
            return make(Expr::Kind::kTuple, t.line);
          }
          ExprPtr inner = parse_tuple(true);
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::kList, t.line);
          while (!(cur().type == Token::Type::kOp && cur().text == "]")) {
            e->a.push_back(parse_expression(true));
            if (cur().type == Token::Type::kOp && cur().text == ",") {
              next();
            } else {
              break;
            }
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          auto e = make(Expr::Kind::kDict, t.line);
          while (!(cur().type == Token::Type::kOp && cur().text == "}")) {
            e->a.push_back(parse_expression(true));
            expect_op(":");
            e->a.push_back(parse_expression(true));
            if (cur().type == Token::Type::kOp && cur().text == ",") {
              next();
            } else {
              break;
            }
          }
          expect_op("}");
          return e;
        }
        break;
      }
      case Token::Type::kEnd:
        fail(origin_, t.line, "an expression is missing before the end of the tag");
    }
    fail(origin_, t.line, "unexpected '" + t.text + "' in an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (cur().type == Token::Type::kOp) {
      const std::string& o = cur().text;
      if (o == ".") {
        const int line = next().line;
        const Token n = next();
        if (n.type == Token::Type::kName) {
          auto e = make(Expr::Kind::kAttr, line);
          e->name = n.text;
          e->a.push_back(std::move(node));
          node = std::move(e);
        } else if (n.type == Token::Type::kInt) {
          auto e = make(Expr::Kind::kItem, line);
          e->a.push_back(std::move(node));
          auto idx = make(Expr::Kind::kLiteral, line);
          idx->value = Value::integer(n.i);
          e->a.push_back(std::move(idx));
          node = std::move(e);
        } else {
          fail(origin_, n.line, "expected an attribute name after '.'");
        }
      } else if (o == "[") {
        node = parse_subscript(std::move(node));
      } else if (o == "(") {
        node = parse_call(std::move(node), Expr::Kind::kCall, "");
      } else {
        break;
      }
    }
    return node;
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = next().line;  // [
    ExprPtr parts[3];
    int colons = 0;
    while (!(cur().type == Token::Type::kOp && cur().text == "]")) {
      if (cur().type == Token::Type::kOp && cur().text == ":") {
        next();
        if (++colons > 2) fail(origin_, line, "a slice has at most two ':'");
        continue;
      }
      if (parts[colons]) fail(origin_, line, "expected ':' or ']' in a subscript");
      parts[colons] = parse_expression(true);
    }
    next();
    if (colons == 0) {
      if (!parts[0]) fail(origin_, line, "an empty subscript []");
      auto e = make(Expr::Kind::kItem, line);
      e->a.push_back(std::move(node));
      e->a.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(Expr::Kind::kSlice, line);
    e->a.push_back(std::move(node));
    for (auto& p : parts) e->a.push_back(std::move(p));
    return e;
  }

  // Arguments "(a, b, k=v)" into e->a (after its first operands) and e->kwnames.
  void parse_args(Expr& e) {
    expect_op("(");
    while (!(cur().type == Token::Type::kOp && cur().text == ")")) {
      if (cur().type == Token::Type::kOp && (cur().text == "*" || cur().text == "**")) {
        fail(origin_, cur().line, std::string("*args / **kwargs in a call are not supported") + kUnsupported);
      }
      if (cur().type == Token::Type::kName && peek_is_op("=")) {
        e.kwnames.push_back(next().text);
        next();
        e.a.push_back(parse_expression(true));
      } else {
        if (!e.kwnames.empty()) fail(origin_, cur().line, "a positional argument after a keyword argument");
        e.a.push_back(parse_expression(true));
      }
      if (cur().type == Token::Type::kOp && cur().text == ",") {
        next();
      } else {
        break;
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node, Expr::Kind kind, const std::string& name) {
    auto e = make(kind, cur().line);
    e->name = name;
    e->a.push_back(std::move(node));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (cur().type == Token::Type::kOp && cur().text == "|") {
        next();
        node = parse_filter(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (cur().type == Token::Type::kOp && cur().text == "(") {
        node = parse_call(std::move(node), Expr::Kind::kCall, "");
      } else {
        break;
      }
    }
    return node;
  }

  ExprPtr parse_filter(ExprPtr node) {
    const Token n = next();
    if (n.type != Token::Type::kName) fail(origin_, n.line, "expected a filter name after '|'");
    std::string name = n.text;
    while (cur().type == Token::Type::kOp && cur().text == "." && peek_type() == Token::Type::kName) {
      next();
      name += "." + next().text;
    }
    if (!known_filter(name)) fail(origin_, n.line, "the filter '" + name + "' is not supported" + kUnsupported);
    if (cur().type == Token::Type::kOp && cur().text == "(") return parse_call(std::move(node), Expr::Kind::kFilter, name);
    auto e = make(Expr::Kind::kFilter, n.line);
    e->name = name;
    e->a.push_back(std::move(node));
    return e;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;  // is
    bool negated = false;
    if (is_name("not")) {
      next();
      negated = true;
    }
    const Token n = next();
    if (n.type != Token::Type::kName) fail(origin_, n.line, "expected a test name after 'is'");
    // `is none` / `is true`: jinja2 lexes them as names too.
    if (!known_test(n.text)) fail(origin_, n.line, "the test '" + n.text + "' is not supported" + kUnsupported);
    ExprPtr e;
    if (cur().type == Token::Type::kOp && cur().text == "(") {
      e = parse_call(std::move(node), Expr::Kind::kTest, n.text);
    } else {
      e = make(Expr::Kind::kTest, line);
      e->name = n.text;
      e->a.push_back(std::move(node));
      const Token& t = cur();
      const bool arg = (t.type == Token::Type::kName && t.text != "else" && t.text != "or" && t.text != "and" &&
                        t.text != "if" && t.text != "is" && t.text != "in" && t.text != "not") ||
                       t.type == Token::Type::kString || t.type == Token::Type::kInt || t.type == Token::Type::kFloat ||
                       (t.type == Token::Type::kOp && (t.text == "(" || t.text == "[" || t.text == "{"));
      if (arg) {
        e->a.push_back(parse_postfix(parse_primary()));
      }
    }
    e->negated = negated;
    e->line = line;
    return e;
  }

  // ---- token helpers
  const Token& cur() const { return (*toks_)[tk_]; }
  Token next() {
    const Token t = (*toks_)[tk_];
    if (t.type != Token::Type::kEnd) ++tk_;
    return t;
  }
  Token::Type peek_type() const { return tk_ + 1 < toks_->size() ? (*toks_)[tk_ + 1].type : Token::Type::kEnd; }
  bool is_name(const char* n) const { return cur().type == Token::Type::kName && cur().text == n; }
  bool peek_is_name(const char* n) const {
    return tk_ + 1 < toks_->size() && (*toks_)[tk_ + 1].type == Token::Type::kName && (*toks_)[tk_ + 1].text == n;
  }
  bool peek_is_op(const char* o) const {
    return tk_ + 1 < toks_->size() && (*toks_)[tk_ + 1].type == Token::Type::kOp && (*toks_)[tk_ + 1].text == o;
  }
  void expect_op(const char* o) {
    if (!(cur().type == Token::Type::kOp && cur().text == o)) {
      fail(origin_, cur().line, std::string("expected '") + o + "'" +
                                    (cur().type == Token::Type::kEnd ? " before the end of the tag" : ", found '" + cur().text + "'"));
    }
    next();
  }
  void expect_end(const char* closer) {
    if (cur().type != Token::Type::kEnd) {
      fail(origin_, cur().line, "unexpected '" + cur().text + "' where the tag should end with " + closer);
    }
    ++seg_;
  }

  std::vector<Segment> segs_;
  const std::string& origin_;
  std::size_t seg_ = 0;
  std::vector<Token>* toks_ = nullptr;
  std::size_t tk_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

Template Template::parse(std::string_view source, const std::string& origin) {
  auto p = std::make_shared<Program>();
  p->origin = origin;
  Lexer lex(source, p->origin);
  Parser parser(lex.run(), p->origin);
  p->body = parser.parse_all();
  Template t;
  t.program_ = std::move(p);
  return t;
}

const std::string& Template::origin() const { return program_->origin; }

}  // namespace scalelab::jinja
