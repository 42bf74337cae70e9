// Jinja lexer (Python Jinja2 3.1 rules with trim_blocks + lstrip_blocks, as transformers
// configures it) and the Unicode text helpers the interpreter shares.
#include <clocale>
#include <cstring>
#include <cwctype>

#include <simdjson.h>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/utf8.h"

namespace kvroute::jinja {

thread_local size_t t_max_bytes = 16u << 20;

// ---------------------------------------------------------------- UTF-8 and Python text

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

size_t cp_count(std::string_view s) {
  size_t k = 0;
  for (unsigned char c : s) k += (c & 0xC0) != 0x80;
  return k;
}

bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {
template <class Pred>
std::string_view strip_if(std::string_view s, bool left, bool right, Pred pred) {
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t n;
      if (!pred(decode(s, b, &n))) break;
      b += n;
    }
  }
  if (right) {
    while (e > b) {
      size_t p = e - 1;
      while (p > b && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
      size_t n;
      if (!pred(decode(s, p, &n)) || p + n != e) break;
      e = p;
    }
  }
  return s.substr(b, e - b);
}
}  // namespace

std::string_view py_strip(std::string_view s, bool left, bool right) {
  return strip_if(s, left, right, py_space);
}

std::string_view py_strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  std::vector<char32_t> set;
  for (size_t i = 0, n; i < chars.size(); i += n) set.push_back(decode(chars, i, &n));
  return strip_if(s, left, right, [&](char32_t c) { for (char32_t x : set) if (x == c) return true; return false; });
}

// Simple case mappings from the C library's Unicode tables (C.UTF-8); Python's special
// (one-to-many) mappings such as "ß".upper() == "SS" are not reproduced.
namespace {
locale_t utf8_locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    return l ? l : newlocale(LC_CTYPE_MASK, "C", static_cast<locale_t>(0));
  }();
  return loc;
}
}  // namespace

char32_t to_upper_cp(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  return char32_t(towupper_l(wint_t(c), utf8_locale()));
}
char32_t to_lower_cp(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return char32_t(towlower_l(wint_t(c), utf8_locale()));
}
bool is_cased_upper(char32_t c) { return to_lower_cp(c) != c || (c < 0x80 ? (c >= 'A' && c <= 'Z') : iswupper_l(wint_t(c), utf8_locale())); }
bool is_cased_lower(char32_t c) { return to_upper_cp(c) != c || (c < 0x80 ? (c >= 'a' && c <= 'z') : iswlower_l(wint_t(c), utf8_locale())); }

std::string py_upper(std::string_view s) {
  // The one-to-many upper-case mappings in common text (SpecialCasing.txt): ß and ligatures.
  static const std::pair<char32_t, const char*> kSpecial[] = {{0xDF, "SS"}, {0xFB00, "FF"}, {0xFB01, "FI"}, {0xFB02, "FL"},
                                                              {0xFB03, "FFI"}, {0xFB04, "FFL"}, {0xFB05, "ST"}, {0xFB06, "ST"}};
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0, n; i < s.size(); i += n) {
    char32_t c = decode(s, i, &n);
    const char* special = nullptr;
    for (auto& [k, v] : kSpecial) if (k == c) special = v;
    if (special) r += special; else append_utf8(r, to_upper_cp(c));
  }
  return r;
}
std::string py_lower(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0, n; i < s.size(); i += n) {
    char32_t c = decode(s, i, &n);
    if (c == 0x130) r += "i\xCC\x87";  // İ -> i + combining dot above (SpecialCasing.txt)
    else append_utf8(r, to_lower_cp(c));
  }
  return r;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_word(char c) { return is_word_start(c) || is_digit(c); }

// ---------------------------------------------------------------- lexer

