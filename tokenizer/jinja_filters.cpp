// Jinja2's builtin filters and tests (with transformers' `tojson`), Python's str / dict /
// list methods as the immutable sandbox exposes them, and printf-style `str % args`.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cwctype>
#include <functional>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/utf8.h"

namespace kvroute::jinja {

Value checked_list(Array items, const CallContext& cx) {
  cx.check_items(items.size());
  Value v = Value::array(std::move(items));
  if (v.a->depth > kValueDepth) fail("Value nested too deeply");
  return v;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return {};
    case Type::String: {
      std::vector<Value> out;
      for (auto cp : code_points(*v.s)) out.push_back(Value::string(std::string(cp)));
      return out;
    }
    case Type::Array: return v.a->items;
    case Type::Object: {
      std::vector<Value> out;
      for (auto& [k, x] : v.o->items) out.push_back(Value::string(k));
      return out;
    }
    default: fail(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

namespace {

// ---------------------------------------------------------------- argument binding

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

std::string soft_str(const Value& v) { return py_str(v); }

int64_t need_int(const Value& v, const char* what) {
  if (v.type == Type::Bool) return v.b;
  if (v.type != Type::Int) fail(std::string(what) + ": '" + type_name(v) + "' object cannot be interpreted as an integer");
  if (v.big) fail(std::string(what) + ": integer too large");
  return v.i;
}
const std::string& need_str(const Value& v, const char* what) {
  if (v.type != Type::String) fail(std::string(what) + " must be str, not " + type_name(v));
  return *v.s;
}

// ---------------------------------------------------------------- Python number parsing

// Python int(str): whitespace, sign, digits with single underscores.
bool parse_py_int(std::string_view s, Value* out) {
  s = py_strip(s, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  std::string digits;
  if (i >= s.size() || !is_digit(s[i])) return false;
  for (; i < s.size(); ++i) {
    if (is_digit(s[i])) digits += s[i];
    else if (s[i] == '_' && i + 1 < s.size() && is_digit(s[i + 1]) && is_digit(s[i - 1])) continue;
    else return false;
  }
  size_t nz = digits.find_first_not_of('0');
  digits = nz == std::string::npos ? "0" : digits.substr(nz);
  std::string text = (neg && digits != "0" ? "-" : "") + digits;
  errno = 0;
  long long v = std::strtoll(text.c_str(), nullptr, 10);
  *out = errno == ERANGE ? Value::big_integer(text, std::strtod(text.c_str(), nullptr)) : Value::integer(v);
  return true;
}

// Python float(str).
bool parse_py_float(std::string_view s, double* out) {
  s = py_strip(s, true, true);
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 >= s.size() || !is_digit(s[i - 1]) || !is_digit(s[i + 1])) return false;
      continue;
    }
    t += s[i];
  }
  std::string low = py_lower(t);
  std::string body = low;
  bool neg = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) { neg = body[0] == '-'; body = body.substr(1); }
  if (body == "inf" || body == "infinity") { *out = neg ? -INFINITY : INFINITY; return true; }
  if (body == "nan") { *out = NAN; return true; }
  size_t i = 0, nd = 0;
  while (i < body.size() && is_digit(body[i])) { ++i; ++nd; }
  if (i < body.size() && body[i] == '.') { ++i; while (i < body.size() && is_digit(body[i])) { ++i; ++nd; } }
  if (nd == 0) return false;
  if (i < body.size() && body[i] == 'e') {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    size_t e0 = i;
    while (i < body.size() && is_digit(body[i])) ++i;
    if (i == e0) return false;
  }
  if (i != body.size()) return false;
  *out = std::strtod(t.c_str(), nullptr);
  return true;
}

Value int_of_double(double d) {
  if (!std::isfinite(d)) fail("cannot convert float infinity or NaN to integer");
  double t = std::trunc(d);
  if (std::fabs(t) < 9.2e18) return Value::integer(int64_t(t));
  char buf[400];
  std::snprintf(buf, sizeof buf, "%.0f", t);
  return Value::big_integer(buf, t);
}

// ---------------------------------------------------------------- string helpers

// Title case of one code point (Python's full mapping for the common special cases:
// the Latin digraphs, ß and the ligatures).
void append_title(std::string& r, char32_t c) {
  switch (c) {
    case 0x1C4: case 0x1C5: case 0x1C6: append_utf8(r, 0x1C5); return;
    case 0x1C7: case 0x1C8: case 0x1C9: append_utf8(r, 0x1C8); return;
    case 0x1CA: case 0x1CB: case 0x1CC: append_utf8(r, 0x1CB); return;
    case 0x1F1: case 0x1F2: case 0x1F3: append_utf8(r, 0x1F2); return;
    case 0xDF: r += "Ss"; return;
    case 0xFB00: r += "Ff"; return;
    case 0xFB01: r += "Fi"; return;
    case 0xFB02: r += "Fl"; return;
    case 0xFB03: r += "Ffi"; return;
    case 0xFB04: r += "Ffl"; return;
    case 0xFB05: case 0xFB06: r += "St"; return;
    default: append_utf8(r, to_upper_cp(c));
  }
}

// Lower case of one code point (İ -> i + combining dot, as Python).
void append_lower(std::string& r, char32_t c) {
  if (c == 0x130) { r += "i\xCC\x87"; return; }
  append_utf8(r, to_lower_cp(c));
}

std::string py_capitalize(std::string_view s) {
  std::string r;
  bool first = true;
  for (size_t i = 0, n; i < s.size(); i += n) {
    char32_t c = decode(s, i, &n);
    if (first) append_title(r, c); else append_lower(r, c);
    first = false;
  }
  return r;
}

bool is_cased(char32_t c) { return is_cased_upper(c) || is_cased_lower(c); }

std::string py_title_method(std::string_view s) {
  std::string r;
  bool prev_cased = false;
  for (size_t i = 0, n; i < s.size(); i += n) {
    char32_t c = decode(s, i, &n);
    if (prev_cased) append_lower(r, c); else append_title(r, c);
    prev_cased = is_cased(c);
  }
  return r;
}

// Jinja2's do_title: words split at runs of [-\s({\[<], first char upper, rest lower.
std::string jinja_title(std::string_view s) {
  std::string r;
  bool at_start = true;
  for (size_t i = 0, n; i < s.size(); i += n) {
    char32_t c = decode(s, i, &n);
    bool sep = c == '-' || py_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) { append_utf8(r, c); at_start = true; continue; }
    if (at_start) { std::string one; append_utf8(one, c); r += py_upper(one); } else append_lower(r, c);
    at_start = false;
  }
  return r;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (count < 0) count = INT64_MAX;
  if (from.empty()) {
    auto cps = code_points(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count > 0) { out += to; --count; }
      if (i < cps.size()) out.append(cps[i]);
      check_built(out.size());
    }
    return out;
  }
  size_t i = 0;
  while (count > 0) {
    size_t p = s.find(from, i);
    if (p == std::string::npos) break;
    out.append(s, i, p - i);
    out += to;
    check_built(out.size());
    --count;
    i = p + from.size();
  }
  out.append(s, i, std::string::npos);
  return out;
}

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool right) {
  std::vector<std::string> parts;
  if (sep.type == Type::Null || sep.type == Type::Undefined) {
    // Runs of whitespace; leading/trailing whitespace ignored.
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < s.size()) {
      size_t n;
      while (i < s.size() && py_space(decode(s, i, &n))) i += n;
      if (i >= s.size()) break;
      size_t b = i;
      while (i < s.size() && !py_space(decode(s, i, &n))) i += n;
      words.emplace_back(b, i);
    }
    if (maxsplit < 0 || size_t(maxsplit) >= words.size()) {
      for (auto& [b, e] : words) parts.push_back(s.substr(b, e - b));
      return parts;
    }
    if (!right) {
      for (int64_t k = 0; k < maxsplit; ++k) parts.push_back(s.substr(words[size_t(k)].first, words[size_t(k)].second - words[size_t(k)].first));
      parts.push_back(s.substr(words[size_t(maxsplit)].first));
    } else {
      size_t first = words.size() - size_t(maxsplit);
      parts.push_back(s.substr(0, words[first - 1].second));
      for (size_t k = first; k < words.size(); ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    return parts;
  }
  const std::string& sp = need_str(sep, "separator");
  if (sp.empty()) fail("empty separator");
  std::vector<std::string> all;
  size_t i = 0;
  for (;;) {
    size_t p = s.find(sp, i);
    if (p == std::string::npos) { all.push_back(s.substr(i)); break; }
    all.push_back(s.substr(i, p - i));
    i = p + sp.size();
  }
  if (maxsplit < 0 || size_t(maxsplit) + 1 >= all.size()) return all;
  if (!right) {
    for (int64_t k = 0; k < maxsplit; ++k) parts.push_back(all[size_t(k)]);
    std::string rest;
    for (size_t k = size_t(maxsplit); k < all.size(); ++k) { if (k > size_t(maxsplit)) rest += sp; rest += all[k]; }
    parts.push_back(rest);
  } else {
    size_t head_n = all.size() - size_t(maxsplit);
    std::string head;
    for (size_t k = 0; k < head_n; ++k) { if (k) head += sp; head += all[k]; }
    parts.push_back(head);
    for (size_t k = head_n; k < all.size(); ++k) parts.push_back(all[k]);
  }
  return parts;
}

bool line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0, i = 0;
  while (i < s.size()) {
    size_t n;
    char32_t c = decode(s, i, &n);
    if (line_break(c)) {
      out.push_back(s.substr(b, i - b));
      i += n;
      if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
      b = i;
    } else {
      i += n;
    }
  }
  if (b < s.size()) out.push_back(s.substr(b));
  return out;
}

