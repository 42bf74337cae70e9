// A worker's URL as the proxy connects to it. Pure; thread-safe.
#pragma once

#include <string_view>

namespace kvroute {

// "http://host[:port][/base]", host a name, an IPv4 address or a bracketed
// IPv6 address ("http://[::1]:8000"). Views into the url (a worker's
// announcement, which outlives the request).
struct UpstreamUrl {
  std::string_view host;  // without brackets: what a resolver or make_address takes
  std::string_view port = "80";
  std::string_view base;  // path prefix without trailing '/'
  bool ipv6 = false;      // the Host header brackets it again
};

// False for anything else (another scheme, an empty host, an unclosed '[',
// a port that is not 1-65535).
inline bool parse_url(std::string_view url, UpstreamUrl& out) {
  out = UpstreamUrl();
  constexpr std::string_view scheme = "http://";
  if (!url.starts_with(scheme)) return false;
  url.remove_prefix(scheme.size());
  const auto slash = url.find('/');
  std::string_view hostport = url.substr(0, slash);
  out.base = slash == std::string_view::npos ? std::string_view() : url.substr(slash);
  while (!out.base.empty() && out.base.back() == '/') out.base.remove_suffix(1);
  if (hostport.starts_with('[')) {
    const auto close = hostport.find(']');
    if (close == std::string_view::npos) return false;
    out.host = hostport.substr(1, close - 1);
    out.ipv6 = true;
    hostport.remove_prefix(close + 1);
    if (!hostport.empty()) {
      if (hostport.front() != ':') return false;
      out.port = hostport.substr(1);
    }
  } else if (const auto colon = hostport.rfind(':'); colon != std::string_view::npos) {
    out.host = hostport.substr(0, colon);
    out.port = hostport.substr(colon + 1);
  } else {
    out.host = hostport;
  }
  if (out.host.empty() || out.port.empty() || out.port.size() > 5) return false;
  unsigned port = 0;
  for (const char c : out.port) {
    if (c < '0' || c > '9') return false;
    port = port * 10 + static_cast<unsigned>(c - '0');
  }
  return port >= 1 && port <= 65535;
}

}  // namespace kvroute
