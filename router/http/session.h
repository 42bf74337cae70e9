// A client connection (Beast's http_session): reads its requests one after
// another within the limits (header and body size, read timeout, the body
// budget and the concurrency limit checked before a body is read), sends each
// to the proxy (the OpenAI routes) or to kvroute's own answers
// (local_routes.h), and keeps the connection alive between them.
//
// Threading: a connection and everything in it lives on one io thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http/status.hpp>

#include "router/http/executor.h"
#include "router/http/io_thread.h"
#include "router/http/server_state.h"
#include "router/http/wire.h"
#include "router/openai_request.h"
#include "router/routing.h"

namespace kvroute {

// A client connection: its socket, the deadline of its current operation, and
// the state its requests need. On its io thread's `connections` list: when
// the server drains, a connection waiting for its next request is closed.
struct ClientConn final : Swept {
  ClientConn(Socket s, IoThread& io) : Swept(io.connections), socket(std::move(s)), deadline(io.sweeper) {}
  Socket socket;
  Deadline deadline;
  bool between = false;  // waiting for the next request, no byte of it received
  uint64_t served = 0;   // requests read on this connection
  // The current request's state, kept from request to request for its
  // capacity (no allocation per request once it has grown).
  std::string upstream_head;
  std::string response_head;
  beast::flat_buffer upstream_buffer;
  UpstreamResponse response;
  ParsedRequest parsed;
  std::string chat_body;  // the chat body a Responses or Messages request converts into (parsed.body views it)
  RouteResult route;
  // Arms the deadline for the next operation on the socket.
  void expires_after(milliseconds t) { deadline.arm(socket, t); }
  // Between requests: an idle connection (thousands may be open) keeps no
  // worker announcement alive and no large buffer.
  void idle();

 private:
  // Draining: closes a kept-alive connection waiting for its next request (a
  // new connection gets its first request served, with Connection: close).
  void on_sweep(Steady::time_point) override;
};

// Serves one accepted connection until it closes (`admin`: the admin
// listener's). Gives its place under the connection limit back when it ends.
awaitable<void> session(ServerState& s, Socket socket, bool admin, IoThread& io);

// A response kvroute writes itself (not a worker's): the body with
// Content-Type, Server and, for a 503, Retry-After. True if the connection is
// kept (the client asked for it and the server is not draining).
awaitable<bool> respond(ServerState& s, ClientConn& client, unsigned version, bool keep_alive, http::status status,
                        std::string body, std::string_view content_type = "application/json",
                        std::optional<unsigned> retry_after = std::nullopt);
// An error body in the route's shape (OpenAI's, or Anthropic's for the
// Messages routes: api_error_body()) with the error's status (503:
// Retry-After: 1, unless `retry_after` says otherwise; a 429 from flow
// control names its own).
awaitable<bool> respond_error(ServerState& s, ClientConn& client, unsigned version, bool keep_alive,
                              const ApiError& e, ApiKind api = ApiKind::ChatCompletions,
                              std::optional<unsigned> retry_after = std::nullopt);

}  // namespace kvroute
