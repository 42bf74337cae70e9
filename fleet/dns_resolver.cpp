#include "fleet/dns_resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <mutex>

namespace kvroute {

namespace {
std::once_flag g_ares_init;
}

struct DnsResolver::Impl {
  ares_channel channel = nullptr;
};

DnsResolver::DnsResolver(const std::string& servers) : impl_(std::make_unique<Impl>()) {
  std::call_once(g_ares_init, [] { ares_library_init(ARES_LIB_INIT_ALL); });
  ares_options opts{};
  opts.timeout = 1000;  // ms per try
  opts.tries = 2;
  int mask = ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES;
  if (int rc = ares_init_options(&impl_->channel, &opts, mask); rc != ARES_SUCCESS) {
    error_ = std::string("c-ares init: ") + ares_strerror(rc);
    impl_->channel = nullptr;
    return;
  }
  if (!servers.empty()) {
    if (int rc = ares_set_servers_ports_csv(impl_->channel, servers.c_str()); rc != ARES_SUCCESS)
      error_ = "discovery.dns_servers: '" + servers + "': " + ares_strerror(rc);
  }
}

DnsResolver::~DnsResolver() {
  if (impl_->channel) ares_destroy(impl_->channel);
}

namespace {

struct Query {
  bool done = false;
  int status = ARES_SUCCESS;
  std::vector<std::string> addrs;
};

void on_addrinfo(void* arg, int status, int /*timeouts*/, ares_addrinfo* res) {
  auto* q = static_cast<Query*>(arg);
  q->done = true;
  q->status = status;
  if (status != ARES_SUCCESS || !res) {
    if (res) ares_freeaddrinfo(res);
    return;
  }
  for (ares_addrinfo_node* n = res->nodes; n; n = n->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (n->ai_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(n->ai_addr)->sin_addr, buf, sizeof buf);
    else if (n->ai_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(n->ai_addr)->sin6_addr, buf, sizeof buf);
    else
      continue;
    q->addrs.emplace_back(buf);
  }
  ares_freeaddrinfo(res);
  std::sort(q->addrs.begin(), q->addrs.end());
  q->addrs.erase(std::unique(q->addrs.begin(), q->addrs.end()), q->addrs.end());
}

}  // namespace

DnsResolver::Result DnsResolver::resolve(const std::string& name, std::chrono::milliseconds timeout,
                                         std::vector<std::string>& addrs, std::string* detail) {
  addrs.clear();
  if (!impl_->channel || !error_.empty()) {
    if (detail) *detail = error_;
    return Result::Failed;
  }
  Query q;
  ares_addrinfo_hints hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  ares_getaddrinfo(impl_->channel, name.c_str(), nullptr, &hints, on_addrinfo, &q);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!q.done) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) {
      ares_cancel(impl_->channel);  // runs the callback with ARES_ECANCELLED
      break;
    }
    // poll(), not select(): the daemon holds thousands of descriptors (FD_SETSIZE is 1024).
    ares_socket_t socks[ARES_GETSOCK_MAXNUM];
    const int bits = ares_getsock(impl_->channel, socks, ARES_GETSOCK_MAXNUM);
    pollfd pfds[ARES_GETSOCK_MAXNUM];
    nfds_t n = 0;
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      short ev = 0;
      if (ARES_GETSOCK_READABLE(bits, i)) ev |= POLLIN;
      if (ARES_GETSOCK_WRITABLE(bits, i)) ev |= POLLOUT;
      if (ev) pfds[n++] = pollfd{socks[i], ev, 0};
    }
    timeval cap{}, tv{};
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(left).count();
    cap.tv_sec = static_cast<time_t>(us / 1000000);
    cap.tv_usec = static_cast<suseconds_t>(us % 1000000);
    const timeval* tvp = ares_timeout(impl_->channel, &cap, &tv);
    const int wait_ms = static_cast<int>(tvp->tv_sec * 1000 + tvp->tv_usec / 1000) + 1;
    poll(pfds, n, wait_ms);
    bool any = false;
    for (nfds_t i = 0; i < n; ++i) {
      if (!pfds[i].revents) continue;
      any = true;
      const bool r = pfds[i].revents & (POLLIN | POLLERR | POLLHUP);
      const bool w = pfds[i].revents & POLLOUT;
      ares_process_fd(impl_->channel, r ? pfds[i].fd : ARES_SOCKET_BAD, w ? pfds[i].fd : ARES_SOCKET_BAD);
    }
    if (!any) ares_process_fd(impl_->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
  }
  if (!q.done || q.status != ARES_SUCCESS) {
    const int st = q.done ? q.status : ARES_ETIMEOUT;
    if (detail) *detail = ares_strerror(st);
    return (st == ARES_ENOTFOUND || st == ARES_ENODATA) ? Result::NotFound : Result::Failed;
  }
  addrs = std::move(q.addrs);
  return addrs.empty() ? Result::NotFound : Result::Ok;
}

}  // namespace kvroute