namespace {

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Jinja2 splits the source on \r\n, \r and \n, drops one trailing empty line
    // (keep_trailing_newline=False) and joins with "\n".
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') { src_ += '\n'; if (i + 1 < source.size() && source[i + 1] == '\n') ++i; }
      else src_ += source[i];
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) root();
    return std::move(out_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> out_;

  char at(size_t i) const { return i < src_.size() ? src_[i] : '\0'; }
  bool starts(size_t p, const char* t) const { return src_.compare(p, std::strlen(t), t) == 0; }
  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      size_t n;
      if (!py_space(decode(src_, p, &n))) break;
      p += n;
    }
    return p;
  }
  void emit_text(std::string text) { if (!text.empty()) out_.push_back({TT::Text, std::move(text)}); }

  // Text before a tag, with the tag's whitespace control applied.
  void text_before(std::string text, char kind, char modifier) {
    if (modifier == '-') {
      text = std::string(py_strip(text, false, true));
    } else if (modifier != '+' && kind != '{') {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if (l_pos > 0 || line_starting_) {
        bool blank = true;
        for (size_t k = l_pos; k < text.size(); ++k) if (text[k] != ' ' && text[k] != '\t') { blank = false; break; }
        if (blank) text.resize(l_pos);
      }
    }
    emit_text(std::move(text));
  }

  // After a block or comment end: `-` strips all whitespace, `+` nothing, else one "\n".
  void after_end(char modifier, bool trim_newline) {
    size_t start = pos_;
    if (modifier == '-') pos_ = skip_space(pos_);
    else if (modifier != '+' && trim_newline && at(pos_) == '\n') ++pos_;
    line_starting_ = pos_ > start ? src_[pos_ - 1] == '\n' : false;
  }

  void root() {
    size_t p = pos_;
    while (p < src_.size() && !(src_[p] == '{' && (at(p + 1) == '{' || at(p + 1) == '%' || at(p + 1) == '#'))) ++p;
    std::string text = src_.substr(pos_, p - pos_);
    if (p >= src_.size()) { emit_text(std::move(text)); line_starting_ = false; pos_ = p; return; }
    char kind = src_[p + 1];
    char mod = at(p + 2) == '-' || at(p + 2) == '+' ? at(p + 2) : '\0';
    size_t body = p + 2 + (mod ? 1 : 0);
    if (kind == '#') {
      text_before(std::move(text), kind, mod);
      size_t e = src_.find("#}", body);
      if (e == std::string::npos) fail("Missing end of comment tag");
      char emod = e > body && (src_[e - 1] == '-' || src_[e - 1] == '+') ? src_[e - 1] : '\0';
      pos_ = e + 2;
      after_end(emod, true);
      return;
    }
    if (kind == '%' && raw_block(text, mod, body)) return;
    text_before(std::move(text), kind, mod);
    pos_ = body;
    out_.push_back({kind == '%' ? TT::BlockBegin : TT::VarBegin, {}});
    tag(kind == '%');
  }

  // `{% raw %}...{% endraw %}`: the content is text, untouched.
  bool raw_block(std::string& text, char mod, size_t body) {
    size_t q = skip_space(body);
    if (!starts(q, "raw")) return false;
    size_t r = skip_space(q + 3);
    char bmod = '\0';
    if (at(r) == '-' && starts(r + 1, "%}")) { bmod = '-'; ++r; }
    if (!starts(r, "%}")) return false;
    text_before(std::move(text), '%', mod);
    size_t content = r + 2;
    if (bmod == '-') content = skip_space(content);
    for (size_t s = src_.find("{%", content); s != std::string::npos; s = src_.find("{%", s + 2)) {
      char emod = at(s + 2) == '-' || at(s + 2) == '+' ? at(s + 2) : '\0';
      size_t t = skip_space(s + 2 + (emod ? 1 : 0));
      if (!starts(t, "endraw")) continue;
      size_t u = skip_space(t + 6);
      char cmod = '\0';
      if ((at(u) == '-' || at(u) == '+') && starts(u + 1, "%}")) { cmod = at(u); ++u; }
      if (!starts(u, "%}")) continue;
      std::string raw = src_.substr(content, s - content);
      if (emod == '-') raw = std::string(py_strip(raw, false, true));
      out_.push_back({TT::Raw, std::move(raw)});
      pos_ = u + 2;
      after_end(cmod, true);
      return true;
    }
    fail("Missing end of raw directive");
  }

  void tag(bool block) {
    int balance = 0;
    for (;;) {
      pos_ = skip_space(pos_);
      if (pos_ >= src_.size()) fail(block ? "Unexpected end of template: expected '%}'" : "Unexpected end of template: expected '}}'");
      if (balance == 0) {
        const char* end = block ? "%}" : "}}";
        char mod = (src_[pos_] == '-' || src_[pos_] == '+') && starts(pos_ + 1, end) ? src_[pos_] : '\0';
        if (mod == '+' && !block) mod = '\0';
        if (mod || starts(pos_, end)) {
          pos_ += (mod ? 1 : 0) + 2;
          out_.push_back({block ? TT::BlockEnd : TT::VarEnd, {}});
          after_end(mod, block);
          return;
        }
      }
      char c = src_[pos_];
      if (is_digit(c)) { number(); continue; }
      if (is_word_start(c)) {
        size_t s = pos_;
        while (pos_ < src_.size() && is_word(src_[pos_])) ++pos_;
        out_.push_back({TT::Name, src_.substr(s, pos_ - s)});
        continue;
      }
      if (c == '\'' || c == '"') { string_literal(c); continue; }
      static const char* kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
      bool two = false;
      for (auto* op : kOps2) if (starts(pos_, op)) { out_.push_back({TT::Op, op}); pos_ += 2; two = true; break; }
      if (two) continue;
      if (std::strchr("+-/*%~[](){}><=.:|,;", c) && c) {
        if (c == '(' || c == '[' || c == '{') ++balance;
        if (c == ')' || c == ']' || c == '}') { if (balance == 0) fail(std::string("unexpected '") + c + "'"); --balance; }
        out_.push_back({TT::Op, std::string(1, c)});
        ++pos_;
        continue;
      }
      size_t n;
      decode(src_, pos_, &n);
      fail("unexpected char '" + src_.substr(pos_, n) + "'");
    }
  }

  // Digits with single underscores between them ((\d+_)*\d+); returns them without '_'.
  bool digits(size_t* p, std::string* out) const {
    if (!is_digit(at(*p))) return false;
    while (is_digit(at(*p)) || (at(*p) == '_' && is_digit(at(*p + 1)))) {
      if (at(*p) != '_') *out += at(*p);
      ++*p;
    }
    return true;
  }

  void number() {
    size_t p = pos_;
    std::string text;
    digits(&p, &text);
    bool is_float = false;
    size_t q = p;
    std::string frac;
    if (at(q) == '.' && is_digit(at(q + 1)) && !(pos_ > 0 && src_[pos_ - 1] == '.')) {
      ++q;
      digits(&q, &frac);
      is_float = true;
      p = q;
      text += "." + frac;
    }
    if (at(p) == 'e' || at(p) == 'E') {
      size_t r = p + 1;
      std::string exp;
      if (at(r) == '+' || at(r) == '-') exp += at(r++);
      std::string ed;
      if (digits(&r, &ed)) { text += "e" + exp + ed; p = r; is_float = true; }
    }
    pos_ = p;
    out_.push_back({is_float ? TT::Float : TT::Int, std::move(text)});
  }

  static int hexval(char h) {
    return is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
  }

  // Python's unicode-escape decoding of the literal's body; unknown escapes keep the backslash.
  void string_literal(char quote) {
    size_t p = pos_ + 1;
    std::string s;
    for (;;) {
      if (p >= src_.size()) fail("unexpected end of string literal");
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\') { s += c; ++p; continue; }
      if (p + 1 >= src_.size()) fail("unexpected end of string literal");
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n': break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        case 'a': s += '\a'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'n': s += '\n'; break;
        case 'r': s += '\r'; break;
        case 't': s += '\t'; break;
        case 'v': s += '\v'; break;
        case 'x': case 'u': case 'U': {
          size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (size_t k = 0; k < len; ++k) {
            int d = hexval(at(p + k));
            if (d < 0) fail(std::string("truncated \\") + e + " escape in string literal");
            v = v * 16 + uint32_t(d);
          }
          p += len;
          if (v > 0x10FFFF) fail("illegal Unicode character in string literal");
          if (v >= 0xD800 && v <= 0xDBFF && at(p) == '\\' && at(p + 1) == 'u') {
            uint32_t lo = 0;
            bool ok = true;
            for (size_t k = 0; k < 4; ++k) { int d = hexval(at(p + 2 + k)); if (d < 0) { ok = false; break; } lo = lo * 16 + uint32_t(d); }
            if (ok && lo >= 0xDC00 && lo <= 0xDFFF) { v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00); p += 6; }
          }
          append_utf8(s, char32_t(v));
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = uint32_t(e - '0');
            for (int k = 0; k < 2 && at(p) >= '0' && at(p) <= '7'; ++k) v = v * 8 + uint32_t(src_[p++] - '0');
            append_utf8(s, char32_t(v));
          } else {
            s += '\\';
            s += e;
          }
      }
    }
    pos_ = p + 1;
    out_.push_back({TT::Str, std::move(s)});
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  Lexer lx(source);
  return lx.run();
}

}  // namespace kvroute::jinja
