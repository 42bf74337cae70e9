// What kvroute answers itself rather than proxying: GET /health, /ready,
// /metrics, /v1/models and /v1/models/{id} on the OpenAI listener (405 or
// 404 for anything else there), and the admin listener's routes (the admin
// API, router/admin_api.h, with route explain tokenizing as the data plane
// does).
//
// Threading: on the connection's io thread (the admin thread for admin).
#pragma once

#include <string_view>

#include "router/http/executor.h"
#include "router/http/io_thread.h"
#include "router/http/server_state.h"
#include "router/http/session.h"
#include "router/http/wire.h"

namespace kvroute {

// The route label of a path (kvroute_router_requests_total{route}): a fixed
// set, "other" for any other path.
std::string_view route_label(std::string_view target);

// Every request of the OpenAI listener but the proxied routes
// (proxied_api()). True if the connection is kept.
awaitable<bool> handle_local(ServerState& s, ClientConn& client, ClientRequest& req);

// A request on the admin listener. True if the connection is kept.
awaitable<bool> handle_admin(ServerState& s, ClientConn& client, ClientRequest& req, IoThread& io);

}  // namespace kvroute
