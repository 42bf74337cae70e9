// A Jinja subset interpreter for Hugging Face chat templates, written to render
// byte-for-byte what the npm package `@huggingface/jinja` (0.5.x, the engine of
// transformers.js) renders, including its quirks (value printing, `tojson`
// separators, JS string semantics). See tokenizer/README.md "Chat templates" for
// the supported subset.
//
// Untrusted input: templates and contexts may be anything. parse() and render()
// return an error string instead of throwing or aborting; recursion depth, the
// number of evaluation steps, container sizes and output size are bounded (Limits).
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

// Runtime types, as @huggingface/jinja has them. Int and Float both hold a
// double (JS numbers): integers above 2^53 lose precision exactly as in JS.
enum class Type : uint8_t { Undefined, Null, Bool, Int, Float, String, Array, Object, Namespace, Function };

struct ArrayBox {
  Array items;
  uint32_t depth = 1;  // nesting depth, bounded when built (keeps recursion and destruction bounded)
};

// A JSON-like value. Strings are immutable and shared; arrays and objects are
// shared by reference (identity matters for `==`, as in JS). Only namespaces
// are mutated, and only during the render that created them.
struct Value {
  Type type = Type::Undefined;
  bool kwargs = false;  // an Object that carries keyword arguments to a call
  bool tuple = false;   // an Array built by a tuple literal (upstream cannot print it as JSON)
  bool b = false;
  double num = 0;
  std::shared_ptr<const std::string> s;
  std::shared_ptr<ArrayBox> a;
  std::shared_ptr<Object> o;
  std::shared_ptr<const Function> f;

  static Value undefined() { return Value(); }
  static Value null() { Value v; v.type = Type::Null; return v; }
  static Value boolean(bool x) { Value v; v.type = Type::Bool; v.b = x; return v; }
  static Value integer(double x) { Value v; v.type = Type::Int; v.num = x; return v; }
  static Value floating(double x) { Value v; v.type = Type::Float; v.num = x; return v; }
  static Value string(std::string x);
  static Value array(Array items);    // throws nothing; depth computed from children
  static Value object(std::shared_ptr<Object> obj);
  static Value new_object();

  bool is_string() const { return type == Type::String; }
  const std::string& str() const { return *s; }
  const Array& arr() const { return a->items; }
};

// Insertion-ordered string-keyed map (JS Map). Small maps are searched linearly; a
// hash index is built once a map grows past kIndexFrom entries.
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
  size_t max_items = 1u << 20;          // elements of one array built by the template (range, +)
};

struct RenderOptions {
  Limits limits;
  // Time for strftime_now() (local time); 0 = the current time.
  std::time_t now = 0;
};

struct Node;

class Template {
 public:
  // Parses with trim_blocks and lstrip_blocks, as transformers / transformers.js do.
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

 private:
  explicit Template(std::unique_ptr<Node> root);
  std::unique_ptr<Node> root_;
};

// JSON text -> Value the way JSON.parse + @huggingface/jinja convert it: integral
// numbers become Int, object keys that are array indices come first in ascending
// order (JS property order), duplicate keys keep the first position and the last value.
bool value_from_json(std::string_view json, Value* out, std::string* error, uint32_t max_depth = 128);

// JSON text of a value with Python json.dumps default separators (", " and ": "),
// as the `tojson` filter prints it.
std::string to_json(const Value& v);

}  // namespace kvroute::jinja
