// Jinja2's builtin tests (`x is defined`, `x is divisibleby 3`, ...) and their operator
// aliases (`==`, `<`, ...).
#include "tokenizer/jinja_internal.h"
#include "tokenizer/utf8.h"

namespace kvroute::jinja {

// ---------------------------------------------------------------- tests

static const char* const kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
    "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt",
    "lessthan", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test",
    "true", "undefined", "upper"};

bool test_exists(const std::string& name) {
  for (auto* t : kTests) if (name == t) return true;
  return false;
}


bool apply_test(const std::string& t, const Value& v, const Array& args, const CallContext& cx) {
  auto arg = [&](size_t i) -> const Value& {
    if (i >= args.size()) fail("test '" + t + "' is missing an argument");
    return args[i];
  };
  if (t == "defined") return v.type != Type::Undefined;
  if (t == "undefined") return v.type == Type::Undefined;
  if (t == "none") return v.type == Type::Null;
  if (t == "boolean") return v.type == Type::Bool;
  if (t == "true") return v.type == Type::Bool && v.b;
  if (t == "false") return v.type == Type::Bool && !v.b;
  if (t == "integer") return v.type == Type::Int;
  if (t == "float") return v.type == Type::Float;
  if (t == "number") return is_number(v);
  if (t == "string") return v.type == Type::String;
  if (t == "mapping") return v.type == Type::Object;
  if (t == "iterable") return v.type == Type::String || v.type == Type::Array || v.type == Type::Object || v.type == Type::Undefined;
  if (t == "sequence") return v.type == Type::String || v.type == Type::Array || v.type == Type::Object || v.type == Type::Undefined;
  if (t == "callable") return v.type == Type::Function || v.type == Type::Undefined;
  if (t == "escaped") return false;
  if (t == "lower" || t == "upper") {
    std::string s = soft_str(v);
    bool cased = false;
    for (size_t i = 0, n; i < s.size(); i += n) {
      char32_t c = decode(s, i, &n);
      if (t == "lower" ? is_cased_upper(c) : is_cased_lower(c)) return false;
      if (is_cased(c)) cased = true;
    }
    return cased;
  }
  if (t == "odd" || t == "even") {
    Value r = binary_mod(v, Value::integer(2));
    bool odd = truthy(r);
    return t == "odd" ? odd : !odd;
  }
  if (t == "divisibleby") return !truthy(binary_mod(v, arg(0)));
  if (t == "eq" || t == "equalto" || t == "==") return py_equal(v, arg(0));
  if (t == "ne" || t == "!=") return !py_equal(v, arg(0));
  if (t == "lt" || t == "lessthan" || t == "<") return py_compare(v, arg(0)) == -1;
  if (t == "le" || t == "<=") { int c = py_compare(v, arg(0)); return c == -1 || c == 0; }
  if (t == "gt" || t == "greaterthan" || t == ">") return py_compare(v, arg(0)) == 1;
  if (t == "ge" || t == ">=") { int c = py_compare(v, arg(0)); return c == 1 || c == 0; }
  if (t == "in") {
    const Value& seq = arg(0);
    if (seq.type == Type::String) {
      if (v.type != Type::String) fail("'in <string>' requires string as left operand, not " + std::string(type_name(v)));
      return seq.s->find(*v.s) != std::string::npos;
    }
    if (seq.type == Type::Object) return v.type == Type::String && seq.o->get(*v.s);
    for (auto& x : iterate(seq)) if (py_equal(x, v)) return true;
    return false;
  }
  if (t == "sameas") {
    const Value& o = arg(0);
    if (v.type != o.type) return false;
    switch (v.type) {
      case Type::Undefined: case Type::Null: return true;
      case Type::Bool: return v.b == o.b;
      case Type::Int: return !v.big && !o.big && v.i == o.i && v.i >= -5 && v.i <= 256;
      case Type::String: return v.s == o.s;
      case Type::Array: return v.a == o.a;
      case Type::Object: case Type::Namespace: return v.o == o.o;
      case Type::Function: return v.f == o.f;
      default: return false;
    }
  }
  if (t == "filter") return v.type == Type::String && filter_exists(*v.s);
  if (t == "test") return v.type == Type::String && test_exists(*v.s);
  (void)cx;
  fail("No test named '" + t + "'.");
}

}  // namespace kvroute::jinja