std::string jinja_indent(std::string s, const std::string& pad, bool first, bool blank) {
  s += "\n";
  auto lines = py_splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) { if (k) rv += "\n" + pad; rv += lines[k]; check_built(rv.size()); }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t k = 1; k < lines.size(); ++k) {
        if (k > 1) rv += "\n";
        if (!lines[k].empty()) rv += pad;
        rv += lines[k];
        check_built(rv.size());
      }
    }
  }
  if (first) rv = pad + rv;
  return rv;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string repeat(const std::string& s, int64_t n) {
  if (n <= 0) return {};
  check_built(s.size() * size_t(n));
  std::string out;
  for (int64_t k = 0; k < n; ++k) out += s;
  return out;
}

std::string center(const std::string& s, int64_t width, const std::string& fill = " ") {
  auto len = int64_t(cp_count(s));
  if (width <= len) return s;
  int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
  return repeat(fill, left) + s + repeat(fill, marg - left);
}

// ---------------------------------------------------------------- attribute paths

// Jinja2's make_attrgetter: "a.b.0" item by item; a default replaces an undefined step.
Value attr_path(const Value& item, const std::string& path, const Value& def) {
  Value cur = item;
  size_t i = 0;
  for (;;) {
    size_t dot = path.find('.', i);
    std::string part = path.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), is_digit);
    cur = get_item(cur, numeric ? Value::integer(std::strtoll(part.c_str(), nullptr, 10)) : Value::string(part));
    if (cur.type == Type::Undefined && def.type != Type::Undefined) cur = def;
    if (dot == std::string::npos) return cur;
    i = dot + 1;
  }
}

