// The mocker's Beast server: the only translation unit of the mocker with
// Beast templates. Same coroutine style as router/http_server.cpp.
#include "mocker/server.h"

#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <random>
#include <simdjson.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <deque>
#include <functional>
#include <unordered_map>

#include "common/json_escape.h"
#include "events/nats_bus.h"
#include "events/vllm_wire.h"
#include "events/wire.h"
#include "mocker/vllm_publisher.h"
#include "router/openai_request.h"
#include "tokenizer/request_tokens.h"

namespace kvroute::mocker {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;

namespace {

auto nothrow(beast::error_code& ec) { return asio::redirect_error(use_awaitable, ec); }

constexpr const char* kWords[] = {"the ", "cache ", "router ", "sends ", "each ", "request ", "to ", "a ",
                                  "worker ", "that ", "already ", "holds ", "its ", "prefix ", "and ", "streams "};

// What the engine produced for one request, waiting for its session.
struct Pending {
  explicit Pending(asio::any_io_executor ex) : wake(ex) { wake.expires_at(asio::steady_timer::time_point::max()); }
  std::deque<EngineOutput> outputs;
  asio::steady_timer wake;  // cancelled to wake the session
  bool client_gone = false;
};

// Fields of a completion request the router does not need.
struct GenParams {
  uint32_t max_tokens = 16;
  bool include_usage = false;
  std::string cache_salt;  // vLLM's per-tenant prefix cache isolation
};

bool parse_gen_params(std::string_view body, GenParams& p, std::string& err) {
  thread_local simdjson::dom::parser parser;
  auto doc = parser.parse(body.data(), body.size(), true);
  if (doc.error()) return false;
  simdjson::dom::object o;
  if (doc.value_unsafe().get_object().get(o)) return false;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    auto v = o.at_key(key);
    if (v.error() || v.value_unsafe().is_null()) continue;
    uint64_t n = 0;
    if (v.value_unsafe().get_uint64().get(n) || n == 0 || n > 1000000) {
      err = fmt::format("'{}' must be an integer in [1, 1000000]", key);
      return false;
    }
    p.max_tokens = static_cast<uint32_t>(n);
  }
  auto salt = o.at_key("cache_salt");
  if (!salt.error() && !salt.value_unsafe().is_null()) {
    std::string_view sv;
    if (salt.value_unsafe().get_string().get(sv) || sv.empty()) {
      err = "'cache_salt' must be a non-empty string";
      return false;
    }
    p.cache_salt.assign(sv);
  }
  auto so = o.at_key("stream_options");
  if (!so.error() && so.value_unsafe().is_object()) {
    auto iu = so.value_unsafe().at_key("include_usage");
    if (!iu.error() && iu.value_unsafe().is_bool()) p.include_usage = iu.value_unsafe().get_bool().value_unsafe();
  }
  return true;
}

}  // namespace

struct MockerServer::Impl {
  Impl(MockerOptions o, NatsBus* b, std::vector<VllmPublisher*> v)
      : opts(std::move(o)),
        bus(b),
        publishers(std::move(v)),
        vllm(publishers.empty() ? nullptr : publishers[0]),
        acceptor(ioc),
        tick(ioc),
        heartbeat(ioc),
        start(std::chrono::steady_clock::now()),
        engines(make_engines(opts, !publishers.empty(), [this](const KvEvent& ev) { publish_event(ev); })),
        engine(*engines[0]) {
    vllm_batch.resize(engines.size());
    requests_by_rank.resize(engines.size(), 0);
    vllm_flush_posted.resize(engines.size(), false);
  }

  static std::vector<std::unique_ptr<Engine>> make_engines(const MockerOptions& o, bool vllm_mode,
                                                           const std::function<void(const KvEvent&)>& sink) {
    std::vector<std::unique_ptr<Engine>> out;
    for (uint32_t r = 0; r < std::max<uint32_t>(o.data_parallel_size, 1); ++r) {
      EngineConfig c = o.engine;
      c.owner = CacheOwner{WorkerId{o.worker_id}, r};
      c.keep_tokens = vllm_mode;  // BlockStored carries token ids
      out.push_back(std::make_unique<Engine>(c, sink));
    }
    return out;
  }

  MockerOptions opts;
  NatsBus* bus;
  std::vector<VllmPublisher*> publishers;  // per rank (vLLM mode); empty: NATS mode
  VllmPublisher* vllm;                     // rank 0's, or null
  std::vector<VllmEventBatch> vllm_batch;  // per rank: this engine step's events (vLLM mode)
  std::vector<bool> vllm_flush_posted;
  asio::io_context ioc;
  tcp::acceptor acceptor;
  asio::steady_timer tick;
  asio::steady_timer heartbeat;
  const std::chrono::steady_clock::time_point start;
  std::vector<std::unique_ptr<Engine>> engines;  // one per data-parallel rank
  Engine& engine;                                // rank 0 (NATS mode has only it)
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending;
  uint64_t next_id = 1;
  std::optional<double> scheduled;  // engine time the tick timer is set for
  // Stats and test hooks (io thread only).
  uint64_t requests_total = 0;   // completion requests received (valid or not)
  uint64_t rejected_total = 0;   // of those, answered with a 4xx error
  uint64_t cancels_total = 0;    // generations stopped because the client went away
  uint64_t events_published = 0, events_dropped = 0, events_publish_failed = 0;
  uint64_t drop_remaining = 0;
  bool hang = false;
  uint64_t steered_total = 0;            // requests whose X-data-parallel-rank chose their rank
  std::vector<uint64_t> requests_by_rank;  // requests queued on each rank
  // Test hook for POST /tokenize (POST /mocker/tokenize): "ok" serves it,
  // "reject" answers 400, "error" 500, "hang" accepts and never answers.
  std::string tokenize_mode = "ok";
  uint64_t tokenize_total = 0;  // POST /tokenize requests received
  // This process's instance id (new at each start) and the resync
  // snapshot being served in chunks (one at a time; a newer one replaces it).
  const uint64_t instance_id = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  uint64_t resync_snapshot = 0;  // id of the newest snapshot
  // The last few snapshots' chunks (several routers may pull at once).
  std::deque<std::pair<uint64_t, std::vector<std::string>>> resync_snapshots;
  uint64_t resync_publish_failed = 0;
  void answer_resync(const std::string& reply, const std::string& body) {
    if (bus->publish(reply, body)) return;  // checked: the router asks for the chunk again
    ++resync_publish_failed;
    spdlog::warn("kvroute-mocker: resync reply of {} bytes not published ({} so far)", body.size(),
                 resync_publish_failed);
  }

