// Jinja subset interpreter matching @huggingface/jinja (see jinja.h). Structure:
// text utilities (UTF-8 / JS string semantics) -> lexer -> parser (AST of Node)
// -> interpreter (per-render scopes, step/depth/size limits) -> JSON conversion.
// Errors inside are thrown as JinjaError and caught at the public boundary.
#include "tokenizer/jinja.h"
#include "tokenizer/utf8.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>

namespace kvroute::jinja {
namespace {

struct JinjaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct BreakSignal {};
struct ContinueSignal {};

[[noreturn]] void fail(const std::string& msg) { throw JinjaError(msg); }

// Largest string any builder may produce during the current render on this thread
// (Limits::max_output_bytes); checked while building, before memory is spent.
thread_local size_t t_max_bytes = 16u << 20;
inline void check_built(size_t n) { if (n > t_max_bytes) fail("Output too large"); }

// ---------------------------------------------------------------- UTF-8 / JS text

// Decodes one code point at s[i]; *len gets its byte length. Input is valid UTF-8
// (checked at the boundary); a stray byte decodes as itself with length 1.
char32_t decode(std::string_view s, size_t i, size_t* len) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) { *len = 1; return c; }
  int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  if (n == 1 || i + n > s.size()) { *len = 1; return c; }
  char32_t cp = c & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}


bool valid_utf8(std::string_view s) { return simdjson::validate_utf8(s.data(), s.size()); }

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0, n; i < s.size(); i += n) { decode(s, i, &n); out.push_back(s.substr(i, n)); }
  return out;
}

// JS `\s` and String.prototype.trim whitespace.
bool js_space(char32_t c) {
  return c == 9 || c == 10 || c == 11 || c == 12 || c == 13 || c == 32 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000 || c == 0xFEFF;
}
size_t space_len(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t n;
  char32_t c = decode(s, i, &n);
  return js_space(c) ? n : 0;
}
std::string_view trim_start(std::string_view s) {
  size_t i = 0, n;
  while ((n = space_len(s, i))) i += n;
  return s.substr(i);
}
std::string_view trim_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t b = end - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    size_t n;
    if (!js_space(decode(s, b, &n)) || b + n != end) break;
    end = b;
  }
  return s.substr(0, end);
}
std::string_view trim(std::string_view s) { return trim_end(trim_start(s)); }

size_t utf16_length(std::string_view s) {
  size_t units = 0;
  for (size_t i = 0, n; i < s.size(); i += n) units += decode(s, i, &n) >= 0x10000 ? 2 : 1;
  return units;
}

bool is_word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// toUpperCase / toLowerCase: ASCII only (documented limitation).
std::string ascii_upper(std::string_view s) {
  std::string r(s);
  for (auto& c : r) if (c >= 'a' && c <= 'z') c = char(c - 32);
  return r;
}
std::string ascii_lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) if (c >= 'A' && c <= 'Z') c = char(c + 32);
  return r;
}

// ECMAScript Number::toString(10).
std::string js_number(double x) {
  if (std::isnan(x)) return "NaN";
  if (x == 0) return "0";
  if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";
  std::string sign = x < 0 ? "-" : "";
  x = std::fabs(x);
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view m(buf, size_t(r.ptr - buf));
  size_t e = m.find('e');
  std::string digits;
  for (char c : m.substr(0, e)) if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int exp = std::atoi(std::string(m.substr(e + 1)).c_str());
  int k = int(digits.size()), n = exp + 1;
  if (k <= n && n <= 21) return sign + digits + std::string(size_t(n - k), '0');
  if (0 < n && n <= 21) return sign + digits.substr(0, size_t(n)) + "." + digits.substr(size_t(n));
  if (-6 < n && n <= 0) return sign + "0." + std::string(size_t(-n), '0') + digits;
  std::string s = sign + digits.substr(0, 1);
  if (k > 1) s += "." + digits.substr(1);
  s += (n - 1 >= 0) ? "e+" : "e-";
  s += std::to_string(std::abs(n - 1));
  return s;
}

// JS Number(string) for loose equality.
double js_to_number(std::string_view s) {
  s = trim(s);
  if (s.empty()) return 0;
  if (s == "Infinity" || s == "+Infinity") return INFINITY;
  if (s == "-Infinity") return -INFINITY;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X' || s[1] == 'o' || s[1] == 'O' || s[1] == 'b' || s[1] == 'B')) {
    int base = (s[1] == 'x' || s[1] == 'X') ? 16 : (s[1] == 'o' || s[1] == 'O') ? 8 : 2;
    double v = 0;
    for (char c : s.substr(2)) {
      int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : 99;
      if (d >= base) return NAN;
      v = v * base + d;
    }
    return v;
  }
  // StrDecimalLiteral: [+-] digits [. digits] [e [+-] digits]
  size_t i = 0;
  if (s[i] == '+' || s[i] == '-') ++i;
  size_t d0 = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  size_t nd = i - d0;
  if (i < s.size() && s[i] == '.') { ++i; size_t f0 = i; while (i < s.size() && is_digit(s[i])) ++i; nd += i - f0; }
  if (nd == 0) return NAN;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t e0 = i;
    while (i < s.size() && is_digit(s[i])) ++i;
    if (i == e0) return NAN;
  }
  if (i != s.size()) return NAN;
  return std::strtod(std::string(s).c_str(), nullptr);
}

void hex4(std::string& out, unsigned v) {
  static const char* k = "0123456789abcdef";
  out += "\\u";
  for (int sh = 12; sh >= 0; sh -= 4) out += k[(v >> sh) & 15];
}

// JSON.stringify(string), optionally followed by the ensure_ascii rewrite of [\x7f-\uffff].
std::string json_quote(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
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
        if (c < 0x20) {
          hex4(out, unsigned(c));
        } else if (ensure_ascii && c >= 0x7F) {
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
  return out;
}

// JS property order of Object.entries: canonical array indices first, ascending.
bool array_index_key(const std::string& k, uint32_t* v) {
  if (k.empty() || k.size() > 10 || (k.size() > 1 && k[0] == '0')) return false;
  uint64_t x = 0;
  for (char c : k) { if (!is_digit(c)) return false; x = x * 10 + uint64_t(c - '0'); }
  if (x >= 4294967295ull) return false;
  *v = uint32_t(x);
  return true;
}

// ---------------------------------------------------------------- lexer

enum class TT : uint8_t {
  Text, Num, Str, Ident, Equals, OpenParen, CloseParen, OpenStmt, CloseStmt, OpenExpr, CloseExpr,
  OpenSq, CloseSq, OpenCurly, CloseCurly, Comma, Dot, Colon, Pipe, Additive, Multiplicative,
  Exponent, Comparison, Unary, Comment, End
};

struct Token {
  TT type;
  std::string value;
};

bool line_start(std::string_view s, size_t i) {
  if (i == 0) return true;
  char p = s[i - 1];
  if (p == '\n' || p == '\r') return true;
  return i >= 3 && static_cast<unsigned char>(s[i - 3]) == 0xE2 && static_cast<unsigned char>(s[i - 2]) == 0x80 &&
         (static_cast<unsigned char>(s[i - 1]) == 0xA8 || static_cast<unsigned char>(s[i - 1]) == 0xA9);
}

// The source rewrites @huggingface/jinja applies before tokenizing: drop one trailing
// newline, lstrip_blocks, trim_blocks, and remove {% generation %} tags.
std::string preprocess(std::string_view src) {
  if (!src.empty() && src.back() == '\n') src.remove_suffix(1);
  std::string a;
  a.reserve(src.size());
  for (size_t i = 0; i < src.size();) {
    if (line_start(src, i)) {
      size_t j = i;
      while (j < src.size() && (src[j] == ' ' || src[j] == '\t')) ++j;
      if (j + 1 < src.size() && src[j] == '{' && (src[j + 1] == '#' || src[j + 1] == '%' || src[j + 1] == '-')) {
        a.append(src.substr(j, 2));
        i = j + 2;
        continue;
      }
    }
    a += src[i++];
  }
  std::string b;
  b.reserve(a.size());
  for (size_t i = 0; i < a.size();) {
    if ((a[i] == '#' || a[i] == '%' || a[i] == '-') && i + 2 < a.size() && a[i + 1] == '}' && a[i + 2] == '\n') {
      b += a[i]; b += '}';
      i += 3;
      continue;
    }
    b += a[i++];
  }
  if (b.find("generation") == std::string::npos) return b;
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  std::string c;
  size_t last_end = 0;
  for (size_t i = 0; i < b.size();) {
    if (b[i] == '{' && i + 1 < b.size() && b[i + 1] == '%') {
      size_t p = i + 2;
      bool lstrip = p < b.size() && b[p] == '-';
      if (lstrip) ++p;
      while (p < b.size() && ws(b[p])) ++p;
      if (b.compare(p, 3, "end") == 0 && b.compare(p + 3, 10, "generation") == 0) p += 3;
      if (b.compare(p, 10, "generation") == 0) {
        p += 10;
        while (p < b.size() && ws(b[p])) ++p;
        bool rstrip = p < b.size() && b[p] == '-';
        if (rstrip) ++p;
        if (b.compare(p, 2, "%}") == 0) {
          p += 2;
          if (lstrip) while (c.size() > last_end && ws(c.back())) c.pop_back();
          size_t q = p;
          while (q < b.size() && ws(b[q])) ++q;
          if (!rstrip) c.append(b, p, q - p);
          i = q;
          last_end = c.size();
          continue;
        }
      }
    }
    c += b[i++];
  }
  return c;
}

std::vector<Token> tokenize(std::string_view source) {
  const std::string src = preprocess(source);
  const size_t n = src.size();
  std::vector<Token> tokens;
  size_t pos = 0;
  int curly = 0;
  auto at = [&](size_t i) -> char { return i < n ? src[i] : '\0'; };
  auto starts = [&](const char* t) { return src.compare(pos, std::strlen(t), t) == 0; };

  auto read_string = [&](char quote) {
    std::string str;
    while (at(pos) != quote) {
      if (pos >= n) fail("Unexpected end of input");
      if (src[pos] == '\\') {
        ++pos;
        if (pos >= n) fail("Unexpected end of input");
        char e = src[pos++];
        if (e == 'x' || e == 'u') {
          size_t len = e == 'x' ? 2 : 4;
          if (pos + len > n) fail(std::string("Invalid hexadecimal escape sequence: \\") + e);
          unsigned v = 0;
          for (size_t k = 0; k < len; ++k) {
            char h = src[pos + k];
            int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) fail(std::string("Invalid hexadecimal escape sequence: \\") + e);
            v = v * 16 + unsigned(d);
          }
          pos += len;
          char32_t cp = v;
          if (cp >= 0xD800 && cp <= 0xDBFF && src.compare(pos, 2, "\\u") == 0 && pos + 6 <= n) {
            unsigned lo = 0;
            bool ok = true;
            for (size_t k = 2; k < 6; ++k) {
              char h = src[pos + k];
              int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
              if (d < 0) { ok = false; break; }
              lo = lo * 16 + unsigned(d);
            }
            if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              pos += 6;
            }
          }
          append_utf8(str, cp);
          continue;
        }
        switch (e) {
          case 'n': str += '\n'; break;
          case 't': str += '\t'; break;
          case 'r': str += '\r'; break;
          case 'b': str += '\b'; break;
          case 'f': str += '\f'; break;
          case 'v': str += '\v'; break;
          case '\'': str += '\''; break;
          case '"': str += '"'; break;
          case '\\': str += '\\'; break;
          default: fail(std::string("Unexpected escaped character: ") + e);
        }
        continue;
      }
      str += src[pos++];
      if (pos >= n) fail("Unexpected end of input");
    }
    return str;
  };
  auto digits = [&] {
    size_t s = pos;
    while (pos < n && is_digit(src[pos])) ++pos;
    return src.substr(s, pos - s);
  };
  auto strip_trailing = [&] {
    if (!tokens.empty() && tokens.back().type == TT::Text) {
      tokens.back().value = std::string(trim_end(tokens.back().value));
      if (tokens.back().value.empty()) tokens.pop_back();
    }
  };
  auto skip_leading = [&] {
    size_t k;
    while ((k = space_len(src, pos))) pos += k;
  };

  static const std::pair<const char*, TT> kTable[] = {
      {"{%", TT::OpenStmt}, {"%}", TT::CloseStmt}, {"{{", TT::OpenExpr}, {"}}", TT::CloseExpr},
      {"(", TT::OpenParen}, {")", TT::CloseParen}, {"{", TT::OpenCurly}, {"}", TT::CloseCurly},
      {"[", TT::OpenSq}, {"]", TT::CloseSq}, {",", TT::Comma}, {".", TT::Dot}, {":", TT::Colon},
      {"|", TT::Pipe}, {"<=", TT::Comparison}, {">=", TT::Comparison}, {"==", TT::Comparison},
      {"!=", TT::Comparison}, {"<", TT::Comparison}, {">", TT::Comparison}, {"+", TT::Additive},
      {"-", TT::Additive}, {"~", TT::Additive}, {"**", TT::Exponent}, {"*", TT::Multiplicative},
      {"//", TT::Multiplicative}, {"/", TT::Multiplicative}, {"%", TT::Multiplicative}, {"=", TT::Equals},
  };

  while (pos < n) {
    TT last = tokens.empty() ? TT::End : tokens.back().type;
    if (tokens.empty() || last == TT::CloseStmt || last == TT::CloseExpr || last == TT::Comment) {
      size_t s = pos;
      while (pos < n && !(src[pos] == '{' && (at(pos + 1) == '%' || at(pos + 1) == '{' || at(pos + 1) == '#'))) ++pos;
      if (pos > s) { tokens.push_back({TT::Text, src.substr(s, pos - s)}); continue; }
    }
    if (src[pos] == '{' && at(pos + 1) == '#') {
      pos += 2;
      bool strip_before = at(pos) == '-';
      if (strip_before) ++pos;
      std::string comment;
      while (at(pos) != '#' || at(pos + 1) != '}') {
        if (pos + 2 >= n) fail("Missing end of comment tag");
        comment += src[pos++];
      }
      bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing();
      tokens.push_back({TT::Comment, std::move(comment)});
      pos += 2;
      if (strip_after) skip_leading();
      continue;
    }
    if (starts("{%-")) { strip_trailing(); tokens.push_back({TT::OpenStmt, "{%"}); pos += 3; continue; }
    if (starts("{{-")) { strip_trailing(); tokens.push_back({TT::OpenExpr, "{{"}); curly = 0; pos += 3; continue; }
    skip_leading();
    if (starts("-%}")) { tokens.push_back({TT::CloseStmt, "%}"}); pos += 3; skip_leading(); continue; }
    if (starts("-}}")) { tokens.push_back({TT::CloseExpr, "}}"}); pos += 3; skip_leading(); continue; }
    if (pos >= n) break;  // only whitespace was left (JS would read undefined and fail below)
    char ch = src[pos];
    if (ch == '-' || ch == '+') {
      TT lt = tokens.empty() ? TT::End : tokens.back().type;
      if (lt == TT::Text || lt == TT::End) fail(std::string("Unexpected character: ") + ch);
      if (!(lt == TT::Ident || lt == TT::Num || lt == TT::Str || lt == TT::CloseParen || lt == TT::CloseSq)) {
        ++pos;
        std::string num = digits();
        if (!num.empty() && at(pos) == '.' && is_digit(at(pos + 1))) { ++pos; num += "." + digits(); }
        tokens.push_back({num.empty() ? TT::Unary : TT::Num, std::string(1, ch) + num});
        continue;
      }
    }
    bool matched = false;
    for (const auto& [seq, type] : kTable) {
      if (type == TT::CloseExpr && curly > 0) continue;
      if (!starts(seq)) continue;
      tokens.push_back({type, seq});
      if (type == TT::OpenExpr) curly = 0;
      else if (type == TT::OpenCurly) ++curly;
      else if (type == TT::CloseCurly) --curly;
      pos += std::strlen(seq);
      matched = true;
      break;
    }
    if (matched) continue;
    if (ch == '\'' || ch == '"') {
      ++pos;
      std::string s = read_string(ch);
      tokens.push_back({TT::Str, std::move(s)});
      ++pos;
      continue;
    }
    if (is_digit(ch)) {
      std::string num = digits();
      if ((tokens.empty() || tokens.back().type != TT::Dot) && at(pos) == '.' && is_digit(at(pos + 1))) {
        ++pos;
        num += "." + digits();
      }
      tokens.push_back({TT::Num, std::move(num)});
      continue;
    }
    if (is_word(ch)) {
      size_t s = pos;
      while (pos < n && is_word(src[pos])) ++pos;
      tokens.push_back({TT::Ident, src.substr(s, pos - s)});
      continue;
    }
    size_t len;
    decode(src, pos, &len);
    fail("Unexpected character: " + src.substr(pos, len));
  }
  return tokens;
}

}  // namespace

