// Router and scheduler metrics, declared in one block (counters, gauges,
// histograms). Names: kvroute_<module>_<noun>_<unit|total>. Labels are
// bounded: route and status are fixed sets, model and worker come from the
// worker registry (unknown models are labelled "unknown"), and a worker's
// series are removed when it leaves.
#pragma once

#include <array>
#include <charconv>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "common/metrics.h"
#include "common/types.h"

namespace kvroute {

struct RouterMetrics {
  explicit RouterMetrics(metrics::Registry& r)
      // counters
      : requests_total(r.counter("kvroute_router_requests_total", "HTTP requests by route, status and model",
                                 {"route", "status", "model"})),
        upstream_errors_total(r.counter("kvroute_router_upstream_errors_total",
                                        "Worker failures by phase (connect, first_byte, mid_stream)", {"reason"})),
        retries_total(r.counter("kvroute_router_retries_total", "Requests sent to a further worker after a failure")),
        cancels_total(r.counter("kvroute_router_cancels_total", "Client disconnects before the response ended")),
        rejected_total(r.counter("kvroute_router_rejected_total",
                                 "Requests refused before routing (limit, queue_full, queue_timeout, body_budget, "
                                 "connection_limit, admin_connection_limit, prompt_exceeds_kv)",
                                 {"reason"})),
        prompt_tokens_total(r.counter("kvroute_router_prompt_tokens_total", "Prompt tokens of routed requests")),
        cached_tokens_total(r.counter("kvroute_router_cached_tokens_total",
                                      "Prompt tokens the index found cached on the chosen worker")),
        worker_prompt_tokens_total(r.counter("kvroute_router_worker_prompt_tokens_total",
                                             "Prompt tokens routed to each worker", {"worker"})),
        worker_cached_tokens_total(r.counter("kvroute_router_worker_cached_tokens_total",
                                             "Cached prompt tokens on each worker at routing time", {"worker"})),
        pool_hit_tokens_total(r.counter("kvroute_router_pool_hit_tokens_total",
                                        "Of cached_tokens_total, the tokens the chosen worker loads from a shared "
                                        "pool (indexer.kv_pools), by pool",
                                        {"pool"})),
        pool_hits_total(r.counter("kvroute_router_pool_hits_total",
                                  "Routed requests whose chosen worker loads part of the prompt from a shared pool",
                                  {"pool"})),
        best_cached_tokens_total(r.counter(
            "kvroute_router_best_cached_tokens_total",
            "Longest cached prefix among eligible workers at routing time (tokens); the decision-quality gap is "
            "1 - cached_tokens_total / this")),
        decisions_total(r.counter("kvroute_scheduler_decisions_total",
                                  "Routing decisions by outcome (best_overlap, balance, no_worker)", {"outcome"})),
        all_busy_total(r.counter("kvroute_scheduler_all_busy_total",
                                 "Requests sent to a busy worker because every worker was busy "
                                 "(scheduler.reject_when_busy false, queue_size 0)")),
        slots_full_total(r.counter("kvroute_scheduler_slots_full_total",
                                   "Requests ranked with the slot test lifted: the model's workers had nearly all "
                                   "their request slots taken (scheduler.busy_slot_fleet_usage)")),
        tokenizer_fallbacks_total(r.counter(
            "kvroute_router_tokenizer_fallbacks_total",
            "Routed requests tokenized by the placeholder, by model and reason (no_tokenizer, "
            "no_chat_template, template_error, engine_error)",
            {"model", "reason"})),
        tokenized_requests_total(r.counter(
            "kvroute_router_tokenized_requests_total",
            "Routed requests by model and where their token ids came from (client, local, engine, placeholder)",
            {"model", "source"})),
        engine_tokenize_total(r.counter(
            "kvroute_router_engine_tokenize_total",
            "Requests tokenized by their engine's POST /tokenize (tokenizer.remote), by result (ok, no_worker, "
            "backoff, connect, timeout, rejected, status, bad_response, too_large); cache hits not counted",
            {"result"})),
        engine_tokenize_cache_total(r.counter("kvroute_router_engine_tokenize_cache_total",
                                              "Lookups in the cache of /tokenize answers by result (hit, miss)",
                                              {"result"})),
        previous_response_total(r.counter(
            "kvroute_router_previous_response_total",
            "Responses API requests naming a previous_response_id, by result (pinned: sent to the worker that "
            "produced it; unknown: an id kvroute does not remember; worker_gone: its worker is no candidate now)",
            {"result"})),
        response_retrieve_total(r.counter(
            "kvroute_router_response_retrieve_total",
            "GET /v1/responses/{id} by result (routed: sent to the worker that produced the response; unknown: an "
            "id kvroute does not remember, 404; worker_gone: its worker is no candidate now, 404)",
            {"result"})),
        pd_requests_total(r.counter(
            "kvroute_pd_requests_total",
            "Requests to a disaggregated fleet by outcome (disaggregated; aggregated: the decision ran it whole; "
            "fallback: run whole after its prefill failed; failed: answered 503 by pd.on_prefill_failure fail) and "
            "reason (the decision's, or the prefill failure's)",
            {"outcome", "reason"})),
        pd_retries_total(r.counter("kvroute_pd_retries_total",
                                   "Legs sent to a further worker after a failure, by leg (prefill, decode)", {"leg"})),
        pd_params_rejected_total(r.counter(
            "kvroute_pd_params_rejected_total",
            "Prefill answers whose kv_transfer_params were not relayed, by reason (too_large, not_json, missing, "
            "not_object, wrong_type, not_for_decode, host_mismatch)",
            {"reason"})),
        pd_releases_total(r.counter(
            "kvroute_pd_releases_total",
            "Decode legs sent only to release a prefilled transfer (the client left during or after its prefill), "
            "by result (ok, failed)",
            {"result"})),
        pd_prefill_legs_total(r.counter(
            "kvroute_pd_prefill_legs_total",
            "Prefill legs by result (ok, refused, status_4xx, status_5xx, timeout, connect, closed, cancelled)",
            {"result"})),
        pd_transfers_left_total(r.counter(
            "kvroute_pd_transfers_left_total",
            "Prefilled transfers left to the engines, by reason: worker_closed (the decode worker closed or reset "
            "the connection after it received its leg: a transfer it had not pulled stays held until the prefill "
            "engine's lease ends), timeout (kvroute closed the decode leg: the decode engine aborts and frees it), "
            "status_5xx (the decode engine answered an error and released it), release_failed (a release leg "
            "failed: held until the lease), params_rejected (a 2xx prefill answer whose kv_transfer_params kvroute "
            "refused: held until the lease)",
            {"reason"})),
        pd_client_gone_total(r.counter(
            "kvroute_pd_client_gone_total",
            "Split requests whose client left, by phase: prefill (during the prefill leg: a vLLM leg runs to its "
            "answer and a prefilled transfer is released, an SGLang leg is closed), after_prefill (before the "
            "decode leg: a release leg claims the transfer), decode_head (while the "
            "decode worker computed its first byte: the decode leg is closed, the engine's abort frees the "
            "transfer)",
            {"phase"})),
        // gauges
        inflight_requests(r.gauge("kvroute_router_inflight_requests", "Requests being handled")),
        queued_requests(r.gauge("kvroute_router_queued_requests", "Requests waiting for a free worker")),
        connections(r.gauge("kvroute_router_connections", "Open client connections on the OpenAI listener")),
        connections_limit(r.gauge("kvroute_router_connections_limit",
                                  "router.max_connections in force (0 in the config: half of RLIMIT_NOFILE)")),
        body_bytes(r.gauge("kvroute_router_body_bytes",
                           "Request body bytes being received or held (router.max_body_bytes_in_flight)")),
        body_bytes_limit(r.gauge("kvroute_router_body_bytes_limit", "router.max_body_bytes_in_flight in force")),
        open_files_limit(r.gauge("kvroute_router_open_files_limit", "RLIMIT_NOFILE of the process, after raising")),
        // histograms
        request_duration_seconds(r.histogram("kvroute_router_request_duration_seconds",
                                             "Request duration from parsed request to end of response",
                                             metrics::exponential_buckets(0.001, 2, 18), {"route"})),
        ttfb_seconds(r.histogram("kvroute_router_ttfb_seconds",
                                 "Time from sending to the worker to its first response byte",
                                 metrics::exponential_buckets(0.0005, 2, 18))),
        decision_seconds(r.histogram("kvroute_router_decision_seconds", "Routing decision time by stage",
                                     metrics::exponential_buckets(1e-6, 2, 20), {"stage"})),
        overlap_ratio(r.histogram("kvroute_router_overlap_ratio",
                                  "Cached fraction of the prompt on the chosen worker",
                                  metrics::linear_buckets(0.1, 0.1, 10))),
        engine_tokenize_seconds(r.histogram("kvroute_router_engine_tokenize_seconds",
                                            "Round trip of one POST /tokenize to an engine (connect included), "
                                            "successful or not",
                                            metrics::exponential_buckets(0.0001, 2, 18))),
        pd_leg_seconds(r.histogram("kvroute_pd_leg_seconds",
                                   "A disaggregated request's legs: prefill (sent to its whole answer), decode (sent "
                                   "to its first byte)",
                                   metrics::exponential_buckets(0.0005, 2, 18), {"leg"})),
        // children with fixed labels, resolved once (no lookup per request)
        duration_chat(request_duration_seconds.with({"chat_completions"})),
        duration_completions(request_duration_seconds.with({"completions"})),
        stage_seconds{&decision_seconds.with({"tokenize"}), &decision_seconds.with({"hash"}),
                      &decision_seconds.with({"find_matches"}), &decision_seconds.with({"score"})},
        decided_best_overlap(decisions_total.with({"best_overlap"})),
        decided_balance(decisions_total.with({"balance"})),
        decided_no_worker(decisions_total.with({"no_worker"})),
        engine_cache_hit(engine_tokenize_cache_total.with({"hit"})),
        engine_cache_miss(engine_tokenize_cache_total.with({"miss"})) {}

