// A Jinja interpreter for Hugging Face chat templates with Python Jinja2's semantics, as
// vLLM and SGLang render them through transformers' apply_chat_template: an immutable
// sandboxed environment with trim_blocks, lstrip_blocks and the loopcontrols extension,
// `tojson` as transformers defines it (json.dumps, ensure_ascii=False), and Python values
// (int, float, str, list, tuple, dict ordered as inserted, None, Undefined).
// See tokenizer/README.md "Chat templates" for the supported subset and every known
// difference from Jinja2.
//
// Layout: jinja_lexer.cpp (source -> tokens, whitespace control), jinja_parser.cpp
// (tokens -> AST), jinja_values.cpp (Value, printing, equality, JSON in and out),
// jinja_filters.cpp (filters), jinja_tests.cpp (tests), jinja_str_methods.cpp
// (str/dict/list methods), jinja_format.cpp (str % args), jinja_interp.cpp
// (evaluation, statements, Template); jinja_internal.h is what they share.
//
// Untrusted input: templates and contexts may be anything. parse() and render() return
// an error string instead of throwing or aborting; recursion depth, the number of
// evaluation steps, container sizes and output size are bounded (Limits).
//
// Thread-safety: a Template is immutable after parse(); render() may be called
// concurrently from any thread (each call has its own scopes and values).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvroute::jinja {

struct Value;
struct Object;
struct Function;
using Array = std::vector<Value>;

// Runtime types. Int is a Python int: exact in 64 bits; a JSON integer beyond 64 bits
// keeps its decimal digits (printed exactly) and computes as a double. Float is a double.
// Array is a list, or a tuple when `tuple` is set. Object is a dict with string keys in
// insertion order; Namespace is the mutable object namespace() returns.
enum class Type : uint8_t { Undefined, Null, Bool, Int, Float, String, Array, Object, Namespace, Function };

struct ArrayBox {
  Array items;
  uint32_t depth = 1;  // nesting depth, bounded when built (keeps recursion and destruction bounded)
};

// A Python-like value. Strings are immutable and shared; lists and dicts are shared by
// reference. Only namespaces are mutated, and only during the render that created them.
struct Value {
  Type type = Type::Undefined;
  bool kwargs = false;  // an Object that carries keyword arguments to a call
  bool tuple = false;   // an Array that is a Python tuple
  uint8_t view = 0;     // an Array returned by dict.items() (1), .keys() (2), .values() (3): printed as the view
  bool b = false;
  bool big = false;     // Int beyond 64 bits: `s` holds its decimal digits, `num` its value
  int64_t i = 0;        // Int
  double num = 0;       // Float; for Int the same value as a double
  std::shared_ptr<const std::string> s;
  std::shared_ptr<ArrayBox> a;
  std::shared_ptr<Object> o;
  std::shared_ptr<const Function> f;

  static Value undefined() { return Value(); }
  static Value null() { Value v; v.type = Type::Null; return v; }
  static Value boolean(bool x) { Value v; v.type = Type::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.type = Type::Int; v.i = x; v.num = double(x); return v; }
  static Value big_integer(std::string digits, double approx);
  static Value floating(double x) { Value v; v.type = Type::Float; v.num = x; return v; }
  static Value string(std::string x);
  static Value array(Array items);    // depth computed from children
  static Value make_tuple(Array items) { Value v = array(std::move(items)); v.tuple = true; return v; }
  static Value object(std::shared_ptr<Object> obj);
  static Value new_object();

  bool is_string() const { return type == Type::String; }
  const std::string& str() const { return *s; }
  const Array& arr() const { return a->items; }
};

// Insertion-ordered string-keyed map (a Python dict with string keys). Small maps are
// searched linearly; a hash index is built once a map grows past kIndexFrom entries.
struct Object {
  static constexpr size_t kIndexFrom = 12;
  std::vector<std::pair<std::string, Value>> items;
  std::unordered_map<std::string, size_t> index;
  uint32_t depth = 1;

  const Value* get(const std::string& key) const {
    if (index.empty()) {
      for (auto& [k, v] : items) if (k == key) return &v;
      return nullptr;
    }
    auto it = index.find(key);
    return it == index.end() ? nullptr : &items[it->second].second;
  }
  void set(const std::string& key, Value v);
  size_t size() const { return items.size(); }
};

struct Limits {
  size_t max_output_bytes = 16u << 20;  // rendered text and any intermediate string
  uint32_t max_depth = 200;             // template nesting, evaluation and value recursion
  uint64_t max_steps = 20'000'000;      // evaluated nodes per render (bounds loops)
  size_t max_items = 1u << 20;          // elements of one list built by the template (range, +, *)
};

struct RenderOptions {
  Limits limits;
  // Time for strftime_now() (local time); 0 = the current time.
  std::time_t now = 0;
};

struct Node;

class Template {
 public:
  // Parses with trim_blocks and lstrip_blocks, as transformers does.
  // Returns nullptr and sets *error on a malformed template.
  static std::unique_ptr<Template> parse(std::string_view source, std::string* error,
                                         const Limits& limits = {});
  ~Template();

  // context: an Object value whose entries become template variables.
  bool render(const Value& context, std::string* out, std::string* error,
              const RenderOptions& options = {}) const;
  // context_json: a JSON object (text).
  bool render_json(std::string_view context_json, std::string* out, std::string* error,
                   const RenderOptions& options = {}) const;

  // vLLM's content-format detection: true ("openai") when the template loops over a
  // message's content (`for x in message['content']`, message from a loop over
  // `messages` or a variable set from it), false ("string") otherwise.
  bool iterates_message_content() const;

 private:
  explicit Template(std::unique_ptr<Node> root);
  std::unique_ptr<Node> root_;
};

// JSON text -> Value as Python's json.loads reads it: integers exact (beyond 64 bits as
// digits), other numbers as doubles (1e400 -> inf), objects in document order with a
// duplicate key keeping its first position and its last value.
bool value_from_json(std::string_view json, Value* out, std::string* error, uint32_t max_depth = 128);

// json.dumps(v, ensure_ascii=False) of a value (the `tojson` filter without arguments).
std::string to_json(const Value& v);

}  // namespace kvroute::jinja
