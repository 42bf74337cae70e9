// Jinja parser: tokens -> AST, following Jinja2 3.1's grammar and operator precedence
// (or < and < not < comparisons < + - < ~ < * / // % < ** < unary - + < postfix, filters,
// tests), plus vLLM's content-format detection over the AST.
#include <algorithm>
#include <cstdlib>
#include <initializer_list>

#include "tokenizer/jinja_internal.h"

namespace kvroute::jinja {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, uint32_t max_depth) : t_(std::move(tokens)), max_depth_(max_depth) {}

  NodePtr program() {
    auto p = std::make_unique<Node>(NK::Program);
    subparse(p->body, {});
    if (cur_ < t_.size()) fail("Encountered unknown tag '" + peek(1).value + "'.");
    return done(std::move(p));
  }

 private:
  std::vector<Token> t_;
  size_t cur_ = 0;
  uint32_t max_depth_;
  uint32_t nest_ = 0;
  int loops_ = 0;

  struct Guard {
    Parser* p;
    explicit Guard(Parser* q) : p(q) { if (++p->nest_ > p->max_depth_) fail("Template nesting too deep"); }
    ~Guard() { --p->nest_; }
  };

  // Depth from the children: bounds AST depth so that evaluation and destruction recursion stay bounded.
  NodePtr done(NodePtr n) {
    uint32_t d = 0;
    for (auto* c : {n->x.get(), n->y.get(), n->z.get()}) if (c) d = std::max(d, c->depth);
    for (auto* v : {&n->list, &n->body, &n->alt}) for (auto& c : *v) d = std::max(d, c->depth);
    n->depth = d + 1;
    if (n->depth > max_depth_) fail("Template nesting too deep");
    return n;
  }
  NodePtr mk(NK k, NodePtr x = nullptr, NodePtr y = nullptr, std::string s = {}) {
    auto n = std::make_unique<Node>(k);
    n->x = std::move(x); n->y = std::move(y); n->str = std::move(s);
    return done(std::move(n));
  }

  const Token& peek(size_t k = 0) const {
    static const Token kEnd{TT::End, ""};
    return cur_ + k < t_.size() ? t_[cur_ + k] : kEnd;
  }
  bool is(TT t, const char* v = nullptr, size_t k = 0) const {
    return peek(k).type == t && (!v || peek(k).value == v);
  }
  bool is_op(const char* v, size_t k = 0) const { return is(TT::Op, v, k); }
  bool is_name(const char* v, size_t k = 0) const { return is(TT::Name, v, k); }
  const Token& next() {
    if (cur_ >= t_.size()) fail("Unexpected end of template.");
    return t_[cur_++];
  }
  void expect_op(const char* v) {
    if (!is_op(v)) fail(std::string("expected token '") + v + "', got '" + peek().value + "'");
    ++cur_;
  }
  void expect_name(const char* v) {
    if (!is_name(v)) fail(std::string("expected token '") + v + "', got '" + peek().value + "'");
    ++cur_;
  }
  void expect(TT t, const char* what) {
    if (!is(t)) fail(std::string("expected ") + what);
    ++cur_;
  }

  // Template data and tags until a block tag named in `ends` (left unconsumed).
  void subparse(std::vector<NodePtr>& body, std::initializer_list<const char*> ends) {
    Guard g(this);
    while (cur_ < t_.size()) {
      const Token& t = peek();
      if (t.type == TT::Text || t.type == TT::Raw) { body.push_back(mk(NK::Text, nullptr, nullptr, next().value)); continue; }
      if (t.type == TT::VarBegin) {
        ++cur_;
        auto e = tuple_expr(true, {});
        expect(TT::VarEnd, "end of print statement");
        body.push_back(std::move(e));
        continue;
      }
      if (t.type != TT::BlockBegin) fail("unexpected token");
      if (peek(1).type == TT::Name)
        for (auto* e : ends) if (peek(1).value == e) return;
      ++cur_;
      body.push_back(statement());
    }
    if (ends.size()) fail(std::string("Unexpected end of template. Jinja was looking for the following tags: '") + *ends.begin() + "'.");
  }

  void end_tag(const char* name) {
    expect(TT::BlockBegin, "'{%'");
    expect_name(name);
    expect(TT::BlockEnd, "'%}'");
  }

  NodePtr statement() {
    Guard g(this);
    if (!is(TT::Name)) fail("tag name expected");
    std::string name = next().value;
    if (name == "for") return for_stmt();
    if (name == "if") return if_stmt();
    if (name == "set") return set_stmt();
    if (name == "macro") return macro_stmt();
    if (name == "filter") return filter_stmt();
    if (name == "break" || name == "continue") {
      if (loops_ == 0) fail("'" + name + "' outside of a loop");
      expect(TT::BlockEnd, "'%}'");
      return mk(name == "break" ? NK::Break : NK::Continue);
    }
    if (name == "generation") {
      auto n = std::make_unique<Node>(NK::Generation);
      expect(TT::BlockEnd, "'%}'");
      subparse(n->body, {"endgeneration"});
      end_tag("endgeneration");
      return done(std::move(n));
    }
    fail("Encountered unknown tag '" + name + "'.");
  }

  NodePtr for_stmt() {
    auto n = std::make_unique<Node>(NK::For);
    n->x = assign_target(false, {"in"});
    expect_name("in");
    n->y = tuple_expr(false, {"recursive", "if"});
    if (is_name("if")) { ++cur_; n->z = expression(true); }
    if (is_name("recursive")) fail("recursive loops are not supported");
    expect(TT::BlockEnd, "'%}'");
    ++loops_;
    subparse(n->body, {"endfor", "else"});
    --loops_;
    if (is_name("else", 1)) {
      cur_ += 2;
      expect(TT::BlockEnd, "'%}'");
      subparse(n->alt, {"endfor"});
    }
    end_tag("endfor");
    return done(std::move(n));
  }

  NodePtr if_stmt() {
    auto n = std::make_unique<Node>(NK::If);
    n->x = tuple_expr(false, {});
    expect(TT::BlockEnd, "'%}'");
    subparse(n->body, {"elif", "else", "endif"});
    if (is_name("elif", 1)) {
      cur_ += 2;
      n->alt.push_back(if_stmt());
      return done(std::move(n));
    }
    if (is_name("else", 1)) {
      cur_ += 2;
      expect(TT::BlockEnd, "'%}'");
      subparse(n->alt, {"endif"});
    }
    end_tag("endif");
    return done(std::move(n));
  }

  NodePtr set_stmt() {
    NodePtr target = assign_target(true, {});
    if (is_op("=")) {
      ++cur_;
      auto n = mk(NK::Set, std::move(target), tuple_expr(true, {}));
      expect(TT::BlockEnd, "'%}'");
      return n;
    }
    auto n = std::make_unique<Node>(NK::SetBlock);
    if (target->kind != NK::Name) fail("can't assign a block to this target");
    n->x = std::move(target);
    if (is_op("|")) n->y = filter_chain(nullptr);
    expect(TT::BlockEnd, "'%}'");
    subparse(n->body, {"endset"});
    end_tag("endset");
    return done(std::move(n));
  }

  NodePtr macro_stmt() {
    auto n = std::make_unique<Node>(NK::Macro);
    if (!is(TT::Name)) fail("expected macro name");
    n->str = next().value;
    expect_op("(");
    while (!is_op(")")) {
      if (!n->list.empty()) expect_op(",");
      if (!is(TT::Name)) fail("expected parameter name");
      std::string p = next().value;
      if (is_op("=")) {
        ++cur_;
        n->list.push_back(mk(NK::KwArg, expression(true), nullptr, p));
      } else {
        for (auto& q : n->list) if (q->kind == NK::KwArg) fail("non-default argument follows default argument");
        n->list.push_back(mk(NK::Name, nullptr, nullptr, p));
      }
    }
    ++cur_;
    expect(TT::BlockEnd, "'%}'");
    int saved = loops_;
    loops_ = 0;
    subparse(n->body, {"endmacro"});
    loops_ = saved;
    end_tag("endmacro");
    return done(std::move(n));
  }

  NodePtr filter_stmt() {
    auto n = std::make_unique<Node>(NK::FilterBlock);
    n->y = filter_chain(nullptr, false);
    expect(TT::BlockEnd, "'%}'");
    subparse(n->body, {"endfilter"});
    end_tag("endfilter");
    return done(std::move(n));
  }

  // Names (or ns.attr with `with_namespace`), optionally a tuple of names.
  NodePtr assign_target(bool with_namespace, std::initializer_list<const char*> extra_end) {
    auto one = [&]() -> NodePtr {
      if (is_op("(")) {
        ++cur_;
        auto t = assign_target(false, {});
        expect_op(")");
        return t;
      }
      if (!is(TT::Name)) fail("expected a name to assign to");
      std::string name = next().value;
      if (with_namespace && is_op(".")) {
        ++cur_;
        if (!is(TT::Name)) fail("expected an attribute name");
        auto ns = mk(NK::Name, nullptr, nullptr, name);
        return mk(NK::Getattr, std::move(ns), nullptr, next().value);
      }
      return mk(NK::Name, nullptr, nullptr, name);
    };
    auto first = one();
    if (!is_op(",")) return first;
    auto t = std::make_unique<Node>(NK::TupleLit);
    t->list.push_back(std::move(first));
    while (is_op(",")) {
      ++cur_;
      bool end = false;
      for (auto* e : extra_end) if (is_name(e)) end = true;
      if (end || is_op("=") || is(TT::BlockEnd)) break;
      t->list.push_back(one());
    }
    for (auto& c : t->list) if (c->kind != NK::Name && c->kind != NK::TupleLit) fail("can't assign to this target");
    return done(std::move(t));
  }

  bool tuple_end(std::initializer_list<const char*> extra_end) const {
    if (is(TT::VarEnd) || is(TT::BlockEnd) || is_op(")") || is(TT::End)) return true;
    for (auto* e : extra_end) if (is_name(e)) return true;
    return false;
  }

  // parse_tuple: a single expression, or a tuple when commas separate several.
  NodePtr tuple_expr(bool with_condexpr, std::initializer_list<const char*> extra_end, bool explicit_parens = false) {
    std::vector<NodePtr> items;
    bool comma = false;
    for (;;) {
      if (!items.empty()) {
        if (!is_op(",")) break;
        ++cur_;
        comma = true;
      }
      if (tuple_end(extra_end)) break;
      items.push_back(expression(with_condexpr));
    }
    if (!comma && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !explicit_parens) fail("Expected an expression, got '" + peek().value + "'");
    auto t = std::make_unique<Node>(NK::TupleLit);
    t->list = std::move(items);
    return done(std::move(t));
  }

  NodePtr expression(bool with_condexpr = true) {
    Guard g(this);
    if (!with_condexpr) return or_expr();
    auto e = or_expr();
    while (is_name("if")) {
      ++cur_;
      auto cond = or_expr();
      NodePtr other;
      if (is_name("else")) { ++cur_; other = expression(true); }
      auto n = std::make_unique<Node>(NK::CondExpr);
      n->x = std::move(cond); n->y = std::move(e); n->z = std::move(other);
      e = done(std::move(n));
    }
    return e;
  }
  NodePtr binary(BinOp op, NodePtr l, NodePtr r) {
    auto n = mk(NK::Binary, std::move(l), std::move(r));
    n->op = op;
    return n;
  }
  NodePtr or_expr() {
    auto l = and_expr();
    while (is_name("or")) { ++cur_; l = binary(kOr, std::move(l), and_expr()); }
    return l;
  }
  NodePtr and_expr() {
    auto l = not_expr();
    while (is_name("and")) { ++cur_; l = binary(kAnd, std::move(l), not_expr()); }
    return l;
  }
  NodePtr not_expr() {
    if (is_name("not")) {
      Guard g(this);
      ++cur_;
      return mk(NK::Unary, not_expr(), nullptr, "not");
    }
    return compare();
  }
  NodePtr compare() {
    auto first = math1();
    auto n = std::make_unique<Node>(NK::Compare);
    for (;;) {
      static const std::pair<const char*, CmpOp> kOps[] = {{"==", kEq}, {"!=", kNe}, {"<", kLt}, {"<=", kLe}, {">", kGt}, {">=", kGe}};
      bool found = false;
      for (auto& [s, op] : kOps) {
        if (is_op(s)) { ++cur_; n->ops.push_back(op); found = true; break; }
      }
      if (!found) {
        if (is_name("in")) { ++cur_; n->ops.push_back(kIn); }
        else if (is_name("not") && is_name("in", 1)) { cur_ += 2; n->ops.push_back(kNotIn); }
        else break;
      }
      n->list.push_back(math1());
    }
    if (n->ops.empty()) return first;
    n->x = std::move(first);
    return done(std::move(n));
  }
  NodePtr math1() {
    auto l = concat();
    while (is_op("+") || is_op("-")) {
      BinOp op = next().value == "+" ? kAdd : kSub;
      l = binary(op, std::move(l), concat());
    }
    return l;
  }
  NodePtr concat() {
    auto l = math2();
    while (is_op("~")) { ++cur_; l = binary(kConcat, std::move(l), math2()); }
    return l;
  }
  NodePtr math2() {
    auto l = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string& s = next().value;
      BinOp op = s == "*" ? kMul : s == "/" ? kDiv : s == "//" ? kFloorDiv : kMod;
      l = binary(op, std::move(l), power());
    }
    return l;
  }
  NodePtr power() {
    auto l = unary(true);
    while (is_op("**")) { ++cur_; l = binary(kPow, std::move(l), unary(true)); }
    return l;
  }
  NodePtr unary(bool with_filter) {
    Guard g(this);
    NodePtr n;
    if (is_op("-") || is_op("+")) {
      std::string op = next().value;
      n = mk(NK::Unary, unary(false), nullptr, op);
    } else {
      n = primary();
    }
    n = postfix(std::move(n));
    if (with_filter) n = filter_expr(std::move(n));
    return n;
  }

  NodePtr constant(Value v) {
    auto n = mk(NK::Const);
    n->value = std::move(v);
    return n;
  }

  NodePtr primary() {
    Guard g(this);
    const Token& t = next();
    switch (t.type) {
      case TT::Name:
        if (t.value == "true" || t.value == "True") return constant(Value::boolean(true));
        if (t.value == "false" || t.value == "False") return constant(Value::boolean(false));
        if (t.value == "none" || t.value == "None") return constant(Value::null());
        return mk(NK::Name, nullptr, nullptr, t.value);
      case TT::Str: {
        std::string s = t.value;
        while (is(TT::Str)) s += next().value;
        return constant(str_value(std::move(s)));
      }
      case TT::Int: {
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(t.value.c_str(), &end, 10);
        if (errno == ERANGE) return constant(Value::big_integer(t.value, std::strtod(t.value.c_str(), nullptr)));
        return constant(Value::integer(v));
      }
      case TT::Float: return constant(Value::floating(std::strtod(t.value.c_str(), nullptr)));
      case TT::Op:
        if (t.value == "(") {
          auto e = tuple_expr(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          auto a = std::make_unique<Node>(NK::ListLit);
          while (!is_op("]")) {
            if (!a->list.empty()) expect_op(",");
            if (is_op("]")) break;
            a->list.push_back(expression(true));
          }
          ++cur_;
          return done(std::move(a));
        }
        if (t.value == "{") {
          auto o = std::make_unique<Node>(NK::DictLit);
          while (!is_op("}")) {
            if (!o->list.empty()) expect_op(",");
            if (is_op("}")) break;
            o->list.push_back(expression(true));
            expect_op(":");
            o->list.push_back(expression(true));
          }
          ++cur_;
          return done(std::move(o));
        }
        break;
      default: break;
    }
    fail("unexpected '" + t.value + "'");
  }

  NodePtr postfix(NodePtr n) {
    for (;;) {
      if (is_op(".") || is_op("[")) n = subscript(std::move(n));
      else if (is_op("(")) n = call(std::move(n));
      else return n;
    }
  }
  NodePtr filter_expr(NodePtr n) {
    for (;;) {
      if (is_op("|")) n = filter_chain(std::move(n));
      else if (is_name("is")) n = test(std::move(n));
      else if (is_op("(")) n = call(std::move(n));
      else return n;
    }
  }

  NodePtr subscript(NodePtr obj) {
    Guard g(this);
    if (next().value == ".") {
      const Token& t = next();
      if (t.type == TT::Name) return mk(NK::Getattr, std::move(obj), nullptr, t.value);
      if (t.type == TT::Int) return mk(NK::Getitem, std::move(obj), constant(Value::integer(std::strtoll(t.value.c_str(), nullptr, 10))));
      fail("expected name or number");
    }
    std::vector<NodePtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(subscribed());
    }
    ++cur_;
    if (args.empty()) fail("expected subscript expression");
    if (args.size() == 1) return mk(NK::Getitem, std::move(obj), std::move(args[0]));
    auto t = std::make_unique<Node>(NK::TupleLit);
    t->list = std::move(args);
    return mk(NK::Getitem, std::move(obj), done(std::move(t)));
  }
  NodePtr subscribed() {
    NodePtr parts[3];
    if (is_op(":")) {
      ++cur_;
    } else {
      auto e = expression(true);
      if (!is_op(":")) return e;
      ++cur_;
      parts[0] = std::move(e);
    }
    if (!is_op("]") && !is_op(",") && !is_op(":")) parts[1] = expression(true);
    if (is_op(":")) {
      ++cur_;
      if (!is_op("]") && !is_op(",")) parts[2] = expression(true);
    }
    auto s = std::make_unique<Node>(NK::Slice);
    s->x = std::move(parts[0]); s->y = std::move(parts[1]); s->z = std::move(parts[2]);
    return done(std::move(s));
  }

  void call_args(std::vector<NodePtr>& out) {
    Guard g(this);
    expect_op("(");
    bool kw = false, dyn = false;
    while (!is_op(")")) {
      if (!out.empty()) { expect_op(","); if (is_op(")")) break; }
      if (is_op("**")) { ++cur_; out.push_back(mk(NK::KwSpread, expression(true))); dyn = true; continue; }
      if (is_op("*")) { ++cur_; out.push_back(mk(NK::Spread, expression(true))); dyn = true; continue; }
      if (is(TT::Name) && is_op("=", 1)) {
        std::string key = next().value;
        ++cur_;
        out.push_back(mk(NK::KwArg, expression(true), nullptr, key));
        kw = true;
        continue;
      }
      if (kw || dyn) fail("invalid syntax for function call expression");
      out.push_back(expression(true));
    }
    ++cur_;
  }
  NodePtr call(NodePtr callee) {
    auto c = std::make_unique<Node>(NK::Call);
    c->x = std::move(callee);
    call_args(c->list);
    return done(std::move(c));
  }

  std::string dotted_name() {
    if (!is(TT::Name)) fail("expected a filter or test name");
    std::string name = next().value;
    while (is_op(".") && is(TT::Name, nullptr, 1)) { ++cur_; name += "." + next().value; }
    return name;
  }

  // `| f(args) | g ...`; with operand nullptr for filter blocks.
  NodePtr filter_chain(NodePtr operand, bool leading_pipe = true) {
    bool first = true;
    while (is_op("|") || (first && !leading_pipe)) {
      if (is_op("|")) ++cur_;
      first = false;
      auto f = std::make_unique<Node>(NK::Filter);
      f->str = dotted_name();
      if (!filter_exists(f->str)) fail("No filter named '" + f->str + "'.");
      if (is_op("(")) call_args(f->list);
      f->x = std::move(operand);
      operand = done(std::move(f));
    }
    return operand;
  }

  NodePtr test(NodePtr operand) {
    ++cur_;  // is
    bool negate = false;
    if (is_name("not")) { ++cur_; negate = true; }
    auto t = std::make_unique<Node>(NK::Test);
    t->str = dotted_name();
    if (!test_exists(t->str)) fail("No test named '" + t->str + "'.");
    if (is_op("(")) {
      call_args(t->list);
    } else if ((is(TT::Name) || is(TT::Str) || is(TT::Int) || is(TT::Float) || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      t->list.push_back(postfix(primary()));
    }
    t->x = std::move(operand);
    t->flag = negate;
    return done(std::move(t));
  }
};

