// The worker side of the data plane: idle keep-alive connections per worker
// (UpstreamPool), the relay buffers a response passes through
// (RelayBuffers), connecting to a worker, and the one request kvroute sends a
// worker on its own account (POST /tokenize, tokenizer.remote).
//
// Threading: each io thread owns one pool and one set of buffers (IoThread);
// a pooled socket stays registered with that thread's reactor and is only
// ever used there, so neither takes a lock. Not thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/http_url.h"
#include "common/types.h"
#include "config/config.h"
#include "router/engine_tokenizer.h"
#include "router/http/executor.h"

namespace kvroute {

// Bytes a relay buffer holds: a response read in pieces of at most this.
inline constexpr size_t kRelayBufferBytes = 16 * 1024;

// Idle keep-alive connections per worker url, owned by one io thread.
class UpstreamPool {
 public:
  // A connection idle for longer than this is checked (one MSG_PEEK) before
  // reuse; servers close idle keep-alive connections after seconds, not
  // milliseconds. Either way a pooled connection that fails before the first
  // response byte is retried on a fresh one (the proxy).
  static constexpr auto kCheckAfter = milliseconds(200);

  // An idle connection to `key` the worker has not closed, if any.
  std::optional<Socket> take(std::string_view key);
  // Keeps `s` for `key`, unless `limit` connections to it are idle already
  // (then `s` closes).
  void give(std::string_view key, Socket s, size_t limit);
  void clear() { idle_.clear(); }
  bool empty() const { return idle_.empty(); }
  bool has_idle(std::string_view key) const {
    auto it = idle_.find(key);
    return it != idle_.end() && !it->second.empty();
  }
  // Closes the idle connections of every url `gone(url)` is true for (a
  // worker that left the registry); returns how many.
  template <class Gone>
  size_t evict_if(Gone&& gone) {
    size_t closed = 0;
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (!gone(std::string_view(it->first))) {
        ++it;
        continue;
      }
      closed += it->second.size();
      it = idle_.erase(it);
    }
    return closed;
  }

 private:
  struct Idle {
    Socket socket;
    Steady::time_point since;
  };
  std::map<std::string, std::vector<Idle>, std::less<>> idle_;  // found by string_view
};

// Relay buffers of one io thread, reused from request to request: a 16 KiB
// array in the proxy coroutine's frame made every request malloc that much.
class RelayBuffers {
 public:
  class Lease {
   public:
    Lease(RelayBuffers& owner, std::unique_ptr<char[]> b) : owner_(owner), b_(std::move(b)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (owner_.spare_.size() < kKeep) owner_.spare_.push_back(std::move(b_));
    }
    char* data() { return b_.get(); }

   private:
    RelayBuffers& owner_;
    std::unique_ptr<char[]> b_;
  };
  // A buffer of kRelayBufferBytes, back to the spares when the lease ends.
  Lease take() {
    std::unique_ptr<char[]> b;
    if (spare_.empty()) {
      b = std::make_unique_for_overwrite<char[]>(kRelayBufferBytes);
    } else {
      b = std::move(spare_.back());
      spare_.pop_back();
    }
    return Lease(*this, std::move(b));
  }

 private:
  static constexpr size_t kKeep = 256;  // spare buffers kept per thread (4 MiB)
  std::vector<std::unique_ptr<char[]>> spare_;
};

// Connects `socket` (open or not) to the worker at `url`: straight to an IP
// address, else through the resolver. The caller bounds it with a Deadline;
// `ec` says how it ended. Sets TCP_NODELAY on success.
awaitable<void> connect_to(Socket& socket, const UpstreamUrl& url, boost::system::error_code& ec);

struct IoThread;

// One POST /tokenize (`body`) to the worker at `url` on this io thread (a
// pooled keep-alive connection if one is idle, else a new one), answered
// whole by `deadline`; the answer bounded by tokenizer.remote_max_tokens,
// its ids into `out`. The connection goes back to the pool when the answer
// leaves it reusable (router.upstream_pool_size > 0).
awaitable<EngineTokenizeResult> fetch_engine_tokens(IoThread& io, const Config& cfg, std::string_view url,
                                                    std::string_view body, std::string_view authorization,
                                                    Steady::time_point deadline, std::vector<TokenId>& out);

}  // namespace kvroute
