// Jinja values with Python semantics: construction, truthiness, str() and repr(),
// equality and ordering, json.dumps (the `tojson` filter) and json.loads (contexts).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <new>

#include <simdjson.h>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/utf8.h"

namespace kvroute::jinja {

// ---------------------------------------------------------------- construction

Value Value::string(std::string x) {
  Value v;
  v.type = Type::String;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}
Value Value::big_integer(std::string digits, double approx) {
  Value v;
  v.type = Type::Int;
  v.big = true;
  v.num = approx;
  v.i = approx < 0 ? INT64_MIN : INT64_MAX;
  v.s = std::make_shared<const std::string>(std::move(digits));
  return v;
}
static uint32_t depth_of(const Value& v) {
  if (v.type == Type::Array && v.a) return v.a->depth;
  if ((v.type == Type::Object || v.type == Type::Namespace) && v.o) return v.o->depth;
  return 0;
}
Value Value::array(Array items) {
  Value v;
  v.type = Type::Array;
  v.a = std::make_shared<ArrayBox>();
  uint32_t d = 0;
  for (auto& x : items) d = std::max(d, depth_of(x));
  v.a->depth = d + 1;
  v.a->items = std::move(items);
  return v;
}
Value Value::object(std::shared_ptr<Object> obj) {
  Value v;
  v.type = Type::Object;
  v.o = std::move(obj);
  return v;
}
Value Value::new_object() { return object(std::make_shared<Object>()); }

void Object::set(const std::string& key, Value v) {
  depth = std::max(depth, depth_of(v) + 1);
  if (index.empty()) {
    for (auto& [k, x] : items) if (k == key) { x = std::move(v); return; }
    items.emplace_back(key, std::move(v));
    if (items.size() >= kIndexFrom) for (size_t i = 0; i < items.size(); ++i) index.emplace(items[i].first, i);
    return;
  }
  auto it = index.find(key);
  if (it != index.end()) { items[it->second].second = std::move(v); return; }
  index.emplace(key, items.size());
  items.emplace_back(key, std::move(v));
}

Value str_value(std::string s) {
  static const std::shared_ptr<const std::string> kEmpty = std::make_shared<const std::string>();
  check_built(s.size());
  if (!s.empty()) return Value::string(std::move(s));
  Value v;
  v.type = Type::String;
  v.s = kEmpty;
  return v;
}

Value make_function(Function::Kind k, std::string name, Value self, const Node* macro) {
  auto f = std::make_shared<Function>();
  f->kind = k;
  f->name = std::move(name);
  f->self = std::move(self);
  f->macro = macro;
  Value v;
  v.type = Type::Function;
  v.f = std::move(f);
  return v;
}

// ---------------------------------------------------------------- type predicates

const char* type_name(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "Undefined";
    case Type::Null: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::Array: return v.tuple ? "tuple" : "list";
    case Type::Object: return "dict";
    case Type::Namespace: return "Namespace";
    case Type::Function: return "function";
  }
  return "?";
}

bool is_number(const Value& v) { return v.type == Type::Int || v.type == Type::Float || v.type == Type::Bool; }
bool is_mapping(const Value& v) { return v.type == Type::Object || v.type == Type::Namespace; }

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::Undefined: case Type::Null: return false;
    case Type::Bool: return v.b;
    case Type::Int: return v.big || v.i != 0;
    case Type::Float: return v.num != 0;
    case Type::String: return !v.s->empty();
    case Type::Array: return !v.a->items.empty();
    case Type::Object: return v.o->size() > 0;
    case Type::Namespace: case Type::Function: return true;
  }
  return false;
}

double as_double(const Value& v) {
  if (v.type == Type::Bool) return v.b ? 1 : 0;
  return v.num;
}

