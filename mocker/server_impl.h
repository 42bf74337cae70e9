// Internal to mocker/ (included only by the kvroute_mocker_server sources):
// MockerServer::Impl, the io thread's state, and what its files share. Its
// members are defined by concept:
//   server.cpp         the public API, accept loop and HTTP session (routes), NATS resync answers
//   generation.cpp     completions: parse, tokenize, admit to a rank's engine, stream or gather the reply
//   engine_events.cpp  the engine clock (tick timer, rank choice) and its KV events (NATS or vLLM ZMQ)
//   telemetry.cpp      heartbeats, GET /mocker/stats, vLLM-named Prometheus metrics
//   pd_server.cpp      prefill/decode disaggregation: vLLM NIXL legs and side channel, SGLang rooms
//   offload_server.cpp offload mode: the host tier and the shared pool, their events and loads
// The six are compiled as one translation unit (mocker/CMakeLists.txt): each
// alone would parse Beast and Asio's coroutines again.
#pragma once

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
#include <optional>
#include <unordered_map>

#include "common/json_escape.h"
#include "events/nats_bus.h"
#include "events/vllm_wire.h"
#include "events/wire.h"
#include "mocker/vllm_publisher.h"
#include "router/api/api_routes.h"
#include "router/openai_request.h"
#include "tokenizer/request_tokens.h"