Value attribute_key(const Value& item, const Value& attribute, const Value& def = Value()) {
  if (attribute.type == Type::Null || attribute.type == Type::Undefined) return item;
  Value r = attribute.type == Type::Int ? get_item(item, attribute) : attr_path(item, py_str(attribute), def);
  if (r.type == Type::Undefined && def.type != Type::Undefined) return def;
  return r;
}

Value ignore_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.type == Type::String) return Value::string(py_lower(*v.s));
  return v;
}

void sort_values(Array& items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    int r = reverse ? py_compare(b.first, a.first) : py_compare(a.first, b.first);
    return r == -1;
  });
  Array out;
  for (auto& [k, i] : keyed) out.push_back(items[i]);
  items = std::move(out);
}


// ---------------------------------------------------------------- filters

Value filter_tojson(const Value& v, const Array& args, const Kwargs& kws) {
  Params p("tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}, args, kws,
           {Value::boolean(false), Value::null(), Value::null(), Value::boolean(false)});
  JsonOptions o;
  o.ensure_ascii = truthy(p[0]);
  const Value& ind = p[1];
  if (ind.type == Type::Int || ind.type == Type::Bool) {
    int64_t n = need_int(ind, "indent");
    if (n > 1024) fail("indent too large");
    o.indent_set = true;
    o.indent = std::string(size_t(std::max<int64_t>(n, 0)), ' ');
  } else if (ind.type == Type::String) {
    o.indent_set = true;
    o.indent = *ind.s;
  } else if (ind.type != Type::Null) {
    fail("indent must be an int, a string or None");
  }
  if (p[2].type == Type::Array) {
    const auto& s = p[2].a->items;
    if (s.size() != 2 || s[0].type != Type::String || s[1].type != Type::String) fail("separators must be two strings");
    o.has_separators = true;
    o.item_sep = *s[0].s;
    o.key_sep = *s[1].s;
  } else if (p[2].type != Type::Null) {
    fail("separators must be a tuple of two strings");
  }
  o.sort_keys = truthy(p[3]);
  return str_value(json_dumps(v, o));
}

Value filter_int(const Value& v, const Array& args, const Kwargs& kws) {
  Params p("int", {"default", "base"}, args, kws, {Value::integer(0), Value::integer(10)});
  if (v.type == Type::String) {
    Value out;
    if (need_int(p[1], "base") == 10 && parse_py_int(*v.s, &out)) return out;
    double d;
    if (parse_py_float(*v.s, &d)) return int_of_double(d);
    return p[0];
  }
  if (v.type == Type::Int) return v;
  if (v.type == Type::Bool) return Value::integer(v.b);
  if (v.type == Type::Float) return int_of_double(v.num);
  return p[0];
}

Value filter_float(const Value& v, const Array& args, const Kwargs& kws) {
  Params p("float", {"default"}, args, kws, {Value::floating(0)});
  if (v.type == Type::String) {
    double d;
    return parse_py_float(*v.s, &d) ? Value::floating(d) : p[0];
  }
  if (is_number(v)) return Value::floating(as_double(v));
  return p[0];
}

Value filter_round(const Value& v, const Array& args, const Kwargs& kws) {
  Params p("round", {"precision", "method"}, args, kws, {Value::integer(0), Value::string("common")});
  int64_t prec = need_int(p[0], "precision");
  const std::string& method = need_str(p[1], "method");
  if (!is_number(v)) fail("type " + std::string(type_name(v)) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.type != Type::Float) return v.type == Type::Bool ? Value::integer(v.b) : v;
    if (prec < 0 || prec > 300 || !std::isfinite(v.num)) return Value::floating(v.num);
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", int(prec), v.num);
    return Value::floating(std::strtod(buf, nullptr));
  }
  if (method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
  double m = std::pow(10.0, double(prec));
  double x = as_double(v) * m;
  x = method == "ceil" ? std::ceil(x) : std::floor(x);
  return Value::floating(x / m);
}

Value filter_sort(const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx) {
  Params p("sort", {"reverse", "case_sensitive", "attribute"}, args, kws, {Value::boolean(false), Value::boolean(false), Value::null()});
  Array items = iterate(v);
  bool cs = truthy(p[1]);
  Value attr = p[2];
  std::vector<Value> attrs;  // Jinja2 3.1: "a,b" sorts by a tuple of attributes
  if (attr.type == Type::String && attr.s->find(',') != std::string::npos) {
    size_t i = 0;
    for (;;) {
      size_t c = attr.s->find(',', i);
      attrs.push_back(Value::string(attr.s->substr(i, c == std::string::npos ? std::string::npos : c - i)));
      if (c == std::string::npos) break;
      i = c + 1;
    }
  }
  sort_values(items, [&](const Value& x) {
    if (attrs.empty()) return ignore_case(attribute_key(x, attr), cs);
    Array key;
    for (auto& a : attrs) key.push_back(ignore_case(attribute_key(x, a), cs));
    return Value::make_tuple(std::move(key));
  }, truthy(p[0]));
  return checked_list(std::move(items), cx);
}