  metrics::CounterFamily& requests_total;
  metrics::CounterFamily& upstream_errors_total;
  metrics::CounterFamily& retries_total;
  metrics::CounterFamily& cancels_total;
  metrics::CounterFamily& rejected_total;
  metrics::CounterFamily& prompt_tokens_total;
  metrics::CounterFamily& cached_tokens_total;
  metrics::CounterFamily& worker_prompt_tokens_total;
  metrics::CounterFamily& worker_cached_tokens_total;
  metrics::CounterFamily& pool_hit_tokens_total;
  metrics::CounterFamily& pool_hits_total;
  metrics::CounterFamily& best_cached_tokens_total;
  // The pools' names (indexer.kv_pools), the `pool` label; set once before serving.
  std::array<std::string, kMaxPools> pool_names;
  metrics::CounterFamily& decisions_total;
  metrics::CounterFamily& all_busy_total;
  metrics::CounterFamily& slots_full_total;
  metrics::CounterFamily& tokenizer_fallbacks_total;
  metrics::CounterFamily& tokenized_requests_total;
  metrics::CounterFamily& engine_tokenize_total;
  metrics::CounterFamily& engine_tokenize_cache_total;
  metrics::CounterFamily& previous_response_total;
  metrics::CounterFamily& response_retrieve_total;
  metrics::CounterFamily& pd_requests_total;
  metrics::CounterFamily& pd_retries_total;
  metrics::CounterFamily& pd_params_rejected_total;
  metrics::CounterFamily& pd_releases_total;
  metrics::CounterFamily& pd_prefill_legs_total;
  metrics::CounterFamily& pd_transfers_left_total;
  metrics::CounterFamily& pd_client_gone_total;
  metrics::GaugeFamily& inflight_requests;
  metrics::GaugeFamily& queued_requests;
  metrics::GaugeFamily& connections;
  metrics::GaugeFamily& connections_limit;
  metrics::GaugeFamily& body_bytes;
  metrics::GaugeFamily& body_bytes_limit;
  metrics::GaugeFamily& open_files_limit;
  metrics::HistogramFamily& request_duration_seconds;
  metrics::HistogramFamily& ttfb_seconds;
  metrics::HistogramFamily& decision_seconds;
  metrics::HistogramFamily& overlap_ratio;
  metrics::HistogramFamily& engine_tokenize_seconds;
  metrics::HistogramFamily& pd_leg_seconds;