// ---------------------------------------------------------------- printing

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(x), std::chars_format::scientific);
  std::string_view m(buf, size_t(r.ptr - buf));
  size_t e = m.find('e');
  std::string digits;
  for (char c : m.substr(0, e)) if (c != '.') digits += c;
  int exp = std::atoi(std::string(m.substr(e + 1)).c_str());
  int decpt = exp + 1;  // digits d1d2... times 10^(decpt - ndigits)
  std::string out = x < 0 ? "-" : "";
  int nd = int(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(size_t(-decpt), '0') + digits;
    } else if (decpt >= nd) {
      out += digits + std::string(size_t(decpt - nd), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (nd > 1) out += "." + digits.substr(1);
  int pe = decpt - 1;
  out += pe < 0 ? "e-" : "e+";
  if (std::abs(pe) < 10) out += '0';
  out += std::to_string(std::abs(pe));
  return out;
}

std::string int_str(const Value& v) { return v.big ? *v.s : std::to_string(v.i); }

namespace {

bool printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c < 0x300) return true;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064) ||
      (c >= 0x2066 && c <= 0x206F) || c == 0x3000 || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) ||
      (c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E ||
      (c >= 0xD800 && c <= 0xF8FF) || c >= 0xF0000 || c == 0xFFFE || c == 0xFFFF || (c >= 0xE0000 && c <= 0xE0FFF))
    return false;
  return true;
}

void hex_escape(std::string& out, char32_t c) {
  char buf[16];
  if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
  else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
  else std::snprintf(buf, sizeof buf, "\\U%08x", unsigned(c));
  out += buf;
}

std::string str_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos, has_double = s.find('"') != std::string_view::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0, n; i < s.size(); i += n) {
    char32_t c = decode(s, i, &n);
    if (c == char32_t(q) || c == '\\') { out += '\\'; out += char(c); }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (!printable(c)) hex_escape(out, c);
    else out.append(s.substr(i, n));
    check_built(out.size());
  }
  out += q;
  return out;
}

void repr_into(const Value& v, std::string& out, uint32_t depth);

void container_repr(const Value& v, std::string& out, uint32_t depth) {
  if (depth > kValueDepth) fail("Value nested too deeply");
  if (v.type == Type::Array) {
    static const char* kViews[] = {"", "dict_items(", "dict_keys(", "dict_values("};
    if (v.view) out += kViews[v.view % 4];
    out += v.tuple ? '(' : '[';
    const auto& items = v.a->items;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ", ";
      repr_into(items[i], out, depth + 1);
      check_built(out.size());
    }
    if (v.tuple && items.size() == 1) out += ',';
    out += v.tuple ? ')' : ']';
    if (v.view) out += ')';
    return;
  }
  out += '{';
  bool first = true;
  for (auto& [k, x] : v.o->items) {
    if (!first) out += ", ";
    first = false;
    out += str_repr(k);
    out += ": ";
    repr_into(x, out, depth + 1);
    check_built(out.size());
  }
  out += '}';
}

void repr_into(const Value& v, std::string& out, uint32_t depth) {
  switch (v.type) {
    case Type::String: out += str_repr(*v.s); return;
    case Type::Undefined: out += "Undefined"; return;
    case Type::Array: case Type::Object: container_repr(v, out, depth); return;
    case Type::Namespace: out += "<Namespace "; container_repr(Value::object(v.o), out, depth); out += '>'; return;
    default: out += py_str(v);
  }
}

}  // namespace

std::string py_str(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "";
    case Type::Null: return "None";
    case Type::Bool: return v.b ? "True" : "False";
    case Type::Int: return int_str(v);
    case Type::Float: return float_repr(v.num);
    case Type::String: return *v.s;
    case Type::Function: return v.f->kind == Function::Macro ? "<Macro '" + v.f->name + "'>" : "<function " + v.f->name + ">";
    default: { std::string out; repr_into(v, out, 0); return out; }
  }
}

std::string py_repr(const Value& v) {
  std::string out;
  repr_into(v, out, 0);
  return out;
}

// ---------------------------------------------------------------- equality and ordering

