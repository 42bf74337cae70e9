// DNS names to addresses with c-ares: every A and AAAA record. Asks the
// servers given ("host:port,...", for split-horizon DNS and tests) or the
// system's (/etc/resolv.conf, /etc/hosts). Blocking, bounded by a timeout.
//
// Threading: one resolver per thread (it owns a c-ares channel); used only
// by the fleet's DNS thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kvroute {

class DnsResolver {
 public:
  enum class Result {
    Ok,        // `addrs` holds every address (numeric text, IPv6 without brackets)
    NotFound,  // the name has no A/AAAA record (NXDOMAIN, NODATA): no workers
    Failed,    // timeout, SERVFAIL, refused...: keep what was known
  };
  // `servers` empty = the system's configuration. On a bad server list,
  // ok() is false and error() says why.
  explicit DnsResolver(const std::string& servers);
  ~DnsResolver();
  DnsResolver(const DnsResolver&) = delete;
  DnsResolver& operator=(const DnsResolver&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  Result resolve(const std::string& name, std::chrono::milliseconds timeout, std::vector<std::string>& addrs,
                 std::string* detail);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string error_;
};

}  // namespace kvroute