// ---------------------------------------------------------------- AST

enum class NK : uint8_t {
  Program, Str, Int, Float, Ident, ArrayLit, TupleLit, ObjectLit, Member, Slice, Call, KwArg, Spread,
  KwSpread, Binary, Unary, Filter, Test, Select, Ternary, If, For, Set, Macro, Break, Continue, Comment,
  FilterStmt
};

// One node type for statements and expressions. Field use per kind:
//   Str: str | Int/Float: num | Ident: str | ArrayLit/TupleLit: list | ObjectLit: list (k0,v0,k1,v1..)
//   Member: x object, y property, flag computed | Slice: x start, y stop, z step (nullable)
//   Call: x callee, list args | KwArg: str key, x value | Spread/KwSpread: x
//   Binary: str op, x, y | Unary: str op, x | Filter: x operand, y filter (Ident or Call)
//   Test: x operand, str test, flag negate | Select: x value, y condition | Ternary: x cond, y, z
//   If: x test, body, alt | For: x target, y iterable, body, alt (else) | Set: x target, y value or body
//   Macro: str name, list params (Ident or KwArg), body | FilterStmt: y filter, body
struct Node {
  NK kind;
  uint8_t op = 0;  // Binary: BinOp, resolved after parsing
  std::string str;
  std::shared_ptr<const std::string> sval;  // Str literals and `.name` properties: shared, no copy per use
  double num = 0;
  bool flag = false;
  uint32_t depth = 1;
  std::unique_ptr<Node> x, y, z;
  std::vector<std::unique_ptr<Node>> list, body, alt;
  explicit Node(NK k) : kind(k) {}
};
using NodePtr = std::unique_ptr<Node>;

namespace {

enum BinOp : uint8_t { kAnd, kOr, kEq, kNe, kIn, kNotIn, kTilde, kPow, kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kLt, kGt, kGe, kLe };

// After parsing: share literal strings and resolve operators, so rendering does
// neither (the tree is read-only from then on).
void finalize(Node* n) {
  if (!n) return;
  if (n->kind == NK::Str) n->sval = std::make_shared<const std::string>(n->str);
  if (n->kind == NK::Member && !n->flag && n->y && n->y->kind == NK::Ident)
    n->y->sval = std::make_shared<const std::string>(n->y->str);
  if (n->kind == NK::Binary) {
    static const char* kOps[] = {"and", "or", "==", "!=", "in", "not in", "~", "**", "+", "-", "*", "/", "//", "%", "<", ">", ">=", "<="};
    for (uint8_t i = 0; i < sizeof kOps / sizeof *kOps; ++i) if (n->str == kOps[i]) n->op = i;
  }
  for (auto* c : {n->x.get(), n->y.get(), n->z.get()}) finalize(c);
  for (auto* v : {&n->list, &n->body, &n->alt}) for (auto& c : *v) finalize(c.get());
}

}  // namespace

namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, uint32_t max_depth) : t_(std::move(tokens)), max_depth_(max_depth) {}

  NodePtr program() {
    auto p = std::make_unique<Node>(NK::Program);
    while (cur_ < t_.size()) p->body.push_back(any());
    return done(std::move(p));
  }

 private:
  std::vector<Token> t_;
  size_t cur_ = 0;
  uint32_t max_depth_;
  uint32_t nest_ = 0;

  struct Guard {
    Parser* p;
    explicit Guard(Parser* q) : p(q) { if (++p->nest_ > p->max_depth_) fail("Template nesting too deep"); }
    ~Guard() { --p->nest_; }
  };

  // Computes the node's depth from its children; bounds AST depth so that evaluation
  // and destruction recursion stay bounded.
  NodePtr done(NodePtr n) {
    uint32_t d = 0;
    for (auto* c : {n->x.get(), n->y.get(), n->z.get()}) if (c) d = std::max(d, c->depth);
    for (auto* v : {&n->list, &n->body, &n->alt}) for (auto& c : *v) d = std::max(d, c->depth);
    n->depth = d + 1;
    if (n->depth > max_depth_) fail("Template nesting too deep");
    return n;
  }
  NodePtr mk(NK k, NodePtr x = nullptr, NodePtr y = nullptr, NodePtr z = nullptr, std::string s = {}) {
    auto n = std::make_unique<Node>(k);
    n->x = std::move(x); n->y = std::move(y); n->z = std::move(z); n->str = std::move(s);
    return done(std::move(n));
  }

  const Token& peek(size_t k = 0) const {
    static const Token kEnd{TT::End, ""};
    return cur_ + k < t_.size() ? t_[cur_ + k] : kEnd;
  }
  bool is(TT t) const { return peek().type == t; }
  bool is2(TT a, TT b) const { return peek().type == a && peek(1).type == b; }
  const Token& next() {
    if (cur_ >= t_.size()) fail("Unexpected end of template");
    return t_[cur_++];
  }
  void expect(TT t, const char* what) {
    if (cur_ >= t_.size() || t_[cur_].type != t) fail(std::string("Parser Error: ") + what);
    ++cur_;
  }
  bool is_ident(const char* name, size_t k = 0) const { return peek(k).type == TT::Ident && peek(k).value == name; }
  void expect_ident(const char* name) {
    if (!is_ident(name)) fail(std::string("Expected ") + name);
    ++cur_;
  }
  bool is_stmt(std::initializer_list<const char*> names) const {
    if (!(peek().type == TT::OpenStmt && peek(1).type == TT::Ident)) return false;
    for (auto* nm : names) if (peek(1).value == nm) return true;
    return false;
  }
  void body_until(std::vector<NodePtr>& body, std::initializer_list<const char*> names) {
    while (!is_stmt(names)) {
      if (cur_ >= t_.size()) fail(std::string("Unexpected end of template: expected {% ") + *names.begin() + " %}");
      body.push_back(any());
    }
  }

  NodePtr any() {
    Guard g(this);
    const Token& t = peek();
    switch (t.type) {
      case TT::Comment: ++cur_; return mk(NK::Comment);
      case TT::Text: { auto n = mk(NK::Str); n->str = next().value; return n; }
      case TT::OpenStmt: return statement();
      case TT::OpenExpr: {
        ++cur_;
        auto e = expression();
        expect(TT::CloseExpr, "Expected closing expression token");
        return e;
      }
      default: fail("Unexpected token type");
    }
  }

  NodePtr statement() {
    expect(TT::OpenStmt, "Expected opening statement token");
    if (!is(TT::Ident)) fail("Unknown statement");
    std::string name = next().value;
    NodePtr r;
    if (name == "set") {
      r = set_statement();
    } else if (name == "if") {
      r = if_statement();
      expect(TT::OpenStmt, "Expected {% token"); expect_ident("endif"); expect(TT::CloseStmt, "Expected %} token");
    } else if (name == "macro") {
      auto m = std::make_unique<Node>(NK::Macro);
      auto id = primary();
      if (id->kind != NK::Ident) fail("Expected identifier following macro statement");
      m->str = id->str;
      args(m->list, true);
      expect(TT::CloseStmt, "Expected closing statement token");
      body_until(m->body, {"endmacro"});
      expect(TT::OpenStmt, "Expected {% token"); expect_ident("endmacro"); expect(TT::CloseStmt, "Expected %} token");
      r = done(std::move(m));
    } else if (name == "for") {
      r = for_statement();
      expect(TT::OpenStmt, "Expected {% token"); expect_ident("endfor"); expect(TT::CloseStmt, "Expected %} token");
    } else if (name == "break" || name == "continue") {
      expect(TT::CloseStmt, "Expected closing statement token");
      r = mk(name == "break" ? NK::Break : NK::Continue);
    } else if (name == "filter") {
      auto f = std::make_unique<Node>(NK::FilterStmt);
      auto fn = primary();
      if (fn->kind == NK::Ident && is(TT::OpenParen)) fn = call(std::move(fn));
      f->y = std::move(fn);
      expect(TT::CloseStmt, "Expected closing statement token");
      body_until(f->body, {"endfilter"});
      expect(TT::OpenStmt, "Expected '{%'"); expect_ident("endfilter"); expect(TT::CloseStmt, "Expected '%}'");
      r = done(std::move(f));
    } else {
      fail("Unknown statement type: " + name);
    }
    return r;
  }

  NodePtr set_statement() {
    auto s = std::make_unique<Node>(NK::Set);
    s->x = sequence(false);
    if (is(TT::Equals)) {
      ++cur_;
      s->y = sequence(false);
    } else {
      expect(TT::CloseStmt, "Expected %} token");
      body_until(s->body, {"endset"});
      expect(TT::OpenStmt, "Expected {% token");
      expect_ident("endset");
    }
    expect(TT::CloseStmt, "Expected closing statement token");
    return done(std::move(s));
  }

  NodePtr if_statement() {
    Guard g(this);
    auto n = std::make_unique<Node>(NK::If);
    n->x = expression();
    expect(TT::CloseStmt, "Expected closing statement token");
    body_until(n->body, {"elif", "else", "endif"});
    if (is_stmt({"elif"})) {
      cur_ += 2;
      n->alt.push_back(if_statement());
    } else if (is_stmt({"else"})) {
      cur_ += 2;
      expect(TT::CloseStmt, "Expected closing statement token");
      body_until(n->alt, {"endif"});
    }
    return done(std::move(n));
  }

  NodePtr for_statement() {
    auto n = std::make_unique<Node>(NK::For);
    n->x = sequence(true);
    if (n->x->kind != NK::Ident && n->x->kind != NK::TupleLit) fail("Expected identifier/tuple for the loop variable");
    if (!is_ident("in")) fail("Expected `in` keyword following loop variable");
    ++cur_;
    n->y = expression();
    expect(TT::CloseStmt, "Expected closing statement token");
    body_until(n->body, {"endfor", "else"});
    if (is_stmt({"else"})) {
      cur_ += 2;
      expect(TT::CloseStmt, "Expected closing statement token");
      body_until(n->alt, {"endfor"});
    }
    return done(std::move(n));
  }

  NodePtr sequence(bool primary_only) {
    auto first = primary_only ? primary() : expression();
    if (!is(TT::Comma)) return first;
    auto t = std::make_unique<Node>(NK::TupleLit);
    t->list.push_back(std::move(first));
    while (is(TT::Comma)) {
      ++cur_;
      t->list.push_back(primary_only ? primary() : expression());
    }
    return done(std::move(t));
  }

  NodePtr expression() {
    Guard g(this);
    auto a = logical_or();
    if (is_ident("if")) {
      ++cur_;
      auto test = logical_or();
      if (is_ident("else")) {
        ++cur_;
        auto f = expression();
        return mk(NK::Ternary, std::move(test), std::move(a), std::move(f));
      }
      return mk(NK::Select, std::move(a), std::move(test));
    }
    return a;
  }
  NodePtr logical_or() {
    auto l = logical_and();
    while (is_ident("or")) { ++cur_; l = mk(NK::Binary, std::move(l), logical_and(), nullptr, "or"); }
    return l;
  }
  NodePtr logical_and() {
    auto l = logical_not();
    while (is_ident("and")) { ++cur_; l = mk(NK::Binary, std::move(l), logical_not(), nullptr, "and"); }
    return l;
  }
  NodePtr logical_not() {
    if (is_ident("not")) {
      Guard g(this);
      ++cur_;
      return mk(NK::Unary, logical_not(), nullptr, nullptr, "not");
    }
    return comparison();
  }
  NodePtr comparison() {
    auto l = additive();
    for (;;) {
      std::string op;
      if (is_ident("not") && is_ident("in", 1)) { op = "not in"; cur_ += 2; }
      else if (is_ident("in")) { op = "in"; ++cur_; }
      else if (is(TT::Comparison)) { op = next().value; }
      else break;
      l = mk(NK::Binary, std::move(l), additive(), nullptr, op);
    }
    return l;
  }
  NodePtr additive() {
    auto l = multiplicative();
    while (is(TT::Additive)) { std::string op = next().value; l = mk(NK::Binary, std::move(l), multiplicative(), nullptr, op); }
    return l;
  }
  NodePtr multiplicative() {
    auto l = power();
    while (is(TT::Multiplicative)) { std::string op = next().value; l = mk(NK::Binary, std::move(l), power(), nullptr, op); }
    return l;
  }
  NodePtr power() {
    auto l = test();
    while (is(TT::Exponent)) { std::string op = next().value; l = mk(NK::Binary, std::move(l), test(), nullptr, op); }
    return l;
  }
  NodePtr test() {
    auto operand = filter();
    while (is_ident("is")) {
      ++cur_;
      bool negate = is_ident("not");
      if (negate) ++cur_;
      auto t = primary();
      if (t->kind != NK::Ident) fail("Expected identifier for the test");
      operand = mk(NK::Test, std::move(operand), nullptr, nullptr, t->str);
      operand->flag = negate;
    }
    return operand;
  }
  NodePtr filter() {
    auto operand = unary_sign();
    while (is(TT::Pipe)) {
      ++cur_;
      auto f = primary();
      if (f->kind != NK::Ident) fail("Expected identifier for the filter");
      if (is(TT::OpenParen)) f = call(std::move(f));
      operand = mk(NK::Filter, std::move(operand), std::move(f));
    }
    return operand;
  }
  NodePtr unary_sign() {
    const Token& t = peek();
    if ((t.type == TT::Unary || t.type == TT::Additive) && (t.value == "-" || t.value == "+")) {
      Guard g(this);
      std::string op = next().value;
      return mk(NK::Unary, unary_sign(), nullptr, nullptr, op);
    }
    auto m = member(primary());
    if (is(TT::OpenParen)) return call(std::move(m));
    return m;
  }
  NodePtr call(NodePtr callee) {
    auto c = std::make_unique<Node>(NK::Call);
    c->x = std::move(callee);
    args(c->list, false);
    NodePtr e = member(done(std::move(c)));
    if (is(TT::OpenParen)) e = call(std::move(e));
    return e;
  }
  void args(std::vector<NodePtr>& out, bool params) {
    Guard g(this);
    expect(TT::OpenParen, "Expected opening parenthesis for arguments list");
    bool saw_kw = false, saw_spread = false;
    while (!is(TT::CloseParen)) {
      if (cur_ >= t_.size()) fail("Expected closing parenthesis for arguments list");
      bool kw_spread = is(TT::Exponent);
      bool pos_spread = is(TT::Multiplicative) && peek().value == "*";
      if (params && (kw_spread || pos_spread)) fail("Argument unpacking is not allowed in parameter declarations");
      if (kw_spread) {
        ++cur_;
        out.push_back(mk(NK::KwSpread, expression()));
        if (is(TT::Comma)) ++cur_;
        if (!is(TT::CloseParen)) fail("Expected closing parenthesis: `**` must be applied to the final argument");
        break;
      }
      NodePtr arg;
      if (pos_spread) {
        if (saw_spread) fail("Only one `*` argument unpacking is allowed");
        saw_spread = true;
        ++cur_;
        arg = mk(NK::Spread, expression());
      } else {
        arg = expression();
        if (is(TT::Equals)) {
          ++cur_;
          if (arg->kind != NK::Ident) fail("Expected identifier for keyword argument");
          auto kw = mk(NK::KwArg, expression(), nullptr, nullptr, arg->str);
          arg = std::move(kw);
        }
        if (params) {
          if (arg->kind != NK::Ident && arg->kind != NK::KwArg) fail("Expected identifier for parameter declaration");
          for (auto& p : out) if (p->str == arg->str) fail("Duplicate parameter name: " + arg->str);
        }
        if (arg->kind == NK::KwArg) saw_kw = true;
        else if (saw_kw) fail(params ? "Non-default argument follows default argument" : "Positional arguments must come before keyword arguments");
        else if (saw_spread) fail("Positional arguments must not follow `*` argument unpacking");
      }
      out.push_back(std::move(arg));
      if (is(TT::Comma)) ++cur_;
    }
    expect(TT::CloseParen, "Expected closing parenthesis for arguments list");
  }
  NodePtr member(NodePtr obj) {
    while (is(TT::Dot) || is(TT::OpenSq)) {
      bool computed = next().type == TT::OpenSq;
      NodePtr prop;
      if (computed) {
        Guard g(this);
        std::vector<NodePtr> parts;
        bool slice = false;
        while (!is(TT::CloseSq)) {
          if (cur_ >= t_.size()) fail("Expected closing square bracket");
          if (is(TT::Colon)) { parts.push_back(nullptr); ++cur_; slice = true; }
          else {
            parts.push_back(expression());
            if (is(TT::Colon)) { ++cur_; slice = true; }
          }
        }
        if (parts.empty()) fail("Expected at least one argument for member/slice expression");
        if (slice) {
          if (parts.size() > 3) fail("Expected 0-3 arguments for slice expression");
          parts.resize(3);
          prop = mk(NK::Slice, std::move(parts[0]), std::move(parts[1]), std::move(parts[2]));
        } else {
          prop = std::move(parts[0]);
        }
        expect(TT::CloseSq, "Expected closing square bracket");
      } else {
        prop = primary();
        if (prop->kind != NK::Ident && prop->kind != NK::Int) fail("Expected identifier or integer following dot operator");
      }
      obj = mk(NK::Member, std::move(obj), std::move(prop));
      obj->flag = computed;
    }
    return obj;
  }
  NodePtr primary() {
    Guard g(this);
    const Token& t = next();
    switch (t.type) {
      case TT::Num: {
        auto n = mk(t.value.find('.') != std::string::npos ? NK::Float : NK::Int);
        n->num = std::strtod(t.value.c_str(), nullptr);
        return n;
      }
      case TT::Str: {
        auto n = mk(NK::Str);
        n->str = t.value;
        while (is(TT::Str)) n->str += next().value;
        return n;
      }
      case TT::Ident: return mk(NK::Ident, nullptr, nullptr, nullptr, t.value);
      case TT::OpenParen: {
        auto e = sequence(false);
        expect(TT::CloseParen, "Expected closing parenthesis");
        return e;
      }
      case TT::OpenSq: {
        auto a = std::make_unique<Node>(NK::ArrayLit);
        while (!is(TT::CloseSq)) {
          if (cur_ >= t_.size()) fail("Expected closing square bracket");
          a->list.push_back(expression());
          if (is(TT::Comma)) ++cur_;
        }
        ++cur_;
        return done(std::move(a));
      }
      case TT::OpenCurly: {
        auto o = std::make_unique<Node>(NK::ObjectLit);
        while (!is(TT::CloseCurly)) {
          if (cur_ >= t_.size()) fail("Expected closing curly bracket");
          o->list.push_back(expression());
          expect(TT::Colon, "Expected colon between key and value in object literal");
          o->list.push_back(expression());
          if (is(TT::Comma)) ++cur_;
        }
        ++cur_;
        return done(std::move(o));
      }
      default: fail("Unexpected token: " + t.value);
    }
  }
};

}  // namespace

// ---------------------------------------------------------------- values

struct Function {
  enum Kind : uint8_t { Namespace, Raise, Range, Strftime, Macro, StrMethod, ObjMethod } kind;
  std::string name;
  const Node* macro = nullptr;
  Value self;
};

Value Value::string(std::string x) {
  Value v;
  v.type = Type::String;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}
static uint32_t depth_of(const Value& v) {
  if ((v.type == Type::Array) && v.a) return v.a->depth;
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

namespace {

const char* type_name(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "UndefinedValue";
    case Type::Null: return "NullValue";
    case Type::Bool: return "BooleanValue";
    case Type::Int: return "IntegerValue";
    case Type::Float: return "FloatValue";
    case Type::String: return "StringValue";
    case Type::Array: return v.tuple ? "TupleValue" : "ArrayValue";
    case Type::Object: return v.kwargs ? "KeywordArgumentsValue" : "ObjectValue";
    case Type::Namespace: return "NamespaceValue";
    case Type::Function: return "FunctionValue";
  }
  return "?";
}

bool is_number(const Value& v) { return v.type == Type::Int || v.type == Type::Float; }
bool is_container(const Value& v) { return v.type == Type::Object || v.type == Type::Namespace; }

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::Undefined: case Type::Null: return false;
    case Type::Bool: return v.b;
    case Type::Int: case Type::Float: return v.num != 0 && !std::isnan(v.num);
    case Type::String: return !v.s->empty();
    case Type::Array: return !v.a->items.empty();
    case Type::Object: return v.o->size() > 0;
    case Type::Namespace: case Type::Function: return true;
  }
  return false;
}

std::string float_display(double x) {
  if (x == 0 && std::signbit(x)) return "-0.0";
  if (std::isfinite(x) && std::fmod(x, 1.0) == 0) {
    std::string s = js_number(x);
    return std::fabs(x) < 1e21 ? s + ".0" : s;
  }
  return js_number(x);
}

struct JsonOptions {
  int indent = -1;  // < 0 or 0: none
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_sep, key_sep;
};

constexpr uint32_t kValueDepth = 512;