namespace {
// Exact comparison of an int with a double, as Python does it (-1, 0, 1; NaN -> 2).
int cmp_int_double(const Value& a, double d) {
  if (std::isnan(d)) return 2;
  if (a.big) return a.num < d ? -1 : a.num > d ? 1 : 0;
  if (d >= 9.3e18) return -1;
  if (d <= -9.3e18) return 1;
  double fl = std::floor(d);
  auto di = int64_t(fl);
  if (a.i < di) return -1;
  if (a.i > di) return 1;
  return fl == d ? 0 : -1;
}
int cmp_numbers(const Value& a, const Value& b) {
  Value x = a.type == Type::Bool ? Value::integer(a.b) : a, y = b.type == Type::Bool ? Value::integer(b.b) : b;
  if (x.type == Type::Int && y.type == Type::Int) {
    if (!x.big && !y.big) return x.i < y.i ? -1 : x.i > y.i ? 1 : 0;
    if (x.big && y.big && *x.s == *y.s) return 0;
    return x.num < y.num ? -1 : x.num > y.num ? 1 : (x.big != y.big ? (x.big ? (x.num < 0 ? -1 : 1) : (y.num < 0 ? 1 : -1)) : 0);
  }
  if (x.type == Type::Int) return cmp_int_double(x, y.num);
  if (y.type == Type::Int) { int r = cmp_int_double(y, x.num); return r == 2 ? 2 : -r; }
  if (std::isnan(x.num) || std::isnan(y.num)) return 2;
  return x.num < y.num ? -1 : x.num > y.num ? 1 : 0;
}
}  // namespace

bool py_equal(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) return cmp_numbers(a, b) == 0;
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::Undefined: case Type::Null: return true;
    case Type::String: return *a.s == *b.s;
    case Type::Array: {
      if (a.tuple != b.tuple || a.a->items.size() != b.a->items.size()) return false;
      if (a.a == b.a) return true;
      for (size_t i = 0; i < a.a->items.size(); ++i) if (!py_equal(a.a->items[i], b.a->items[i])) return false;
      return true;
    }
    case Type::Object: {
      if (a.o->size() != b.o->size()) return false;
      if (a.o == b.o) return true;
      for (auto& [k, v] : a.o->items) {
        const Value* w = b.o->get(k);
        if (!w || !py_equal(v, *w)) return false;
      }
      return true;
    }
    case Type::Namespace: return a.o == b.o;
    case Type::Function: return a.f == b.f;
    default: return false;
  }
}

int py_compare(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) {
    int r = cmp_numbers(a, b);
    return r == 2 ? 2 : r;
  }
  if (a.type == Type::String && b.type == Type::String) { int r = a.s->compare(*b.s); return r < 0 ? -1 : r > 0 ? 1 : 0; }
  if (a.type == Type::Array && b.type == Type::Array && a.tuple == b.tuple) {
    const auto &x = a.a->items, &y = b.a->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail(std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'");
}

// ---------------------------------------------------------------- json.dumps

namespace {

void hex4(std::string& out, unsigned v) {
  static const char* k = "0123456789abcdef";
  out += "\\u";
  for (int sh = 12; sh >= 0; sh -= 4) out += k[(v >> sh) & 15];
}

void json_quote(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0, n; i < s.size(); i += n) {
    char32_t c = decode(s, i, &n);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            hex4(out, unsigned(0xD800 + (v >> 10)));
            hex4(out, unsigned(0xDC00 + (v & 0x3FF)));
          } else {
            hex4(out, unsigned(c));
          }
        } else {
          out.append(s.substr(i, n));
        }
    }
  }
  out += '"';
}

