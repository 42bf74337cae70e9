#include "common/url_allow_list.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>

#include "common/http_url.h"

namespace kvroute {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// "host:port" of a parsed URL, host lower-case: what an origin entry is compared on.
std::string origin_key(const UpstreamUrl& u) {
  std::string key(u.host);
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
  key += ':';
  key += u.port;
  return key;
}

}  // namespace

bool UrlAllowList::parse_address(std::string_view text, std::array<uint8_t, 16>& out, bool* v4) {
  char buf[64];
  if (text.empty() || text.size() >= sizeof buf) return false;
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  in_addr a4{};
  if (inet_pton(AF_INET, buf, &a4) == 1) {
    out = {};
    out[10] = out[11] = 0xff;
    std::memcpy(out.data() + 12, &a4, 4);
    if (v4) *v4 = true;
    return true;
  }
  in6_addr a6{};
  if (inet_pton(AF_INET6, buf, &a6) == 1) {
    std::memcpy(out.data(), &a6, 16);
    if (v4) *v4 = false;
    return true;
  }
  return false;
}

bool UrlAllowList::in(const Net& n, const std::array<uint8_t, 16>& a) {
  const unsigned bytes = n.prefix / 8, bits = n.prefix % 8;
  if (std::memcmp(n.addr.data(), a.data(), bytes) != 0) return false;
  if (bits == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xff << (8 - bits));
  return (n.addr[bytes] & mask) == (a[bytes] & mask);
}

std::optional<UrlAllowList> UrlAllowList::parse(std::string_view text, std::string* error) {
  UrlAllowList list;
  auto fail = [&](std::string_view entry, std::string_view why) -> std::optional<UrlAllowList> {
    if (error) *error = "'" + std::string(entry) + "': " + std::string(why);
    return std::nullopt;
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view entry = trim(text.substr(start, end - start));
    start = end + 1;
    if (entry.empty()) continue;
    if (entry == "*") {
      list.any_ = true;
      continue;
    }
    if (entry.find("://") != std::string_view::npos) {
      UpstreamUrl u;
      if (!parse_url(entry, u)) return fail(entry, "not an http://host[:port] origin");
      if (!u.base.empty()) return fail(entry, "an origin has no path");
      list.origins_.push_back(origin_key(u));
      continue;
    }
    Net n;
    const size_t slash = entry.find('/');
    bool v4 = false;
    if (!parse_address(entry.substr(0, slash), n.addr, &v4)) return fail(entry, "not an IP address or CIDR");
    const unsigned max_prefix = v4 ? 32 : 128;
    unsigned prefix = max_prefix;
    if (slash != std::string_view::npos) {
      const std::string_view p = entry.substr(slash + 1);
      const auto r = std::from_chars(p.data(), p.data() + p.size(), prefix);
      if (p.empty() || r.ec != std::errc() || r.ptr != p.data() + p.size() || prefix > max_prefix)
        return fail(entry, "prefix length out of range");
    }
    n.prefix = v4 ? prefix + 96 : prefix;
    list.nets_.push_back(n);
  }
  return list;
}

bool UrlAllowList::allows(std::string_view url) const {
  if (any_) return true;
  UpstreamUrl u;
  if (!parse_url(url, u)) return false;
  if (!origins_.empty() && std::find(origins_.begin(), origins_.end(), origin_key(u)) != origins_.end()) return true;
  std::array<uint8_t, 16> a;
  if (!parse_address(u.host, a)) return false;  // a name: only an origin entry names it
  return std::any_of(nets_.begin(), nets_.end(), [&](const Net& n) { return in(n, a); });
}

}  // namespace kvroute