  metrics::Histogram& duration_chat;
  metrics::Histogram& duration_completions;
  metrics::Histogram* stage_seconds[4];  // tokenize, hash, find_matches, score
  metrics::Counter& decided_best_overlap;
  metrics::Counter& decided_balance;
  metrics::Counter& decided_no_worker;
  metrics::Counter& engine_cache_hit;
  metrics::Counter& engine_cache_miss;

  // The per-request series, remembered per thread (the proxy's hot path: no
  // label hashing while the labels repeat); a child removed meanwhile (a
  // worker that left) is looked up again.
  metrics::Counter& request(std::string_view route, unsigned status, std::string_view model) {
    struct Memo {
      uint64_t family = 0, generation = 0;
      std::string route;
      unsigned status = 0;
      std::string model;
      metrics::Counter* child = nullptr;
    };
    thread_local Memo memo;
    const uint64_t generation = requests_total.generation();
    if (memo.family != requests_total.id() || memo.generation != generation || memo.route != route ||
        memo.status != status || memo.model != model) {
      char digits[12];
      const auto end = std::to_chars(digits, digits + sizeof digits, status).ptr;
      memo.child = &requests_total.with({route, std::string_view(digits, static_cast<size_t>(end - digits)), model});
      memo.family = requests_total.id();
      memo.generation = generation;
      memo.route.assign(route);
      memo.status = status;
      memo.model.assign(model);
    }
    return *memo.child;
  }
  // kvroute_router_tokenized_requests_total{model,source}, remembered per
  // thread as request() is (every routed request counts once).
  metrics::Counter& tokenized(std::string_view model, std::string_view source) {
    struct Memo {
      uint64_t family = 0, generation = 0;
      std::string model, source;
      metrics::Counter* child = nullptr;
    };
    thread_local Memo memo;
    const uint64_t generation = tokenized_requests_total.generation();
    if (memo.family != tokenized_requests_total.id() || memo.generation != generation || memo.model != model ||
        memo.source != source) {
      memo.child = &tokenized_requests_total.with({model, source});
      memo.family = tokenized_requests_total.id();
      memo.generation = generation;
      memo.model.assign(model);
      memo.source.assign(source);
    }
    return *memo.child;
  }
  // Scrape time (HttpServer::register_metrics()): removes the per-worker
  // series (kvroute_router_worker_*_tokens_total) of the workers that were
  // present at the previous call and are not in `present` (a worker that
  // left), so the label set stays bounded by the fleet.
  void retain_workers(std::set<std::string> present) {
    std::lock_guard lk(workers_mu_);
    for (const auto& id : present_workers_) {
      if (present.count(id)) continue;
      worker_prompt_tokens_total.remove({id});
      worker_cached_tokens_total.remove({id});
    }
    present_workers_ = std::move(present);
  }

