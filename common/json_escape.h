// JSON string escaping for hand-written JSON output. Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace kvroute {

// Appends `in` escaped for use inside a JSON string literal (quotes not
// added); runs of plain characters go in one append.
inline void json_escape_append(std::string& out, std::string_view in) {
  static constexpr char kHex[] = "0123456789abcdef";
  size_t run = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const auto c = static_cast<unsigned char>(in[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(in.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        const char u[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        out.append(u, 6);
      }
    }
  }
  out.append(in.data() + run, in.size() - run);
}

// Escapes `in` for use inside a JSON string literal (quotes not added).
inline std::string json_escape(std::string_view in) {
  std::string out;
  out.reserve(in.size() + 8);
  json_escape_append(out, in);
  return out;
}

}  // namespace kvroute
