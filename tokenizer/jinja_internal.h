// Shared internals of the Jinja interpreter (tokenizer/jinja_*.cpp); not a public API.
// Errors inside are thrown as JinjaError and caught at the public boundary (Template,
// value_from_json). Thread-safety: free functions only; t_max_bytes is per thread.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja.h"

namespace kvroute::jinja {

// ---------------------------------------------------------------- errors and limits
struct JinjaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void fail(const std::string& msg) { throw JinjaError(msg); }

// Largest string any builder may produce during the current render on this thread
// (Limits::max_output_bytes); checked while building, before memory is spent.
extern thread_local size_t t_max_bytes;
inline void check_built(size_t n) { if (n > t_max_bytes) fail("Output too large"); }
constexpr uint32_t kValueDepth = 512;

// ---------------------------------------------------------------- text (jinja_lexer.cpp)
// One code point at s[i]; *len its byte length (a stray byte decodes as itself, length 1).
char32_t decode(std::string_view s, size_t i, size_t* len);
bool valid_utf8(std::string_view s);
std::vector<std::string_view> code_points(std::string_view s);
size_t cp_count(std::string_view s);
bool py_space(char32_t c);  // Python str.isspace()
std::string_view py_strip(std::string_view s, bool left, bool right);
// Strips any code point of `chars` (Python str.strip(chars)).
std::string_view py_strip_chars(std::string_view s, std::string_view chars, bool left, bool right);
char32_t to_upper_cp(char32_t c);
char32_t to_lower_cp(char32_t c);
bool is_cased_upper(char32_t c);
bool is_cased_lower(char32_t c);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
bool is_digit(char c);
bool is_word_start(char c);
bool is_word(char c);

// ---------------------------------------------------------------- lexer
enum class TT : uint8_t {
  Text, Int, Float, Str, Name, Op, BlockBegin, BlockEnd, VarBegin, VarEnd, Raw, End
};
struct Token {
  TT type;
  std::string value;
  uint32_t line = 1;
};
// Jinja2's lexer with trim_blocks + lstrip_blocks, newlines normalized to "\n", one
// trailing newline dropped; comments and `{% raw %}` handled here.
std::vector<Token> tokenize(std::string_view source);

// ---------------------------------------------------------------- AST (jinja_parser.cpp)
enum class NK : uint8_t {
  Program, Text, Const, Name, ListLit, TupleLit, DictLit, Getattr, Getitem, Slice, Call, KwArg, Spread,
  KwSpread, Binary, Compare, Unary, Filter, Test, CondExpr, Output, If, For, Set, SetBlock, Macro, CallBlock,
  Break, Continue, FilterBlock, Generation
};

enum BinOp : uint8_t { kAnd, kOr, kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat };
enum CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

// One node type for statements and expressions. Field use per kind:
//   Text: str | Const: value | Name: str | ListLit/TupleLit: list | DictLit: list (k0,v0,k1,v1..)
//   Getattr: x object, str name | Getitem: x object, y index (or Slice: x start, y stop, z step)
//   Call: x callee, list args | KwArg: str key, x value | Spread/KwSpread: x
//   Binary: op, x, y | Compare: x first, list operands, ops | Unary: str op ("-","+","not"), x
//   Filter: x operand (nullptr in a filter block), str name, list args | Test: x, str name, list args, flag negate
//   CondExpr: x cond, y then, z else (nullable) | Output: list of expressions/text
//   If: x test, body, alt | For: x target, y iterable, z condition, body, alt, flag recursive
//   Set: x target, y value | SetBlock: x target, body, y filter (nullable) | Macro: str name, list params, body
//   FilterBlock: y filter chain (Filter nodes with x = nullptr), body | Generation: body
struct Node {
  NK kind;
  uint8_t op = 0;
  bool flag = false;
  uint32_t depth = 1;
  std::string str;
  Value value;  // Const
  std::vector<uint8_t> ops;  // Compare
  std::unique_ptr<Node> x, y, z;
  std::vector<std::unique_ptr<Node>> list, body, alt;
  explicit Node(NK k) : kind(k) {}
};
using NodePtr = std::unique_ptr<Node>;

NodePtr parse_template(std::vector<Token> tokens, uint32_t max_depth);
bool detect_openai_content(const Node* root);

// ---------------------------------------------------------------- values (jinja_values.cpp)
struct Env;  // a scope (jinja_interp.cpp)
struct Function {
  enum Kind : uint8_t { Namespace, Raise, Range, Strftime, Dict, Macro, Method, LoopCycle } kind;
  std::string name;
  const Node* macro = nullptr;
  Value self;
  std::shared_ptr<Env> closure;  // Macro: the scope it was defined in (its free names resolve there)
};
Value make_function(Function::Kind k, std::string name, Value self = {}, const Node* macro = nullptr);

const char* type_name(const Value& v);  // Python's type name, for error messages
bool is_number(const Value& v);         // int, float or bool (Python numbers)
bool is_mapping(const Value& v);        // dict or namespace
bool truthy(const Value& v);
double as_double(const Value& v);       // a number (bool, int, float) as a double
std::string float_repr(double x);       // Python repr(float)
std::string int_str(const Value& v);
std::string py_str(const Value& v);     // Python str(); Undefined -> ""
std::string py_repr(const Value& v);
bool py_equal(const Value& a, const Value& b);
int py_compare(const Value& a, const Value& b);  // TypeError between unorderable types
Value str_value(std::string s);

struct JsonOptions {
  bool indent_set = false;
  std::string indent;  // the indent unit (json.dumps indent=int -> spaces, str -> itself)
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_sep, key_sep;
};
std::string json_dumps(const Value& v, const JsonOptions& o);

// Environment.getattr / getitem of the sandbox: `obj.name` tries methods first, then
// keys; `obj[key]` keys first, then methods. Missing -> Undefined.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);

// ---------------------------------------------------------------- builtins: filters (jinja_filters.cpp),
// tests (jinja_tests.cpp), methods (jinja_str_methods.cpp), str % args (jinja_format.cpp)
using Kwargs = std::vector<std::pair<std::string, Value>>;
struct CallContext {
  const Limits* limits;
  std::time_t now;
  void check_items(size_t n) const { if (n > limits->max_items) fail("Too many items"); }
};
Value apply_filter(const std::string& name, const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx);
bool apply_test(const std::string& name, const Value& v, const Array& args, const CallContext& cx);
bool filter_exists(const std::string& name);
bool test_exists(const std::string& name);
// A bound method of a str, list or dict (Function::Method, self = the receiver).
Value call_method(const Function& f, const Array& args, const Kwargs& kws, const CallContext& cx);
bool has_method(const Value& self, const std::string& name);
Value py_format(const std::string& fmt, const Value& args);  // str % args
std::vector<Value> iterate(const Value& v);  // list(v): str -> chars, dict -> keys; TypeError otherwise
Value checked_list(Array items, const CallContext& cx);

// ---------------------------------------------------------------- builtins' shared helpers
// What the filters, tests, str/dict/list methods and `str % args` share: argument
// binding and numbers (jinja_filters.cpp), Python str helpers (jinja_str_methods.cpp).
// Binds positional and keyword arguments to named parameters (Python call semantics).
struct Params {
  std::vector<Value> v;
  std::vector<bool> given;
  Params(const char* fn, std::initializer_list<const char*> names, const Array& args, const Kwargs& kws,
         std::initializer_list<Value> defaults = {}) {
    std::vector<const char*> n(names);
    v.assign(n.size(), Value());
    given.assign(n.size(), false);
    size_t k = 0;
    for (auto& d : defaults) { if (k < v.size()) v[k] = d; ++k; }
    if (args.size() > n.size()) fail(std::string(fn) + "() takes at most " + std::to_string(n.size()) + " arguments");
    for (size_t i = 0; i < args.size(); ++i) { v[i] = args[i]; given[i] = true; }
    for (auto& [key, val] : kws) {
      size_t i = 0;
      while (i < n.size() && key != n[i]) ++i;
      if (i == n.size()) fail(std::string(fn) + "() got an unexpected keyword argument '" + key + "'");
      if (given[i]) fail(std::string(fn) + "() got multiple values for argument '" + key + "'");
      v[i] = val;
      given[i] = true;
    }
  }
  const Value& operator[](size_t i) const { return v[i]; }
};
std::string soft_str(const Value& v);  // str() of an operand or argument
int64_t need_int(const Value& v, const char* what);  // an int (or bool), else TypeError
const std::string& need_str(const Value& v, const char* what);
Value int_of_double(double d);  // Python int(float): truncates; inf and nan fail
void no_args(const char* name, const Array& args, const Kwargs& kws);
Value filter_items(const Value& v, const CallContext& cx);  // the `items` filter and dict.items()
bool is_cased(char32_t c);
void append_lower(std::string& r, char32_t c);  // Python lower() of one code point
std::string py_capitalize(std::string_view s);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
std::vector<std::string> py_splitlines(const std::string& s);
std::string repeat(const std::string& s, int64_t n);  // s * n, checked against the output limit
std::string center(const std::string& s, int64_t width, const std::string& fill = " ");

// ---------------------------------------------------------------- operators (jinja_interp.cpp)
Value add_values(const Value& a, const Value& b);  // a + b
Value binary_mod(const Value& a, const Value& b);  // a % b (str % args formats)

}  // namespace kvroute::jinja
