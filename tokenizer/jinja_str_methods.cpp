// Python's str / dict / list methods as Jinja2's immutable sandbox exposes them (the
// mutating ones fail as "unsafe"), and the Python str helpers they share with the filters
// (case mapping, replace, split, splitlines, padding).
#include <algorithm>
#include <cstdint>
#include <cwctype>
#include <iterator>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/utf8.h"

namespace kvroute::jinja {

// ---------------------------------------------------------------- string helpers

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

std::string repeat(const std::string& s, int64_t n) {
  if (n <= 0) return {};
  check_built(s.size() * size_t(n));
  std::string out;
  for (int64_t k = 0; k < n; ++k) out += s;
  return out;
}

std::string center(const std::string& s, int64_t width, const std::string& fill) {
  auto len = int64_t(cp_count(s));
  if (width <= len) return s;
  int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
  return repeat(fill, left) + s + repeat(fill, marg - left);
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

}  // namespace kvroute::jinja
