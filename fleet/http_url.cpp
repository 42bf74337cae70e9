#include "fleet/http_url.h"

#include <charconv>

namespace kvroute {

bool parse_http_url(std::string_view url, HttpUrl& out) {
  out = HttpUrl{};
  if (url.rfind("http://", 0) == 0) {
    url.remove_prefix(7);
  } else if (url.rfind("https://", 0) == 0) {
    url.remove_prefix(8);
    out.https = true;
    out.port = 443;
  } else {
    return false;
  }
  const size_t slash = url.find('/');
  std::string_view authority = url.substr(0, slash);
  out.target = slash == std::string_view::npos ? "/" : std::string(url.substr(slash));
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      port = rest.substr(1);
      if (port.empty()) return false;
    }
  } else {
    const size_t colon = authority.rfind(':');
    if (colon != std::string_view::npos) {
      if (authority.find(':') != colon) return false;  // a bare IPv6 literal needs brackets
      port = authority.substr(colon + 1);
      if (port.empty()) return false;
      authority = authority.substr(0, colon);
    }
    out.host = std::string(authority);
  }
  if (out.host.empty() || out.host.find_first_of(" /?#@") != std::string::npos) return false;
  if (!port.empty()) {
    unsigned p = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || ptr != port.data() + port.size() || p == 0 || p > 65535) return false;
    out.port = static_cast<uint16_t>(p);
  }
  return true;
}

}  // namespace kvroute
