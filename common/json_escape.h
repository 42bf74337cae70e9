// JSON string escaping for hand-written JSON output. Pure; thread-safe.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace kvroute {

// Escapes `in` for use inside a JSON string literal (quotes not added).
inline std::string json_escape(std::string_view in) {
  std::string out;
  out.reserve(in.size() + 8);
  for (char ch : in) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(ch)));
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

}  // namespace kvroute