void dumps(const Value& v, const JsonOptions& o, uint32_t depth, std::string& out) {
  if (depth > kValueDepth) fail("Value nested too deeply");
  switch (v.type) {
    case Type::Null: out += "null"; return;
    case Type::Bool: out += v.b ? "true" : "false"; return;
    case Type::Int: out += int_str(v); return;
    case Type::Float:
      if (std::isnan(v.num)) out += "NaN";
      else if (std::isinf(v.num)) out += v.num < 0 ? "-Infinity" : "Infinity";
      else out += float_repr(v.num);
      return;
    case Type::String: json_quote(out, *v.s, o.ensure_ascii); return;
    case Type::Array:
      if (v.view) fail("Object of type dict view is not JSON serializable");
      break;
    case Type::Object: break;
    default: fail(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
  }
  std::string item_sep = o.has_separators ? o.item_sep : o.indent_set ? "," : ", ";
  std::string key_sep = o.has_separators ? o.key_sep : ": ";
  std::string base, child;
  if (o.indent_set) {
    base = "\n";
    for (uint32_t k = 0; k < depth; ++k) base += o.indent;
    child = base + o.indent;
  }
  if (v.type == Type::Array) {
    const auto& items = v.a->items;
    if (items.empty()) { out += "[]"; return; }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      if (o.indent_set) out += child;
      dumps(items[i], o, depth + 1, out);
      check_built(out.size());
    }
    if (o.indent_set) out += base;
    out += ']';
    return;
  }
  if (v.o->items.empty()) { out += "{}"; return; }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (auto& e : v.o->items) entries.push_back(&e);
  if (o.sort_keys) std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += item_sep;
    if (o.indent_set) out += child;
    json_quote(out, entries[i]->first, o.ensure_ascii);
    out += key_sep;
    dumps(entries[i]->second, o, depth + 1, out);
    check_built(out.size());
  }
  if (o.indent_set) out += base;
  out += '}';
}

}  // namespace

std::string json_dumps(const Value& v, const JsonOptions& o) {
  std::string out;
  dumps(v, o, 0, out);
  return out;
}

std::string to_json(const Value& v) {
  try {
    return json_dumps(v, {});
  } catch (const std::exception&) {
    return "null";
  }
}

// ---------------------------------------------------------------- attribute and item access

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.type) {
    case Type::Undefined: fail("'" + name + "' is undefined (attribute of an undefined value)");
    case Type::Object:
      if (has_method(obj, name)) return make_function(Function::Method, name, obj);
      if (const Value* v = obj.o->get(name)) return *v;
      return Value();
    case Type::Namespace:
      if (const Value* v = obj.o->get(name)) return *v;
      return Value();
    case Type::String: case Type::Array:
      if (has_method(obj, name)) return make_function(Function::Method, name, obj);
      return Value();
    default: return Value();
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.type == Type::Undefined) fail("cannot index an undefined value");
  if (obj.type == Type::Object) {
    if (key.type == Type::String) {
      if (const Value* v = obj.o->get(*key.s)) return *v;
      return get_attr(obj, *key.s);
    }
    return Value();
  }
  if ((obj.type == Type::Array || obj.type == Type::String) && (key.type == Type::Int || key.type == Type::Bool)) {
    int64_t idx = key.type == Type::Bool ? key.b : key.big ? INT64_MAX : key.i;
    if (obj.type == Type::Array) {
      auto len = int64_t(obj.a->items.size());
      if (idx < 0) idx += len;
      if (idx < 0 || idx >= len) return Value();
      return obj.a->items[size_t(idx)];
    }
    auto cps = code_points(*obj.s);
    auto len = int64_t(cps.size());
    if (idx < 0) idx += len;
    if (idx < 0 || idx >= len) return Value();
    return Value::string(std::string(cps[size_t(idx)]));
  }
  if (key.type == Type::String) return get_attr(obj, *key.s);
  return Value();
}

// ---------------------------------------------------------------- json.loads

