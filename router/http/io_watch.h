// Timeouts and client-disconnect watches for the proxy, without a timer or a
// system call per socket operation.
//
// Each io thread has one Sweeper: a list of the Deadlines and ClientWatches
// living on that thread, and a periodic tick (HttpServer's sweep loop) that
// looks at each of them. Arming a Deadline is a clock read and two stores;
// a ClientWatch costs nothing until it has waited past its delay. Before this
// the proxy armed a Beast stream timer around every read and write and an
// epoll re-registration per request; without them its CPU per small request
// fell from 76 to 42 us (router/README.md, "Threading and the hot path").
//
// Everything here runs on its io thread only (no locks). Cancelling a socket
// never runs a completion handler inline, so a tick may cancel freely while it
// walks the list.
#pragma once

#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <chrono>
#include <functional>
#include <memory>

#include <sys/socket.h>
#include <cerrno>

namespace kvroute {

// The proxy's sockets: bound to their io thread's io_context by type (no
// type-erased executor on every completion).
using Socket = boost::asio::basic_stream_socket<boost::asio::ip::tcp, boost::asio::io_context::executor_type>;

class Sweeper;

// Something its thread's Sweeper looks at on every tick while it exists.
class Swept {
 public:
  Swept(const Swept&) = delete;
  Swept& operator=(const Swept&) = delete;

 protected:
  explicit Swept(Sweeper& s);
  ~Swept();
  virtual void on_sweep(std::chrono::steady_clock::time_point now) = 0;

 private:
  friend class Sweeper;
  Sweeper& sweeper_;
  Swept* prev_ = nullptr;
  Swept* next_ = nullptr;
};

class Sweeper {
 public:
  void sweep(std::chrono::steady_clock::time_point now) {
    for (Swept* s = head_; s != nullptr;) {
      Swept* next = s->next_;
      s->on_sweep(now);
      s = next;
    }
  }
  size_t size() const { return size_; }

 private:
  friend class Swept;
  void link(Swept* s) {
    s->next_ = head_;
    if (head_) head_->prev_ = s;
    head_ = s;
    ++size_;
  }
  void unlink(Swept* s) {
    (s->prev_ ? s->prev_->next_ : head_) = s->next_;
    if (s->next_) s->next_->prev_ = s->prev_;
    --size_;
  }
  Swept* head_ = nullptr;
  size_t size_ = 0;
};

inline Swept::Swept(Sweeper& s) : sweeper_(s) { sweeper_.link(this); }
inline Swept::~Swept() { sweeper_.unlink(this); }

// A coarse timeout on one socket's operations:
//   d.arm(socket, timeout);  co_await <operation on socket>;  d.settle(ec);
// (arm ... settle around every operation: an armed deadline left behind
// would cancel whatever the socket does next, e.g. a ClientWatch's wait).
// From the first tick past the deadline (and on every later tick until armed
// again or disarmed) the socket's pending operations are cancelled; settle()
// turns that cancellation into asio::error::timed_out. A timeout fires at
// most one tick late (HttpServer picks the tick from the configured timeouts).
class Deadline final : Swept {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(Sweeper& s) : Swept(s) {}

  void arm(Socket& socket, std::chrono::milliseconds timeout) {
    socket_ = &socket;
    at_ = Clock::now() + timeout;
    expired_ = false;
  }
  void disarm() {
    socket_ = nullptr;
    expired_ = false;
  }
  bool expired() const { return expired_; }
  // After the operation: disarms; its failure reads as a timeout if this
  // deadline cut it.
  void settle(boost::system::error_code& ec) {
    if (ec && expired_) ec = boost::asio::error::timed_out;
    disarm();
  }

 private:
  void on_sweep(Clock::time_point now) override {
    if (socket_ == nullptr || now < at_) return;
    expired_ = true;
    boost::system::error_code ignored;
    socket_->cancel(ignored);
  }
  Socket* socket_ = nullptr;
  Clock::time_point at_{};
  bool expired_ = false;
};

// True if the peer closed or reset the connection: readable with no data.
// One non-blocking MSG_PEEK recv; never changes the socket's blocking mode.
inline bool peer_closed(Socket& s) {
  char b;
  const ssize_t n = ::recv(s.native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  return true;  // eof, reset, or another socket error
}

// Watches a client connection while its request waits on a worker: if the
// client goes away, the upstream connection is closed at once (the worker sees
// the disconnect and stops generating). Use, on the request's io thread:
//   ClientWatch w(sweeper, client_socket);
//   w.watch(upstream_socket, at_once);  co_await <upstream op>;
//   if (w.client_gone()) ...   // stops watching
// Watching means one async_wait on the client socket, which costs an epoll
// re-registration; a request that is answered within kDelay never pays for
// it (the first tick after kDelay arms it). Streams arm at once.
class ClientWatch final : Swept {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kDelay = std::chrono::milliseconds(20);

  ClientWatch(Sweeper& s, Socket& client) : Swept(s), client_(client) {}
  ~ClientWatch() { client_gone(); }

  void watch(Socket& upstream, bool at_once) {
    if (upstream_ != &upstream) client_gone();  // a new upstream connection: start over
    upstream_ = &upstream;
    if (at_once) {
      arm();
    } else if (!state_) {
      since_ = Clock::now();
    }
  }
  // Stops watching; true if the client went away meanwhile.
  bool client_gone() {
    upstream_ = nullptr;
    if (!state_) return false;
    const bool gone = state_->client_gone;
    state_->done = true;
    state_.reset();
    boost::system::error_code ignored;
    client_.cancel(ignored);  // the only operation pending on it is the wait
    return gone;
  }
  bool armed() const { return state_ != nullptr; }
  // Watches the client with no connection to close: for a leg that must run
  // to its end whatever the client does (a prefill whose KV would be held
  // for nobody if it were cut as it finished). Arms at once; when the client
  // goes away `on_gone` runs once, on this thread, and client_gone() reads
  // true. Stopped as a watch is (client_gone(), or watch() of an upstream).
  void notice(std::function<void()> on_gone) {
    client_gone();
    arm();
    state_->on_gone = std::move(on_gone);
  }

 private:
  struct State {
    bool done = false;
    bool client_gone = false;
    Socket* upstream = nullptr;       // closed when the client goes (null: none)
    std::function<void()> on_gone;  // notice(): run when the client goes
  };
  void on_sweep(Clock::time_point now) override {
    if (upstream_ != nullptr && !state_ && now - since_ >= kDelay) arm();
  }
  void arm() {
    if (state_) return;
    state_ = std::make_shared<State>();
    state_->upstream = upstream_;
    client_.async_wait(Socket::wait_read,
                       [s = state_, &client = client_](boost::system::error_code ec) {
                         // Disarmed: the request (and maybe the socket) moved on.
                         if (ec || s->done) return;
                         // A spurious wake-up or pipelined data: the client is alive.
                         if (!peer_closed(client)) return;
                         s->client_gone = true;
                         if (s->on_gone) s->on_gone();
                         if (!s->upstream) return;
                         boost::system::error_code ignored;
                         s->upstream->shutdown(Socket::shutdown_both, ignored);
                         s->upstream->close(ignored);
                       });
  }
  Socket& client_;
  Socket* upstream_ = nullptr;
  Clock::time_point since_{};
  std::shared_ptr<State> state_;
};

}  // namespace kvroute