  std::string advertised_url() const {
    return opts.advertise_url.empty() ? fmt::format("http://{}:{}", opts.host, acceptor.local_endpoint().port())
                                      : opts.advertise_url;
  }

  double now_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() *
           opts.speedup;
  }

  static const char* medium_of(StorageTier t) {
    switch (t) {
      case StorageTier::Device: return "GPU";
      case StorageTier::HostPinned: return "CPU";
      case StorageTier::Disk: return "DISK";
      case StorageTier::External: return "EXTERNAL";
    }
    return "GPU";
  }

  // vLLM mode: the event joins this step's batch, sent when the io thread
  // finishes the current handler (vLLM publishes one batch per step).
  void queue_vllm_event(const KvEvent& ev) {
    const uint32_t rank = ev.owner.dp_rank;
    const Engine& engine = *engines[rank];
    VllmEventBatch& batch = vllm_batch[rank];
    if (auto* st = std::get_if<KvStored>(&ev.data)) {
      VllmBlockStored s;
      s.parent_block_hash = st->parent;
      s.block_size = opts.engine.block_size;
      s.medium = medium_of(ev.tier);
      s.group_idx = 0;
      s.kv_cache_spec_kind = "full_attention";
      s.token_ids.reserve(st->blocks.size() * opts.engine.block_size);
      for (size_t i = 0; i < st->blocks.size(); ++i) {
        const Engine::BlockInfo* info = engine.block_info(st->blocks[i].block_hash);
        if (!info) return;  // cannot happen with keep_tokens: every announced block is cached
        s.block_hashes.push_back(st->blocks[i].block_hash);
        s.token_ids.insert(s.token_ids.end(), info->tokens.begin(), info->tokens.end());
        if (i == 0) {
          s.lora_name = info->lora_name;
          if (!st->parent) s.cache_salt = info->cache_salt;
        }
      }
      // vLLM before its extra_keys field: no salt on the wire (lora_name is a
      // field of its own), while the engine's own cache stays keyed by it.
      s.omit_extra_keys = opts.no_extra_keys;
      batch.events.push_back(std::move(s));
    } else if (auto* rm = std::get_if<KvRemoved>(&ev.data)) {
      batch.events.push_back(VllmBlockRemoved{rm->block_hashes, medium_of(ev.tier), 0});
    } else {
      batch.events.push_back(VllmAllBlocksCleared{});
    }
    ++events_published;
    if (vllm_flush_posted[rank]) return;
    vllm_flush_posted[rank] = true;
    asio::post(ioc, [this, rank] {
      vllm_flush_posted[rank] = false;
      VllmEventBatch& b = vllm_batch[rank];
      b.ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      publishers[rank]->publish(std::move(b));
      b = VllmEventBatch{};
    });
  }

  void publish_event(const KvEvent& ev) {
    if (vllm) {
      queue_vllm_event(ev);
      return;
    }
    if (drop_remaining > 0) {
      --drop_remaining;
      ++events_dropped;
      return;
    }
    if (!bus) return;
    KvEvent stamped = ev;
    stamped.instance = instance_id;  // restarts are told by instance, not by event ids
    if (bus->publish(opts.subject_prefix + ".kv_events", encode_kv_event(stamped))) {
      ++events_published;
    } else {
      ++events_publish_failed;
      spdlog::warn("kvroute-mocker: KV event {} not published (NATS connection closed)", engine.last_event_id());
    }
  }

  void publish_heartbeat() {
    if (!bus) return;
    WorkerHeartbeat hb;
    hb.worker_id = WorkerId{opts.worker_id};
    hb.url = advertised_url();
    hb.model = opts.model;
    hb.block_size = opts.engine.block_size;
    hb.instance_id = instance_id;
    hb.load = engine.load();
    bus->publish(opts.subject_prefix + ".workers", encode_heartbeat(hb));
  }

  void heartbeat_loop() {
    publish_heartbeat();
    heartbeat.expires_after(std::chrono::milliseconds(opts.heartbeat_ms));
    heartbeat.async_wait([this](beast::error_code ec) {
      if (!ec) heartbeat_loop();
    });
  }

  // Runs the engine up to now, hands outputs to sessions, re-arms the timer.
  void on_tick() {
    const double now = now_ms();
    for (auto& e : engines)
      for (const auto& out : e->advance_to(now)) {
        auto it = pending.find(out.request);
        if (it == pending.end()) continue;
        it->second->outputs.push_back(out);
        it->second->wake.cancel();
      }
    schedule();
  }

  // The earliest step end of any rank.
  std::optional<double> next_event_time() const {
    std::optional<double> next;
    for (const auto& e : engines)
      if (auto t = e->next_event_time(); t && (!next || *t < *next)) next = t;
    return next;
  }

  // The rank a request goes to: the X-data-parallel-rank header (vLLM's
  // _get_data_parallel_rank(): an integer, else ignored), else the rank with
  // the lowest waiting * 4 + running, the lowest rank on ties (vLLM's
  // DPLBAsyncMPClient.get_core_engine_for_request(),
  // vllm/v1/engine/core_client.py). -1: the header names no rank of ours.
  int pick_rank(const http::request<http::string_body>& req) {
    auto h = req.find("X-data-parallel-rank");
    if (h != req.end()) {
      const std::string_view v(h->value().data(), h->value().size());
      int64_t r = 0;
      const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), r);
      if (ec == std::errc() && p == v.data() + v.size()) {
        if (r < 0 || r >= static_cast<int64_t>(engines.size())) return -1;
        ++steered_total;
        return static_cast<int>(r);
      }
    }
    int best = 0;
    uint64_t best_score = UINT64_MAX;
    for (size_t r = 0; r < engines.size(); ++r) {
      const auto l = engines[r]->load();
      const uint64_t score = uint64_t{l.num_requests_waiting} * 4 + l.request_active_slots;
      if (score < best_score) best_score = score, best = static_cast<int>(r);
    }
    return best;
  }

  void schedule() {
    const auto next = next_event_time();
    if (!next) {
      scheduled.reset();
      tick.cancel();
      return;
    }
    if (scheduled && *scheduled == *next) return;
    scheduled = next;
    const double wait_real_ms = std::max(0.0, (*next - now_ms()) / opts.speedup);
    tick.expires_after(std::chrono::microseconds(static_cast<int64_t>(wait_real_ms * 1000)));
    tick.async_wait([this](beast::error_code ec) {
      if (ec) return;  // re-armed or stopped
      scheduled.reset();
      on_tick();
    });
  }

  std::string stats_json() const {
    WorkerLoad l;
    uint64_t cached_blocks = 0, last_event_id = 0;
    std::string ranks;
    for (size_t r = 0; r < engines.size(); ++r) {
      const auto e = engines[r]->load();
      l.request_active_slots += e.request_active_slots;
      l.num_requests_waiting += e.num_requests_waiting;
      l.kv_active_blocks += e.kv_active_blocks;
      l.kv_total_blocks += e.kv_total_blocks;
      cached_blocks += engines[r]->cached_blocks();
      last_event_id += engines[r]->last_event_id();
      ranks += fmt::format(R"({}{{"rank":{},"requests":{},"kv_cached_blocks":{}}})", r ? "," : "", r,
                           requests_by_rank[r], engines[r]->cached_blocks());
    }
    std::string out = fmt::format(
        R"({{"worker_id":{},"requests_total":{},"rejected_total":{},"cancels_total":{},"active":{},"waiting":{},)"
        R"("kv_cached_blocks":{},"kv_active_blocks":{},"kv_total_blocks":{},"events_published":{},"events_dropped":{},)"
        R"("events_publish_failed":{},"drop_pending":{},"last_event_id":{},"hang":{},"steered_total":{},"ranks":[{}],"tokenize_total":{}}})",
        opts.worker_id, requests_total, rejected_total, cancels_total, l.request_active_slots, l.num_requests_waiting,
        cached_blocks, l.kv_active_blocks, l.kv_total_blocks, events_published, events_dropped,
        events_publish_failed, drop_remaining, last_event_id, hang, steered_total, ranks, tokenize_total);
    if (vllm)  // vLLM mode: ZMQ batches numbered (next seq), not sent live (test hook), replays served
      out.insert(out.size() - 1, fmt::format(R"(,"zmq_batches":{},"zmq_dropped_live":{},"zmq_replays":{})",
                                             vllm->published(), vllm->dropped_live(), vllm->replays_served()));
    return out;
  }

  // Prometheus text with vLLM's metric names, types and labels (vLLM
  // v1/metrics/loggers.py: model_name and engine on every series, one series
  // per data-parallel rank; the cache config as an info gauge whose labels
  // carry block_size and num_gpu_blocks).
  std::string metrics_text() const {
    struct Family {
      const char* name;
      const char* type;
      const char* help;
    };
    static constexpr Family kFamilies[] = {
        {"vllm:num_requests_running", "gauge", "Number of requests in model execution batches."},
        {"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."},
        {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."},
        {"vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens."},
        {"vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens."},
    };
    std::string out;
    for (size_t f = 0; f < std::size(kFamilies); ++f) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", kFamilies[f].name, kFamilies[f].help, kFamilies[f].name,
                         kFamilies[f].type);
      for (size_t r = 0; r < engines.size(); ++r) {
        const Engine& e = *engines[r];
        const auto l = e.load();
        const double usage = l.kv_total_blocks ? static_cast<double>(l.kv_active_blocks) / l.kv_total_blocks : 0.0;
        const double values[] = {static_cast<double>(l.request_active_slots),
                                 static_cast<double>(l.num_requests_waiting), usage,
                                 static_cast<double>(e.prefix_queries_tokens()),
                                 static_cast<double>(e.prefix_hits_tokens())};
        out += fmt::format("{}{{engine=\"{}\",model_name=\"{}\"}} {}\n", kFamilies[f].name, r, opts.model, values[f]);
      }
    }
    out += "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
           "# TYPE vllm:cache_config_info gauge\n";
    for (size_t r = 0; r < engines.size(); ++r)
      out += fmt::format(
          "vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\","
          "engine=\"{}\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256\"}} 1.0\n",
          opts.engine.block_size, r, opts.engine.kv_blocks);
    return out;
  }

  awaitable<void> accept_loop();
  awaitable<void> session(tcp::socket socket);
  awaitable<bool> respond(beast::tcp_stream& s, unsigned version, bool keep, http::status st, std::string body,
                          std::string_view type = "application/json");
  awaitable<bool> generate(beast::tcp_stream& s, const http::request<http::string_body>& req, ApiKind kind);
  // generate()'s phases. A rejection is answered by generate() (counted once).
  struct Reject {
    http::status status;
    ApiError error;
  };
  std::optional<Reject> parse_generation(const http::request<http::string_body>& req, ApiKind kind,
                                         ParsedRequest& parsed, GenParams& gen, bool& lora) const;
  // Tokenizes and queues the request on its rank's engine as `id`.
  std::optional<Reject> admit_generation(const http::request<http::string_body>& req, const ParsedRequest& parsed,
                                         const GenParams& gen, bool lora, uint64_t id, Engine*& engine,
                                         uint32_t& prompt_len);
  struct Reply;
  awaitable<bool> relay_tokens(beast::tcp_stream& s, Pending& p, Reply& r);
  awaitable<bool> finish_reply(beast::tcp_stream& s, Reply& r);
  awaitable<bool> tokenize(beast::tcp_stream& s, const http::request<http::string_body>& req);
  bool serves(std::string_view model) const {
    return model == opts.model ||
           std::find(opts.lora_modules.begin(), opts.lora_modules.end(), model) != opts.lora_modules.end();
  }
  // The served model's tokenizer: a LoRA adapter tokenizes with its base
  // model's, as vLLM does (null: the placeholder).
  const ModelTokenizer* model_tokenizer() const { return opts.tokenizers ? opts.tokenizers->find(opts.model) : nullptr; }
};

