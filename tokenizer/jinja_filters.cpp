// Jinja2's builtin filters (with transformers' `tojson`), and what the other builtins
// share: argument binding, Python number conversions, list building.
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

// ---------------------------------------------------------------- argument binding

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

namespace {

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

}  // namespace

Value int_of_double(double d) {
  if (!std::isfinite(d)) fail("cannot convert float infinity or NaN to integer");
  double t = std::trunc(d);
  if (std::fabs(t) < 9.2e18) return Value::integer(int64_t(t));
  char buf[400];
  std::snprintf(buf, sizeof buf, "%.0f", t);
  return Value::big_integer(buf, t);
}

namespace {

// ---------------------------------------------------------------- filter-only string helpers

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

void no_args(const char* name, const Array& args, const Kwargs& kws) {
  if (!args.empty() || !kws.empty()) fail(std::string(name) + "() takes no arguments");
}

Value filter_items(const Value& v, const CallContext& cx) {
  if (v.type == Type::Undefined) return checked_list({}, cx);
  if (!is_mapping(v)) fail("Can only get item pairs from a mapping.");
  Array out;
  for (auto& [k, x] : v.o->items) out.push_back(Value::make_tuple({Value::string(k), x}));
  return checked_list(std::move(out), cx);
}

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

}  // namespace kvroute::jinja