void to_json_impl(const Value& v, const JsonOptions& o, uint32_t depth, bool undef_null, std::string& out) {
  if (depth > kValueDepth) fail("Value nested too deeply");
  switch (v.type) {
    case Type::Null: out += "null"; return;
    case Type::Undefined: out += undef_null ? "null" : "undefined"; return;
    case Type::Int: case Type::Float: out += std::isfinite(v.num) ? js_number(v.num) : "null"; return;
    case Type::Bool: out += v.b ? "true" : "false"; return;
    case Type::String: out += json_quote(*v.s, o.ensure_ascii); return;
    case Type::Function: fail("Cannot convert to JSON: FunctionValue");
    case Type::Array: if (v.tuple) fail("Cannot convert to JSON: TupleValue"); break;
    default: break;
  }
  bool indent = o.indent > 0;
  std::string item_sep = o.has_separators ? o.item_sep : indent ? "," : ", ";
  std::string key_sep = o.has_separators ? o.key_sep : ": ";
  std::string base, child;
  if (indent) {
    base = "\n" + std::string(size_t(o.indent) * depth, ' ');
    child = base + std::string(size_t(o.indent), ' ');
  }
  if (v.type == Type::Array) {
    const auto& items = v.a->items;
    out += '[';
    if (indent && !items.empty()) out += child;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) { out += item_sep; if (indent) out += child; }
      to_json_impl(items[i], o, depth + 1, undef_null, out);
      check_built(out.size());
    }
    if (indent && !items.empty()) out += base;
    out += ']';
    return;
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (auto& e : v.o->items) entries.push_back(&e);
  if (o.sort_keys) std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += item_sep;
    if (indent) out += child;
    out += json_quote(entries[i]->first, o.ensure_ascii);
    out += key_sep;
    to_json_impl(entries[i]->second, o, depth + 1, undef_null, out);
    check_built(out.size());
  }
  if (indent && !entries.empty()) out += base;
  out += '}';
}

std::string to_json_str(const Value& v, const JsonOptions& o, bool undef_null) {
  std::string out;
  to_json_impl(v, o, 0, undef_null, out);
  return out;
}

// RuntimeValue.toString(): how {{ value }} prints.
std::string display(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "undefined";
    case Type::Null: return "undefined";  // upstream NullValue holds JS undefined, not null
    case Type::Bool: return v.b ? "true" : "false";
    case Type::Int: return js_number(v.num);
    case Type::Float: return float_display(v.num);
    case Type::String: return *v.s;
    case Type::Array: case Type::Object: case Type::Namespace: return to_json_str(v, {}, false);
    case Type::Function: return "[function]";  // JS prints the function source: not reproduced
  }
  return "";
}

// JS String(x.value): what `+` and `~` concatenate.
std::string raw_string(const Value& v, uint32_t depth = 0) {
  if (depth > kValueDepth) fail("Value nested too deeply");
  switch (v.type) {
    case Type::Int: case Type::Float: return js_number(v.num);
    case Type::Array: {
      std::string r;
      for (size_t i = 0; i < v.a->items.size(); ++i) {
        if (i) r += ',';
        r += display(v.a->items[i]);
        check_built(r.size());
      }
      return r;
    }
    case Type::Object: case Type::Namespace: return "[object Map]";
    default: return display(v);
  }
}

bool same_identity(const Value& a, const Value& b) {
  if (a.type == Type::Array) return a.a == b.a;
  if (a.type == Type::Function) return a.f == b.f;
  return a.o == b.o;
}

enum class JsKind { Undefined, Null, Boolean, Number, String, Object };
JsKind js_kind(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return JsKind::Undefined;
    case Type::Null: return JsKind::Null;
    case Type::Bool: return JsKind::Boolean;
    case Type::Int: case Type::Float: return JsKind::Number;
    case Type::String: return JsKind::String;
    default: return JsKind::Object;
  }
}

// `x.value === y.value` (a NullValue's value is JS undefined upstream).
bool strict_equal(const Value& a, const Value& b) {
  JsKind ka = js_kind(a), kb = js_kind(b);
  if (ka == JsKind::Null) ka = JsKind::Undefined;
  if (kb == JsKind::Null) kb = JsKind::Undefined;
  if (ka != kb) return false;
  switch (ka) {
    case JsKind::Undefined: case JsKind::Null: return true;
    case JsKind::Boolean: return a.b == b.b;
    case JsKind::Number: return a.num == b.num;
    case JsKind::String: return *a.s == *b.s;
    case JsKind::Object: return (a.type == b.type || (is_container(a) && is_container(b))) && same_identity(a, b);
  }
  return false;
}

// `x.value == y.value` (JS IsLooselyEqual).
bool loose_equal(const Value& a, const Value& b) {
  JsKind ka = js_kind(a), kb = js_kind(b);
  if (ka == kb) return strict_equal(a, b);
  bool na = ka == JsKind::Null || ka == JsKind::Undefined, nb = kb == JsKind::Null || kb == JsKind::Undefined;
  if (na || nb) return na && nb;
  if (ka == JsKind::Boolean) return loose_equal(Value::integer(a.b ? 1 : 0), b);
  if (kb == JsKind::Boolean) return loose_equal(a, Value::integer(b.b ? 1 : 0));
  if (ka == JsKind::Number && kb == JsKind::String) return a.num == js_to_number(*b.s);
  if (ka == JsKind::String && kb == JsKind::Number) return js_to_number(*a.s) == b.num;
  if (ka == JsKind::Object) return loose_equal(Value::string(raw_string(a)), b);
  if (kb == JsKind::Object) return loose_equal(a, Value::string(raw_string(b)));
  return false;
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.type == Type::Null && b.type == Type::Null) return 0;
  if (a.type == Type::Null || b.type == Type::Null) fail(std::string("Cannot compare ") + type_name(a) + " with " + type_name(b));
  if (a.type == Type::Undefined && b.type == Type::Undefined) return 0;
  if (a.type == Type::Undefined || b.type == Type::Undefined) fail(std::string("Cannot compare ") + type_name(a) + " with " + type_name(b));
  auto numeric = [](const Value& v) { return is_number(v) || v.type == Type::Bool; };
  auto num = [](const Value& v) { return v.type == Type::Bool ? (v.b ? 1.0 : 0.0) : v.num; };
  if (numeric(a) && numeric(b)) { double x = num(a), y = num(b); return x < y ? -1 : x > y ? 1 : 0; }
  if (a.type != b.type) fail(std::string("Cannot compare different types: ") + type_name(a) + " and " + type_name(b));
  if (a.type == Type::String) {
    std::string x = case_sensitive ? *a.s : ascii_lower(*a.s), y = case_sensitive ? *b.s : ascii_lower(*b.s);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  fail(std::string("Cannot compare type: ") + type_name(a));
}

// JS Array.prototype.slice-like stepping as in @huggingface/jinja utils.slice.
template <class T>
std::vector<T> js_slice(const std::vector<T>& arr, const Value& vstart, const Value& vstop, const Value& vstep) {
  double len = double(arr.size());
  double step = vstep.type == Type::Undefined ? 1 : vstep.num;
  double start, stop;
  int dir = step > 0 ? 1 : step < 0 ? -1 : 0;
  if (dir >= 0) {
    start = vstart.type == Type::Undefined ? 0 : vstart.num;
    start = start < 0 ? std::max(len + start, 0.0) : std::min(start, len);
    stop = vstop.type == Type::Undefined ? len : vstop.num;
    stop = stop < 0 ? std::max(len + stop, 0.0) : std::min(stop, len);
  } else {
    start = vstart.type == Type::Undefined ? len - 1 : vstart.num;
    start = start < 0 ? std::max(len + start, -1.0) : std::min(start, len - 1);
    stop = vstop.type == Type::Undefined ? -1 : vstop.num;
    stop = stop < -1 ? std::max(len + stop, -1.0) : std::min(stop, len - 1);
  }
  std::vector<T> out;
  if (dir == 0) return out;
  for (double i = start; dir * i < dir * stop; i += step) {
    if (i >= 0 && i < len) out.push_back(arr[size_t(i)]);
    else out.push_back(T{});
  }
  return out;
}

std::string js_replace(const std::string& s, const std::string& from, const std::string& to, double count) {
  if (count == 0 || std::isnan(count)) return s;  // upstream: NaN count replaces nothing
  double remaining = count < 0 ? INFINITY : count;
  std::string out;
  if (from.empty()) {
    // The regex (?=) with the u flag matches before every code point and at the end.
    size_t i = 0, n;
    for (; i < s.size(); i += n) {
      if (remaining > 0) { out += to; --remaining; check_built(out.size()); }
      decode(s, i, &n);
      out.append(s, i, n);
    }
    if (remaining > 0) out += to;
    return out;
  }
  size_t i = 0;
  for (;;) {
    size_t p = s.find(from, i);
    if (p == std::string::npos || remaining <= 0) break;
    out.append(s, i, p - i);
    out += to;
    check_built(out.size());
    --remaining;
    i = p + from.size();
  }
  out.append(s, i, std::string::npos);
  return out;
}

std::string title_case(std::string_view s) {
  std::string r(s);
  for (size_t i = 0; i < r.size(); ++i)
    if (is_word(r[i]) && (i == 0 || !is_word(r[i - 1])) && r[i] >= 'a' && r[i] <= 'z') r[i] = char(r[i] - 32);
  return r;
}

// String.prototype.at on UTF-16 units.
Value string_at(const std::string& s, double idx) {
  double len = double(utf16_length(s));
  if (idx < 0) idx += len;
  if (idx < 0 || idx >= len) return Value();
  size_t unit = 0;
  for (size_t i = 0, n; i < s.size(); i += n) {
    char32_t cp = decode(s, i, &n);
    size_t w = cp >= 0x10000 ? 2 : 1;
    if (double(unit) == idx) return Value::string(w == 2 ? "\xEF\xBF\xBD" : s.substr(i, n));
    if (w == 2 && double(unit + 1) == idx) return Value::string("\xEF\xBF\xBD");
    unit += w;
  }
  return Value();
}