awaitable<void> MockerServer::Impl::accept_loop() {
  for (;;) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(nothrow(ec));
    if (ec) {
      if (!acceptor.is_open()) co_return;
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    asio::co_spawn(ioc, session(std::move(socket)), asio::detached);
  }
}

awaitable<bool> MockerServer::Impl::respond(beast::tcp_stream& s, unsigned version, bool keep, http::status st,
                                            std::string body, std::string_view type) {
  http::response<http::string_body> res{st, version};
  res.set(http::field::server, "kvroute-mocker");
  res.set(http::field::content_type, beast::string_view(type.data(), type.size()));
  res.keep_alive(keep);
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  co_await http::async_write(s, res, nothrow(ec));
  co_return !ec && keep;
}

awaitable<void> MockerServer::Impl::session(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    beast::error_code ec;
    co_await http::async_read(stream, buffer, parser, nothrow(ec));
    if (ec) break;
    auto req = parser.release();
    std::string_view target(req.target().data(), req.target().size());
    const bool keep = req.keep_alive();
    const unsigned v = req.version();
    bool again = false;
    if (req.method() == http::verb::post && target == "/v1/completions") {
      again = co_await generate(stream, req, ApiKind::Completions);
    } else if (req.method() == http::verb::post && target == "/v1/chat/completions") {
      again = co_await generate(stream, req, ApiKind::ChatCompletions);
    } else if (req.method() == http::verb::post && target == "/v1/embeddings") {
      // vLLM's /v1/embeddings, simulated: one small deterministic vector per input, from its first prompt's tokens.
      ParsedRequest parsed;
      ApiError err;
      std::string body;
      if (!parse_openai_request(ApiKind::Embeddings, req.body(), parsed, err)) {
        body = error_body(err);
      } else {
        TokenizerFallback fallback;
        TokenSource source;
        std::vector<TokenId> buffer;
        const auto tokens =
            tokenize_request(parsed.prompt(), buffer, model_tokenizer(), &source, &fallback, nullptr);
        std::string data;
        for (uint32_t i = 0; i < parsed.prompts; ++i)
          data += fmt::format(R"({}{{"object":"embedding","index":{},"embedding":[{},0.5,-0.25,0.125]}})", i ? "," : "",
                              i, static_cast<double>(tokens.size() % 97) / 97.0);
        body = fmt::format(R"({{"object":"list","data":[{}],"model":"{}","usage":{{"prompt_tokens":{},"total_tokens":{}}}}})",
                           data, json_escape(opts.model), tokens.size(), tokens.size());
      }
      again = co_await respond(stream, v, keep, err.message.empty() ? http::status::ok : http::status::bad_request,
                               std::move(body));
    } else if (req.method() == http::verb::post && target == "/tokenize") {
      again = co_await tokenize(stream, req);
    } else if (target == "/mocker/tokenize" && req.method() == http::verb::post) {
      simdjson::dom::parser p;
      std::string_view mode;
      auto doc = p.parse(req.body());
      if (!doc.error() && !doc.value_unsafe()["mode"].get_string().get(mode) &&
          (mode == "ok" || mode == "reject" || mode == "error" || mode == "hang")) {
        tokenize_mode = std::string(mode);
        again = co_await respond(stream, v, keep, http::status::ok, fmt::format(R"({{"mode":"{}"}})", tokenize_mode));
      } else {
        again = co_await respond(stream, v, keep, http::status::bad_request,
                                 R"({"error":{"message":"body must be {\"mode\": \"ok\"|\"reject\"|\"error\"|\"hang\"}","type":"invalid_request_error","param":"mode","code":null}})");
      }
    } else if (target == "/health") {
      again = co_await respond(stream, v, keep, http::status::ok, R"({"status":"ok"})");
    } else if (target == "/v1/models") {
      again = co_await respond(
          stream, v, keep, http::status::ok,
          fmt::format(R"({{"object":"list","data":[{{"id":"{}","object":"model","created":0,"owned_by":"kvroute-mocker"}}]}})",
                      json_escape(opts.model)));
    } else if (target == "/metrics") {
      again = co_await respond(stream, v, keep, http::status::ok, metrics_text(), "text/plain; version=0.0.4");
    } else if (target == "/mocker/stats") {
      again = co_await respond(stream, v, keep, http::status::ok, stats_json());
    } else if (target == "/mocker/drop_events" && req.method() == http::verb::post) {
      simdjson::dom::parser p;
      uint64_t n = 0;
      auto doc = p.parse(req.body());
      if (!doc.error() && !doc.value_unsafe()["count"].get_uint64().get(n)) {
        if (vllm) vllm->drop_next_live(n);  // vLLM mode: n batches skip the PUB socket (replay has them)
        else drop_remaining += n;
        again = co_await respond(stream, v, keep, http::status::ok, fmt::format(R"({{"dropping":{}}})", drop_remaining));
      } else {
        again = co_await respond(stream, v, keep, http::status::bad_request,
                                 R"({"error":{"message":"body must be {\"count\": N}","type":"invalid_request_error","param":"count","code":null}})");
      }
    } else if (target == "/mocker/hang" && req.method() == http::verb::post) {
      simdjson::dom::parser p;
      bool on = false;
      auto doc = p.parse(req.body());
      if (!doc.error() && !doc.value_unsafe()["enabled"].get_bool().get(on)) {
        hang = on;
        again = co_await respond(stream, v, keep, http::status::ok, fmt::format(R"({{"hang":{}}})", hang));
      } else {
        again = co_await respond(stream, v, keep, http::status::bad_request,
                                 R"({"error":{"message":"body must be {\"enabled\": true|false}","type":"invalid_request_error","param":"enabled","code":null}})");
      }
    } else {
      again = co_await respond(stream, v, keep, http::status::not_found,
                               R"({"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}})");
    }
    if (!again) break;
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