Value filter_unique(const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx) {
  Params p("unique", {"case_sensitive", "attribute"}, args, kws, {Value::boolean(false), Value::null()});
  Array out, seen;
  for (auto& x : iterate(v)) {
    Value k = ignore_case(attribute_key(x, p[1]), truthy(p[0]));
    if (k.type == Type::Object || (k.type == Type::Array && !k.tuple)) fail(std::string("unhashable type: '") + type_name(k) + "'");
    bool dup = false;
    for (auto& s : seen) if (py_equal(s, k)) { dup = true; break; }
    if (dup) continue;
    seen.push_back(k);
    out.push_back(x);
  }
  return checked_list(std::move(out), cx);
}

Value filter_minmax(bool max, const Value& v, const Array& args, const Kwargs& kws) {
  Params p(max ? "max" : "min", {"case_sensitive", "attribute"}, args, kws, {Value::boolean(false), Value::null()});
  Array items = iterate(v);
  if (items.empty()) return Value();
  size_t best = 0;
  Value bk = ignore_case(attribute_key(items[0], p[1]), truthy(p[0]));
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = ignore_case(attribute_key(items[i], p[1]), truthy(p[0]));
    int c = py_compare(k, bk);
    if (max ? c == 1 : c == -1) { best = i; bk = k; }
  }
  return items[best];
}

Value filter_sum(const Value& v, const Array& args, const Kwargs& kws) {
  Params p("sum", {"attribute", "start"}, args, kws, {Value::null(), Value::integer(0)});
  Value total = p[1];
  for (auto& x : iterate(v)) total = add_values(total, attribute_key(x, p[0]));
  return total;
}

Value filter_dictsort(const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx) {
  Params p("dictsort", {"case_sensitive", "by", "reverse"}, args, kws, {Value::boolean(false), Value::string("key"), Value::boolean(false)});
  if (!is_mapping(v)) fail("You can only sort by either a mapping");
  const std::string& by = need_str(p[1], "by");
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  Array items;
  for (auto& [k, x] : v.o->items) items.push_back(Value::make_tuple({Value::string(k), x}));
  size_t idx = by == "key" ? 0 : 1;
  bool cs = truthy(p[0]);
  sort_values(items, [&](const Value& t) { return ignore_case(t.a->items[idx], cs); }, truthy(p[2]));
  return checked_list(std::move(items), cx);
}

Value filter_truncate(const Value& v, const Array& args, const Kwargs& kws) {
  Params p("truncate", {"length", "killwords", "end", "leeway"}, args, kws,
           {Value::integer(255), Value::boolean(false), Value::string("..."), Value::null()});
  std::string s = soft_str(v);
  int64_t length = need_int(p[0], "length");
  const std::string& end = need_str(p[2], "end");
  int64_t leeway = p[3].type == Type::Null ? 5 : need_int(p[3], "leeway");
  auto end_len = int64_t(cp_count(end));
  if (length < end_len) fail("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) fail("expected leeway >= 0");
  auto cps = code_points(s);
  if (int64_t(cps.size()) <= length + leeway) return str_value(s);
  std::string head;
  for (int64_t k = 0; k < length - end_len && size_t(k) < cps.size(); ++k) head.append(cps[size_t(k)]);
  if (truthy(p[1])) return str_value(head + end);
  size_t sp = head.rfind(' ');
  if (sp != std::string::npos) head.resize(sp);
  return str_value(head + end);
}

Value filter_map(const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx) {
  Array items = iterate(v), out;
  if (args.empty()) {
    Value attr, def;
    for (auto& [k, x] : kws) {
      if (k == "attribute") attr = x;
      else if (k == "default") def = x;
      else fail("Unexpected keyword argument '" + k + "'");
    }
    if (attr.type == Type::Undefined) fail("map requires a filter argument");
    for (auto& x : items) out.push_back(attribute_key(x, attr, def));
  } else {
    const std::string& name = need_str(args[0], "filter name");
    if (!filter_exists(name)) fail("No filter named '" + name + "'");
    Array rest(args.begin() + 1, args.end());
    for (auto& x : items) out.push_back(apply_filter(name, x, rest, kws, cx));
  }
  return checked_list(std::move(out), cx);
}

Value filter_select(bool attr_mode, bool select, const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx) {
  size_t k = 0;
  Value attr;
  if (attr_mode) {
    if (args.empty()) fail("Missing parameter for attribute name");
    attr = args[k++];
  }
  std::string test;
  if (k < args.size()) test = need_str(args[k++], "test name");
  Array rest(args.begin() + long(std::min(k, args.size())), args.end());
  if (!test.empty() && !test_exists(test)) fail("No test named '" + test + "'");
  Array out;
  for (auto& x : iterate(v)) {
    Value item = attr_mode ? attribute_key(x, attr) : x;
    bool r = test.empty() ? truthy(item) : apply_test(test, item, rest, cx);
    if (r == select) out.push_back(x);
  }
  (void)kws;
  return checked_list(std::move(out), cx);
}

Value filter_join(const Value& v, const Array& args, const Kwargs& kws) {
  Params p("join", {"d", "attribute"}, args, kws, {Value::string(""), Value::null()});
  std::string sep = soft_str(p[0]), out;
  bool first = true;
  for (auto& x : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += soft_str(attribute_key(x, p[1]));
    check_built(out.size());
  }
  return str_value(std::move(out));
}

Value filter_indent(const Value& v, const Array& args, const Kwargs& kws) {
  Params p("indent", {"width", "first", "blank"}, args, kws, {Value::integer(4), Value::boolean(false), Value::boolean(false)});
  std::string pad;
  if (p[0].type == Type::String) pad = *p[0].s;
  else {
    int64_t w = need_int(p[0], "width");
    if (w > 4096) fail("indent width too large");
    pad = std::string(size_t(std::max<int64_t>(w, 0)), ' ');
  }
  return str_value(jinja_indent(soft_str(v), pad, truthy(p[1]), truthy(p[2])));
}

// batch(linecount, fill_with=None): lists of linecount items, the last one filled.
Value filter_batch(const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx) {
  Params p("batch", {"linecount", "fill_with"}, args, kws, {Value(), Value::null()});
  int64_t n = need_int(p[0], "linecount");
  if (n <= 0) fail("batch size must be positive");
  Array out, cur;
  for (auto& x : iterate(v)) {
    cur.push_back(x);
    if (int64_t(cur.size()) == n) { out.push_back(checked_list(std::move(cur), cx)); cur.clear(); }
  }
  if (!cur.empty()) {
    if (p[1].type != Type::Null) while (int64_t(cur.size()) < n) cur.push_back(p[1]);
    out.push_back(checked_list(std::move(cur), cx));
  }
  return checked_list(std::move(out), cx);
}

// slice(slices, fill_with=None): the items cut into `slices` columns.
Value filter_slice(const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx) {
  Params p("slice", {"slices", "fill_with"}, args, kws, {Value(), Value::null()});
  int64_t slices = need_int(p[0], "slices");
  if (slices <= 0 || slices > 100000) fail("slices must be positive");
  Array seq = iterate(v), out;
  auto length = int64_t(seq.size());
  int64_t per = length / slices, with_extra = length % slices, offset = 0;
  for (int64_t k = 0; k < slices; ++k) {
    int64_t start = offset + k * per;
    if (k < with_extra) ++offset;
    int64_t end = offset + (k + 1) * per;
    Array part(seq.begin() + start, seq.begin() + end);
    if (p[1].type != Type::Null && k >= with_extra) part.push_back(p[1]);
    out.push_back(checked_list(std::move(part), cx));
  }
  return checked_list(std::move(out), cx);
}

void no_args(const char* name, const Array& args, const Kwargs& kws) {
  if (!args.empty() || !kws.empty()) fail(std::string(name) + "() takes no arguments");
}

Value filter_length(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return Value::integer(0);
    case Type::String: return Value::integer(int64_t(cp_count(*v.s)));
    case Type::Array: return Value::integer(int64_t(v.a->items.size()));
    case Type::Object: return Value::integer(int64_t(v.o->size()));
    default: fail(std::string("object of type '") + type_name(v) + "' has no len()");
  }
}

