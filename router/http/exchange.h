// The Exchange, one proxied request's state in proxy()'s coroutine frame, and
// the phases that proxy.cpp (connect, forward, relay, finish) and
// admission.cpp (parse, route, queue, accept) share over it.
//
// Threading: an exchange runs on its client connection's io thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "router/http/flow_gate.h"
#include "router/http/pd_exchange.h"
#include "router/http/proxy.h"
#include "router/http/response_pin.h"
#include "router/http/upstream.h"
#include "router/http/worker_credential.h"

namespace kvroute {

// The phases and the Exchange they share: a named namespace (not an anonymous
// one) because the coroutine frames of the public functions hold these types.
namespace phases {

// What a phase tells proxy() to do next.
enum class Next : uint8_t { Go, NextWorker, Done };

// One proxied request, in proxy()'s coroutine frame; its phases read and
// update it. On its io thread's `exchanges` list: when the shutdown grace is
// over, a walk of that list cuts it (its upstream operation is cancelled; a
// stream ends with an error event and [DONE]). Runs on its io thread only.
struct Exchange final : Swept {
  Exchange(ServerState& st, ClientConn& c, ClientRequest& r, ApiKind k, IoThread& t,
           std::shared_ptr<const Config> config)
      : Swept(t.exchanges), s(st), client(c), req(r), kind(k), io(t), cfg_holder(std::move(config)),
        cfg(*cfg_holder), up_deadline(t.sweeper), watch(t.sweeper, c.socket) {}
  // A slot claimed for a request answered before its first attempt (refused
  // after the queue admitted it) never reached the worker.
  ~Exchange() {
    if (claim && guard) guard->withdraw();
  }

  ServerState& s;
  ClientConn& client;
  ClientRequest& req;
  const ApiKind kind;
  IoThread& io;
  const std::shared_ptr<const Config> cfg_holder;
  const Config& cfg;
  const Steady::time_point started = Steady::now();
  AccessRecord rec;                      // the access log's record, written on every exit
  std::string_view model_label = "unknown";
  bool keep_result = false;              // what proxy() returns when a phase says Done
  FlowStanding flow;                     // tenant, band, deadline (router/http/flow_gate.h)
  std::optional<FlowRefusal> refusal;    // set by wait_in_queue() when flow control answers
  bool cut = false;                      // the shutdown grace is over
  // The workers' credential fields (worker_credential.h), taken once per
  // request before its first attempt; `worker_key` holds the text they view.
  std::shared_ptr<const WorkerCredential::Key> worker_key;
  std::string_view credentials;

  // The attempt in progress: one worker of the ranking.
  const RouteTarget* target = nullptr;
  UpstreamUrl url;
  std::optional<InflightGuard> guard;
  // The slot a queue trial claimed in `guard` when it routed the request
  // (claim_slot(), admission.cpp; the trial may run on the io thread that
  // freed the slot): the first attempt keeps it if it goes to that worker
  // with the same load, else it is released and taken again.
  struct Claim {
    WorkerId worker;
    uint64_t blocks = 0;
    uint64_t prefill = 0;
    uint64_t cached_blocks = 0;
    bool distinct = false;  // the prompt's blocks counted once per worker (inflight_prompt())
  };
  std::optional<Claim> claim;
  std::optional<Socket> upstream;
  bool pooled = false;
  Deadline up_deadline;  // after `upstream`: destroyed first
  std::optional<UpstreamResponseParser> parser;
  beast::error_code ec;
  Steady::time_point sent_at{};
  ResponsePin pin;    // Responses: previous_response_id affinity (response_pin.h)
  bool sent_request = false;  // the attempt's request was written to its worker
  PdState pd;         // a disaggregated fleet's legs (pd_exchange.h)
  const PdContext* pdc = nullptr;  // their context, once the request is routed (in run()'s frame)
  ClientWatch watch;  // last: stops first

  // The body sent to the attempt's worker: a disaggregated fleet's (stripped
  // of the client's transfer fields; the decode leg's), else the client's.
  std::string_view body() const { return pd.active ? pd.body() : std::string_view(req.body); }

  RouterMetrics* metrics() const { return s.hooks.metrics; }

 private:
  void on_sweep(Steady::time_point) override {
    cut = true;
    beast::error_code ignored;
    if (upstream) upstream->cancel(ignored);
  }
};

// ---- outcomes (proxy.cpp)

// The access record and metrics are written, then the API's error answer.
awaitable<bool> reject(Exchange& x, const ApiError& e, std::string_view outcome);
// The same for flow control's refusal (429 with Retry-After, or its 503).
awaitable<bool> refuse(Exchange& x, const FlowRefusal& r);

// ---- admission (admission.cpp)

// A POST's admission: parse, classify (flow control), tokenize by the engine
// where needed, route, wait in the queue while every worker is busy, accept
// the decision, and pin the tenant's and the band's body fields. nullopt:
// the request goes on to its worker; else it was answered here and the value
// is whether the connection is kept.
awaitable<std::optional<bool>> admit(Exchange& x);
// GET /v1/responses/{id}: the ranking is the worker that stored the
// response; an ApiError (404) when kvroute knows no such worker.
std::optional<ApiError> route_retrieve(Exchange& x);

}  // namespace phases
}  // namespace kvroute
