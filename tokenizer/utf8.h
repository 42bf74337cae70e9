// UTF-8 encoding shared by the tokenizer's parts (HfTokenizer, NFC, Jinja). Pure.
#pragma once

#include <cstdint>
#include <string>

namespace kvroute {

// Appends code point `cp` as UTF-8. A lone surrogate (U+D800..U+DFFF) is
// written as U+FFFD, as Node and Rust do when they encode one.
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace kvroute