Value filter_first_last(bool last, const Value& v) {
  Array items = iterate(v);
  if (items.empty()) return Value();
  return last ? items.back() : items.front();
}

Value filter_reverse(const Value& v, const CallContext& cx) {
  if (v.type == Type::String) {
    auto cps = code_points(*v.s);
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out.append(*it);
    return str_value(std::move(out));
  }
  Array items = iterate(v);
  std::reverse(items.begin(), items.end());
  return checked_list(std::move(items), cx);
}

Value filter_items(const Value& v, const CallContext& cx) {
  if (v.type == Type::Undefined) return checked_list({}, cx);
  if (!is_mapping(v)) fail("Can only get item pairs from a mapping.");
  Array out;
  for (auto& [k, x] : v.o->items) out.push_back(Value::make_tuple({Value::string(k), x}));
  return checked_list(std::move(out), cx);
}

Value filter_attr(const Value& v, const Value& name) {
  std::string n = soft_str(name);
  if (v.type == Type::Namespace) { const Value* x = v.o->get(n); return x ? *x : Value(); }
  if ((v.type == Type::Object || v.type == Type::String || v.type == Type::Array) && has_method(v, n))
    return make_function(Function::Method, n, v);
  return Value();
}

size_t word_count(const std::string& s) {
  size_t n = 0;
  bool in = false;
  for (size_t i = 0, k; i < s.size(); i += k) {
    char32_t c = decode(s, i, &k);
    bool w = c == '_' || (c < 0x80 ? (is_word(char(c))) : bool(std::iswalnum(wint_t(c))));
    if (w && !in) ++n;
    in = w;
  }
  return n;
}

}  // namespace


static const char* const kFilters[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
    "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "sum", "title",
    "tojson", "trim", "truncate", "unique", "upper", "wordcount"};

bool filter_exists(const std::string& name) {
  for (auto* f : kFilters) if (name == f) return true;
  return false;
}