// POST /tokenize as vLLM serves it (vllm/entrypoints/serve/tokenize/
// protocol.py and serving.py): {"model"?, "prompt", "add_special_tokens"?}
// or {"model"?, "messages", "add_generation_prompt"?, ...} -> {"count",
// "max_model_len", "tokens", "token_strs": null}, tokenized exactly as this
// worker's completions and chat endpoints tokenize (same code); a missing
// model is the served one, an unknown one 404, a template error 400.
awaitable<bool> MockerServer::Impl::tokenize(beast::tcp_stream& s, const http::request<http::string_body>& req) {
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  ++tokenize_total;
  if (tokenize_mode == "hang") {
    char b;
    beast::error_code ec;
    s.expires_never();
    co_await s.socket().async_receive(asio::buffer(&b, 1), nothrow(ec));
    co_return false;
  }
  if (tokenize_mode == "reject") {
    std::string body = error_body(ApiError{400, "rejected (test hook)", "BadRequestError", "", ""});
    co_return co_await respond(s, v, keep, http::status::bad_request, std::move(body));
  }
  if (tokenize_mode == "error") {
    std::string body = error_body(ApiError{500, "tokenizer unavailable (test hook)", "InternalServerError", "", ""});
    co_return co_await respond(s, v, keep, http::status::internal_server_error, std::move(body));
  }
  std::string text = req.body();
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(text).get(doc) || !doc.is_object()) {
    std::string body = error_body(ApiError{400, "the body must be a JSON object", "BadRequestError", "", ""});
    co_return co_await respond(s, v, keep, http::status::bad_request, std::move(body));
  }
  const bool chat = !doc["messages"].error();
  if (doc["model"].error()) {  // optional in vLLM: the served model
    const size_t open = text.find('{');
    const bool empty = text.find_first_not_of(" \t\r\n", open + 1) == text.find('}', open + 1);
    text.insert(open + 1, fmt::format(R"("model":"{}"{})", json_escape(opts.model), empty ? "" : ","));
  }
  ParsedRequest parsed;
  ApiError err;
  if (!parse_openai_request(chat ? ApiKind::ChatCompletions : ApiKind::Completions, text, parsed, err)) {
    std::string body = error_body(err);
    co_return co_await respond(s, v, keep, http::status::bad_request, std::move(body));
  }
  if (!serves(parsed.model)) {
    std::string body = error_body(ApiError{404, fmt::format("The model `{}` does not exist.", parsed.model),
                                           "NotFoundError", "model", "model_not_found"});
    co_return co_await respond(s, v, keep, http::status::not_found, std::move(body));
  }
  TokenizerFallback fallback = TokenizerFallback::None;
  TokenSource source;
  std::string terr;
  std::vector<TokenId> buffer;
  const auto tokens = tokenize_request(parsed.prompt(), buffer, model_tokenizer(), &source, &fallback, &terr);
  if (opts.tokenizers && fallback != TokenizerFallback::None) {
    std::string body = error_body(ApiError{
        400, fallback == TokenizerFallback::NoChatTemplate ? std::string("The model has no chat template.") : terr,
        "BadRequestError", "", ""});
    co_return co_await respond(s, v, keep, http::status::bad_request, std::move(body));
  }
  std::string body = fmt::format(R"({{"count":{},"max_model_len":{},"tokens":[{}],"token_strs":null}})", tokens.size(),
                                 uint64_t{opts.engine.kv_blocks} * opts.engine.block_size, fmt::join(tokens, ","));
  co_return co_await respond(s, v, keep, http::status::ok, std::move(body));
}