Value make_function(Function::Kind k, std::string name, Value self = {}, const Node* macro = nullptr) {
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

const char* const kStringMethods[] = {"upper", "lower", "strip", "title", "capitalize", "rstrip", "lstrip",
                                      "startswith", "endswith", "split", "replace", "rsplit", "find"};
const char* const kObjectMethods[] = {"get", "items", "keys", "values", "dictsort"};

Value object_builtin(const Value& obj, const std::string& name) {
  for (auto* m : kObjectMethods) if (name == m) return make_function(Function::ObjMethod, name, obj);
  return Value();
}
Value string_builtin(const Value& str, const std::string& name) {
  if (name == "length") return Value::integer(double(utf16_length(*str.s)));
  for (auto* m : kStringMethods) if (name == m) return make_function(Function::StrMethod, name, str);
  return Value();
}

// ---------------------------------------------------------------- interpreter

struct Env {
  std::unordered_map<std::string, Value> vars;
  Env* parent = nullptr;
  const Value* lookup(const std::string& name) const {
    for (const Env* e = this; e; e = e->parent) {
      auto it = e->vars.find(name);
      if (it != e->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

class Interp {
 public:
  explicit Interp(const RenderOptions& o) : opt_(o), lim_(o.limits), saved_max_bytes_(t_max_bytes) {
    t_max_bytes = lim_.max_output_bytes;
  }
  ~Interp() {
    t_max_bytes = saved_max_bytes_;
    // Namespaces are the only mutable values: clearing them breaks any reference
    // cycle the template built and keeps destruction non-recursive.
    for (auto& ns : namespaces_) { ns->items.clear(); ns->index.clear(); }
  }

  std::string block(const std::vector<NodePtr>& stmts, Env& env) {
    std::string out;
    for (auto& s : stmts) {
      Value v = eval(s.get(), env);
      if (v.type == Type::Null || v.type == Type::Undefined) continue;
      if (v.type == Type::String) out += *v.s; else out += display(v);
      check_size(out.size());
    }
    return out;
  }

 private:
  const RenderOptions& opt_;
  const Limits& lim_;
  size_t saved_max_bytes_;
  uint64_t steps_ = 0;
  uint32_t depth_ = 0;
  std::vector<std::shared_ptr<Object>> namespaces_;

  struct Depth {
    Interp* in;
    explicit Depth(Interp* i) : in(i) { if (++in->depth_ > in->lim_.max_depth) fail("Maximum recursion depth exceeded"); }
    ~Depth() { --in->depth_; }
  };

  void check_size(size_t n) const { if (n > lim_.max_output_bytes) fail("Output too large"); }
  void check_items(size_t n) const { if (n > lim_.max_items) fail("Too many items"); }
  Value checked_array(Array items) {
    check_items(items.size());
    Value v = Value::array(std::move(items));
    if (v.a->depth > kValueDepth) fail("Value nested too deeply");
    return v;
  }
  Value str(std::string s) {
    static const std::shared_ptr<const std::string> kEmpty = std::make_shared<const std::string>();
    check_size(s.size());
    if (!s.empty()) return Value::string(std::move(s));
    Value v;
    v.type = Type::String;
    v.s = kEmpty;
    return v;
  }

 public:
  Value eval(const Node* n, Env& env) {
    if (!n) return Value();
    if (++steps_ > lim_.max_steps) fail("Template evaluation step limit exceeded");
    Depth d(this);
    switch (n->kind) {
      case NK::Program: return str(block(n->body, env));
      case NK::Str: { Value v; v.type = Type::String; v.s = n->sval; return v; }
      case NK::Int: return Value::integer(n->num);
      case NK::Float: return Value::floating(n->num);
      case NK::Ident: { const Value* v = env.lookup(n->str); return v ? *v : Value(); }
      case NK::ArrayLit: case NK::TupleLit: {
        Array items;
        for (auto& c : n->list) items.push_back(eval(c.get(), env));
        Value v = checked_array(std::move(items));
        v.tuple = n->kind == NK::TupleLit;
        return v;
      }
      case NK::ObjectLit: {
        auto obj = std::make_shared<Object>();
        for (size_t i = 0; i + 1 < n->list.size(); i += 2) {
          Value k = eval(n->list[i].get(), env);
          if (k.type != Type::String) fail(std::string("Object keys must be strings: got ") + type_name(k));
          obj->set(*k.s, eval(n->list[i + 1].get(), env));
        }
        if (obj->depth > kValueDepth) fail("Value nested too deeply");
        return Value::object(std::move(obj));
      }
      case NK::Member: return member(n, env);
      case NK::Call: return call_expr(n, env);
      case NK::Binary: return binary(n, env);
      case NK::Unary: return unary(n, env);
      case NK::Filter: return apply_filter(eval(n->x.get(), env), n->y.get(), env);
      case NK::Test: return test(n, env);
      case NK::Select: {
        if (!truthy(eval(n->y.get(), env))) return Value();
        return eval(n->x.get(), env);
      }
      case NK::Ternary: return truthy(eval(n->x.get(), env)) ? eval(n->y.get(), env) : eval(n->z.get(), env);
      case NK::If: return str(block(truthy(eval(n->x.get(), env)) ? n->body : n->alt, env));
      case NK::For: return for_loop(n, env);
      case NK::Set: return set(n, env);
      case NK::Macro: env.vars[n->str] = make_function(Function::Macro, n->str, {}, n); return Value::null();
      case NK::Break: throw BreakSignal{};
      case NK::Continue: throw ContinueSignal{};
      case NK::Comment: return Value::null();
      case NK::FilterStmt: return apply_filter(str(block(n->body, env)), n->y.get(), env);
      case NK::Slice: case NK::KwArg: case NK::Spread: case NK::KwSpread: break;
    }
    fail("Unknown node type");
  }

 private:
  using Kwargs = std::vector<std::pair<std::string, Value>>;

  static const Value* kw(const Kwargs& k, const char* name) {
    for (auto& [key, v] : k) if (key == name) return &v;
    return nullptr;
  }

  void eval_args(const std::vector<NodePtr>& args, Env& env, Array* pos, Kwargs* kws) {
    for (auto& a : args) {
      if (a->kind == NK::Spread) {
        Value v = eval(a->x.get(), env);
        if (v.type != Type::Array) fail(std::string("Cannot unpack non-iterable type: ") + type_name(v));
        for (auto& x : v.a->items) pos->push_back(x);
      } else if (a->kind != NK::KwArg && a->kind != NK::KwSpread) {
        pos->push_back(eval(a.get(), env));
      }
    }
    auto add = [&](const std::string& k, Value v) {
      if (kw(*kws, k.c_str())) fail("Got multiple values for keyword argument '" + k + "'");
      kws->emplace_back(k, std::move(v));
    };
    for (auto& a : args) {
      if (a->kind == NK::KwArg) {
        add(a->str, eval(a->x.get(), env));
      } else if (a->kind == NK::KwSpread) {
        Value v = eval(a->x.get(), env);
        if (v.type != Type::Object) fail(std::string("Argument after ** must be a mapping, not ") + type_name(v));
        for (auto& [k, x] : v.o->items) add(k, x);
      }
    }
  }

  static Value kwargs_value(const Kwargs& k) {
    auto obj = std::make_shared<Object>();
    for (auto& [key, v] : k) obj->set(key, v);
    Value v = Value::object(std::move(obj));
    v.kwargs = true;
    return v;
  }

  Value member(const Node* n, Env& env) {
    Value obj = eval(n->x.get(), env);
    Value prop;
    if (n->flag) {
      if (n->y->kind == NK::Slice) return slice(obj, n->y.get(), env);
      prop = eval(n->y.get(), env);
    } else if (n->y->kind == NK::Int) {
      prop = Value::integer(n->y->num);
    } else {
      prop.type = Type::String;
      prop.s = n->y->sval;
    }
    if (is_container(obj)) {
      if (prop.type != Type::String) fail(std::string("Cannot access property with non-string: got ") + type_name(prop));
      if (const Value* v = obj.o->get(*prop.s)) return *v;
      return obj.type == Type::Object ? object_builtin(obj, *prop.s) : Value();
    }
    if (obj.type == Type::Array || obj.type == Type::String) {
      if (prop.type == Type::Int) {
        double idx = std::isnan(prop.num) ? 0 : prop.num;  // Array.prototype.at: NaN -> 0
        if (obj.type == Type::String) return string_at(*obj.s, idx);
        double len = double(obj.a->items.size()), i = idx < 0 ? idx + len : idx;
        if (i < 0 || i >= len) return Value();
        return obj.a->items[size_t(i)];
      }
      if (prop.type == Type::String) {
        if (obj.type == Type::String) return string_builtin(obj, *prop.s);
        if (*prop.s == "length") return Value::integer(double(obj.a->items.size()));
        return Value();
      }
      fail(std::string("Cannot access property with non-string/non-number: got ") + type_name(prop));
    }
    if (prop.type != Type::String) fail(std::string("Cannot access property with non-string: got ") + type_name(prop));
    return Value();
  }

  Value slice(const Value& obj, const Node* s, Env& env) {
    if (obj.type != Type::Array && obj.type != Type::String) fail("Slice object must be an array or string");
    Value a = eval(s->x.get(), env), b = eval(s->y.get(), env), c = eval(s->z.get(), env);
    for (auto* v : {&a, &b, &c})
      if (v->type != Type::Int && v->type != Type::Undefined) fail("Slice start must be numeric or undefined");
    if (obj.type == Type::Array) return checked_array(js_slice(obj.a->items, a, b, c));
    auto cps = code_points(*obj.s);
    std::string out;
    for (auto& cp : js_slice(cps, a, b, c)) out.append(cp);
    return Value::string(std::move(out));
  }

  Value call_expr(const Node* n, Env& env) {
    Array args;
    Kwargs kws;
    eval_args(n->list, env, &args, &kws);
    if (!kws.empty()) args.push_back(kwargs_value(kws));
    Value fn = eval(n->x.get(), env);
    if (fn.type != Type::Function) fail(std::string("Cannot call something that is not a function: got ") + type_name(fn));
    return call(*fn.f, args, env);
  }

  Value call(const Function& f, Array& args, Env& env) {
    switch (f.kind) {
      case Function::Namespace: return make_namespace(args);
      case Function::Raise:
        fail(args.empty() || args[0].type == Type::Null || args[0].type == Type::Undefined ? std::string() : raw_string(args[0]));
      case Function::Range: return range(args);
      case Function::Strftime: return strftime_now(args);
      case Function::Macro: return call_macro(f, args, env);
      case Function::StrMethod: return string_method(*f.self.s, f.name, args);
      case Function::ObjMethod: return object_method(f.self, f.name, args);
    }
    fail("bad function");
  }

  Value make_namespace(Array& args) {
    Value kwv;
    if (!args.empty() && args.back().type == Type::Object && args.back().kwargs) { kwv = args.back(); args.pop_back(); }
    if (args.size() > 1) fail("namespace expected at most 1 argument, got " + std::to_string(args.size()));
    auto ns = std::make_shared<Object>();
    if (args.size() == 1) {
      const Value& src = args[0];
      if (src.type == Type::Object) {
        for (auto& [k, v] : src.o->items) ns->set(k, v);
      } else if (src.type == Type::Array) {
        for (auto& pair : src.a->items) {
          Array kv;
          if (pair.type == Type::Array) kv = pair.a->items;
          else if (pair.type == Type::String) for (auto cp : code_points(*pair.s)) kv.push_back(Value::string(std::string(cp)));
          if (kv.size() != 2) fail("namespace expected an object or an iterable of [key, value] pairs");
          if (kv[0].type != Type::String) fail("namespace keys must be strings");
          ns->set(*kv[0].s, kv[1]);
        }
      } else {
        fail(std::string("'") + type_name(src) + "' object is not iterable");
      }
    }
    if (kwv.o) for (auto& [k, v] : kwv.o->items) ns->set(k, v);
    namespaces_.push_back(ns);
    check_items(namespaces_.size());
    Value v;
    v.type = Type::Namespace;
    v.o = std::move(ns);
    return v;
  }

  Value range(const Array& args) {
    for (auto& a : args) if (!is_number(a)) fail("range() arguments must be numbers");
    if (args.empty()) fail("range() expects at least 1 argument");
    double start = 0, stop, step = 1;
    if (args.size() == 1) stop = args[0].num;
    else { start = args[0].num; stop = args[1].num; if (args.size() > 2) step = args[2].num; }
    if (step == 0) fail("range() step must not be zero");
    Array out;
    for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
      out.push_back(std::fmod(i, 1.0) == 0 ? Value::integer(i) : Value::floating(i));
      check_items(out.size());
    }
    return checked_array(std::move(out));
  }

  Value strftime_now(const Array& args) {
    if (args.empty() || args[0].type != Type::String) fail("strftime_now expects a format string");
    std::time_t t = opt_.now ? opt_.now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    static const char* kMonths[] = {"January", "February", "March", "April", "May", "June", "July",
                                    "August", "September", "October", "November", "December"};
    const std::string& f = *args[0].s;
    std::string out;
    auto pad2 = [](int v) { return (v < 10 ? "0" : "") + std::to_string(v); };
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] == '%' && i + 1 < f.size() && std::strchr("YmdbBHM%", f[i + 1])) {
        switch (f[++i]) {
          case 'Y': out += std::to_string(tm.tm_year + 1900); break;
          case 'm': out += pad2(tm.tm_mon + 1); break;
          case 'd': out += pad2(tm.tm_mday); break;
          case 'b': out += std::string(kMonths[tm.tm_mon]).substr(0, 3); break;
          case 'B': out += kMonths[tm.tm_mon]; break;
          case 'H': out += pad2(tm.tm_hour); break;
          case 'M': out += pad2(tm.tm_min); break;
          case '%': out += '%'; break;
        }
      } else {
        out += f[i];
      }
    }
    return Value::string(std::move(out));
  }

  static bool uses_name(const Node* n, const char* name) {
    if (!n) return false;
    if (n->kind == NK::Ident && n->str == name) return true;
    for (auto* c : {n->x.get(), n->y.get(), n->z.get()}) if (uses_name(c, name)) return true;
    for (auto* v : {&n->list, &n->body, &n->alt}) for (auto& c : *v) if (uses_name(c.get(), name)) return true;
    return false;
  }

  Value call_macro(const Function& f, Array& args, Env& call_env) {
    const Node* m = f.macro;
    Env scope;
    scope.parent = &call_env;  // @huggingface/jinja resolves macro free variables at the call site
    Kwargs kws;
    if (!args.empty() && args.back().type == Type::Object && args.back().kwargs) {
      for (auto& [k, v] : args.back().o->items) kws.emplace_back(k, v);
      args.pop_back();
    }
    std::vector<std::pair<std::string, const Node*>> pending;
    std::vector<std::string> params;
    for (size_t i = 0; i < m->list.size(); ++i) {
      const Node* p = m->list[i].get();
      const std::string& name = p->str;
      params.push_back(name);
      Value v;
      bool have = i < args.size();
      if (have) v = args[i];
      if (!have) {
        for (auto it = kws.begin(); it != kws.end(); ++it)
          if (it->first == name) { v = it->second; kws.erase(it); have = true; break; }
      }
      if (!have && p->kind == NK::KwArg) pending.emplace_back(name, p->x.get());
      scope.vars[name] = v;
    }
    auto declared = [&](const char* s) { return std::find(params.begin(), params.end(), s) != params.end(); };
    bool want_kwargs = !declared("kwargs") && [&] { for (auto& b : m->body) if (uses_name(b.get(), "kwargs")) return true; return false; }();
    bool want_varargs = !declared("varargs") && [&] { for (auto& b : m->body) if (uses_name(b.get(), "varargs")) return true; return false; }();
    if (want_kwargs) scope.vars["kwargs"] = kwargs_value(kws);
    else if (!kws.empty()) fail("macro '" + f.name + "' takes no keyword argument '" + kws.front().first + "'");
    if (want_varargs) {
      Array rest;
      for (size_t i = m->list.size(); i < args.size(); ++i) rest.push_back(args[i]);
      scope.vars["varargs"] = checked_array(std::move(rest));
    } else if (args.size() > m->list.size()) {
      fail("macro '" + f.name + "' takes not more than " + std::to_string(m->list.size()) + " argument(s)");
    }
    for (auto& [name, def] : pending) scope.vars[name] = eval(def, scope);
    return str(block(m->body, scope));
  }

  Value string_method(const std::string& s, const std::string& name, const Array& args) {
    if (name == "upper") return Value::string(ascii_upper(s));
    if (name == "lower") return Value::string(ascii_lower(s));
    if (name == "strip") return Value::string(std::string(trim(s)));  // JS trim(): arguments ignored
    if (name == "lstrip") return Value::string(std::string(trim_start(s)));
    if (name == "rstrip") return Value::string(std::string(trim_end(s)));
    if (name == "title") return Value::string(title_case(s));
    if (name == "capitalize") {
      std::string r = s;
      if (!r.empty() && r[0] >= 'a' && r[0] <= 'z') r[0] = char(r[0] - 32);
      return Value::string(std::move(r));
    }
    if (name == "startswith" || name == "endswith") {
      bool start = name == "startswith";
      if (args.empty()) fail(name + "() requires at least one argument");
      auto test = [&](const std::string& p) {
        if (p.size() > s.size()) return false;
        return start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
      };
      if (args[0].type == Type::String) return Value::boolean(test(*args[0].s));
      if (args[0].type == Type::Array) {
        for (auto& it : args[0].a->items) {
          if (it.type != Type::String) fail(name + "() tuple elements must be strings");
          if (test(*it.s)) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      fail(name + "() argument must be a string or tuple of strings");
    }
    if (name == "split" || name == "rsplit") {
      Value sep = args.size() > 0 ? args[0] : Value::null();
      if (sep.type != Type::String && sep.type != Type::Null) fail("sep argument must be a string or null");
      Value maxv = args.size() > 1 ? args[1] : Value::integer(-1);
      if (maxv.type != Type::Int) fail("maxsplit argument must be a number");
      double maxsplit = maxv.num;
      std::vector<std::string> parts;
      if (sep.type == Type::Null) {
        if (name == "rsplit") fail("rsplit() without a separator is not supported");
        std::string_view text = trim_start(s);
        size_t i = 0;
        while (i < text.size()) {
          size_t k;
          while ((k = space_len(text, i))) i += k;
          if (i >= text.size()) break;
          size_t b = i;
          while (i < text.size() && !space_len(text, i)) { size_t n; decode(text, i, &n); i += n; }
          if (maxsplit != -1 && double(parts.size()) >= maxsplit) { parts.emplace_back(text.substr(b)); break; }
          parts.emplace_back(text.substr(b, i - b));
        }
      } else {
        const std::string& sp = *sep.s;
        if (sp.empty()) fail("empty separator");
        size_t i = 0;
        for (;;) {
          size_t p = s.find(sp, i);
          if (p == std::string::npos) { parts.push_back(s.substr(i)); break; }
          parts.push_back(s.substr(i, p - i));
          i = p + sp.size();
          check_items(parts.size());
        }
        if (maxsplit != -1 && double(parts.size()) > maxsplit) {
          size_t keep = maxsplit < 0 ? 0 : size_t(maxsplit);
          if (name == "split") {
            std::string rest;
            for (size_t k = keep; k < parts.size(); ++k) { if (k > keep) rest += sp; rest += parts[k]; }
            parts.resize(keep);
            parts.push_back(std::move(rest));
          } else {  // rsplit (extension, Python semantics): split from the right
            size_t head_n = parts.size() - keep;
            std::string head;
            for (size_t k = 0; k < head_n; ++k) { if (k) head += sp; head += parts[k]; }
            std::vector<std::string> r{std::move(head)};
            for (size_t k = head_n; k < parts.size(); ++k) r.push_back(std::move(parts[k]));
            parts = std::move(r);
          }
        }
      }
      Array out;
      for (auto& p : parts) out.push_back(Value::string(std::move(p)));
      return checked_array(std::move(out));
    }
    if (name == "replace") {
      if (args.size() < 2) fail("replace() requires at least two arguments");
      if (args[0].type != Type::String || args[1].type != Type::String) fail("replace() arguments must be strings");
      Value count = Value::null();
      if (args.size() > 2) {
        if (args[2].type == Type::Object && args[2].kwargs) {
          const Value* c = args[2].o->get("count");
          count = c ? *c : Value::null();
        } else {
          count = args[2];
        }
      }
      if (count.type != Type::Int && count.type != Type::Null) fail("replace() count argument must be a number or null");
      return str(js_replace(s, *args[0].s, *args[1].s, count.type == Type::Null ? -1 : count.num));
    }
    if (name == "find") {  // extension (Python str.find, result in code points)
      if (args.empty() || args[0].type != Type::String) fail("find() argument must be a string");
      size_t p = s.find(*args[0].s);
      if (p == std::string::npos) return Value::integer(-1);
      return Value::integer(double(code_points(std::string_view(s).substr(0, p)).size()));
    }
    fail("Unknown string method: " + name);
  }

  Value object_method(const Value& self, const std::string& name, const Array& args) {
    const Object& o = *self.o;
    if (name == "get") {
      if (args.empty() || args[0].type != Type::String)
        fail(std::string("Object key must be a string: got ") + (args.empty() ? "UndefinedValue" : type_name(args[0])));
      if (const Value* v = o.get(*args[0].s)) return *v;
      return args.size() > 1 ? args[1] : Value::null();
    }
    if (name == "items") return items(self);
    if (name == "keys") {
      Array out;
      for (auto& [k, v] : o.items) out.push_back(Value::string(k));
      return checked_array(std::move(out));
    }
    if (name == "values") {
      Array out;
      for (auto& [k, v] : o.items) out.push_back(v);
      return checked_array(std::move(out));
    }
    if (name == "dictsort") {
      Kwargs kws;
      Array pos;
      for (auto& a : args) {
        if (a.type == Type::Object && a.kwargs) for (auto& [k, v] : a.o->items) kws.emplace_back(k, v);
        else pos.push_back(a);
      }
      Value cs = pos.size() > 0 ? pos[0] : kw(kws, "case_sensitive") ? *kw(kws, "case_sensitive") : Value::boolean(false);
      if (cs.type != Type::Bool) fail("case_sensitive must be a boolean");
      Value by = pos.size() > 1 ? pos[1] : kw(kws, "by") ? *kw(kws, "by") : Value::string("key");
      if (by.type != Type::String) fail("by must be a string");
      if (*by.s != "key" && *by.s != "value") fail("by must be either 'key' or 'value'");
      Value rev = pos.size() > 2 ? pos[2] : kw(kws, "reverse") ? *kw(kws, "reverse") : Value::boolean(false);
      if (rev.type != Type::Bool) fail("reverse must be a boolean");
      Array out = items(self).a->items;
      size_t idx = *by.s == "key" ? 0 : 1;
      std::stable_sort(out.begin(), out.end(), [&](const Value& a, const Value& b) {
        int r = compare_values(a.a->items[idx], b.a->items[idx], cs.b);
        return rev.b ? r > 0 : r < 0;
      });
      return checked_array(std::move(out));
    }
    fail("Unknown object method: " + name);
  }

  Value items(const Value& self) {
    Array out;
    for (auto& [k, v] : self.o->items) out.push_back(Value::array({Value::string(k), v}));
    return checked_array(std::move(out));
  }

  Value binary(const Node* n, Env& env) {
    const std::string& op = n->str;
    Value l = eval(n->x.get(), env);
    const uint8_t k = n->op;
    if (k == kAnd) return truthy(l) ? eval(n->y.get(), env) : l;
    if (k == kOr) return truthy(l) ? l : eval(n->y.get(), env);
    Value r = eval(n->y.get(), env);
    if (k == kEq) return Value::boolean(loose_equal(l, r));
    if (k == kNe) return Value::boolean(!loose_equal(l, r));
    bool in_op = k == kIn || k == kNotIn;
    if (l.type == Type::Undefined || r.type == Type::Undefined) {
      if (r.type == Type::Undefined && in_op) return Value::boolean(k == kNotIn);
      fail("Cannot perform operation " + op + " on undefined values");
    }
    if (l.type == Type::Null || r.type == Type::Null) fail("Cannot perform operation on null values");
    if (k == kTilde) return str(raw_string(l) + raw_string(r));
    auto numeric_like = [](const Value& v) { return is_number(v) || v.type == Type::Bool; };
    auto num = [](const Value& v) { return v.type == Type::Bool ? (v.b ? 1.0 : 0.0) : v.num; };
    if (k == kPow && numeric_like(l) && numeric_like(r)) {
      double a = num(l), b = num(r);
      if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
      double res = std::pow(a, b);
      if (!std::isfinite(res)) fail("Exponentiation result is not a finite real number");
      bool f = l.type == Type::Float || r.type == Type::Float || b < 0;
      return f ? Value::floating(res) : Value::integer(res);
    }
    if (is_number(l) && is_number(r)) {
      double a = l.num, b = r.num;
      bool f = l.type == Type::Float || r.type == Type::Float;
      auto mkn = [&](double x) { return f ? Value::floating(x) : Value::integer(x); };
      if (k == kAdd) return mkn(a + b);
      if (k == kSub) return mkn(a - b);
      if (k == kMul) return mkn(a * b);
      if (k == kDiv) return Value::floating(a / b);
      if (k == kFloorDiv) return mkn(std::floor(a / b));
      if (k == kMod) return mkn(std::fmod(a, b));
      if (k == kLt) return Value::boolean(a < b);
      if (k == kGt) return Value::boolean(a > b);
      if (k == kGe) return Value::boolean(a >= b);
      if (k == kLe) return Value::boolean(a <= b);
    } else if (l.type == Type::Array && r.type == Type::Array) {
      if (k == kAdd) {
        check_items(l.a->items.size() + r.a->items.size());
        Array out = l.a->items;
        out.insert(out.end(), r.a->items.begin(), r.a->items.end());
        return checked_array(std::move(out));
      }
    } else if (r.type == Type::Array) {
      bool member = false;
      for (auto& x : r.a->items) if (strict_equal(x, l)) { member = true; break; }
      if (k == kIn) return Value::boolean(member);
      if (k == kNotIn) return Value::boolean(!member);
    }
    if ((l.type == Type::String || r.type == Type::String) && k == kAdd) {
      std::string a = raw_string(l), b = raw_string(r);
      check_size(a.size() + b.size());
      return Value::string(a + b);
    }
    if (l.type == Type::String && r.type == Type::String && in_op) {
      bool has = r.s->find(*l.s) != std::string::npos;
      return Value::boolean(k == kIn ? has : !has);
    }
    if (l.type == Type::String && r.type == Type::Object && in_op) {
      bool has = r.o->get(*l.s) != nullptr;
      return Value::boolean(k == kIn ? has : !has);
    }
    fail("Unknown operator \"" + op + "\" between " + type_name(l) + " and " + type_name(r));
  }

  Value unary(const Node* n, Env& env) {
    Value v = eval(n->x.get(), env);
    if (n->str == "not") return Value::boolean(!truthy(v));
    double sign = n->str == "-" ? -1 : 1;
    if (is_number(v) || v.type == Type::Bool) {
      double x = v.type == Type::Bool ? (v.b ? 1 : 0) : v.num;
      return v.type == Type::Float ? Value::floating(sign * x) : Value::integer(sign * x);
    }
    fail("Unknown operator \"" + n->str + "\" for " + type_name(v));
  }

  Value test(const Node* n, Env& env) {
    Value v = eval(n->x.get(), env);
    bool r = apply_test(n->str, v, nullptr);
    return Value::boolean(n->flag ? !r : r);
  }

  Value set(const Node* n, Env& env) {
    Value rhs = n->y ? eval(n->y.get(), env) : str(block(n->body, env));
    const Node* t = n->x.get();
    if (t->kind == NK::Ident) {
      env.vars[t->str] = std::move(rhs);
    } else if (t->kind == NK::TupleLit) {
      if (rhs.type != Type::Array) fail(std::string("Cannot unpack non-iterable type in set: ") + type_name(rhs));
      const Array& arr = rhs.a->items;
      if (arr.size() != t->list.size()) fail(std::string("Too ") + (t->list.size() > arr.size() ? "few" : "many") + " items to unpack in set");
      for (size_t i = 0; i < arr.size(); ++i) {
        if (t->list[i]->kind != NK::Ident) fail("Cannot unpack to non-identifier in set");
        env.vars[t->list[i]->str] = arr[i];
      }
    } else if (t->kind == NK::Member) {
      Value obj = eval(t->x.get(), env);
      if (obj.type != Type::Namespace) fail("cannot assign attribute on non-namespace object");
      if (t->y->kind != NK::Ident || t->flag) fail("Cannot assign to member with non-identifier property");
      obj.o->set(t->y->str, std::move(rhs));
      if (obj.o->depth > kValueDepth) fail("Value nested too deeply");
    } else {
      fail("Invalid LHS inside assignment expression");
    }
    return Value::null();
  }

  static void bind(const Node* target, const Value& item, Env& env) {
    if (target->kind == NK::Ident) { env.vars[target->str] = item; return; }
    if (item.type != Type::Array) fail(std::string("Cannot unpack non-iterable type: ") + type_name(item));
    const Array& c = item.a->items;
    if (target->list.size() != c.size()) fail(std::string("Too ") + (target->list.size() > c.size() ? "few" : "many") + " items to unpack");
    for (size_t j = 0; j < c.size(); ++j) {
      if (target->list[j]->kind != NK::Ident) fail("Cannot unpack non-identifier type");
      env.vars[target->list[j]->str] = c[j];
    }
  }

  Value for_loop(const Node* n, Env& env) {
    Env scope;
    scope.parent = &env;
    const Node* iter_node = n->y.get();
    const Node* cond = nullptr;
    if (iter_node->kind == NK::Select) { cond = iter_node->y.get(); iter_node = iter_node->x.get(); }
    Value iterable = eval(iter_node, scope);
    if (iterable.type == Type::Object) {
      Array keys;
      for (auto& [k, v] : iterable.o->items) keys.push_back(Value::string(k));
      iterable = Value::array(std::move(keys));
    }
    if (iterable.type != Type::Array) fail(std::string("Expected iterable or object type in for loop: got ") + type_name(iterable));
    Array items;
    for (const Value& cur : iterable.a->items) {
      if (n->x->kind == NK::TupleLit) {
        if (cur.type != Type::Array) fail(std::string("Cannot unpack non-iterable type: ") + type_name(cur));
        if (cur.a->items.size() != n->x->list.size()) fail(std::string("Too ") + (n->x->list.size() > cur.a->items.size() ? "few" : "many") + " items to unpack");
      }
      if (cond) {
        Env loop_scope;
        loop_scope.parent = &scope;
        bind(n->x.get(), cur, loop_scope);
        if (!truthy(eval(cond, loop_scope))) continue;
      }
      items.push_back(cur);
    }
    std::string out;
    bool no_iteration = true;
    const size_t len = items.size();
    for (size_t i = 0; i < len; ++i) {
      if (++steps_ > lim_.max_steps) fail("Template evaluation step limit exceeded");
      auto loop = std::make_shared<Object>();
      loop->items.reserve(9);
      loop->set("index", Value::integer(double(i + 1)));
      loop->set("index0", Value::integer(double(i)));
      loop->set("revindex", Value::integer(double(len - i)));
      loop->set("revindex0", Value::integer(double(len - i - 1)));
      loop->set("first", Value::boolean(i == 0));
      loop->set("last", Value::boolean(i == len - 1));
      loop->set("length", Value::integer(double(len)));
      loop->set("previtem", i > 0 ? items[i - 1] : Value());
      loop->set("nextitem", i + 1 < len ? items[i + 1] : Value());
      scope.vars["loop"] = Value::object(std::move(loop));
      bind(n->x.get(), items[i], scope);
      try {
        out += block(n->body, scope);
        check_size(out.size());
      } catch (const ContinueSignal&) {
        continue;
      } catch (const BreakSignal&) {
        break;
      }
      no_iteration = false;
    }
    if (no_iteration) out += block(n->alt, scope);
    return str(std::move(out));
  }

  [[noreturn]] static void filter_type_error(const std::string& f, const Value& v) {
    fail("Cannot apply filter \"" + f + "\" to type: " + type_name(v));
  }

  static std::string join_values(const Array& items, const std::string& sep) {
    // Array.prototype.join over the runtime values' `.value`.
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += sep;
      const Value& x = items[i];
      if (x.type != Type::Null && x.type != Type::Undefined) out += raw_string(x);
      check_built(out.size());
    }
    return out;
  }

  Value apply_filter(const Value& v, const Node* f, Env& env) {
    if (f->kind == NK::Ident) return simple_filter(v, f->str);
    if (f->kind != NK::Call || f->x->kind != NK::Ident) fail("Unknown filter");
    const std::string& name = f->x->str;
    Array args;
    Kwargs kws;
    if (name == "tojson") {
      eval_args(f->list, env, &args, &kws);
      JsonOptions o;
      if (const Value* x = kw(kws, "indent")) {
        if (x->type != Type::Int && x->type != Type::Null) fail("If set, indent must be a number");
        if (x->type == Type::Int) {
          if (x->num < 0 && (v.type == Type::Array || is_container(v))) fail("Invalid count value: " + js_number(x->num));
          if (!(x->num <= 1024)) fail("indent too large");
          o.indent = int(x->num);
        }
      }
      if (const Value* x = kw(kws, "ensure_ascii")) {
        if (x->type != Type::Bool) fail("If set, ensure_ascii must be a boolean");
        o.ensure_ascii = x->b;
      }
      if (const Value* x = kw(kws, "sort_keys")) {
        if (x->type != Type::Bool) fail("If set, sort_keys must be a boolean");
        o.sort_keys = x->b;
      }
      if (const Value* x = kw(kws, "separators")) {
        if (x->type == Type::Array) {
          if (x->a->items.size() != 2 || x->a->items[0].type != Type::String || x->a->items[1].type != Type::String)
            fail("separators must be a tuple of two strings");
          o.has_separators = true;
          o.item_sep = *x->a->items[0].s;
          o.key_sep = *x->a->items[1].s;
        } else if (x->type != Type::Null) {
          fail("If set, separators must be a tuple of two strings");
        }
      }
      return str(to_json_str(v, o, true));
    }
    if (name == "join") {
      if (v.type != Type::String && v.type != Type::Array) filter_type_error(name, v);
      eval_args(f->list, env, &args, &kws);
      Value sep = !args.empty() ? args[0] : kw(kws, "separator") ? *kw(kws, "separator") : Value::string("");
      if (sep.type != Type::String) fail("separator must be a string");
      if (v.type == Type::String) {
        std::string out;
        auto cps = code_points(*v.s);
        for (size_t i = 0; i < cps.size(); ++i) { if (i) out += *sep.s; out.append(cps[i]); check_built(out.size()); }
        return str(std::move(out));
      }
      return str(join_values(v.a->items, *sep.s));
    }
    if (name == "int" || name == "float") {
      eval_args(f->list, env, &args, &kws);
      bool is_int = name == "int";
      Value def = !args.empty() ? args[0] : kw(kws, "default") ? *kw(kws, "default") : is_int ? Value::integer(0) : Value::floating(0);
      if (v.type == Type::String) {
        double x;
        if (!parse_number_prefix(*v.s, is_int, &x)) return def;
        return is_int ? Value::integer(x) : Value::floating(x);
      }
      if (is_number(v)) return v;
      if (v.type == Type::Bool) return is_int ? Value::integer(v.b ? 1 : 0) : Value::floating(v.b ? 1 : 0);
      filter_type_error(name, v);
    }
    if (name == "default") {
      eval_args(f->list, env, &args, &kws);
      Value def = !args.empty() ? args[0] : Value::string("");
      Value boolean = args.size() > 1 ? args[1] : kw(kws, "boolean") ? *kw(kws, "boolean") : Value::boolean(false);
      if (boolean.type != Type::Bool) fail("`default` filter flag must be a boolean");
      if (v.type == Type::Undefined || (boolean.b && !truthy(v))) return def;
      return v;
    }
    if (v.type == Type::Array) {
      const Array& items = v.a->items;
      if (name == "sort") {
        eval_args(f->list, env, &args, &kws);
        Value rev = args.size() > 0 ? args[0] : kw(kws, "reverse") ? *kw(kws, "reverse") : Value::boolean(false);
        if (rev.type != Type::Bool) fail("reverse must be a boolean");
        Value cs = args.size() > 1 ? args[1] : kw(kws, "case_sensitive") ? *kw(kws, "case_sensitive") : Value::boolean(false);
        if (cs.type != Type::Bool) fail("case_sensitive must be a boolean");
        Value attr = args.size() > 2 ? args[2] : kw(kws, "attribute") ? *kw(kws, "attribute") : Value::null();
        if (attr.type != Type::String && attr.type != Type::Int && attr.type != Type::Null) fail("attribute must be a string, integer, or null");
        std::string path = attr.type == Type::String ? *attr.s : attr.type == Type::Int ? js_number(attr.num) : "";
        auto key = [&](const Value& x) { return attr.type == Type::Null ? x : attribute(x, path); };
        Array out = items;
        std::stable_sort(out.begin(), out.end(), [&](const Value& a, const Value& b) {
          int r = compare_values(key(a), key(b), cs.b);
          return rev.b ? r > 0 : r < 0;
        });
        return checked_array(std::move(out));
      }
      if (name == "selectattr" || name == "rejectattr") {
        bool select = name == "selectattr";
        for (auto& x : items) if (!is_container(x)) fail("`" + name + "` can only be applied to array of objects");
        for (auto& a : f->list) if (a->kind != NK::Str) fail("arguments of `" + name + "` must be strings");
        if (f->list.empty()) fail("`" + name + "` requires an attribute name");
        const std::string& attr_name = f->list[0]->str;
        std::string test_name = f->list.size() > 1 ? f->list[1]->str : "";
        const Value* cmp = nullptr;
        Value cmp_v;
        if (f->list.size() > 2) { cmp_v = Value::string(f->list[2]->str); cmp = &cmp_v; }
        Array out;
        for (auto& x : items) {
          const Value* a = x.o->get(attr_name);
          bool r = false;
          if (a) r = test_name.empty() ? truthy(*a) : apply_test(test_name, *a, cmp);
          if (r == select) out.push_back(x);
        }
        return checked_array(std::move(out));
      }
      if (name == "map") {
        eval_args(f->list, env, &args, &kws);
        const Value* attr = kw(kws, "attribute");
        if (!attr) fail("`map` expressions without `attribute` set are not currently supported.");
        if (attr->type != Type::String) fail("attribute must be a string");
        const Value* def = kw(kws, "default");
        Array out;
        for (auto& x : items) {
          if (!is_container(x)) fail("items in map must be an object");
          Value r = attribute(x, *attr->s);
          out.push_back(r.type == Type::Undefined && def ? *def : r);
        }
        return checked_array(std::move(out));
      }
      fail("Unknown ArrayValue filter: " + name);
    }
    if (v.type == Type::String) {
      if (name == "indent") {
        eval_args(f->list, env, &args, &kws);
        Value width = args.size() > 0 ? args[0] : kw(kws, "width") ? *kw(kws, "width") : Value::integer(4);
        if (width.type != Type::Int) fail("width must be a number");
        if (!(width.num >= 0 && width.num <= 1024)) fail("indent width out of range");
        Value first = args.size() > 1 ? args[1] : kw(kws, "first") ? *kw(kws, "first") : Value::boolean(false);
        Value blank = args.size() > 2 ? args[2] : kw(kws, "blank") ? *kw(kws, "blank") : Value::boolean(false);
        return str(indent(*v.s, size_t(width.num), truthy(first), truthy(blank)));
      }
      if (name == "replace") {
        eval_args(f->list, env, &args, &kws);
        args.push_back(kwargs_value(kws));
        return string_method(*v.s, "replace", args);
      }
      fail("Unknown StringValue filter: " + name);
    }
    if (v.type == Type::Object) {
      for (auto* m : kObjectMethods) {
        if (name != m) continue;
        eval_args(f->list, env, &args, &kws);
        if (!kws.empty()) args.push_back(kwargs_value(kws));
        return object_method(v, name, args);
      }
      fail("Unknown ObjectValue filter: " + name);
    }
    filter_type_error(name, v);
  }

  // Environment.TESTS; `arg` is the second operand (only selectattr/rejectattr pass one).
  static bool apply_test(const std::string& t, const Value& v, const Value* arg) {
    if (t == "boolean") return v.type == Type::Bool;
    if (t == "callable") return v.type == Type::Function;
    if (t == "false") return v.type == Type::Bool && !v.b;
    if (t == "true") return v.type == Type::Bool && v.b;
    if (t == "none") return v.type == Type::Null;
    if (t == "string") return v.type == Type::String;
    if (t == "number") return is_number(v);
    if (t == "integer") return v.type == Type::Int;
    if (t == "iterable") return v.type == Type::Array || v.type == Type::String;
    if (t == "mapping") return v.type == Type::Object;
    if (t == "sequence") return v.type == Type::Array || v.type == Type::Object || v.type == Type::String;
    if (t == "defined") return v.type != Type::Undefined;
    if (t == "undefined") return v.type == Type::Undefined;
    if (t == "odd" || t == "even") {
      if (v.type != Type::Int) fail("cannot " + t + " on " + type_name(v));
      bool odd = std::fmod(v.num, 2) != 0;
      return t == "odd" ? odd : !odd;
    }
    if (t == "lower" || t == "upper") {
      if (v.type != Type::String) fail("Cannot apply test \"" + t + "\" to type: " + type_name(v));
      return *v.s == (t == "lower" ? ascii_lower(*v.s) : ascii_upper(*v.s));
    }
    if (t == "equalto" || t == "eq") {
      if (!arg) fail("Test \"" + t + "\" needs a value to compare with");
      return strict_equal(v, *arg);
    }
    fail("Unknown test: " + t);
  }

  static Value attribute(const Value& item, const std::string& path) {
    Value cur = item;
    size_t i = 0;
    for (;;) {
      size_t dot = path.find('.', i);
      std::string part = path.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
      if (is_container(cur)) {
        const Value* v = cur.o->get(part);
        cur = v ? *v : Value();
      } else if (cur.type == Type::Array) {
        char* end = nullptr;
        long idx = std::strtol(part.c_str(), &end, 10);
        if (end != part.c_str() && idx >= 0 && size_t(idx) < cur.a->items.size()) cur = Value(cur.a->items[size_t(idx)]);
        else return Value();
      } else {
        return Value();
      }
      if (dot == std::string::npos) break;
      i = dot + 1;
    }
    return cur;
  }

  static std::string indent(const std::string& s, size_t width, bool first, bool blank) {
    std::string pad(width, ' '), out;
    size_t i = 0, line = 0;
    for (;;) {
      size_t nl = s.find('\n', i);
      std::string_view part(s.data() + i, (nl == std::string::npos ? s.size() : nl) - i);
      if (!((!first && line == 0) || (!blank && part.empty()))) out += pad;
      out.append(part);
      check_built(out.size());
      if (nl == std::string::npos) break;
      out += '\n';
      i = nl + 1;
      ++line;
    }
    return out;
  }

  // parseInt(s, 10) / parseFloat(s).
  static bool parse_number_prefix(const std::string& s, bool integer, double* out) {
    std::string_view t = trim_start(s);
    size_t i = 0;
    bool neg = false;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) { neg = t[i] == '-'; ++i; }
    if (!integer && t.substr(i, 8) == "Infinity") { *out = neg ? -INFINITY : INFINITY; return true; }
    size_t d0 = i;
    while (i < t.size() && is_digit(t[i])) ++i;
    size_t int_digits = i - d0;
    if (integer) {
      if (int_digits == 0) return false;
      double v = std::strtod(std::string(t.substr(d0, int_digits)).c_str(), nullptr);
      *out = neg ? -v : v;
      return true;
    }
    size_t frac_digits = 0;
    if (i < t.size() && t[i] == '.') { size_t f0 = ++i; while (i < t.size() && is_digit(t[i])) ++i; frac_digits = i - f0; if (!frac_digits && !int_digits) return false; }
    if (!int_digits && !frac_digits) return false;
    if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
      size_t save = i++;
      if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
      size_t e0 = i;
      while (i < t.size() && is_digit(t[i])) ++i;
      if (i == e0) i = save;
    }
    *out = std::strtod(std::string(t.substr(0, i)).c_str(), nullptr);
    return true;
  }

  Value simple_filter(const Value& v, const std::string& f) {
    if (f == "safe") return v;
    if (f == "tojson") return str(to_json_str(v, {}, true));
    switch (v.type) {
      case Type::Array: {
        const Array& items = v.a->items;
        if (f == "list") return v;
        if (f == "first") return items.empty() ? Value() : items.front();
        if (f == "last") return items.empty() ? Value() : items.back();
        if (f == "length" || f == "count") return Value::integer(double(items.size()));
        if (f == "reverse") return checked_array(Array(items.rbegin(), items.rend()));
        if (f == "sort") {
          Array out = items;
          std::stable_sort(out.begin(), out.end(), [](const Value& a, const Value& b) { return compare_values(a, b, false) < 0; });
          return checked_array(std::move(out));
        }
        if (f == "join") return str(join_values(items, ""));
        if (f == "string") return str(to_json_str(v, {}, false));
        if (f == "unique") {
          Array out;
          for (auto& x : items) {
            bool seen = false;
            for (auto& y : out) if (strict_equal(x, y) || (is_number(x) && is_number(y) && std::isnan(x.num) && std::isnan(y.num))) { seen = true; break; }
            if (!seen) out.push_back(x);
          }
          return checked_array(std::move(out));
        }
        fail("Unknown ArrayValue filter: " + f);
      }
      case Type::String: {
        const std::string& s = *v.s;
        if (f == "length" || f == "count") return Value::integer(double(utf16_length(s)));
        if (f == "upper") return Value::string(ascii_upper(s));
        if (f == "lower") return Value::string(ascii_lower(s));
        if (f == "title") return Value::string(title_case(s));
        if (f == "capitalize") return string_method(s, "capitalize", {});
        if (f == "trim") return Value::string(std::string(trim(s)));
        if (f == "indent") return str(indent(s, 4, false, false));
        if (f == "join" || f == "string") return v;
        if (f == "int") { double x; return Value::integer(parse_number_prefix(s, true, &x) ? x : 0); }
        if (f == "float") { double x; return Value::floating(parse_number_prefix(s, false, &x) ? x : 0); }
        fail("Unknown StringValue filter: " + f);
      }
      case Type::Int: case Type::Float: {
        if (f == "abs") return v.type == Type::Int ? Value::integer(std::fabs(v.num)) : Value::floating(std::fabs(v.num));
        if (f == "int") return Value::integer(std::floor(v.num));
        if (f == "float") return Value::floating(v.num);
        if (f == "string") return Value::string(display(v));
        fail("Unknown NumericValue filter: " + f);
      }
      case Type::Object: {
        if (f == "items") return items(v);
        if (f == "length" || f == "count") return Value::integer(double(v.o->size()));
        for (auto* m : kObjectMethods) if (f == m) return object_method(v, f, {});
        fail("Unknown ObjectValue filter: " + f);
      }
      case Type::Bool: {
        if (f == "bool") return v;
        if (f == "int") return Value::integer(v.b ? 1 : 0);
        if (f == "float") return Value::floating(v.b ? 1 : 0);
        if (f == "string") return Value::string(v.b ? "true" : "false");
        fail("Unknown BooleanValue filter: " + f);
      }
      default: filter_type_error(f, v);
    }
  }
};

