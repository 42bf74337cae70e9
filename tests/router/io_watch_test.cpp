// router/http/io_watch.h on real loopback sockets: deadlines cut a pending
// operation only once past, and only while armed; a client watch arms itself
// after its delay and closes the upstream when the client goes away.
#include <doctest/doctest.h>

#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>

#include <optional>

#include "router/http/io_watch.h"

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using kvroute::Socket;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Two connected loopback sockets on `ioc`.
std::pair<Socket, Socket> connected_pair(asio::io_context& ioc) {
  tcp::acceptor acceptor(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  Socket a(ioc);
  a.connect(acceptor.local_endpoint());
  Socket b(ioc);
  acceptor.accept(b);
  return {std::move(a), std::move(b)};
}

// Runs `ioc` and ticks `sweeper` every 2 ms until `done()` or `limit` passes.
template <class Done>
void run_until(asio::io_context& ioc, kvroute::Sweeper& sweeper, Done done, milliseconds limit = milliseconds(3000)) {
  const auto end = Clock::now() + limit;
  while (!done() && Clock::now() < end) {
    ioc.restart();
    ioc.run_for(milliseconds(2));
    sweeper.sweep(Clock::now());
  }
}

// A client connection and an upstream one on one io_context and sweeper.
struct WatchRig {
  asio::io_context ioc;
  kvroute::Sweeper sweeper;
  std::pair<Socket, Socket> client_pair = connected_pair(ioc);
  std::pair<Socket, Socket> upstream_pair = connected_pair(ioc);
  Socket& client = client_pair.first;
  Socket& client_peer = client_pair.second;
  Socket& upstream = upstream_pair.first;
  Socket& upstream_peer = upstream_pair.second;
};

}  // namespace

TEST_CASE("a deadline cancels a pending read once past, and it reads as a timeout") {
  asio::io_context ioc;
  kvroute::Sweeper sweeper;
  auto [mine, peer] = connected_pair(ioc);
  kvroute::Deadline deadline(sweeper);
  CHECK(sweeper.size() == 1);

  char b[16];
  std::optional<boost::system::error_code> result;
  const auto t0 = Clock::now();
  deadline.arm(mine, milliseconds(40));
  mine.async_read_some(asio::buffer(b), [&](boost::system::error_code ec, size_t) { result = ec; });
  run_until(ioc, sweeper, [&] { return result.has_value(); });
  REQUIRE(result.has_value());
  const auto waited = Clock::now() - t0;
  CHECK(waited >= milliseconds(40));
  CHECK(waited < milliseconds(1000));
  CHECK(*result == asio::error::operation_aborted);
  boost::system::error_code ec = *result;
  deadline.settle(ec);
  CHECK(ec == asio::error::timed_out);
  CHECK_FALSE(deadline.expired());  // settle disarms
}

TEST_CASE("a settled deadline does not cut the socket's next operation") {
  asio::io_context ioc;
  kvroute::Sweeper sweeper;
  auto [mine, peer] = connected_pair(ioc);
  kvroute::Deadline deadline(sweeper);

  // An operation that finishes in time keeps its result.
  char b[16];
  std::optional<boost::system::error_code> first;
  deadline.arm(mine, milliseconds(20));
  asio::write(peer, asio::buffer("x", 1));
  mine.async_read_some(asio::buffer(b), [&](boost::system::error_code ec, size_t) { first = ec; });
  run_until(ioc, sweeper, [&] { return first.has_value(); });
  REQUIRE(first.has_value());
  boost::system::error_code ec = *first;
  deadline.settle(ec);
  CHECK(!ec);

  // Long past the old deadline, a read started without arming stays pending
  // until data comes.
  std::optional<boost::system::error_code> second;
  mine.async_read_some(asio::buffer(b), [&](boost::system::error_code e, size_t) { second = e; });
  const auto t0 = Clock::now();
  run_until(ioc, sweeper, [&] { return second.has_value() || Clock::now() - t0 > milliseconds(100); });
  CHECK_FALSE(second.has_value());
  asio::write(peer, asio::buffer("y", 1));
  run_until(ioc, sweeper, [&] { return second.has_value(); });
  REQUIRE(second.has_value());
  CHECK(!*second);
}

TEST_CASE("a client watch arms after its delay and closes the upstream when the client leaves") {
  WatchRig rig;
  auto& [ioc, sweeper, cp, up, client, client_peer, upstream, upstream_peer] = rig;
  {
    kvroute::ClientWatch watch(sweeper, client);
    watch.watch(upstream, false);
    sweeper.sweep(Clock::now());
    CHECK_FALSE(watch.armed());  // a quick answer never pays for the watch
    run_until(ioc, sweeper, [&] { return watch.armed(); });
    CHECK(watch.armed());

    client_peer.close();  // the client goes away
    run_until(ioc, sweeper, [&] { return !upstream.is_open(); });
    CHECK_FALSE(upstream.is_open());
    CHECK(watch.client_gone());
  }
  CHECK(sweeper.size() == 0);
  // The worker side sees the close (the worker stops generating).
  char b[4];
  boost::system::error_code ec;
  upstream_peer.read_some(asio::buffer(b), ec);
  CHECK(ec == asio::error::eof);
}

TEST_CASE("a client that stays leaves the upstream alone") {
  WatchRig rig;
  auto& [ioc, sweeper, cp, up, client, client_peer, upstream, upstream_peer] = rig;
  kvroute::ClientWatch watch(sweeper, client);
  watch.watch(upstream, true);
  CHECK(watch.armed());
  const auto t0 = Clock::now();
  run_until(ioc, sweeper, [&] { return Clock::now() - t0 > milliseconds(50); });
  CHECK(upstream.is_open());
  CHECK_FALSE(watch.client_gone());
  CHECK_FALSE(watch.armed());
  // Disarmed: closing the client now touches nothing.
  client_peer.close();
  const auto t1 = Clock::now();
  run_until(ioc, sweeper, [&] { return Clock::now() - t1 > milliseconds(50); });
  CHECK(upstream.is_open());
}

TEST_CASE("a notice tells the client's leaving once and closes nothing; a later watch replaces it") {
  WatchRig rig;
  auto& [ioc, sweeper, cp, up, client, client_peer, upstream, upstream_peer] = rig;
  kvroute::ClientWatch watch(sweeper, client);
  int noticed = 0;
  watch.notice([&] { ++noticed; });
  CHECK(watch.armed());  // at once: no upstream whose activity would arm it
  client_peer.close();
  run_until(ioc, sweeper, [&] { return noticed > 0; });
  CHECK(noticed == 1);
  CHECK(upstream.is_open());  // the leg it watched for runs on
  CHECK(watch.client_gone());
  CHECK_FALSE(watch.armed());

  // A notice stopped before the client leaves runs nothing; watch() of an upstream stops it too.
  auto [client2, client2_peer] = connected_pair(ioc);
  kvroute::ClientWatch watch2(sweeper, client2);
  int noticed2 = 0;
  watch2.notice([&] { ++noticed2; });
  watch2.watch(upstream, true);  // the decode leg's watch: closes its upstream when the client goes
  client2_peer.close();
  run_until(ioc, sweeper, [&] { return !upstream.is_open(); });
  CHECK_FALSE(upstream.is_open());
  CHECK(noticed2 == 0);
  CHECK(watch2.client_gone());
}