namespace kvroute::mocker {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;

inline auto nothrow(beast::error_code& ec) { return asio::redirect_error(use_awaitable, ec); }

// Watches a served connection for its client leaving while the server has
// nothing to read from it (a generation, a wait in a room): readable with
// no data (end of stream) or failed; `on_gone` runs then, once. A byte
// pipelined by a client that is still there reads as alive (the watch
// ends). Cancel the socket's operations to end the watch: the handler then
// touches nothing (the session may be gone).
template <typename OnGone>
void watch_departure(tcp::socket& sock, OnGone on_gone) {
  sock.async_wait(tcp::socket::wait_read, [&sock, on_gone = std::move(on_gone)](beast::error_code ec) mutable {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {  // readable: a peek without blocking tells end of stream from data
      char b;
      beast::error_code rec;
      sock.non_blocking(true, rec);
      const size_t n = sock.receive(asio::buffer(&b, 1), tcp::socket::message_peek, rec);
      beast::error_code ignored;
      sock.non_blocking(false, ignored);
      if (n > 0 || rec == asio::error::would_block || rec == asio::error::try_again) return;  // alive
    }
    on_gone();
  });
}

inline constexpr const char* kWords[] = {"the ", "cache ", "router ", "sends ", "each ", "request ", "to ", "a ",
                                  "worker ", "that ", "already ", "holds ", "its ", "prefix ", "and ", "streams "};

// What the engine produced for one request, waiting for its session.
struct Pending {
  explicit Pending(asio::any_io_executor ex) : wake(ex) { wake.expires_at(asio::steady_timer::time_point::max()); }
  std::deque<EngineOutput> outputs;
  asio::steady_timer wake;  // cancelled to wake the session
  bool client_gone = false;
  double arrival_ms = 0;  // engine time the engine got the request
};

// Which leg of a disaggregated request this is (none: aggregated).
enum class PdLeg : uint8_t { None, NixlPrefill, NixlDecode, MooncakePrefill, MooncakeDecode, SglPrefill, SglDecode };

// Fields of a completion request the router does not need.
struct GenParams {
  uint32_t max_tokens = 16;
  bool include_usage = false;
  std::string cache_salt;  // vLLM's per-tenant prefix cache isolation
  // Prefill/decode disaggregation (pd_server.cpp classify_pd()).
  PdLeg leg = PdLeg::None;
  KvTransferParams kv;               // vLLM: the request's kv_transfer_params
  uint64_t room = 0;                 // SGLang: bootstrap_room
  std::string bootstrap_host;        // SGLang: the prefill worker's host
  uint16_t bootstrap_port = 8998;    // SGLang: its bootstrap port (null = SGLang's default)
  std::string request_id_header;     // X-Request-Id, vLLM's base request id
};

// A tokenized request ready for its rank's engine (generation.cpp prepare_generation()).
struct Prepared {
  std::vector<TokenId> tokens;
  HashNamespace ns;
  std::string lora_name;  // owns ns.lora_name's text
  int rank = 0;
  bool read_cache = true;        // false with prompt_logprobs (vLLM reads no cache for it)
  int64_t priority = 0;          // vLLM's request priority (--scheduling-policy priority)
  uint32_t imported_blocks = 0;  // decode leg: complete prompt blocks that came from the prefill worker
};

// SGLang: one bootstrap room on the prefill worker, where its two legs meet.
struct Room {
  explicit Room(asio::any_io_executor ex) : prefill_wake(ex), decode_wake(ex) {}
  asio::steady_timer prefill_wake, decode_wake;  // each side waits on its own, the other cancels it
  bool prefill_arrived = false, decode_arrived = false;
  bool ready = false;   // prefill finished: `blocks` are held for the decode leg
  bool taken = false;   // the decode leg took them
  bool failed = false;  // a side gave up: the other fails too
  std::vector<SequenceHash> blocks;
};

// Counters of the PD emulation (io thread only).
struct PdStats {
  uint64_t transfers_served = 0;     // prefill: pulls answered
  uint64_t transfers_expired = 0;    // prefill: leases that ran out
  uint64_t transfers_freed = 0;      // prefill: freed by the decode side without a pull
  uint64_t transfers_completed = 0;  // decode: pulls done (the request then ran)
  uint64_t blocks_pulled = 0, bytes_pulled = 0;
  uint64_t blocks_local = 0;         // decode: blocks already cached here, not transferred
  uint64_t rooms_completed = 0;      // SGLang: rendezvous done (counted on each side)
  uint64_t prefill_legs = 0;         // requests served as a prefill leg
  uint64_t answers_held = 0;         // vLLM prefill legs whose KV is held and whose answer waits (hold_answers)
  uint64_t pulls_waited = 0;         // Mooncake prefill: pulls that arrived before their transfer was held
  uint64_t pulls_timed_out = 0;      // Mooncake prefill: of those, the ones whose transfer never came
  uint64_t recomputed = 0;           // decode: bad params served aggregated (--pd-bad-params recompute)
  std::unordered_map<std::string, uint64_t> rejected;               // decode / leg refusals by reason
  std::unordered_map<std::string, uint64_t> side_channel_rejected;  // prefill: reads refused by reason
};

// The answer of a side-channel call to another mocker.
struct PeerReply {
  unsigned status = 0;  // 0: no answer (error says why)
  std::string body;
  std::string error;
};

// Reads GenParams from a completion request's body (generation.cpp).
bool parse_gen_params(std::string_view body, GenParams& p, std::string& err);

struct MockerServer::Impl {
  Impl(MockerOptions o, NatsBus* b, std::vector<VllmPublisher*> v)
      : opts(std::move(o)),
        bus(b),
        publishers(std::move(v)),
        vllm(publishers.empty() ? nullptr : publishers[0]),
        acceptor(ioc),
        side_acceptor(ioc),
        lease_timer(ioc),
        answers_gate(ioc, asio::steady_timer::time_point::max()),
        transfers(opts.pd.max_held, opts.pd.lease_ms),
        tick(ioc),
        heartbeat(ioc),
        start(std::chrono::steady_clock::now()),
        engines(make_engines(opts, !publishers.empty(), [this](const KvEvent& ev) { on_engine_event(ev); })),
        engine(*engines[0]) {
    vllm_batch.resize(engines.size());
    requests_by_rank.resize(engines.size(), 0);
    vllm_flush_posted.resize(engines.size(), false);
    engine_id = opts.pd.engine_id.empty() ? uuid4() : opts.pd.engine_id;
  }