std::optional<MockerServer::Impl::Reject> MockerServer::Impl::parse_generation(
    const http::request<http::string_body>& req, ApiKind kind, ParsedRequest& parsed, GenParams& gen,
    bool& lora) const {
  ApiError err;
  std::string gerr;
  if (!parse_openai_request(kind, req.body(), parsed, err)) return Reject{http::status::bad_request, err};
  if (!parse_gen_params(req.body(), gen, gerr)) {
    if (gerr.empty()) gerr = "the request body is not a JSON object";
    return Reject{http::status::bad_request, ApiError{400, gerr, "invalid_request_error", "max_tokens", ""}};
  }
  lora = std::find(opts.lora_modules.begin(), opts.lora_modules.end(), parsed.model) != opts.lora_modules.end();
  if (parsed.model != opts.model && !lora)
    return Reject{http::status::not_found, ApiError{404, fmt::format("The model `{}` does not exist.", parsed.model),
                                                    "invalid_request_error", "model", "model_not_found"}};
  return std::nullopt;
}

std::optional<MockerServer::Impl::Reject> MockerServer::Impl::admit_generation(
    const http::request<http::string_body>& req, const ParsedRequest& parsed, const GenParams& gen, bool lora,
    uint64_t id, Engine*& engine, uint32_t& prompt_len) {
  TokenizerFallback fallback = TokenizerFallback::None;
  TokenSource source;
  std::string terr;
  std::vector<TokenId> buffer;
  const auto span = tokenize_request(parsed.prompt(), buffer, model_tokenizer(), &source, &fallback, &terr);
  const std::vector<TokenId> tokens(span.begin(), span.end());
  if (opts.tokenizers && fallback != TokenizerFallback::None) {
    // As vLLM: a chat request its template cannot render is the client's error.
    return Reject{http::status::bad_request,
                  ApiError{400,
                           fallback == TokenizerFallback::NoChatTemplate ? std::string("The model has no chat template.")
                                                                         : terr,
                           "invalid_request_error", "messages", ""}};
  }
  prompt_len = static_cast<uint32_t>(tokens.size());
  if (tokens.empty())
    return Reject{http::status::bad_request, ApiError{400, "The prompt is empty.", "invalid_request_error", "prompt", ""}};
  const HashNamespace ns{lora ? std::string_view(parsed.model) : std::string_view{}, gen.cache_salt};
  const int rank = pick_rank(req);
  if (rank < 0)
    return Reject{http::status::bad_request,
                  ApiError{400, fmt::format("X-data-parallel-rank must be in [0, {}).", engines.size()),
                           "invalid_request_error", "", ""}};
  engine = engines[static_cast<size_t>(rank)].get();
  if (!engine->add_request(id, tokens, gen.max_tokens, now_ms(), ns, /*read_cache=*/!parsed.prompt_logprobs))
    return Reject{http::status::bad_request,
                  ApiError{400,
                           fmt::format("This request needs more KV blocks than the worker has ({}).",
                                       opts.engine.kv_blocks),
                           "invalid_request_error", "messages", "context_length_exceeded"}};
  ++requests_by_rank[static_cast<size_t>(rank)];
  return std::nullopt;
}

