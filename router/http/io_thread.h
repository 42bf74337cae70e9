// One io thread of the data plane and what it owns: its io_context (run by
// exactly one thread, so handlers need no strand), its upstream pool and
// relay buffers, and its sweepers (timeouts and client watches, io_watch.h).
// A client connection, every request on it and the upstream connections they
// use stay on one IoThread for their whole life.
//
// Threading: everything here is touched by its own thread only, but for
// `ioc` (posting to it is thread-safe) and construction/join by the server.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <thread>
#include <vector>

#include "common/types.h"
#include "router/http/admission_queue.h"
#include "router/http/executor.h"
#include "router/http/io_watch.h"
#include "router/http/upstream.h"

namespace kvroute {

struct IoThread {
  // First: these outlive the coroutines the io_context destroys.
  Sweeper sweeper;
  Sweeper connections;  // every client connection; walked when draining (never ticked)
  Sweeper exchanges;    // every proxied request; walked when the shutdown grace is over
  RelayBuffers buffers;
  // Workers this thread reported a failure of (passive health) and has not
  // seen answer since: a success is reported only for them (no registry
  // update per request otherwise).
  std::vector<WorkerId> suspects;
  Steady::time_point next_pool_check{};
  // One thread runs it and only that thread starts operations on its sockets:
  // the reactor's per-socket locks are not needed (registration and posting
  // from other threads stay locked).
  asio::io_context ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(ioc);
  // The queue trials a capacity event raised on this thread took from
  // other threads' waiters (admission_queue.h); installed while it runs.
  Handover handover{ioc.get_executor()};
  UpstreamPool pool;
  std::thread thread;

  // Remembers a worker this thread reported a failure of.
  void suspect(WorkerId id) {
    if (std::find(suspects.begin(), suspects.end(), id) == suspects.end()) suspects.push_back(id);
  }
};

}  // namespace kvroute