  // vLLM's default engine_id (vllm/config/kv_transfer.py __post_init__: str(uuid.uuid4())).
  std::string uuid4() {
    const uint64_t a = rng(), b = rng();
    return fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xffff, a & 0xfff,
                       0x8000 | ((b >> 48) & 0x3fff), b & 0xffffffffffffULL);
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
  tcp::acceptor side_acceptor;  // PD: vLLM side channel or SGLang bootstrap server
  asio::steady_timer lease_timer;
  // POST /mocker/pd/hold_answers: while set, a vLLM prefill leg that
  // finished (its KV held, as the engine holds it) waits on answers_gate
  // before its answer is written (the window in which an engine has
  // prefilled but its client has not read the answer). The gate never
  // expires; clearing the flag cancels its waits.
  bool hold_answers = false;
  asio::steady_timer answers_gate;
  TransferTable transfers;      // prefill: held for their pull
  std::unordered_map<uint64_t, std::shared_ptr<Room>> rooms;  // SGLang bootstrap rooms
  PdStats pd;
  std::string engine_id;        // vLLM remote_engine_id
  std::mt19937_64 rng{std::random_device{}()};
  uint64_t next_block_id = 1;   // prefill: the block ids reported in remote_block_ids
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
  // The vLLM priority of the last request queued on an engine (GET
  // /mocker/stats "last_priority"), for tests of what a router forwards.
  int64_t last_priority = 0;
  // The credential fields requests arrived with, for tests of what a router
  // passes on (GET /mocker/stats "credentials"): requests carrying each, the
  // last value of each, and requests refused by --api-key.
  uint64_t with_authorization = 0, with_x_api_key = 0, unauthorized_total = 0;
  std::string last_authorization, last_x_api_key;
  // The Responses this worker produced (id, final response object), newest
  // last (at most kStoredResponses, kStoredResponseBytes of bodies), as
  // vLLM's in-memory response store holds them: a previous_response_id not
  // among them is answered 404 as vLLM answers it; GET /v1/responses/{id}
  // returns the object.
  static constexpr size_t kStoredResponses = 4096;
  static constexpr size_t kStoredResponseBytes = 64u << 20;
  std::deque<std::pair<std::string, std::string>> stored_responses;
  size_t stored_response_bytes = 0;
  const std::string* stored_response(std::string_view id) const {
    for (const auto& [rid, body] : stored_responses)
      if (rid == id) return &body;
    return nullptr;
  }
  bool stores_response(std::string_view id) const { return stored_response(id) != nullptr; }
  void store_response(std::string id, std::string body) {
    stored_response_bytes += body.size();
    stored_responses.emplace_back(std::move(id), std::move(body));
    while (stored_responses.size() > kStoredResponses ||
           (stored_response_bytes > kStoredResponseBytes && stored_responses.size() > 1)) {
      stored_response_bytes -= stored_responses.front().second.size();
      stored_responses.pop_front();
    }
  }
  // This process's instance id (new at each start) and the resync
  // snapshot being served in chunks (one at a time; a newer one replaces it).
  const uint64_t instance_id = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  uint64_t resync_snapshot = 0;  // id of the newest snapshot
  // The last few snapshots' chunks (several routers may pull at once).
  std::deque<std::pair<uint64_t, std::vector<std::string>>> resync_snapshots;
  uint64_t resync_publish_failed = 0;

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

  awaitable<void> accept_loop(tcp::acceptor& a, bool side);
  awaitable<void> session(tcp::socket socket, bool side);
  // Records the request's credential fields; false if --api-key refuses it.
  bool authorized(const http::request<http::string_body>& req);
  awaitable<bool> respond(beast::tcp_stream& s, unsigned version, bool keep, http::status st, std::string body,
                          std::string_view type = "application/json");
  awaitable<bool> generate(beast::tcp_stream& s, const http::request<http::string_body>& req, ApiKind kind);
  // generate()'s phases. A rejection is answered by generate() (counted once).
  struct Reject {
    http::status status;
    ApiError error;
  };
  // `chat_body`: what a Responses or Messages body converts into (parsed.body views it).
  std::optional<Reject> parse_generation(const http::request<http::string_body>& req, ApiKind kind,
                                         ParsedRequest& parsed, std::string& chat_body, GenParams& gen,
                                         bool& lora) const;
  // Tokenizes the request and picks its rank.
  std::optional<Reject> prepare_generation(const http::request<http::string_body>& req, const ParsedRequest& parsed,
                                           const GenParams& gen, bool lora, Prepared& out);
  // Queues it on its rank's engine as `id`, arrived at engine time `now`.
  std::optional<Reject> admit_generation(const Prepared& prep, const GenParams& gen, uint64_t id, Engine*& engine,
                                         double now);
  struct Reply;
  awaitable<bool> relay_tokens(beast::tcp_stream& s, Pending& p, Reply& r);
  awaitable<bool> finish_reply(beast::tcp_stream& s, Reply& r);
  awaitable<bool> tokenize(beast::tcp_stream& s, const http::request<http::string_body>& req);
  // POST /mocker/drop_events, /mocker/hang, /mocker/pd/hold_answers (server.cpp); false: another route.
  awaitable<bool> test_hook(beast::tcp_stream& stream, const http::request<http::string_body>& req, bool& again);
  awaitable<bool> embeddings(beast::tcp_stream& s, const http::request<http::string_body>& req);
  // POST /detokenize, /v1/rerank, /v1/score, /v1/messages/count_tokens (passthrough.cpp).
  awaitable<bool> passthrough(beast::tcp_stream& s, const http::request<http::string_body>& req, ApiKind kind);
  bool serves(std::string_view model) const {
    return model == opts.model ||
           std::find(opts.lora_modules.begin(), opts.lora_modules.end(), model) != opts.lora_modules.end();
  }
  // The served model's tokenizer: a LoRA adapter tokenizes with its base
  // model's, as vLLM does (null: the placeholder).
  const ModelTokenizer* model_tokenizer() const { return opts.tokenizers ? opts.tokenizers->find(opts.model) : nullptr; }

