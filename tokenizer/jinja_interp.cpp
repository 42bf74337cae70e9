// Jinja evaluation with Python semantics: scopes, operators, statements (loops with
// break/continue as control-flow state, no exceptions), macros, globals, and Template.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "tokenizer/jinja_internal.h"

namespace kvroute::jinja {
namespace {

[[noreturn]] void type_error(const char* op, const Value& a, const Value& b) {
  fail(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

void no_undefined(const Value& a, const Value& b) {
  if (a.type == Type::Undefined || b.type == Type::Undefined) fail("an undefined value was used in an operation");
}

std::string int128_str(__int128 v) {
  if (v == 0) return "0";
  bool neg = v < 0;
  unsigned __int128 u = neg ? (unsigned __int128)(-(v + 1)) + 1 : (unsigned __int128)v;
  std::string s;
  while (u) { s += char('0' + int(u % 10)); u /= 10; }
  if (neg) s += '-';
  std::reverse(s.begin(), s.end());
  return s;
}

Value int128_value(__int128 r) {
  if (r >= INT64_MIN && r <= INT64_MAX) return Value::integer(int64_t(r));
  return Value::big_integer(int128_str(r), double(r));
}

bool plain_int(const Value& v) { return (v.type == Type::Int && !v.big) || v.type == Type::Bool; }
int64_t ival(const Value& v) { return v.type == Type::Bool ? v.b : v.i; }
bool any_float(const Value& a, const Value& b) { return a.type == Type::Float || b.type == Type::Float; }

// Integer arithmetic is exact in 64 bits (results up to 128 bits kept as digits); an
// integer beyond 64 bits computes as a double.
Value arith(char op, const Value& a, const Value& b) {
  if (plain_int(a) && plain_int(b)) {
    __int128 x = ival(a), y = ival(b);
    switch (op) {
      case '+': return int128_value(x + y);
      case '-': return int128_value(x - y);
      case '*': return int128_value(x * y);
      case 'f': case '%': {
        if (y == 0) fail("integer division or modulo by zero");
        __int128 q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) { --q; r += y; }
        return int128_value(op == 'f' ? q : r);
      }
      default: break;
    }
  }
  double x = as_double(a), y = as_double(b);
  bool fl = any_float(a, b);
  switch (op) {
    case '+': return fl ? Value::floating(x + y) : Value::floating(x + y);
    case '-': return Value::floating(x - y);
    case '*': return Value::floating(x * y);
    case 'f': {
      if (y == 0) fail("float floor division by zero");
      double m = std::fmod(x, y);
      double d = (x - m) / y;
      if (m != 0 && ((y < 0) != (m < 0))) d -= 1;
      double fl_d = std::floor(d);
      if (d - fl_d > 0.5) fl_d += 1;
      return Value::floating(d == 0 ? std::copysign(0.0, x / y) : fl_d);
    }
    case '%': {
      if (y == 0) fail("float modulo");
      double m = std::fmod(x, y);
      if (m != 0) { if ((y < 0) != (m < 0)) m += y; } else m = std::copysign(0.0, y);
      return Value::floating(m);
    }
    default: break;
  }
  fail("bad arithmetic operator");
}

Value repeat_seq(const Value& seq, const Value& n, const Limits& lim) {
  int64_t k = std::max<int64_t>(0, ival(n));
  if (seq.type == Type::String) {
    if (size_t(k) > 0 && seq.s->size() * size_t(k) / size_t(k) != seq.s->size()) fail("Output too large");
    check_built(seq.s->size() * size_t(k));
    std::string out;
    for (int64_t i = 0; i < k; ++i) out += *seq.s;
    return str_value(std::move(out));
  }
  if (seq.a->items.size() * size_t(k) > lim.max_items) fail("Too many items");
  Array out;
  for (int64_t i = 0; i < k; ++i) out.insert(out.end(), seq.a->items.begin(), seq.a->items.end());
  Value v = Value::array(std::move(out));
  v.tuple = seq.tuple;
  return v;
}

}  // namespace

Value add_values(const Value& a, const Value& b) {
  no_undefined(a, b);
  if (is_number(a) && is_number(b)) return any_float(a, b) ? Value::floating(as_double(a) + as_double(b)) : arith('+', a, b);
  if (a.type == Type::String && b.type == Type::String) {
    check_built(a.s->size() + b.s->size());
    return str_value(*a.s + *b.s);
  }
  if (a.type == Type::Array && b.type == Type::Array && a.tuple == b.tuple) {
    Array out = a.a->items;
    out.insert(out.end(), b.a->items.begin(), b.a->items.end());
    Value v = Value::array(std::move(out));
    v.tuple = a.tuple;
    return v;
  }
  if (a.type == Type::String || b.type == Type::String) fail(std::string("can only concatenate str (not \"") + type_name(a.type == Type::String ? b : a) + "\") to str");
  type_error("+", a, b);
}

Value binary_mod(const Value& a, const Value& b) {
  no_undefined(a, b);
  if (a.type == Type::String) return py_format(*a.s, b);
  if (!is_number(a) || !is_number(b)) type_error("%", a, b);
  if (any_float(a, b)) return arith('%', Value::floating(as_double(a)), Value::floating(as_double(b)));
  return arith('%', a, b);
}

// A scope. Heap-allocated and shared: a macro keeps the scope it was defined in alive
// (Function::closure). Interp clears the scopes that define macros when a render ends,
// which breaks the scope -> macro -> scope cycle.
struct Env : std::enable_shared_from_this<Env> {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Env> parent;
  explicit Env(std::shared_ptr<Env> p = nullptr) : parent(std::move(p)) {}
  const Value* lookup(const std::string& name) const {
    for (const Env* e = this; e; e = e->parent.get()) {
      auto it = e->vars.find(name);
      if (it != e->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

namespace {

enum class Flow : uint8_t { Normal, Break, Continue };

class Interp {
 public:
  explicit Interp(const RenderOptions& o)
      : opt_(o), lim_(o.limits), cx_{&o.limits, o.now}, saved_max_bytes_(t_max_bytes) {
    t_max_bytes = lim_.max_output_bytes;
  }
  ~Interp() {
    t_max_bytes = saved_max_bytes_;
    // Namespaces are the only mutable values: clearing them breaks any reference
    // cycle the template built and keeps destruction non-recursive.
    for (auto& ns : namespaces_) { ns->items.clear(); ns->index.clear(); }
    for (auto& env : closures_) env->vars.clear();
  }

  // Renders statements into out; stops early when a break/continue is pending.
  void block(const std::vector<NodePtr>& stmts, Env& env, std::string& out) {
    for (auto& s : stmts) {
      stmt(s.get(), env, out);
      check_size(out.size());
      if (flow_ != Flow::Normal) return;
    }
  }
  std::string render_block(const std::vector<NodePtr>& stmts, Env& env) {
    std::string out;
    block(stmts, env, out);
    return out;
  }

 private:
  const RenderOptions& opt_;
  const Limits& lim_;
  CallContext cx_;
  size_t saved_max_bytes_;
  std::vector<std::shared_ptr<Env>> closures_;  // scopes that define macros (cleared at the end)
  uint64_t steps_ = 0;
  uint32_t depth_ = 0;
  Flow flow_ = Flow::Normal;
  std::vector<std::shared_ptr<Object>> namespaces_;

  struct Depth {
    Interp* in;
    explicit Depth(Interp* i) : in(i) {
      if (++in->depth_ > in->lim_.max_depth) fail("Maximum recursion depth exceeded");
      if (++in->steps_ > in->lim_.max_steps) fail("Template evaluation step limit exceeded");
    }
    ~Depth() { --in->depth_; }
  };

  void check_size(size_t n) const { if (n > lim_.max_output_bytes) fail("Output too large"); }

  // ------------------------------------------------------------ statements

  void stmt(const Node* n, Env& env, std::string& out) {
    Depth d(this);
    switch (n->kind) {
      case NK::Text: out += n->str; return;
      case NK::If: block(truthy(eval(n->x.get(), env)) ? n->body : n->alt, env, out); return;
      case NK::For: for_loop(n, env, out); return;
      case NK::Set: set(n, env); return;
      case NK::SetBlock: {
        Value v = str_value(render_block(n->body, env));
        if (n->y) v = eval_filter(n->y.get(), env, &v);
        env.vars[n->x->str] = std::move(v);
        return;
      }
      case NK::Macro: {
        auto f = std::make_shared<Function>();
        f->kind = Function::Macro;
        f->name = n->str;
        f->macro = n;
        f->closure = env.shared_from_this();
        if (closures_.empty() || closures_.back() != f->closure) closures_.push_back(f->closure);
        cx_.check_items(closures_.size());
        Value v;
        v.type = Type::Function;
        v.f = std::move(f);
        env.vars[n->str] = std::move(v);
        return;
      }
      case NK::FilterBlock: {
        Value body = str_value(render_block(n->body, env));
        out += py_str(eval_filter(n->y.get(), env, &body));
        return;
      }
      case NK::Generation: block(n->body, env, out); return;
      case NK::Break: flow_ = Flow::Break; return;
      case NK::Continue: flow_ = Flow::Continue; return;
      default: {
        Value v = eval(n, env);
        if (v.type == Type::String) out += *v.s; else out += py_str(v);
      }
    }
  }

  void bind(const Node* target, const Value& item, Env& env) {
    if (target->kind == NK::Name) { env.vars[target->str] = item; return; }
    Array parts = iterate(item);
    if (parts.size() != target->list.size())
      fail(parts.size() < target->list.size() ? "not enough values to unpack" : "too many values to unpack");
    for (size_t j = 0; j < parts.size(); ++j) bind(target->list[j].get(), parts[j], env);
  }

  void for_loop(const Node* n, Env& env, std::string& out) {
    auto scope_ptr = std::make_shared<Env>(env.shared_from_this());
    Env& scope = *scope_ptr;
    Array all = iterate(eval(n->y.get(), env));
    Array items;
    if (n->z) {
      for (const Value& cur : all) {
        auto test_scope = std::make_shared<Env>(scope_ptr);
        bind(n->x.get(), cur, *test_scope);
        if (truthy(eval(n->z.get(), *test_scope))) items.push_back(cur);
      }
    } else {
      items = std::move(all);
    }
    const size_t len = items.size();
    for (size_t i = 0; i < len; ++i) {
      if (++steps_ > lim_.max_steps) fail("Template evaluation step limit exceeded");
      auto loop = std::make_shared<Object>();
      loop->items.reserve(12);
      auto I = [](size_t x) { return Value::integer(int64_t(x)); };
      loop->set("index", I(i + 1));
      loop->set("index0", I(i));
      loop->set("revindex", I(len - i));
      loop->set("revindex0", I(len - i - 1));
      loop->set("first", Value::boolean(i == 0));
      loop->set("last", Value::boolean(i == len - 1));
      loop->set("length", I(len));
      loop->set("depth", I(1));
      loop->set("depth0", I(0));
      loop->set("previtem", i > 0 ? items[i - 1] : Value());
      loop->set("nextitem", i + 1 < len ? items[i + 1] : Value());
      loop->set("cycle", make_function(Function::LoopCycle, "cycle", I(i)));
      scope.vars.clear();
      scope.vars["loop"] = Value::object(std::move(loop));
      bind(n->x.get(), items[i], scope);
      block(n->body, scope, out);
      check_size(out.size());
      if (flow_ == Flow::Break) { flow_ = Flow::Normal; break; }
      flow_ = Flow::Normal;
    }
    if (len == 0) block(n->alt, env, out);
  }

  void set(const Node* n, Env& env) {
    Value rhs = eval(n->y.get(), env);
    const Node* t = n->x.get();
    if (t->kind == NK::Getattr) {
      Value obj = eval(t->x.get(), env);
      if (obj.type != Type::Namespace) fail("cannot assign attribute on non-namespace object");
      obj.o->set(t->str, std::move(rhs));
      if (obj.o->depth > kValueDepth) fail("Value nested too deeply");
      return;
    }
    bind(t, rhs, env);
  }

  // ------------------------------------------------------------ expressions

 public:
  Value eval(const Node* n, Env& env) {
    Depth d(this);
    switch (n->kind) {
      case NK::Const: return n->value;
      case NK::Name: { const Value* v = env.lookup(n->str); return v ? *v : Value(); }
      case NK::ListLit: case NK::TupleLit: {
        Array items;
        for (auto& c : n->list) items.push_back(eval(c.get(), env));
        Value v = checked_list(std::move(items), cx_);
        v.tuple = n->kind == NK::TupleLit;
        return v;
      }
      case NK::DictLit: {
        auto obj = std::make_shared<Object>();
        for (size_t i = 0; i + 1 < n->list.size(); i += 2) {
          Value k = eval(n->list[i].get(), env);
          if (k.type != Type::String) fail(std::string("dict keys other than strings are not supported: got ") + type_name(k));
          obj->set(*k.s, eval(n->list[i + 1].get(), env));
        }
        if (obj->depth > kValueDepth) fail("Value nested too deeply");
        return Value::object(std::move(obj));
      }
      case NK::Getattr: return get_attr(eval(n->x.get(), env), n->str);
      case NK::Getitem: {
        Value obj = eval(n->x.get(), env);
        if (n->y->kind == NK::Slice) return slice(obj, n->y.get(), env);
        return get_item(obj, eval(n->y.get(), env));
      }
      case NK::Call: return call_expr(n, env);
      case NK::Binary: return binary(n, env);
      case NK::Compare: return compare(n, env);
      case NK::Unary: return unary(n, env);
      case NK::Filter: return eval_filter(n, env, nullptr);
      case NK::Test: {
        Value v = eval(n->x.get(), env);
        Array args;
        Kwargs kws;
        eval_args(n->list, env, &args, &kws);
        bool r = apply_test(n->str, v, args, cx_);
        return Value::boolean(n->flag ? !r : r);
      }
      case NK::CondExpr:
        if (truthy(eval(n->x.get(), env))) return eval(n->y.get(), env);
        return n->z ? eval(n->z.get(), env) : Value();
      default: break;
    }
    fail("unexpected node in an expression");
  }

 private:
  void eval_args(const std::vector<NodePtr>& args, Env& env, Array* pos, Kwargs* kws) {
    auto add = [&](const std::string& k, Value v) {
      for (auto& [key, x] : *kws) if (key == k) fail("got multiple values for keyword argument '" + k + "'");
      kws->emplace_back(k, std::move(v));
    };
    for (auto& a : args) {
      if (a->kind == NK::Spread) {
        for (auto& x : iterate(eval(a->x.get(), env))) pos->push_back(x);
      } else if (a->kind == NK::KwArg) {
        add(a->str, eval(a->x.get(), env));
      } else if (a->kind == NK::KwSpread) {
        Value v = eval(a->x.get(), env);
        if (v.type != Type::Object) fail(std::string("argument after ** must be a mapping, not ") + type_name(v));
        for (auto& [k, x] : v.o->items) add(k, x);
      } else {
        pos->push_back(eval(a.get(), env));
      }
    }
  }

  // A filter node; `input` replaces the innermost operand (filter blocks, set blocks).
  Value eval_filter(const Node* f, Env& env, const Value* input) {
    Value v;
    if (f->x) v = f->x->kind == NK::Filter ? eval_filter(f->x.get(), env, input) : eval(f->x.get(), env);
    else if (input) v = *input;
    Array args;
    Kwargs kws;
    eval_args(f->list, env, &args, &kws);
    return apply_filter(f->str, v, args, kws, cx_);
  }

  static int64_t slice_arg(const Value& v) {
    if (v.type == Type::Bool) return v.b;
    if (v.type != Type::Int) fail("slice indices must be integers or None");
    if (v.big) return v.num < 0 ? INT64_MIN / 4 : INT64_MAX / 4;
    return v.i;
  }

  Value slice(const Value& obj, const Node* s, Env& env) {
    if (obj.type == Type::Undefined) fail("cannot slice an undefined value");
    Value a = s->x ? eval(s->x.get(), env) : Value::null();
    Value b = s->y ? eval(s->y.get(), env) : Value::null();
    Value c = s->z ? eval(s->z.get(), env) : Value::null();
    auto none = [](const Value& v) { return v.type == Type::Null || v.type == Type::Undefined; };
    int64_t step = none(c) ? 1 : slice_arg(c);
    if (step == 0) fail("slice step cannot be zero");
    std::vector<std::string_view> cps;
    size_t n = 0;
    if (obj.type == Type::String) { cps = code_points(*obj.s); n = cps.size(); }
    else if (obj.type == Type::Array) n = obj.a->items.size();
    else fail(std::string("'") + type_name(obj) + "' object is not subscriptable");
    auto len = int64_t(n);
    auto clamp = [&](const Value& v, bool is_start) -> int64_t {
      if (none(v)) return step > 0 ? (is_start ? 0 : len) : (is_start ? len - 1 : -1);
      int64_t x = slice_arg(v);
      if (x < 0) { x += len; if (x < 0) x = step > 0 ? 0 : -1; }
      else if (x >= len) x = step > 0 ? len : len - 1;
      return x;
    };
    int64_t start = clamp(a, true), stop = clamp(b, false);
    std::string sout;
    Array aout;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.type == Type::String) sout.append(cps[size_t(i)]);
      else aout.push_back(obj.a->items[size_t(i)]);
    }
    if (obj.type == Type::String) return str_value(std::move(sout));
    Value v = checked_list(std::move(aout), cx_);
    v.tuple = obj.tuple;
    return v;
  }

  Value call_expr(const Node* n, Env& env) {
    Value fn = eval(n->x.get(), env);
    Array args;
    Kwargs kws;
    eval_args(n->list, env, &args, &kws);
    if (fn.type == Type::Undefined) fail("'" + (n->x->kind == NK::Name ? n->x->str : std::string("value")) + "' is undefined");
    if (fn.type != Type::Function) fail(std::string("'") + type_name(fn) + "' object is not callable");
    const Function& f = *fn.f;
    switch (f.kind) {
      case Function::Namespace: case Function::Dict: return make_dict(f.kind == Function::Namespace, args, kws);
      case Function::Raise: fail(args.empty() ? std::string() : py_str(args[0]));
      case Function::Range: return range(args);
      case Function::Strftime: return strftime_now(args);
      case Function::Macro: return call_macro(f, args, kws);
      case Function::Method: return call_method(f, args, kws, cx_);
      case Function::LoopCycle: {
        if (args.empty()) fail("no items for cycling given");
        return args[size_t(f.self.i) % args.size()];
      }
    }
    fail("bad function");
  }

  Value make_dict(bool ns, const Array& args, const Kwargs& kws) {
    if (args.size() > 1) fail("expected at most 1 positional argument");
    auto obj = std::make_shared<Object>();
    if (args.size() == 1) {
      const Value& src = args[0];
      if (is_mapping(src)) {
        for (auto& [k, v] : src.o->items) obj->set(k, v);
      } else {
        for (auto& pair : iterate(src)) {
          Array kv = iterate(pair);
          if (kv.size() != 2) fail("dictionary update sequence element has wrong length");
          if (kv[0].type != Type::String) fail("dict keys other than strings are not supported");
          obj->set(*kv[0].s, kv[1]);
        }
      }
    }
    for (auto& [k, v] : kws) obj->set(k, v);
    if (!ns) return Value::object(std::move(obj));
    namespaces_.push_back(obj);
    cx_.check_items(namespaces_.size());
    Value v;
    v.type = Type::Namespace;
    v.o = std::move(obj);
    return v;
  }

  Value range(const Array& args) {
    if (args.empty() || args.size() > 3) fail("range expected 1 to 3 arguments");
    int64_t a[3] = {0, 0, 1};
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].type != Type::Int && args[i].type != Type::Bool) fail(std::string("'") + type_name(args[i]) + "' object cannot be interpreted as an integer");
      if (args[i].big) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    if (args.size() == 1) a[1] = ival(args[0]);
    else { a[0] = ival(args[0]); a[1] = ival(args[1]); if (args.size() == 3) a[2] = ival(args[2]); }
    if (a[2] == 0) fail("range() arg 3 must not be zero");
    __int128 count = a[2] > 0 ? (a[1] > a[0] ? ((__int128)a[1] - a[0] + a[2] - 1) / a[2] : 0)
                              : (a[0] > a[1] ? ((__int128)a[0] - a[1] - a[2] - 1) / -(__int128)a[2] : 0);
    if (count > 100000) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    Array out;
    for (__int128 k = 0; k < count; ++k) out.push_back(Value::integer(int64_t(a[0] + k * a[2])));
    return checked_list(std::move(out), cx_);
  }

  Value strftime_now(const Array& args) {
    if (args.empty() || args[0].type != Type::String) fail("strftime_now expects a format string");
    std::time_t t = opt_.now ? opt_.now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    if (args[0].s->size() > 256) fail("strftime format too long");
    char buf[4096];
    size_t n = std::strftime(buf, sizeof buf, args[0].s->c_str(), &tm);
    if (n == 0 && !args[0].s->empty()) return str_value("");
    return str_value(std::string(buf, n));
  }

  static bool uses_name(const Node* n, const char* name) {
    if (!n) return false;
    if (n->kind == NK::Name && n->str == name) return true;
    for (auto* c : {n->x.get(), n->y.get(), n->z.get()}) if (uses_name(c, name)) return true;
    for (auto* v : {&n->list, &n->body, &n->alt}) for (auto& c : *v) if (uses_name(c.get(), name)) return true;
    return false;
  }

  // Macros resolve free names in the scope they were defined in, as Jinja2's do.
  Value call_macro(const Function& f, const Array& args, Kwargs kws) {
    const Node* m = f.macro;
    auto scope_ptr = std::make_shared<Env>(f.closure);
    Env& scope = *scope_ptr;
    std::vector<std::pair<std::string, const Node*>> pending;
    for (size_t i = 0; i < m->list.size(); ++i) {
      const Node* p = m->list[i].get();
      const std::string& name = p->str;
      Value v;
      bool have = i < args.size();
      if (have) v = args[i];
      for (auto it = kws.begin(); it != kws.end(); ++it) {
        if (it->first != name) continue;
        if (have) fail("macro '" + f.name + "' got multiple values for argument '" + name + "'");
        v = it->second;
        kws.erase(it);
        have = true;
        break;
      }
      if (!have && p->kind == NK::KwArg) pending.emplace_back(name, p->x.get());
      scope.vars[name] = v;
    }
    bool want_kwargs = false, want_varargs = false;
    for (auto& b : m->body) { want_kwargs |= uses_name(b.get(), "kwargs"); want_varargs |= uses_name(b.get(), "varargs"); }
    if (want_kwargs) {
      auto o = std::make_shared<Object>();
      for (auto& [k, v] : kws) o->set(k, v);
      scope.vars["kwargs"] = Value::object(std::move(o));
    } else if (!kws.empty()) {
      fail("macro '" + f.name + "' takes no keyword argument '" + kws.front().first + "'");
    }
    if (want_varargs) {
      Array rest;
      for (size_t i = m->list.size(); i < args.size(); ++i) rest.push_back(args[i]);
      scope.vars["varargs"] = Value::make_tuple(std::move(rest));
    } else if (args.size() > m->list.size()) {
      fail("macro '" + f.name + "' takes not more than " + std::to_string(m->list.size()) + " argument(s)");
    }
    for (auto& [name, def] : pending) scope.vars[name] = eval(def, scope);
    Flow saved = flow_;
    flow_ = Flow::Normal;
    std::string out = render_block(m->body, scope);
    flow_ = saved;
    return str_value(std::move(out));
  }

  Value binary(const Node* n, Env& env) {
    Value l = eval(n->x.get(), env);
    if (n->op == kAnd) return truthy(l) ? eval(n->y.get(), env) : l;
    if (n->op == kOr) return truthy(l) ? l : eval(n->y.get(), env);
    Value r = eval(n->y.get(), env);
    if (n->op == kConcat) {
      std::string a = py_str(l), b = py_str(r);
      check_size(a.size() + b.size());
      return str_value(a + b);
    }
    no_undefined(l, r);
    switch (n->op) {
      case kAdd: return add_values(l, r);
      case kMod: return binary_mod(l, r);
      case kMul:
        if ((l.type == Type::String || l.type == Type::Array) && plain_int(r)) return repeat_seq(l, r, lim_);
        if ((r.type == Type::String || r.type == Type::Array) && plain_int(l)) return repeat_seq(r, l, lim_);
        break;
      default: break;
    }
    if (!is_number(l) || !is_number(r)) {
      static const char* kNames[] = {"and", "or", "+", "-", "*", "/", "//", "%", "** or pow()", "~"};
      type_error(kNames[n->op], l, r);
    }
    bool fl = any_float(l, r);
    switch (n->op) {
      case kSub: return fl ? Value::floating(as_double(l) - as_double(r)) : arith('-', l, r);
      case kMul: return fl ? Value::floating(as_double(l) * as_double(r)) : arith('*', l, r);
      case kDiv: {
        if (as_double(r) == 0) fail("division by zero");
        if (!fl && plain_int(l) && plain_int(r)) return Value::floating(double((long double)ival(l) / (long double)ival(r)));
        return Value::floating(as_double(l) / as_double(r));
      }
      case kFloorDiv:
        return fl ? arith('f', Value::floating(as_double(l)), Value::floating(as_double(r))) : arith('f', l, r);
      case kPow: return power(l, r);
      default: break;
    }
    fail("bad binary operator");
  }

  static Value power(const Value& l, const Value& r) {
    if (plain_int(l) && plain_int(r) && ival(r) >= 0) {
      __int128 base = ival(l), acc = 1;
      int64_t e = ival(r);
      bool overflow = false;
      for (int64_t k = 0; k < e && !overflow; ++k) {
        if (base == 0 || base == 1) { acc = k == 0 ? base : acc; if (base == 0) acc = 0; break; }
        if (base == -1) { acc = (e % 2) ? -1 : 1; break; }
        overflow = __builtin_mul_overflow(acc, base, &acc);
      }
      if (!overflow) return int128_value(acc);
      double d = std::pow(double(ival(l)), double(e));
      if (!std::isfinite(d)) fail("integer result too large");
      char buf[400];
      std::snprintf(buf, sizeof buf, "%.0f", d);
      return Value::big_integer(buf, d);
    }
    double a = as_double(l), b = as_double(r);
    if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
    if (a < 0 && std::floor(b) != b) fail("negative number cannot be raised to a fractional power");
    double res = std::pow(a, b);
    if (std::isinf(res) && std::isfinite(a) && std::isfinite(b)) fail("(34, 'Numerical result out of range')");
    return Value::floating(res);
  }

  static bool contains(const Value& seq, const Value& item) {
    switch (seq.type) {
      case Type::String:
        if (item.type != Type::String) fail(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
        return seq.s->find(*item.s) != std::string::npos;
      case Type::Array:
        for (auto& x : seq.a->items) if (py_equal(x, item)) return true;
        return false;
      case Type::Object:
        if (item.type == Type::Array && !item.tuple) fail("unhashable type: 'list'");
        if (item.type == Type::Object) fail("unhashable type: 'dict'");
        return item.type == Type::String && seq.o->get(*item.s);
      case Type::Undefined: return false;
      default: fail(std::string("argument of type '") + type_name(seq) + "' is not iterable");
    }
  }

  Value compare(const Node* n, Env& env) {
    Value left = eval(n->x.get(), env);
    for (size_t i = 0; i < n->ops.size(); ++i) {
      Value right = eval(n->list[i].get(), env);
      bool ok;
      switch (n->ops[i]) {
        case kEq: ok = py_equal(left, right); break;
        case kNe: ok = !py_equal(left, right); break;
        case kIn: ok = contains(right, left); break;
        case kNotIn: ok = !contains(right, left); break;
        default: {
          no_undefined(left, right);
          int c = py_compare(left, right);
          uint8_t op = n->ops[i];
          ok = c != 2 && (op == kLt ? c < 0 : op == kLe ? c <= 0 : op == kGt ? c > 0 : c >= 0);
        }
      }
      if (!ok) return Value::boolean(false);
      left = std::move(right);
    }
    return Value::boolean(true);
  }

  Value unary(const Node* n, Env& env) {
    Value v = eval(n->x.get(), env);
    if (n->str == "not") return Value::boolean(!truthy(v));
    if (v.type == Type::Undefined) fail("an undefined value was used in an operation");
    if (!is_number(v)) fail(std::string("bad operand type for unary ") + n->str + ": '" + type_name(v) + "'");
    if (n->str == "+") return v.type == Type::Bool ? Value::integer(v.b) : v;
    if (v.type == Type::Float) return Value::floating(-v.num);
    if (v.big) return Value::big_integer(v.s->front() == '-' ? v.s->substr(1) : "-" + *v.s, -v.num);
    return int128_value(-(__int128)ival(v));
  }
};

void setup_globals(Env& env) {
  env.vars["namespace"] = make_function(Function::Namespace, "namespace");
  env.vars["dict"] = make_function(Function::Dict, "dict");
  env.vars["range"] = make_function(Function::Range, "range");
  env.vars["raise_exception"] = make_function(Function::Raise, "raise_exception");
  env.vars["strftime_now"] = make_function(Function::Strftime, "strftime_now");
}

}  // namespace

Template::Template(std::unique_ptr<Node> root) : root_(std::move(root)) {}
Template::~Template() = default;

std::unique_ptr<Template> Template::parse(std::string_view source, std::string* error, const Limits& limits) {
  if (!valid_utf8(source)) { *error = "template is not valid UTF-8"; return nullptr; }
  try {
    NodePtr root = parse_template(tokenize(source), limits.max_depth);
    return std::unique_ptr<Template>(new Template(std::move(root)));
  } catch (const JinjaError& e) {
    *error = std::string("template syntax error: ") + e.what();
  } catch (const std::bad_alloc&) {
    *error = "template syntax error: out of memory";
  }
  return nullptr;
}

bool Template::iterates_message_content() const { return detect_openai_content(root_.get()); }

bool Template::render(const Value& context, std::string* out, std::string* error, const RenderOptions& options) const {
  if (context.type != Type::Object) { *error = "context must be an object"; return false; }
  try {
    auto globals = std::make_shared<Env>();
    setup_globals(*globals);
    auto top = std::make_shared<Env>(globals);
    for (auto& [k, v] : context.o->items) top->vars[k] = v;
    Interp in(options);
    *out = in.render_block(root_->body, *top);
    return true;
  } catch (const JinjaError& e) {
    *error = e.what();
  } catch (const std::bad_alloc&) {
    *error = "out of memory";
  } catch (const std::exception& e) {
    *error = e.what();
  }
  return false;
}

bool Template::render_json(std::string_view context_json, std::string* out, std::string* error,
                           const RenderOptions& options) const {
  Value ctx;
  if (!value_from_json(context_json, &ctx, error)) return false;
  return render(ctx, out, error, options);
}

}  // namespace kvroute::jinja