// Watches the client while generating: a close cancels the request.
static void watch_client(tcp::socket& sock, const std::shared_ptr<Pending>& p) {
  sock.async_wait(tcp::socket::wait_read, [&sock, p](beast::error_code ec) {
    // Cancelled when the response is done: the session may be gone, touch nothing.
    if (ec == asio::error::operation_aborted || p->client_gone) return;
    if (ec) {  // the socket failed: the client is gone
      p->client_gone = true;
      p->wake.cancel();
      return;
    }
    char b;
    beast::error_code rec;
    sock.non_blocking(true, rec);
    const size_t n = sock.receive(asio::buffer(&b, 1), tcp::socket::message_peek, rec);
    beast::error_code ignored;
    sock.non_blocking(false, ignored);
    if (n > 0 || rec == asio::error::would_block || rec == asio::error::try_again) return;  // alive
    p->client_gone = true;
    p->wake.cancel();
  });
}

// One generation's answer as it is written: ids, counts, the SSE framing.
struct MockerServer::Impl::Reply {
  Reply(const ParsedRequest& parsed, const GenParams& gen, uint64_t id, uint64_t worker_id, bool chat, bool keep,
        unsigned version, uint32_t prompt_len)
      : parsed(parsed), gen(gen), id(id), chat(chat), keep(keep), version(version), prompt_len(prompt_len),
        rid(fmt::format("{}-{}-{}", chat ? "chatcmpl" : "cmpl", worker_id, id)),
        created(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                    .count()),
        model(json_escape(parsed.model)),  // the base model or the LoRA adapter asked for
        head{http::status::ok, version}, sr{head} {}