  // ---- prefill/decode disaggregation (pd_server.cpp) ----
  static Reject pd_reject(http::status st, PdError e, std::string message);
  std::optional<Reject> classify_pd(const http::request<http::string_body>& req, GenParams& gen);
  std::optional<Reject> classify_vllm(simdjson::dom::object body, GenParams& gen);
  std::optional<Reject> classify_sglang(simdjson::dom::object body, GenParams& gen);
  void count_rejection(PdError e) { ++pd.rejected[pd_error_name(e)]; }
  // Decode leg, before admission: pulls (vLLM) or takes (SGLang) the prompt's
  // KV from the prefill worker; sets prep.imported_blocks.
  awaitable<std::optional<Reject>> nixl_pull(const GenParams& gen, Prepared& prep, bool& contacted);
  awaitable<std::optional<Reject>> mooncake_pull(const GenParams& gen, Prepared& prep, bool& contacted);
  // Their shared end: the prefill worker's reply (from its `peer`, naming
  // `transfer` in errors) checked against the prompt's blocks from `local`
  // on, then transfer_blocks(); and a failed pull refused or recomputed.
  awaitable<std::optional<Reject>> finish_pull(const PeerReply& reply, const std::vector<SequenceHash>& blocks,
                                               uint32_t local, Prepared& prep, bool& contacted, std::string_view peer,
                                               std::string_view transfer);
  std::optional<Reject> pull_failed(PdError e, std::string msg, Prepared& prep);
  awaitable<std::optional<Reject>> sgl_take(const GenParams& gen, Prepared& prep);
  // Both protocols' transfer once the peer has answered: waits the link's time
  // for the `blocks` − `local` blocks moved, counts them, marks them imported.
  awaitable<void> transfer_blocks(size_t blocks, uint32_t local, Prepared& prep);
  // SGLang prefill leg, before admission: waits for the decode leg of its room.
  // `client`: its leaving ends the wait (the room fails).
  awaitable<std::optional<Reject>> sgl_wait_decode(const GenParams& gen, tcp::socket& client);
  // SGLang prefill leg that met its decode leg but will not hand its blocks
  // over (refused, or its client left): closes the room, failing the decode leg.
  void sgl_close_room(uint64_t id);
  // Prefill leg, after its engine request finished: registers the held
  // transfer (vLLM; returns the kv_transfer_params JSON, empty when none) or
  // hands the blocks to the room's decode leg and waits for it (SGLang).
  std::string nixl_hold(const GenParams& gen, const Prepared& prep, const std::string& rid, uint64_t id);
  awaitable<std::optional<Reject>> sgl_hand_over(const GenParams& gen, const Prepared& prep, uint64_t id,
                                                 tcp::socket& client);
  // A refused request's PD cleanup: an SGLang room it joined closes; a vLLM
  // decode leg that never reached the prefill worker (`pulled` false) frees
  // its transfer there (notify_peer()).
  void pd_leg_refused(const GenParams& gen, bool pulled, bool in_room);
  // vLLM: a decode leg refused before its pull tells the prefill worker
  // (gen.kv.remote_host:remote_port) to free the blocks: POST `target` `body`.
  void notify_peer(const GenParams& gen, std::string_view target, std::string body);
  // Mooncake: the prefill leg's blocks held under its transfer_id (no params returned).
  void mooncake_hold(const GenParams& gen, const Prepared& prep, uint64_t id);
  // A vLLM prefill leg's answer waits here while hold_answers is set (its KV is held meanwhile).
  awaitable<void> hold_answer();
  // Mooncake: rank r's engine id (the engine id alone without data parallelism,
  // engine_id + "_dp" + r with it).
  std::string mooncake_engine_id(uint32_t rank) const;
  void arm_lease_timer();
  double wall_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  awaitable<PeerReply> peer_post(std::string host, uint16_t port, std::string target, std::string body,
                                 std::chrono::milliseconds timeout);
  // The side channel's routes; false: not a side-channel route.
  awaitable<bool> side_channel(beast::tcp_stream& s, const http::request<http::string_body>& req, bool& again);
  awaitable<std::pair<http::status, std::string>> sgl_room_request(std::string_view body);
  awaitable<void> mooncake_side_channel(beast::tcp_stream& s, const http::request<http::string_body>& req, bool& again);
  // Mooncake prefill: a pull (or the empty pull that frees) for a transfer not
  // held yet waits until it is, at most lease_ms (send_kv_to_decode). False:
  // too many pulls wait already.
  awaitable<bool> mooncake_wait_held(std::string transfer_id);
  // Wakes the pulls waiting for `transfer_id` (its prefill finished and holds it).
  void mooncake_wake(const std::string& transfer_id);
  std::unordered_multimap<std::string, asio::steady_timer*> mooncake_waiters;  // by transfer id
  std::shared_ptr<Room> room_for(uint64_t id);
  std::string pd_stats_json() const;
  std::string pd_metrics_text() const;