  struct WorkerTokens {
    metrics::Counter& prompt;
    metrics::Counter& cached;
  };
  WorkerTokens worker_tokens(uint64_t worker) {
    struct Memo {
      uint64_t family = 0, generation = 0, worker = 0;
      metrics::Counter* prompt = nullptr;
      metrics::Counter* cached = nullptr;
    };
    thread_local std::array<Memo, 16> memos;
    Memo& memo = memos[worker % memos.size()];
    // One generation for both: they are removed together.
    const uint64_t generation = worker_prompt_tokens_total.generation() + worker_cached_tokens_total.generation();
    if (memo.family != worker_prompt_tokens_total.id() || memo.generation != generation || memo.worker != worker ||
        !memo.prompt) {
      char digits[24];
      const auto end = std::to_chars(digits, digits + sizeof digits, worker).ptr;
      const std::string_view w(digits, static_cast<size_t>(end - digits));
      memo = Memo{worker_prompt_tokens_total.id(), generation, worker, &worker_prompt_tokens_total.with({w}),
                  &worker_cached_tokens_total.with({w})};
    }
    return {*memo.prompt, *memo.cached};
  }

 private:
  std::mutex workers_mu_;
  std::set<std::string> present_workers_;  // at the last retain_workers()
};

}  // namespace kvroute