  const ParsedRequest& parsed;
  const GenParams& gen;
  const uint64_t id;
  const bool chat, keep;
  const unsigned version;
  const uint32_t prompt_len;
  const std::string rid;
  const int64_t created;
  const std::string model;
  uint32_t generated = 0, cached = 0;
  std::string text;
  bool header_sent = false;
  beast::error_code ec;
  http::response<http::empty_body> head;
  http::response_serializer<http::empty_body> sr;

  std::string chunk_json(std::string_view piece, const char* finish) const {
    const std::string fin = finish ? fmt::format("\"{}\"", finish) : "null";
    if (chat)
      return fmt::format(
          R"({{"id":"{}","object":"chat.completion.chunk","created":{},"model":"{}","choices":[{{"index":0,"delta":{},"logprobs":null,"finish_reason":{}}}]}})",
          rid, created, model,
          finish ? std::string("{}") : fmt::format(R"({{"content":"{}"}})", json_escape(piece)), fin);
    return fmt::format(
        R"({{"id":"{}","object":"text_completion","created":{},"model":"{}","choices":[{{"index":0,"text":"{}","logprobs":null,"finish_reason":{}}}]}})",
        rid, created, model, json_escape(piece), fin);
  }
  std::string usage_json() const {
    return fmt::format(
        R"({{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":{}}}}})",
        prompt_len, generated, prompt_len + generated, cached);
  }
  awaitable<bool> write_chunk(beast::tcp_stream& s, std::string payload) {
    std::string frame = "data: " + payload + "\n\n";
    co_await asio::async_write(s, http::make_chunk(asio::buffer(frame)), nothrow(ec));
    co_return !ec;
  }
};

// Relays the engine's tokens as they come (streamed, or gathered into
// r.text); true when the engine finished, false when the client left or a
// write failed.
awaitable<bool> MockerServer::Impl::relay_tokens(beast::tcp_stream& s, Pending& p, Reply& r) {
  bool ok = true;
  while (ok) {
    if (p.outputs.empty()) {
      p.wake.expires_at(asio::steady_timer::time_point::max());
      co_await p.wake.async_wait(nothrow(r.ec));
      r.ec = {};
      if (p.client_gone) break;
      continue;
    }
    const EngineOutput out = p.outputs.front();
    p.outputs.pop_front();
    if (out.kind == EngineOutput::Kind::Finished) co_return true;
    if (out.kind == EngineOutput::Kind::FirstToken) r.cached = out.cached_tokens;
    const std::string piece = kWords[(r.id + r.generated) % std::size(kWords)];
    ++r.generated;
    r.text += piece;
    if (!r.parsed.stream) continue;
    if (!r.header_sent) {
      r.head.set(http::field::server, "kvroute-mocker");
      r.head.set(http::field::content_type, "text/event-stream");
      r.head.set(http::field::cache_control, "no-cache");
      r.head.chunked(true);
      r.head.keep_alive(r.keep);
      co_await http::async_write_header(s, r.sr, nothrow(r.ec));
      r.header_sent = true;
      if (r.ec) break;
      if (r.chat) {
        ok = co_await r.write_chunk(s, fmt::format(
            R"({{"id":"{}","object":"chat.completion.chunk","created":{},"model":"{}","choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}})",
            r.rid, r.created, r.model));
        if (!ok) break;
      }
    }
    ok = co_await r.write_chunk(s, r.chunk_json(piece, nullptr));
  }
  co_return false;
}

// The end of a finished generation: the whole answer, or the stream's last
// chunks. Returns whether the connection goes on.
awaitable<bool> MockerServer::Impl::finish_reply(beast::tcp_stream& s, Reply& r) {
  if (!r.parsed.stream) {
    // One choice per prompt of a batch and per `n` (the same text), index
    // ordered as vLLM's (prompt-major), so a router's n > 1 and batched
    // prompts can be checked; streams still carry one choice.
    std::string choice;
    for (uint32_t i = 0; i < r.parsed.n * r.parsed.prompts; ++i)
      choice += (i ? "," : "") +
                (r.chat ? fmt::format(R"({{"index":{},"message":{{"role":"assistant","content":"{}"}},"logprobs":null,"finish_reason":"length"}})",
                                      i, json_escape(r.text))
                        : fmt::format(R"({{"index":{},"text":"{}","logprobs":null,"finish_reason":"length"}})", i,
                                      json_escape(r.text)));
    co_return co_await respond(s, r.version, r.keep, http::status::ok,
                               fmt::format(R"({{"id":"{}","object":"{}","created":{},"model":"{}","choices":[{}],"usage":{}}})",
                                           r.rid, r.chat ? "chat.completion" : "text_completion", r.created, r.model,
                                           choice, r.usage_json()));
  }
  if (!co_await r.write_chunk(s, r.chunk_json("", "length"))) co_return false;
  if (r.gen.include_usage &&
      !co_await r.write_chunk(s, fmt::format(R"({{"id":"{}","object":"{}","created":{},"model":"{}","choices":[],"usage":{}}})",
                                             r.rid, r.chat ? "chat.completion.chunk" : "text_completion", r.created,
                                             r.model, r.usage_json())))
    co_return false;
  if (!co_await r.write_chunk(s, "[DONE]")) co_return false;
  co_await asio::async_write(s, http::make_chunk_last(), nothrow(r.ec));
  co_return !r.ec && r.keep;
}