Value apply_filter(const std::string& f, const Value& v, const Array& args, const Kwargs& kws, const CallContext& cx) {
  if (f == "tojson") return filter_tojson(v, args, kws);
  if (f == "default" || f == "d") {
    Params p("default", {"default_value", "boolean"}, args, kws, {Value::string(""), Value::boolean(false)});
    if (v.type == Type::Undefined || (truthy(p[1]) && !truthy(v))) return p[0];
    return v;
  }
  if (f == "int") return filter_int(v, args, kws);
  if (f == "float") return filter_float(v, args, kws);
  if (f == "round") return filter_round(v, args, kws);
  if (f == "sort") return filter_sort(v, args, kws, cx);
  if (f == "unique") return filter_unique(v, args, kws, cx);
  if (f == "min" || f == "max") return filter_minmax(f == "max", v, args, kws);
  if (f == "sum") return filter_sum(v, args, kws);
  if (f == "dictsort") return filter_dictsort(v, args, kws, cx);
  if (f == "truncate") return filter_truncate(v, args, kws);
  if (f == "map") return filter_map(v, args, kws, cx);
  if (f == "select" || f == "reject") return filter_select(false, f == "select", v, args, kws, cx);
  if (f == "selectattr" || f == "rejectattr") return filter_select(true, f == "selectattr", v, args, kws, cx);
  if (f == "join") return filter_join(v, args, kws);
  if (f == "batch") return filter_batch(v, args, kws, cx);
  if (f == "slice") return filter_slice(v, args, kws, cx);
  if (f == "indent") return filter_indent(v, args, kws);
  if (f == "replace") {
    Params p("replace", {"old", "new", "count"}, args, kws, {Value(), Value(), Value::null()});
    if (!p.given[0] || !p.given[1]) fail("replace() missing required arguments");
    int64_t count = p[2].type == Type::Null ? -1 : need_int(p[2], "count");
    return str_value(py_replace(soft_str(v), soft_str(p[0]), soft_str(p[1]), count));
  }
  if (f == "trim") {
    Params p("trim", {"chars"}, args, kws, {Value::null()});
    std::string s = soft_str(v);
    if (p[0].type == Type::Null) return str_value(std::string(py_strip(s, true, true)));
    return str_value(std::string(py_strip_chars(s, need_str(p[0], "chars"), true, true)));
  }
  if (f == "center") {
    Params p("center", {"width"}, args, kws, {Value::integer(80)});
    return str_value(center(soft_str(v), need_int(p[0], "width")));
  }
  if (f == "format") {
    if (!args.empty() && !kws.empty()) fail("can't handle positional and keyword arguments at the same time");
    Value a;
    if (!kws.empty()) {
      auto o = std::make_shared<Object>();
      for (auto& [k, x] : kws) o->set(k, x);
      a = Value::object(o);
    } else {
      a = Value::make_tuple(args);
    }
    return py_format(soft_str(v), a);
  }
  if (f == "attr") {
    if (args.size() != 1) fail("attr() takes exactly one argument");
    return filter_attr(v, args[0]);
  }
  no_args(f.c_str(), args, kws);
  if (f == "length" || f == "count") return filter_length(v);
  if (f == "first" || f == "last") return filter_first_last(f == "last", v);
  if (f == "list") return checked_list(iterate(v), cx);
  if (f == "reverse") return filter_reverse(v, cx);
  if (f == "items") return filter_items(v, cx);
  if (f == "upper") return str_value(py_upper(soft_str(v)));
  if (f == "lower") return str_value(py_lower(soft_str(v)));
  if (f == "capitalize") return str_value(py_capitalize(soft_str(v)));
  if (f == "title") return str_value(jinja_title(soft_str(v)));
  if (f == "string") return str_value(soft_str(v));
  if (f == "safe") return v.type == Type::String ? v : str_value(soft_str(v));
  if (f == "e" || f == "escape") return str_value(html_escape(soft_str(v)));
  if (f == "wordcount") return Value::integer(int64_t(word_count(soft_str(v))));
  if (f == "abs") {
    if (v.type == Type::Float) return Value::floating(std::fabs(v.num));
    if (v.type == Type::Bool) return Value::integer(v.b);
    if (v.type == Type::Int) {
      if (v.big) return Value::big_integer(v.s->front() == '-' ? v.s->substr(1) : *v.s, std::fabs(v.num));
      if (v.i == INT64_MIN) return Value::big_integer("9223372036854775808", 9223372036854775808.0);
      return Value::integer(v.i < 0 ? -v.i : v.i);
    }
    fail(std::string("bad operand type for abs(): '") + type_name(v) + "'");
  }
  fail("No filter named '" + f + "'.");
}

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

// ---------------------------------------------------------------- methods

