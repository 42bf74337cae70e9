// HfTokenizer's text helpers: UTF-8 validation and repair (as Rust's str),
// White_Space, and tokenizer.json regex patterns compiled with PCRE2 so that
// they match as the reference's Oniguruma does.
#include "tokenizer/hf_tokenizer_impl.h"

namespace kvroute::hf_detail {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 if invalid (overlongs,
// surrogates and > U+10FFFF are invalid, as for Rust's str).
size_t valid_seq_len(std::string_view s, size_t i) {
  const unsigned char c = s[i];
  const size_t n = s.size() - i;
  auto cont = [&](size_t k) { return k < n && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    const unsigned char c1 = s[i + 1];
    if (c == 0xE0 && c1 < 0xA0) return 0;
    if (c == 0xED && c1 >= 0xA0) return 0;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    const unsigned char c1 = s[i + 1];
    if (c == 0xF0 && c1 < 0x90) return 0;
    if (c == 0xF4 && c1 >= 0x90) return 0;
    return 4;
  }
  return 0;
}

}  // namespace

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const size_t n = valid_seq_len(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

// Like Rust's String::from_utf8_lossy: each maximal invalid prefix becomes U+FFFD.
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = valid_seq_len(s, i);
    if (n) { out.append(s.substr(i, n)); i += n; continue; }
    // Skip the longest prefix of a valid sequence (at least one byte).
    const unsigned char c = s[i];
    size_t skip = 1;
    const size_t want = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 1;
    while (skip < want && i + skip < s.size()) {
      const unsigned char x = s[i + skip];
      bool ok = (x & 0xC0) == 0x80;
      if (skip == 1) {
        if (c == 0xE0 && x < 0xA0) ok = false;
        if (c == 0xED && x >= 0xA0) ok = false;
        if (c == 0xF0 && x < 0x90) ok = false;
        if (c == 0xF4 && x >= 0x90) ok = false;
      }
      if (!ok) break;
      ++skip;
    }
    out += "\xEF\xBF\xBD";
    i += skip;
  }
  return out;
}

// Unicode White_Space (Rust char::is_whitespace).
bool is_white_space(uint32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

// The reference's regex engine (Oniguruma) defines \s as White_Space
// (\t-\r, U+0085, Zs, Zl, Zp); PCRE2 with UCP adds U+180E (its \h). Rewrite
// \s and \S (outside classes) to the explicit set so both agree.
std::string rewrite_space_classes(std::string_view pat) {
  static const char kWs[] = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  std::string out;
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < pat.size(); ++i) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char d = pat[i + 1];
      if (d == 's') out += in_class ? std::string(kWs) : "[" + std::string(kWs) + "]";
      else if (d == 'S' && !in_class) out += "[^" + std::string(kWs) + "]";
      else { out += c; out += d; }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = out.size() + 1;
      out += c;
      if (i + 1 < pat.size() && pat[i + 1] == '^') { out += '^'; ++i; ++class_start; }
      continue;
    }
    if (in_class && c == '[' && i + 1 < pat.size() && pat[i + 1] == ':') {  // POSIX [:name:]
      const size_t e = pat.find(":]", i + 2);
      if (e != std::string_view::npos) { out.append(pat.substr(i, e + 2 - i)); i = e + 1; continue; }
    }
    if (in_class && c == ']' && out.size() > class_start) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

std::shared_ptr<Regex> compile(std::string_view pattern, std::string* error) {
  int ec;
  PCRE2_SIZE eo;
  auto r = std::make_shared<Regex>();
  const std::string pat = rewrite_space_classes(pattern);
  r->code = pcre2_compile((PCRE2_SPTR)pat.data(), pat.size(), PCRE2_UTF | PCRE2_UCP, &ec, &eo, nullptr);
  if (!r->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ec, msg, sizeof msg);
    *error = "regex compile failed at " + std::to_string(eo) + " (" + reinterpret_cast<char*>(msg) + "): " + std::string(pat);
    return nullptr;
  }
  r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

// Word character for added-token single_word: the reference tests \w of
// Rust's regex crate (Alphabetic, marks, Pc, Nd, Join_Control); approximated
// with general categories (Alphabetic ~ L + Nl + marks).
bool is_word_char(uint32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  static const std::shared_ptr<Regex> re = [] {
    std::string e;
    return compile("^[\\p{L}\\p{Nl}\\p{M}\\p{Pc}\\p{Nd}\\x{200C}\\x{200D}]", &e);
  }();
  if (!re) return false;
  std::string s;
  append_utf8(s, c);
  bool hit = false;
  for_each_match(*re, s, [&](size_t, size_t) { hit = true; });
  return hit;
}

}  // namespace kvroute::hf_detail