// ---------------------------------------------------------------- vLLM content-format detection

bool is_var(const Node* n, const std::string& var) { return n && n->kind == NK::Name && n->str == var; }

bool is_attr(const Node* n, const std::string& var, const std::string& key) {
  if (!n) return false;
  if (n->kind == NK::Getitem && n->y && n->y->kind == NK::Const && n->y->value.type == Type::String)
    return is_var(n->x.get(), var) && *n->y->value.s == key;
  if (n->kind == NK::Getattr) return is_var(n->x.get(), var) && n->str == key;
  return false;
}

// vLLM's _is_var_or_elems_access: var (or var[key]) under filters, tests and slices.
bool var_or_elems(const Node* n, const std::string& var, const std::string* key) {
  if (!n) return false;
  if (n->kind == NK::Filter || n->kind == NK::Test) return var_or_elems(n->x.get(), var, key);
  if (n->kind == NK::Getitem && n->y && n->y->kind == NK::Slice) return var_or_elems(n->x.get(), var, key);
  return key ? is_attr(n, var, *key) : is_var(n, var);
}

void collect(const Node* n, NK kind, std::vector<const Node*>& out) {
  if (!n) return;
  if (n->kind == kind) out.push_back(n);
  for (auto* c : {n->x.get(), n->y.get(), n->z.get()}) collect(c, kind, out);
  for (auto* v : {&n->list, &n->body, &n->alt}) for (auto& c : *v) collect(c.get(), kind, out);
}

}  // namespace