  // ---- NATS resync (server.cpp) ----
  void answer_resync(const std::string& reply, const std::string& body);

  // ---- engine clock and KV events (engine_events.cpp) ----
  void queue_vllm_event(const KvEvent& ev);
  void publish_event(const KvEvent& ev);
  void on_tick();
  std::optional<double> next_event_time() const;
  int pick_rank(const http::request<http::string_body>& req);
  void schedule();

  // ---- offload mode: host tier and shared pool (offload_server.cpp) ----
  std::optional<KvPoolDir> pool;      // --kv-pool-dir
  HostTier host{0};                   // --kv-host-blocks
  std::unordered_map<uint64_t, BlockMeta> device_meta;  // host tier: the device's blocks, to offload on eviction
  struct OffloadStats {
    uint64_t pool_loaded_blocks = 0;   // prompt blocks loaded from the pool instead of prefilled
    uint64_t host_loaded_blocks = 0;   // prompt blocks loaded from the host tier
    uint64_t computed_blocks = 0;      // prompt blocks prefilled (neither cached nor loaded)
    uint64_t cached_blocks = 0;        // prompt blocks found on the device
    uint64_t pool_stored_blocks = 0;   // blocks this mocker wrote to the pool (first)
    uint64_t pool_evicted_blocks = 0;  // blocks this mocker evicted from the pool
    uint64_t host_offloaded_blocks = 0, host_evicted_blocks = 0;
    uint64_t loads = 0;                // requests that loaded from a tier
    double load_ms = 0;                // engine ms spent loading
  } offload_stats;
  bool open_offload(std::string* err);
  // Every engine event: published, then the offload tiers follow it.
  void on_engine_event(const KvEvent& ev);
  void offload_after(const KvEvent& ev);
  void offload_evicted(const KvRemoved& rm);  // the engine's eviction hook (host tier)
  // Before admission: the prompt's blocks after the device's prefix found in
  // the host tier or the pool are loaded (their load time waited), then
  // imported by the engine as computed.
  awaitable<void> offload_load(Prepared& prep);
  std::vector<KvEvent> offload_dump() const;
  std::string offload_stats_json() const;

  // ---- heartbeats, stats and metrics (telemetry.cpp) ----
  void publish_heartbeat();
  void heartbeat_loop();
  std::string stats_json() const;
  std::string metrics_text() const;
};

}  // namespace kvroute::mocker
