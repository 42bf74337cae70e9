// The exchange: one proxied OpenAI request's life, one function per phase
// (proxy.cpp; after Envoy's router filter, source/common/router/router.cc,
// and Beast's relay() in example/doc/http_examples.hpp):
//   admit       router.max_concurrent_requests (503)
//   parse       the body (400 with OpenAI's error body)
//   tokenize    by the engine, when no local tokenizer can (tokenizer.remote)
//   route       the ranking; the wait queue while every worker is busy
//   forward     each worker of the ranking until one answers: a pooled or new
//               connection, the request, the response head (the first byte)
//   relay       a small sized body whole, anything else piece by piece
//   finish      the access record and metrics, on every exit
//
// Threading: an exchange runs on its client connection's io thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "router/http/executor.h"
#include "router/http/io_thread.h"
#include "router/http/server_state.h"
#include "router/http/session.h"
#include "router/http/wire.h"
#include "router/openai_request.h"

namespace kvroute {

// The API a request is proxied as, if it is a POST to one of the OpenAI routes
// or GET /v1/responses/{id} (ApiKind::Responses; the proxy tells it by its method).
std::optional<ApiKind> proxied_api(const ClientRequest& req);
// The {id} of GET /v1/responses/{id}[?query] (empty: none, or it has a '/').
std::string_view response_id_of_path(std::string_view target);

// One proxied OpenAI request on `client`; true if the connection is kept.
awaitable<bool> proxy(ServerState& s, ClientConn& client, ClientRequest& req, ApiKind kind, IoThread& io);

// Tokenization by the engine (tokenizer.remote = auto; router/engine_tokenizer.h),
// the synchronous half: the /tokenize body for the request into `body`, and
// its answer from the cache if one was seen. True when the request needs no
// round trip (a cache hit, or nothing to ask: engine_failed).
bool engine_tokens_cached(ServerState& s, const Config& cfg, ParsedRequest& parsed, std::string& body);
// The round trip (a cache miss): one of the model's workers is asked with its
// own POST /tokenize (`body`), within tokenizer.remote_timeout_ms. Connection
// failures move on to one more worker; any failure leaves the request to the
// placeholder (parsed.engine_failed: counted, warned), and the engine's own
// failures (not a request it refuses) start the model's backoff.
awaitable<void> engine_tokens(ServerState& s, IoThread& io, const Config& cfg, ParsedRequest& parsed,
                              std::string_view authorization, const std::string& body);

}  // namespace kvroute
