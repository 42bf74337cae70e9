// Which worker URLs a bus-announced worker may have (`events.worker_url_allow`):
// CIDRs ("10.0.0.0/8", "fd00::/8"), single addresses ("10.0.0.7", "::1") and
// origins ("http://vllm-0.llm:8000": scheme, host and port must be equal);
// "*" allows every URL. A URL whose host is a name matches only an origin
// entry or "*": no name is resolved on the heartbeat path. Pure; an
// UrlAllowList is immutable once parsed and safe to read from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvroute {

class UrlAllowList {
 public:
  // Parses the comma-separated entries; nullopt + `error` (naming the entry)
  // on a malformed one. An empty text allows nothing.
  static std::optional<UrlAllowList> parse(std::string_view text, std::string* error = nullptr);

  bool allows(std::string_view url) const;
  bool allows_any() const { return any_; }
  bool empty() const { return !any_ && nets_.empty() && origins_.empty(); }

 private:
  struct Net {
    std::array<uint8_t, 16> addr{};  // IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d)
    unsigned prefix = 128;           // bits compared
  };
  static bool parse_address(std::string_view text, std::array<uint8_t, 16>& out, bool* v4 = nullptr);
  static bool in(const Net& n, const std::array<uint8_t, 16>& a);
  bool any_ = false;
  std::vector<Net> nets_;
  std::vector<std::string> origins_;  // "host:port", host lower-case, IPv6 without brackets
};

}  // namespace kvroute