const char* const kGlobals[] = {"false", "true", "none", "raise_exception", "range", "strftime_now",
                                "True", "False", "None", "namespace"};

void setup_globals(Env& env) {
  env.vars["namespace"] = make_function(Function::Namespace, "namespace");
  env.vars["false"] = Value::boolean(false);
  env.vars["true"] = Value::boolean(true);
  env.vars["none"] = Value::null();
  env.vars["raise_exception"] = make_function(Function::Raise, "raise_exception");
  env.vars["range"] = make_function(Function::Range, "range");
  env.vars["strftime_now"] = make_function(Function::Strftime, "strftime_now");
  env.vars["True"] = Value::boolean(true);
  env.vars["False"] = Value::boolean(false);
  env.vars["None"] = Value::null();
}

// ---------------------------------------------------------------- JSON -> Value

// Any JSON number -> double as JSON.parse does it (correctly rounded, big integers included).
Value number_value(std::string_view raw) {
  while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\n' || raw.back() == '\r' || raw.back() == '\t')) raw.remove_suffix(1);
  double d = std::strtod(std::string(raw).c_str(), nullptr);
  return (std::isfinite(d) && std::fmod(d, 1.0) == 0) ? Value::integer(d) : Value::floating(d);
}

Value object_from_entries(std::vector<std::pair<std::string, Value>> entries) {
  // JS property order: canonical array-index keys first (ascending), then insertion order.
  std::vector<std::pair<uint32_t, size_t>> idx;
  std::vector<size_t> rest;
  for (size_t i = 0; i < entries.size(); ++i) {
    uint32_t n;
    if (array_index_key(entries[i].first, &n)) idx.emplace_back(n, i); else rest.push_back(i);
  }
  std::sort(idx.begin(), idx.end());
  auto obj = std::make_shared<Object>();
  for (auto& [n, i] : idx) obj->set(entries[i].first, std::move(entries[i].second));
  for (size_t i : rest) obj->set(entries[i].first, std::move(entries[i].second));
  return Value::object(std::move(obj));
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
      std::vector<std::pair<std::string, Value>> entries;
      std::unordered_map<std::string, size_t> pos;
      for (auto field : v.get_object()) {
        od::field f;
        if (auto err = std::move(field).get(f)) throw simdjson::simdjson_error(err);
        std::string k(std::string_view(f.unescaped_key()));
        Value x = convert(f.value(), depth + 1, max_depth);
        auto it = pos.find(k);
        if (it != pos.end()) { entries[it->second].second = std::move(x); continue; }
        pos.emplace(k, entries.size());
        entries.emplace_back(std::move(k), std::move(x));
      }
      return object_from_entries(std::move(entries));
    }
  }
  fail("unsupported JSON value");
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
    } else {
      // A scalar document: validated by the DOM parser (a number too large for 64 bits is
      // still a valid JSON number, read as a double).
      simdjson::dom::parser dp;
      simdjson::dom::element e;
      auto err = dp.parse(padded).get(e);
      if ((err == simdjson::NUMBER_ERROR || err == simdjson::NUMBER_OUT_OF_RANGE) && js_to_number(trim(json)) == js_to_number(trim(json))) *out = number_value(trim(json));
      else if (err) throw simdjson::simdjson_error(err);
      else if (e.is_string()) *out = Value::string(std::string(std::string_view(e.get_string().value_unsafe())));
      else if (e.is_bool()) *out = Value::boolean(bool(e.get_bool().value_unsafe()));
      else if (e.is_null()) *out = Value::null();
      else *out = number_value(trim(json));
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

std::string to_json(const Value& v) {
  try {
    return to_json_str(v, {}, true);
  } catch (const std::exception&) {
    return "null";
  }
}

Template::Template(std::unique_ptr<Node> root) : root_(std::move(root)) {}
Template::~Template() = default;

std::unique_ptr<Template> Template::parse(std::string_view source, std::string* error, const Limits& limits) {
  if (!valid_utf8(source)) { *error = "template is not valid UTF-8"; return nullptr; }
  try {
    Parser p(tokenize(source), limits.max_depth);
    NodePtr root = p.program();
    finalize(root.get());
    return std::unique_ptr<Template>(new Template(std::move(root)));
  } catch (const JinjaError& e) {
    *error = std::string("template syntax error: ") + e.what();
  } catch (const std::bad_alloc&) {
    *error = "template syntax error: out of memory";
  }
  return nullptr;
}

bool Template::render(const Value& context, std::string* out, std::string* error, const RenderOptions& options) const {
  if (context.type != Type::Object) { *error = "context must be an object"; return false; }
  try {
    Env global;
    setup_globals(global);
    for (auto& [k, v] : context.o->items) {
      if (std::find_if(std::begin(kGlobals), std::end(kGlobals), [&](const char* g) { return k == g; }) != std::end(kGlobals)) {
        *error = "Variable already declared: " + k;
        return false;
      }
      global.vars[k] = v;
    }
    Interp in(options);
    *out = in.block(root_->body, global);
    return true;
  } catch (const JinjaError& e) {
    *error = e.what();
  } catch (const BreakSignal&) {
    *error = "break outside of a loop";
  } catch (const ContinueSignal&) {
    *error = "continue outside of a loop";
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
