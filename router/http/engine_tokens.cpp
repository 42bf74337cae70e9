// Tokenization by the engine (proxy.h engine_tokens()): a model without a
// local tokenizer has its prompt tokenized by one of its workers' own
// POST /tokenize before routing, with an exact-answer cache and a per-model
// backoff while the engines fail.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/log.h"
#include "router/http/proxy.h"
#include "router/http/upstream.h"

namespace kvroute {

bool engine_tokens_cached(ServerState& s, const Config& cfg, ParsedRequest& parsed, std::string& body) {
  RouterMetrics* m = s.hooks.metrics;
  if (!engine_tokenize_body(parsed, body)) {
    parsed.engine_failed = true;
    return true;
  }
  if (s.engine_cache.get(EngineTokenCache::key_of(body), parsed.engine_tokens)) {
    if (m) m->engine_cache_hit.inc();
    parsed.has_engine_tokens = true;
    return true;
  }
  if (m && cfg.tokenizer.remote_cache_bytes > 0) m->engine_cache_miss.inc();
  return false;
}

namespace {

// The workers to ask for a model's tokens, and the first to ask: any healthy
// worker serving the model (a LoRA adapter: one serving it), non-draining
// ones if there are any; one with an idle pooled connection on this thread
// first (no connect), else round-robin from a per-thread cursor.
size_t pick_tokenizing_worker(ServerState& s, IoThread& io, std::string_view model, std::vector<WorkerView>& workers) {
  thread_local size_t cursor = 0;
  s.hooks.registry->candidates(model, workers);
  if (std::any_of(workers.begin(), workers.end(), [](const WorkerView& w) { return !w.draining; }))
    std::erase_if(workers, [](const WorkerView& w) { return w.draining; });
  const size_t n = workers.size();
  const size_t first = n ? cursor++ % n : 0;
  for (size_t i = 0; i < n; ++i)
    if (io.pool.has_idle(workers[(first + i) % n].info->url)) return (first + i) % n;
  return first;
}

// Asks the picked worker, and one more on a connection failure, by the deadline.
awaitable<EngineTokenizeResult> ask_engines(ServerState& s, IoThread& io, const Config& cfg, ParsedRequest& parsed,
                                            std::string_view authorization, const std::string& body,
                                            Steady::time_point start) {
  RouterMetrics* m = s.hooks.metrics;
  std::vector<WorkerView> workers;
  const size_t pick = pick_tokenizing_worker(s, io, parsed.model, workers);
  const size_t n = workers.size();
  EngineTokenizeResult result = EngineTokenizeResult::NoWorker;
  const auto deadline = start + milliseconds(cfg.tokenizer.remote_timeout_ms);
  for (size_t attempt = 0; attempt < std::min<size_t>(n, 2) && Steady::now() < deadline; ++attempt) {
    const WorkerView& w = workers[(pick + attempt) % n];
    const std::string url = w.info->url;
    const WorkerId id = w.info->id;
    const auto t0 = Steady::now();
    result = co_await fetch_engine_tokens(io, cfg, url, body, authorization, deadline, parsed.engine_tokens);
    if (m) m->engine_tokenize_seconds.get().observe(seconds_since(t0));
    if (result != EngineTokenizeResult::Connect) break;
    // Refused: counted and reported to passive health as the proxy does,
    // so a dead worker leaves the candidates as fast either way.
    if (m) m->upstream_errors_total.with({"connect"}).inc();
    s.hooks.registry->report_failure(id, HealthSignal::ConnectRefused);
    io.suspect(id);
  }
  co_return result;
}

}  // namespace

awaitable<void> engine_tokens(ServerState& s, IoThread& io, const Config& cfg, ParsedRequest& parsed,
                              std::string_view authorization, const std::string& body) {
  RouterMetrics* m = s.hooks.metrics;
  const bool chat = parsed.kind == ApiKind::ChatCompletions;
  const auto start = Steady::now();
  EngineTokenizeResult result = EngineTokenizeResult::Backoff;
  if (s.engine_backoff.allow(parsed.model, chat, start))
    result = co_await ask_engines(s, io, cfg, parsed, authorization, body, start);
  if (m) m->engine_tokenize_total.with({to_string(result)}).inc();
  if (result == EngineTokenizeResult::Ok) {
    parsed.has_engine_tokens = true;
    s.engine_backoff.on_success(parsed.model, chat);
    s.engine_cache.put(EngineTokenCache::key_of(body), parsed.engine_tokens);
    co_return;
  }
  parsed.engine_tokens.clear();
  parsed.engine_failed = true;
  if (EngineTokenizeBackoff::backs_off(result)) s.engine_backoff.on_failure(parsed.model, chat, Steady::now());
  if (result == EngineTokenizeResult::NoWorker) co_return;  // an unknown model (404) or no healthy worker (503)
  static RateLimiter rl;
  if (rl.allow())
    spdlog::warn("model '{}': the engine's POST /tokenize failed ({}); this request is routed on placeholder tokens",
                 parsed.model, to_string(result));
}

}  // namespace kvroute