awaitable<bool> MockerServer::Impl::generate(beast::tcp_stream& s, const http::request<http::string_body>& req,
                                             ApiKind kind) {
  const bool keep = req.keep_alive();
  const unsigned v = req.version();
  ++requests_total;
  ParsedRequest parsed;
  GenParams gen;
  bool lora = false;
  auto reject = parse_generation(req, kind, parsed, gen, lora);
  if (!reject && hang) {
    // Test hook: accept and never answer; return when the client gives up.
    char b;
    beast::error_code ec;
    s.expires_never();
    co_await s.socket().async_receive(asio::buffer(&b, 1), nothrow(ec));
    co_return false;
  }
  Engine* engine = nullptr;
  uint32_t prompt_len = 0;
  uint64_t id = 0;
  if (!reject) {
    id = next_id++;
    reject = admit_generation(req, parsed, gen, lora, id, engine, prompt_len);
  }
  if (reject) {
    ++rejected_total;
    // Bodies are built before co_await: GCC 12 mishandles temporaries in co_await expressions.
    std::string body = error_body(reject->error);
    co_return co_await respond(s, v, keep, reject->status, std::move(body));
  }
  auto p = std::make_shared<Pending>(ioc.get_executor());
  pending[id] = p;
  schedule();
  watch_client(s.socket(), p);

  Reply r(parsed, gen, id, opts.worker_id, kind == ApiKind::ChatCompletions, keep, v, prompt_len);
  const bool finished = co_await relay_tokens(s, *p, r);
  pending.erase(id);
  {
    beast::error_code ignored;
    s.socket().cancel(ignored);  // stop the client watch
  }
  if (!finished) {
    // Client went away (or a write failed): stop generating, free the blocks.
    engine->cancel(id);
    schedule();
    ++cancels_total;
    co_return false;
  }
  co_return co_await finish_reply(s, r);
}

MockerServer::MockerServer(MockerOptions opts, NatsBus* bus, VllmPublisher* vllm)
    : MockerServer(std::move(opts), bus, vllm ? std::vector<VllmPublisher*>{vllm} : std::vector<VllmPublisher*>{}) {}
MockerServer::MockerServer(MockerOptions opts, NatsBus* bus, std::vector<VllmPublisher*> vllm)
    : impl_(std::make_unique<Impl>(std::move(opts), bus, std::move(vllm))) {}
MockerServer::~MockerServer() = default;

bool MockerServer::listen(std::string* error) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(impl_->opts.host, ec);
  if (ec) {
    if (error) *error = fmt::format("--host: '{}' is not an IP address", impl_->opts.host);
    return false;
  }
  tcp::endpoint ep(addr, impl_->opts.port);
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    if (error) *error = fmt::format("cannot listen on {}:{}: {}", impl_->opts.host, impl_->opts.port, ec.message());
    return false;
  }
  return true;
}

uint16_t MockerServer::port() const { return impl_->acceptor.local_endpoint().port(); }

bool MockerServer::start_nats(std::string* error) {
  if (!impl_->bus) return true;
  const std::string subject = fmt::format("{}.kv_resync.{}", impl_->opts.subject_prefix, impl_->opts.worker_id);
  return impl_->bus->subscribe(
      subject,
      [impl = impl_.get()](const NatsMessage& m) {
        if (m.reply.empty()) return;
        // The engine lives on the io thread: take the dump there. Chunked
        // (events/wire.h): chunk 0 of snapshot 0 takes a new snapshot.
        ResyncRequest rq;
        if (decode_resync_request(m.data, rq) != DecodeError::None) return;
        asio::post(impl->ioc, [impl, rq, reply = std::string(m.reply)] {
          const std::vector<std::string>* chunks = nullptr;
          for (const auto& [id, c] : impl->resync_snapshots)
            if (id == rq.snapshot) chunks = &c;
          if (!chunks) {
            if (rq.snapshot != 0 || rq.chunk != 0) {
              impl->answer_resync(reply, encode_resync_gone());
              return;
            }
            ResyncDump d;
            d.owner = CacheOwner{WorkerId{impl->opts.worker_id}, 0};
            d.last_event_id = impl->engine.last_event_id();
            d.instance = impl->instance_id;
            d.events = impl->engine.dump();
            if (rq.max_bytes == 0) {  // a router of the legacy protocol: one message
              impl->answer_resync(reply, encode_resync_dump(d));
              return;
            }
            const size_t cap = std::min<size_t>(rq.max_bytes, impl->bus->max_payload());
            ++impl->resync_snapshot;
            impl->resync_snapshots.emplace_back(impl->resync_snapshot,
                                                encode_resync_chunks(d, impl->resync_snapshot, cap));
            if (impl->resync_snapshots.size() > 4) impl->resync_snapshots.pop_front();
            chunks = &impl->resync_snapshots.back().second;
          }
          if (rq.chunk >= chunks->size()) return;  // nonsense: no answer
          impl->answer_resync(reply, (*chunks)[rq.chunk]);
        });
      },
      error);
}

void MockerServer::run() {
  asio::co_spawn(impl_->ioc, impl_->accept_loop(), asio::detached);
  if (impl_->bus) impl_->heartbeat_loop();
  impl_->ioc.run();
}

void MockerServer::stop() {
  asio::post(impl_->ioc, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->ioc.stop();
  });
}

}  // namespace kvroute::mocker
