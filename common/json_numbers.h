// JSON numbers that a 64-bit reader (simdjson) rejects but Python's json accepts: integers
// beyond 64 bits and floats beyond the double range (1e400). vLLM and SGLang accept such a
// body, so kvroute must too. Readers that only need other fields parse the copy this makes
// (each such number replaced by +-1e308, itself out of every integer range); the chat
// template reads the original text (tokenizer/jinja_values.cpp keeps the numbers exact).
// Thread-safety: pure functions.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace kvroute {

// The body with every out-of-range number replaced; false when there is none (or the
// text has an unterminated string), leaving *out untouched.
inline bool replace_out_of_range_numbers(std::string_view json, std::string* out) {
  std::string r;
  bool changed = false;
  size_t i = 0, copied = 0;
  while (i < json.size()) {
    char c = json[i];
    if (c == '"') {
      for (++i; i < json.size() && json[i] != '"'; ++i) if (json[i] == '\\') ++i;
      if (i >= json.size()) return false;
      ++i;
      continue;
    }
    if (c != '-' && (c < '0' || c > '9')) { ++i; continue; }
    size_t b = i;
    bool integer = true;
    while (i < json.size() && (json[i] == '-' || json[i] == '+' || json[i] == '.' || json[i] == 'e' || json[i] == 'E' ||
                               (json[i] >= '0' && json[i] <= '9'))) {
      if (json[i] == '.' || json[i] == 'e' || json[i] == 'E') integer = false;
      ++i;
    }
    std::string tok(json.substr(b, i - b));
    bool bad;
    if (integer) {
      int64_t s;
      uint64_t u;
      bool fits = std::from_chars(tok.data(), tok.data() + tok.size(), s).ec == std::errc() ||
                  std::from_chars(tok.data(), tok.data() + tok.size(), u).ec == std::errc();
      bad = !fits;
    } else {
      double d = std::strtod(tok.c_str(), nullptr);
      bad = d > 1.7976931348623157e308 || d < -1.7976931348623157e308;
    }
    if (!bad) continue;
    r.append(json, copied, b - copied);
    r += tok[0] == '-' ? "-1e308" : "1e308";
    copied = i;
    changed = true;
  }
  if (!changed) return false;
  r.append(json, copied, std::string_view::npos);
  *out = std::move(r);
  return true;
}

}  // namespace kvroute