namespace {

// JSON number grammar; true for an integer literal (no fraction or exponent).
bool valid_number(std::string_view t, bool* integer) {
  size_t i = 0;
  if (i < t.size() && t[i] == '-') ++i;
  if (i >= t.size() || !is_digit(t[i])) return false;
  if (t[i] == '0') ++i; else while (i < t.size() && is_digit(t[i])) ++i;
  *integer = true;
  if (i < t.size() && t[i] == '.') {
    ++i;
    *integer = false;
    if (i >= t.size() || !is_digit(t[i])) return false;
    while (i < t.size() && is_digit(t[i])) ++i;
  }
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    *integer = false;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    if (i >= t.size() || !is_digit(t[i])) return false;
    while (i < t.size() && is_digit(t[i])) ++i;
  }
  return i == t.size();
}

// Python's json: integers exact (beyond 64 bits kept as digits), others float (1e400 -> inf).
Value number_value(std::string_view raw) {
  while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\n' || raw.back() == '\r' || raw.back() == '\t')) raw.remove_suffix(1);
  bool integer = false;
  if (!valid_number(raw, &integer)) fail("invalid number " + std::string(raw.substr(0, 40)));
  std::string text(raw);
  if (!integer) return Value::floating(std::strtod(text.c_str(), nullptr));
  int64_t v = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec == std::errc() && r.ptr == text.data() + text.size()) return Value::integer(v);
  std::string digits = text;
  if (digits.rfind("-0", 0) == 0 && digits.size() == 2) return Value::integer(0);
  return Value::big_integer(digits, std::strtod(text.c_str(), nullptr));
}

template <class V>
Value convert(V&& v, uint32_t depth, uint32_t max_depth) {
  namespace od = simdjson::ondemand;
  if (depth > max_depth) fail("JSON nested too deeply");
  switch (od::json_type(v.type())) {
    case od::json_type::null:
      if (!v.is_null()) fail("invalid JSON literal");
      return Value::null();
    case od::json_type::boolean: return Value::boolean(bool(v.get_bool()));
    case od::json_type::number: return number_value(v.raw_json_token());
    case od::json_type::string: return Value::string(std::string(std::string_view(v.get_string())));
    case od::json_type::array: {
      Array items;
      for (auto x : v.get_array()) items.push_back(convert(od::value(x.value()), depth + 1, max_depth));
      return Value::array(std::move(items));
    }
    case od::json_type::object: {
      auto obj = std::make_shared<Object>();
      for (auto field : v.get_object()) {
        od::field f;
        if (auto err = std::move(field).get(f)) throw simdjson::simdjson_error(err);
        std::string k(std::string_view(f.unescaped_key()));
        obj->set(k, convert(f.value(), depth + 1, max_depth));
      }
      return Value::object(std::move(obj));
    }
  }
  fail("unsupported JSON value");
}

std::string_view trim_json_ws(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

bool value_from_json(std::string_view json, Value* out, std::string* error, uint32_t max_depth) {
  namespace od = simdjson::ondemand;
  try {
    simdjson::padded_string padded(json);
    od::parser parser;
    od::document doc = parser.iterate(padded);
    od::json_type t = doc.type();
    if (t == od::json_type::object || t == od::json_type::array) {
      *out = convert(doc.get_value().value(), 0, max_depth);
      if (doc.current_location().error() == simdjson::SUCCESS) fail("trailing content after JSON value");
    } else if (t == od::json_type::number) {
      *out = number_value(trim_json_ws(json));
    } else {
      simdjson::dom::parser dp;
      simdjson::dom::element e;
      if (auto err = dp.parse(padded).get(e)) throw simdjson::simdjson_error(err);
      if (e.is_string()) *out = Value::string(std::string(std::string_view(e.get_string().value_unsafe())));
      else if (e.is_bool()) *out = Value::boolean(bool(e.get_bool().value_unsafe()));
      else if (e.is_null()) *out = Value::null();
      else fail("unsupported JSON value");
    }
    return true;
  } catch (const simdjson::simdjson_error& e) {
    *error = std::string("invalid JSON: ") + e.what();
  } catch (const JinjaError& e) {
    *error = std::string("invalid JSON: ") + e.what();
  } catch (const std::bad_alloc&) {
    *error = "out of memory";
  }
  return false;
}

}  // namespace kvroute::jinja