NodePtr parse_template(std::vector<Token> tokens, uint32_t max_depth) {
  Parser p(std::move(tokens), max_depth);
  return p.program();
}

bool detect_openai_content(const Node* root) {
  std::vector<const Node*> sets, loops;
  collect(root, NK::Set, sets);
  collect(root, NK::For, loops);
  // Variables holding `messages` (or a filtered / sliced view of it), breadth first.
  std::vector<std::string> msgs{"messages"};
  for (size_t i = 0; i < msgs.size() && msgs.size() < 1000; ++i) {
    for (const Node* s : sets) {
      if (s->x->kind != NK::Name || !var_or_elems(s->y.get(), msgs[i], nullptr)) continue;
      if (s->x->str != msgs[i]) msgs.push_back(s->x->str);
    }
  }
  std::vector<std::string> message_vars;
  for (const Node* l : loops) {
    for (auto& m : msgs) {
      if (var_or_elems(l->y.get(), m, nullptr)) {
        if (l->x->kind == NK::Name) message_vars.push_back(l->x->str);
        break;
      }
    }
  }
  static const std::string kContent = "content";
  for (const Node* l : loops)
    for (auto& m : message_vars)
      if (var_or_elems(l->y.get(), m, &kContent)) return true;
  return false;
}

}  // namespace kvroute::jinja
