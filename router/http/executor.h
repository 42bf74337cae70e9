// The io threads' Asio vocabulary: sockets, timers and coroutines typed on
// the io_context's own executor (the default any_io_executor type-erases it
// on every completion), and their coroutine frames from the FramePool.
//
// Every translation unit that defines a coroutine returning
// awaitable<T> includes this header: the std::coroutine_traits
// specialization below must be seen wherever such a coroutine is defined.
//
// GCC 12 destroys some temporaries of a co_await expression twice: never pass
// a temporary object (e.g. ApiError{...}) into a co_await'ed call; name it first.
#pragma once

#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/basic_resolver.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <coroutine>

#include "router/http/frame_pool.h"
#include "router/http/io_watch.h"

namespace kvroute {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Executor = asio::io_context::executor_type;
template <class T>
using awaitable = asio::awaitable<T, Executor>;
inline constexpr asio::use_awaitable_t<Executor> use_awaitable;
using Acceptor = asio::basic_socket_acceptor<tcp, Executor>;
using Timer = asio::basic_waitable_timer<std::chrono::steady_clock, asio::wait_traits<std::chrono::steady_clock>,
                                         Executor>;
using Resolver = asio::ip::basic_resolver<tcp, Executor>;
using Steady = std::chrono::steady_clock;
using std::chrono::milliseconds;

// An operation's completion token that stores its error in `ec` instead of
// throwing it.
inline auto nothrow(boost::system::error_code& ec) { return asio::redirect_error(use_awaitable, ec); }

inline double seconds_since(Steady::time_point t) {
  return std::chrono::duration<double>(Steady::now() - t).count();
}

// Asio's promise type for this executor's coroutines, with frames from the
// FramePool (the std::coroutine_traits specialization below picks it).
template <class T>
class PooledFrame final : public asio::detail::awaitable_frame<T, Executor> {
  using Base = asio::detail::awaitable_frame<T, Executor>;

 public:
  static void* operator new(std::size_t size) { return FramePool::allocate(size); }
  static void operator delete(void* p, std::size_t size) noexcept { FramePool::deallocate(p, size); }

  // Asio's awaitable takes its caller's handle typed on asio's promise: this
  // hands it over as one (the promise is that base at the same address).
  template <class U>
  struct Awaiter {
    asio::awaitable<U, Executor> a;
    bool await_ready() const noexcept { return a.await_ready(); }
    void await_suspend(std::coroutine_handle<PooledFrame> h) {
      a.await_suspend(std::coroutine_handle<Base>::from_promise(static_cast<Base&>(h.promise())));
    }
    U await_resume() { return a.await_resume(); }
  };
  using Base::await_transform;
  template <class U>
  Awaiter<U> await_transform(asio::awaitable<U, Executor> a) const {
    return Awaiter<U>{std::move(a)};
  }
};

}  // namespace kvroute

// Every coroutine typed on kvroute::Executor uses PooledFrame; asio's own
// specialization, for any executor, is less specialized.
template <class T, class... Args>
struct std::coroutine_traits<boost::asio::awaitable<T, kvroute::Executor>, Args...> {
  using promise_type = kvroute::PooledFrame<T>;
};