namespace {
const char* const kStrMethods[] = {"capitalize", "center", "count", "endswith", "find", "index", "isalnum", "isalpha",
                                   "isdigit", "islower", "isspace", "isupper", "join", "ljust", "lower", "lstrip",
                                   "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rsplit",
                                   "rstrip", "split", "splitlines", "startswith", "strip", "title", "upper", "zfill"};
const char* const kDictMethods[] = {"get", "items", "keys", "values", "copy",
                                    "pop", "popitem", "setdefault", "update", "clear"};  // last five: unsafe
const char* const kListMethods[] = {"count", "index", "copy",
                                    "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};  // unsafe after copy
bool in_list(const std::string& n, const char* const* b, const char* const* e) {
  for (; b != e; ++b) if (n == *b) return true;
  return false;
}
}  // namespace

bool has_method(const Value& self, const std::string& name) {
  if (self.type == Type::String) return in_list(name, std::begin(kStrMethods), std::end(kStrMethods));
  if (self.type == Type::Object) return in_list(name, std::begin(kDictMethods), std::end(kDictMethods));
  if (self.type == Type::Array) {
    if (self.tuple) return name == "count" || name == "index";
    return in_list(name, std::begin(kListMethods), std::end(kListMethods));
  }
  return false;
}

namespace {

// center, ljust, rjust, zfill, removeprefix, removesuffix; false for another method.
bool str_padding_method(const std::string& s, const std::string& m, const Array& args, const Kwargs& kws, Value* out) {
  if (m == "center" || m == "ljust" || m == "rjust") {
    Params p(m.c_str(), {"width", "fillchar"}, args, kws, {Value(), Value::string(" ")});
    int64_t w = need_int(p[0], "width");
    const std::string& fill = need_str(p[1], "fillchar");
    if (cp_count(fill) != 1) fail("The fill character must be exactly one character long");
    if (w > int64_t(t_max_bytes)) fail("Output too large");
    if (m == "center") { *out = str_value(center(s, w, fill)); return true; }
    auto len = int64_t(cp_count(s));
    std::string pad = repeat(fill, w - len);
    *out = str_value(m == "ljust" ? s + pad : pad + s);
    return true;
  }
  if (m == "zfill") {
    Params p("zfill", {"width"}, args, kws);
    int64_t w = need_int(p[0], "width");
    auto len = int64_t(cp_count(s));
    if (w <= len) { *out = str_value(s); return true; }
    if (w > int64_t(t_max_bytes)) fail("Output too large");
    std::string zeros(size_t(w - len), '0');
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) { *out = str_value(s.substr(0, 1) + zeros + s.substr(1)); return true; }
    *out = str_value(zeros + s);
    return true;
  }
  if (m == "removeprefix" || m == "removesuffix") {
    if (args.size() != 1) fail(m + "() takes exactly one argument");
    const std::string& a = need_str(args[0], m.c_str());
    if (m == "removeprefix") { *out = str_value(s.rfind(a, 0) == 0 ? s.substr(a.size()) : s); return true; }
    bool suffix = s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0;
    *out = str_value(suffix ? s.substr(0, s.size() - a.size()) : s);
    return true;
  }
  return false;
}

Value str_method(const std::string& s, const std::string& m, const Array& args, const Kwargs& kws, const CallContext& cx) {
  auto opt_chars = [&](const char* fn) -> Value {
    Params p(fn, {"chars"}, args, kws, {Value::null()});
    return p[0];
  };
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    Value chars = opt_chars(m.c_str());
    bool l = m != "rstrip", r = m != "lstrip";
    if (chars.type == Type::Null) return str_value(std::string(py_strip(s, l, r)));
    return str_value(std::string(py_strip_chars(s, need_str(chars, "chars"), l, r)));
  }
  if (m == "split" || m == "rsplit") {
    Params p(m.c_str(), {"sep", "maxsplit"}, args, kws, {Value::null(), Value::integer(-1)});
    Array out;
    for (auto& part : py_split(s, p[0], need_int(p[1], "maxsplit"), m == "rsplit")) out.push_back(Value::string(std::move(part)));
    return checked_list(std::move(out), cx);
  }
  if (m == "splitlines") {
    Array out;
    for (auto& part : py_splitlines(s)) out.push_back(Value::string(std::move(part)));
    return checked_list(std::move(out), cx);
  }
  if (m == "startswith" || m == "endswith") {
    if (args.empty()) fail(m + "() takes at least 1 argument");
    bool start = m == "startswith";
    auto test = [&](const std::string& p) {
      if (p.size() > s.size()) return false;
      return start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
    };
    if (args[0].type == Type::String) return Value::boolean(test(*args[0].s));
    if (args[0].type == Type::Array && args[0].tuple) {
      for (auto& it : args[0].a->items) if (test(need_str(it, m.c_str()))) return Value::boolean(true);
      return Value::boolean(false);
    }
    fail(m + " first arg must be str or a tuple of str, not " + type_name(args[0]));
  }
  if (m == "replace") {
    Params p("replace", {"old", "new", "count"}, args, kws, {Value(), Value(), Value::integer(-1)});
    return str_value(py_replace(s, need_str(p[0], "replace() argument 1"), need_str(p[1], "replace() argument 2"), need_int(p[2], "count")));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
    if (args.empty()) fail(m + "() takes at least 1 argument");
    const std::string& sub = need_str(args[0], m.c_str());
    if (m == "count") {
      if (sub.empty()) return Value::integer(int64_t(cp_count(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::integer(n);
    }
    size_t p = m[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (m == "index" || m == "rindex") fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(int64_t(cp_count(std::string_view(s).substr(0, p))));
  }
  if (m == "join") {
    if (args.size() != 1) fail("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (auto& x : iterate(args[0])) {
      if (!first) out += s;
      first = false;
      out += need_str(x, "sequence item");
      check_built(out.size());
    }
    return str_value(std::move(out));
  }
  if (Value v; str_padding_method(s, m, args, kws, &v)) return v;
  no_args(m.c_str(), args, kws);
  if (m == "upper") return str_value(py_upper(s));
  if (m == "lower") return str_value(py_lower(s));
  if (m == "title") return str_value(py_title_method(s));
  if (m == "capitalize") return str_value(py_capitalize(s));
  if (m == "isspace" || m == "isdigit" || m == "isalpha" || m == "isalnum") {
    if (s.empty()) return Value::boolean(false);
    for (size_t i = 0, n; i < s.size(); i += n) {
      char32_t c = decode(s, i, &n);
      bool ok = m == "isspace" ? py_space(c)
                : m == "isdigit" ? (c < 0x80 ? is_digit(char(c)) : bool(std::iswdigit(wint_t(c))))
                : m == "isalpha" ? (c < 0x80 ? (is_word_start(char(c)) && c != '_') : bool(std::iswalpha(wint_t(c))))
                                 : (c < 0x80 ? (is_word(char(c)) && c != '_') : bool(std::iswalnum(wint_t(c))));
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (m == "islower" || m == "isupper") return Value::boolean(apply_test(m.substr(2), Value::string(s), {}, cx));
  fail("str has no method '" + m + "'");
}

}  // namespace

Value call_method(const Function& f, const Array& args, const Kwargs& kws, const CallContext& cx) {
  const Value& self = f.self;
  const std::string& m = f.name;
  if (self.type == Type::String) return str_method(*self.s, m, args, kws, cx);
  if (self.type == Type::Object) {
    if (m == "get") {
      if (args.empty() || args.size() > 2 || !kws.empty()) fail("get() takes 1 or 2 arguments");
      if (args[0].type == Type::String) if (const Value* v = self.o->get(*args[0].s)) return *v;
      return args.size() > 1 ? args[1] : Value::null();
    }
    no_args(m.c_str(), args, kws);
    Value view;
    if (m == "items") { view = filter_items(self, cx); view.view = 1; return view; }
    if (m == "keys") { view = checked_list(iterate(self), cx); view.view = 2; return view; }
    if (m == "values") {
      Array out;
      for (auto& [k, v] : self.o->items) out.push_back(v);
      view = checked_list(std::move(out), cx);
      view.view = 3;
      return view;
    }
    if (m == "copy") return Value::object(std::make_shared<Object>(*self.o));
    fail("access to attribute '" + m + "' of 'dict' object is unsafe.");
  }
  if (self.type == Type::Array) {
    if (m == "count" || m == "index") {
      if (args.size() != 1) fail(m + "() takes exactly one argument");
      int64_t n = 0;
      for (size_t i = 0; i < self.a->items.size(); ++i) {
        if (!py_equal(self.a->items[i], args[0])) continue;
        if (m == "index") return Value::integer(int64_t(i));
        ++n;
      }
      if (m == "index") fail("value is not in list");
      return Value::integer(n);
    }
    if (m == "copy") return checked_list(self.a->items, cx);
    fail("access to attribute '" + m + "' of '" + type_name(self) + "' object is unsafe.");
  }
  fail("'" + std::string(type_name(self)) + "' object has no method '" + m + "'");
}

// ---------------------------------------------------------------- printf-style formatting

Value py_format(const std::string& fmt, const Value& argv) {
  Array pos;
  const Object* mapping = nullptr;
  if (argv.type == Type::Array && argv.tuple) pos = argv.a->items;
  else if (argv.type == Type::Object) mapping = argv.o.get();
  else pos.push_back(argv);
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') { out += fmt[i]; continue; }
    if (++i >= fmt.size()) fail("incomplete format");
    const Value* arg = nullptr;
    Value keyed;
    if (fmt[i] == '(') {
      size_t e = fmt.find(')', i);
      if (e == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      const Value* v = mapping->get(fmt.substr(i + 1, e - i - 1));
      if (!v) fail("KeyError: '" + fmt.substr(i + 1, e - i - 1) + "'");
      keyed = *v;
      arg = &keyed;
      used_mapping = true;
      i = e + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::strchr("-+ #0", fmt[i])) flags += fmt[i++];
    std::string width, prec;
    while (i < fmt.size() && is_digit(fmt[i])) width += fmt[i++];
    bool has_prec = false;
    if (i < fmt.size() && fmt[i] == '.') { has_prec = true; ++i; while (i < fmt.size() && is_digit(fmt[i])) prec += fmt[i++]; }
    if (i >= fmt.size()) fail("incomplete format");
    char conv = fmt[i];
    if (conv == '%') { out += '%'; continue; }
    if (!arg) {
      if (mapping && !(argv.type == Type::Array)) { keyed = argv; arg = &keyed; used_mapping = true; }
      else {
        if (next >= pos.size()) fail("not enough arguments for format string");
        arg = &pos[next++];
      }
    }
    if (width.size() > 6 || prec.size() > 3) fail("format width too large");
    std::string body;
    if (conv == 's' || conv == 'r' || conv == 'a') {
      body = conv == 's' ? py_str(*arg) : py_repr(*arg);
      if (has_prec) {
        auto cps = code_points(body);
        size_t p = prec.empty() ? 0 : std::stoul(prec);
        if (p < cps.size()) { std::string t; for (size_t k = 0; k < p; ++k) t.append(cps[k]); body = t; }
      }
      auto len = cp_count(body);
      size_t w = width.empty() ? 0 : std::stoul(width);
      if (len < w) body = flags.find('-') != std::string::npos ? body + std::string(w - len, ' ') : std::string(w - len, ' ') + body;
    } else if (std::strchr("diouxXeEfFgGc", conv)) {
      if (!is_number(*arg)) fail(std::string("%") + conv + " format: a real number is required, not " + type_name(*arg));
      char spec[64], buf[512];
      if (std::strchr("diouxX", conv)) {
        Value iv = arg->type == Type::Float ? int_of_double(arg->num) : arg->type == Type::Bool ? Value::integer(arg->b) : *arg;
        if (arg->type == Type::Float && conv != 'd' && conv != 'i') fail(std::string("%") + conv + " format: an integer is required, not float");
        if (iv.big) { body = *iv.s; }
        else {
          char c = conv == 'i' || conv == 'u' ? 'd' : conv;
          std::snprintf(spec, sizeof spec, "%%%s%s%s%sll%c", flags.c_str(), width.c_str(), has_prec ? "." : "", prec.c_str(), c);
          std::snprintf(buf, sizeof buf, spec, (long long)iv.i);
          body = buf;
        }
      } else if (conv == 'c') {
        Value iv = *arg;
        std::string ch;
        append_utf8(ch, char32_t(iv.i));
        body = ch;
      } else {
        double d = as_double(*arg);
        if (!std::isfinite(d)) {
          body = std::isnan(d) ? "nan" : d < 0 ? "-inf" : "inf";
          if (std::isupper(static_cast<unsigned char>(conv))) body = py_upper(body);
        } else {
          std::snprintf(spec, sizeof spec, "%%%s%s.%s%c", flags.c_str(), width.c_str(), has_prec ? (prec.empty() ? "0" : prec.c_str()) : "6", conv);
          std::snprintf(buf, sizeof buf, spec, d);
          body = buf;
        }
      }
    } else {
      fail(std::string("unsupported format character '") + conv + "'");
    }
    out += body;
    check_built(out.size());
  }
  if (!mapping && next < pos.size()) fail("not all arguments converted during string formatting");
  (void)used_mapping;
  return str_value(std::move(out));
}

}  // namespace kvroute::jinja
