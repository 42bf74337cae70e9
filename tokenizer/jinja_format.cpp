// Python's printf-style formatting, `str % args`: flags, width, precision, `%(key)s`,
// the conversions Python accepts (s r a d i u o x X e E f F g G c %).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/utf8.h"

namespace kvroute::jinja {

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
