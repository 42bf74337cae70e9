// http://host[:port][/path] split into parts; IPv6 literals in brackets
// (http://[::1]:8000/metrics). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvroute {

struct HttpUrl {
  std::string host;    // without brackets
  uint16_t port = 80;
  std::string target;  // "/path?query", "/" when absent
  bool https = false;
};

// False for anything that is not a well-formed http:// or https:// URL.
bool parse_http_url(std::string_view url, HttpUrl& out);

}  // namespace kvroute
