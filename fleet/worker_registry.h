// The table of workers: what they announced, their last reported load, their
// health as the router judges it, and the router's own in-flight requests on
// each (predicted load).
//
// Liveness rule: a worker is known and judged by the router itself. Workers
// come from the config (`workers.static`), DNS discovery, the admin API or
// NATS heartbeats. Health comes from the worker directly: scrapes of its
// /metrics (fleet/scraper.h) and the proxy's connections (refused, timed
// out, 5xx). KV events never keep a worker alive nor take it out; only a
// heartbeat-only worker is removed by heartbeat silence (expire()).
//
// Health states (see health_state()):
//   ok       - a candidate.
//   down     - its last scrape or connection was refused, or
//              `workers.eject_after_failures` scrapes/connections in a row
//              failed; returns with the next success (scrape or request).
//   ejected  - outlier ejection: that many proxied requests in a row timed
//              out or got a 5xx while the worker may still answer /metrics
//              (a hung engine); out for eject_base_ms * 2^(n-1) (capped at
//              eject_max_ms), n = ejections in a row; scrapes do not end it.
//
// Thread-safe: heartbeats arrive on a NATS dispatcher thread, scrapes on the
// fleet thread, request threads read candidates, report health and update
// in-flight counts, the index writer thread expires silent heartbeat-only
// workers. One mutex; every operation is O(workers) at most and holds it for
// microseconds.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/types.h"
#include "fleet/inflight_blocks.h"
#include "scheduler/ranked_candidates.h"
#include "scheduler/scheduler.h"
#include "scheduler/ttft_model.h"

namespace kvroute {

// Where the router learnt of a worker. Maps one-to-one to the `source` label.
enum class WorkerSource : uint8_t {
  Heartbeat,  // NATS `{prefix}.workers` heartbeats (expires on silence)
  Static,     // config `workers.static`
  Dns,        // config `discovery.dns` (one worker per A/AAAA record)
  Admin,      // added through the admin API
};
std::string_view to_string(WorkerSource s);

// A failure the router observed talking to a worker. Maps to the `signal` label.
enum class HealthSignal : uint8_t {
  ConnectRefused,    // TCP connect refused or reset: the process is gone (down at once)
  ConnectTimeout,    // TCP connect timed out
  FirstByteTimeout,  // a proxied request got no response header in time (outlier)
  ServerError,       // a proxied request got a 5xx (outlier)
  ScrapeFailed,      // a /metrics scrape failed (timeout, bad status, unparseable)
};
inline constexpr size_t kNumHealthSignals = 5;
std::string_view to_string(HealthSignal s);

enum class HealthState : uint8_t { Ok, Down, Ejected };
std::string_view to_string(HealthState s);

// What became of a heartbeat (WorkerRegistry::admit_heartbeat()).
enum class HeartbeatVerdict : uint8_t {
  Joined,          // a new heartbeat-only worker
  Refreshed,       // a known worker: load (and, for a heartbeat-only one, its announcement) updated
  UrlChanged,      // refused: a heartbeat-only worker's heartbeat names another URL
  TooManyWorkers,  // refused: a new worker while max_bus_workers are known by heartbeat
};

// Passive and active health thresholds (config `workers.*`).
struct HealthPolicy {
  uint32_t eject_after_failures = 3;  // consecutive failures (timeouts, 5xx, failed scrapes)
  uint32_t eject_base_ms = 2000;      // first outlier ejection; doubles per ejection in a row
  uint32_t eject_max_ms = 30000;
};

struct WorkerAnnouncement {
  WorkerId id;
  WorkerSource source = WorkerSource::Heartbeat;
  std::string url;
  std::string model;
  uint32_t block_size = 0;
  uint32_t dp_size = 1;
  bool approximate = false;  // publishes no KV events: its cache is predicted from routing
  WorkerLoad load;  // as reported (heartbeat or scrape); replaced by on_load_report()
  // Router-known workers (static, DNS, admin): where to scrape and subscribe.
  std::string metrics_url;        // empty: not scraped
  std::string kv_events;          // ZMQ PUB endpoint of dp rank 0 (rank r: port + r); empty: none
  std::string replay;             // ZMQ ROUTER replay endpoint of dp rank 0; empty: none
  std::vector<std::string> lora_adapters;  // model names served as LoRA adapters of `model`
  // Disaggregated fleets (scheduler/pd_decision.h): what it does, and for an
  // SGLang prefill worker the port of its bootstrap server.
  WorkerRole role = WorkerRole::Both;
  uint32_t bootstrap_port = 8998;
};

struct WorkerView {
  std::shared_ptr<const WorkerAnnouncement> info;  // immutable; replaced by each heartbeat
  WorkerLoad predicted;         // reported load, raised by the router's own in-flight work
  uint32_t inflight_requests = 0;
  uint64_t inflight_blocks = 0;
  uint64_t pending_prefill_tokens = 0;  // in-flight requests not yet answered with a first byte
  // The wait for a request slot as tokens of queue (set_slot_wait_tokens()).
  uint64_t slot_wait_tokens = 0;
  bool draining = false;
  HealthState health = HealthState::Ok;
  uint32_t consecutive_failures = 0;
  uint64_t failures_total = 0;     // every HealthSignal, since the worker was added
  Nanos load_age{-1};              // since the last load report; -1 = never
  // The part of inflight_* / pending_prefill_tokens other router
  // replicas have in flight (the rest is this router's own).
  uint32_t remote_requests = 0;
  uint64_t remote_blocks = 0;
  uint64_t remote_prefill_tokens = 0;
  // TTFT model (scheduler/ttft_model.h): requests not yet answered, and the
  // worker's fitted coefficients.
  uint32_t pending_prefill_requests = 0;
  TtftCoefficients ttft;
  // KV the routers expect back on the worker (set_parked_kv_seconds()):
  // this router's and, through replica sync, the other replicas'
  // (remote_parked_blocks of it), faded to the worker's last change or load
  // report.
  double parked_blocks = 0;
  double remote_parked_blocks = 0;
  // KV blocks the worker's events reported evicted from its device
  // (add_evicted()), faded to its last change or load report.
  double evicted_blocks = 0;
};

// One request's KV as the registry counts it in flight on a worker
// (begin_request(), end_request()). Three ways, by what the caller knows:
// `chain` set: the prompt's complete blocks, each counted once per worker
// however many in-flight requests hold it (the exact distinct count);
// else `cached_blocks`: the worker's cached prefix of the prompt, the
// largest of them counted once per worker (a lower bound); else every
// block is the request's own.
struct InflightKv {
  uint64_t blocks = 0;          // the KV blocks the request holds
  uint64_t cached_blocks = 0;   // of `blocks`, the worker's cached prefix (without `chain`)
  std::vector<uint64_t> chain;  // of `blocks`, the prompt's complete blocks (inflight_chain())
  // The worker's cached prefix of the prompt as routing saw it, whatever
  // `cached_blocks` counts: the parked KV this request takes up again.
  uint64_t resumed_blocks = 0;
  // Set by begin_request(): the worker's table that counts `chain`.
  std::shared_ptr<InflightBlocks> counted_in;
};

// What begin_request() saw, for learning the TTFT when the first byte comes.
struct TtftSample {
  TtftFeatures features;
  TimePoint start{};
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(const Clock& clock) : clock_(clock) {}

  // Records a heartbeat; returns true if the worker was not known before. A
  // worker the router knows from another source keeps that source (and its
  // URL): the heartbeat only refreshes its load.
  bool on_heartbeat(const WorkerAnnouncement& a);
  // The same under the bus's trust rules: a known worker's URL never changes
  // through a heartbeat (only config or the admin API change it, or the
  // worker expires first), and a new worker is refused while
  // `max_bus_workers` heartbeat-only workers are known (the known ones are
  // never evicted). A refused heartbeat changes nothing.
  HeartbeatVerdict admit_heartbeat(const WorkerAnnouncement& a, size_t max_bus_workers);
  // Heartbeat-only workers known now.
  size_t bus_workers() const;
  // Adds or replaces a router-known worker (static, DNS, admin); keeps its
  // health, load and in-flight counts when it was known. True if new.
  bool upsert(const WorkerAnnouncement& a);
  // Removes heartbeat-only workers silent for longer than `ttl`; returns them.
  // Router-known workers never expire here: their health decides.
  std::vector<WorkerId> expire(Nanos ttl);
  // Removes one worker now.
  bool remove(WorkerId id);
  // Counts every heartbeat-only worker as heard from now (the bus is down:
  // their silence is the bus's, not theirs).
  void hold_heartbeats();

  // Load scraped from the worker's /metrics: replaces the reported load and
  // counts as a success (a down worker returns). True when the worker was
  // down: it may have restarted (its KV event stream is then re-synced).
  bool on_load_report(WorkerId id, const WorkerLoad& load);
  // Passive and active health (any thread).
  void report_failure(WorkerId id, HealthSignal signal);
  void report_success(WorkerId id);
  void set_health_policy(const HealthPolicy& p);
  // Parked KV (config scheduler.parked_kv_seconds): the prompt blocks of
  // the requests this router saw answered on a worker (their first byte
  // came), kept in the cache by the engine and likely asked for again (a
  // conversation's next turn, an agent back from a tool). Each worker's
  // figure fades by exp(-elapsed / seconds) and loses a new request's
  // cached prefix there (InflightKv::resumed_blocks), which is in flight
  // again. The scheduler counts it with the worker's active KV, so a new
  // context goes where it displaces the least of what is expected back.
  // 0 turns it off and clears it.
  void set_parked_kv_seconds(double seconds);
  // Evictions (config scheduler.eviction_seconds): the KV blocks a worker's
  // removed events took out of its cache in the index (Indexer::take_removed:
  // a block moved to a lower tier of the worker stays cached and is not
  // counted), each worker's figure fading by exp(-elapsed / seconds). The
  // scheduler prices new work on a worker by how fast its cache turns over
  // (scheduler.h, eviction_term()). Liveness never reads it.
  void set_eviction_seconds(double seconds);
  // `blocks` more evicted on `id`; ignored for an unknown worker and for one
  // that reports no KV capacity (nothing to weigh them against). The figure
  // is kept at most the worker's capacity: a worker that reports removals it
  // never made only turns work away from itself, and by a bounded amount.
  void add_evicted(WorkerId id, uint64_t blocks);
  // Slot waits (config scheduler.slot_wait_tokens): on a worker whose
  // request slots are all taken (predicted load), a request waits for a
  // running one to finish before its prefill starts; `tokens` per request
  // beyond the slots, the next one included, join the queue the cost prices
  // there (WorkerView/Candidate::slot_wait_tokens). 0 = off.
  void set_slot_wait_tokens(double tokens);
  // Failures observed by signal, since start (for metrics).
  std::array<uint64_t, kNumHealthSignals> failure_counts() const;
  // Marks a worker as draining: it gets no new requests, in-flight ones finish.
  bool set_draining(WorkerId id, bool draining);

  // Healthy workers that serve `model` (empty = any; a LoRA adapter of the
  // worker's model counts) and have a URL, sorted by id.
  std::vector<WorkerView> candidates(std::string_view model) const;
  // The same into `out` (replaced; its capacity is reused: no allocation per request).
  void candidates(std::string_view model, std::vector<WorkerView>& out) const;
  std::vector<WorkerView> all() const;
  // A known worker holding some of a prefix, as the KV location API shows it.
  struct CacheHolder {
    OwnerOverlap overlap;
    const WorkerAnnouncement* info = nullptr;  // alive while the call's `keep` is
    HealthState health = HealthState::Ok;
    bool draining = false;
  };
  // What keeps the holders' announcements alive after the call (each
  // holder's own, or a kept set's): one reference per set, not per holder.
  using Keep = std::vector<std::shared_ptr<const void>>;
  // The owners of `owners` that belong to a known worker serving `model`
  // (empty = any), with that worker's announcement and state, into `out`
  // (replaced; its capacity reused), in the order of `owners`. One lock, a
  // table lookup per owner. The KV location API's reference read (tests and
  // bench_kv_lookup compare the layered read below with it).
  void holders(std::string_view model, std::span<const OwnerOverlap> owners, std::vector<CacheHolder>& out,
               Keep& keep) const;
  // The holders of `match` (find_match_layers' answer: an owner's overlap is
  // its deepest layer's, or its `extra` entry when that is longer) that
  // belong to a known worker serving `model` (empty = any), longest first
  // (ties by worker id, then dp rank), at most `max` of them into `out`
  // (replaced; its capacity reused). Returns how many there are in all. One
  // lock. The members of a layer's set of more than kSmallHolderSet owners
  // are looked up in the table once, sorted and kept under the set's serial
  // (with their announcements) until the table's membership changes (a
  // worker joins, leaves, or changes its URL, what it serves or whether it
  // is approximate; fleet/cache_holders.cpp): a lookup then costs the
  // holders it lists plus O(layers + extra log extra), not a table lookup,
  // a reference count and a sort per holder. Health and draining are read
  // per listed holder, current.
  size_t holders(std::string_view model, const MatchLayers& match, size_t max, std::vector<CacheHolder>& out,
                 Keep& keep) const;
  // A layer's set up to this size is looked up per call, never cached.
  static constexpr size_t kSmallHolderSet = 16;
  // Sets kept at most; their members together at most 8 per known worker + 4,096.
  static constexpr size_t kMaxHolderSets = 32;
  // The routing decision's fast read path: the healthy workers serving
  // `model` are kept pre-ranked (one RankedCandidates per model and LoRA name,
  // updated by every change below), and the decision is taken under the lock
  // without copying every worker (scheduler/ranked_candidates.h; requires
  // RankedCandidates::supports(cfg, rank_limit)). `views` gets the WorkerView of
  // each ranked worker, parallel to out.ranked. Returns false when no healthy
  // worker with a URL serves `model` (the caller tells 404 from 503).
  bool decide(std::string_view model, const MatchLayers& match, uint32_t isl_tokens,
              uint32_t block_size, const SchedulerConfig& cfg, Random& random, size_t rank_limit,
              RankedDecision& out, std::vector<WorkerView>& views);
  // Whether the healthy workers serving `model` have nearly all their
  // request slots taken (scheduler.busy_slot_fleet_usage, with the band of
  // RankedCandidates::slots_full; false when none serves it). Each call
  // advances that band's state: call once per decision. `usage` (optional):
  // that share itself (0 when none serves the model), under the same lock.
  bool slots_full(std::string_view model, const SchedulerConfig& cfg, double* usage = nullptr);
  // The leading blocks of a prompt (`chain`: inflight_chain() of its
  // complete blocks) that each worker serving `model` has in flight from
  // this router: requests sent there and not ended, whose prompts share
  // that prefix (scheduler.inflight_prefix_weight). The engine computes
  // those blocks once and a request behind them there reads them from its
  // cache; the index learns of them only when they are stored. Appended to
  // `out` as owners (dp rank 0), for workers holding more than `beyond`
  // such blocks (the longest prefix any worker has cached: a copy in
  // computation counts where it goes further than every stored one, and a
  // worker is skipped after one probe otherwise). Only workers with a
  // request not answered yet are read (where a prefix can be in
  // computation; answered prompts are stored, and in the index). Left out: workers with several dp ranks (which rank computes
  // the prefix is the engine's choice), and a worker whose in-flight table
  // is being updated at that moment (not waited for). Only scheduler.
  // inflight_kv distinct counts the keys. Returns the model's workers
  // eligible under `cfg` and their mean KV load, as the fast path reads it
  // (RankedCandidates::load_mean(); 0 when none). One lock; O(log chain)
  // probes per worker with a request not answered.
  struct EligibleFleet {
    double load_mean = 0;
    size_t workers = 0;
  };
  EligibleFleet inflight_overlaps(std::string_view model, std::span<const uint64_t> chain, uint32_t beyond,
                                  const SchedulerConfig& cfg, std::vector<OwnerOverlap>& out);
  bool known(WorkerId id) const;
  // The most KV blocks one worker serving `model` (or the LoRA adapter
  // `model`) can hold: the largest kv_total_blocks reported, whatever the
  // worker's health. nullopt when nobody serves it or some worker serving it
  // has not reported a capacity. Recomputed only after a capacity or the
  // membership changed.
  std::optional<uint64_t> kv_capacity(std::string_view model) const;
  // True when `blocks` exceed kv_capacity(model) (which goes into
  // `capacity`). No lock for a request within the smallest capacity any
  // worker reported (the request path's common case).
  bool exceeds_kv_capacity(std::string_view model, uint64_t blocks, uint64_t* capacity = nullptr) const;
  // True when some worker serves `model` as a LoRA adapter (its blocks hash
  // with the adapter's name). Lock-free read of a snapshot.
  bool is_lora_adapter(std::string_view model) const;
  // True when some known worker has role prefill or decode (a disaggregated
  // fleet): routing then scores every candidate so the PD decision sees both
  // sides. Lock-free; refreshed on every membership or role change.
  bool has_pd_roles() const { return pd_roles_.load(std::memory_order_relaxed); }
  // The base model (the worker entry's `model`) of a LoRA adapter name; empty
  // when `model` is no worker's adapter. Lock-free read of the same snapshot.
  std::string lora_base(std::string_view model) const;
  std::vector<std::string> models() const;
  size_t size() const;

  // In-flight accounting (predicted load): the router calls begin_request()
  // when it dispatches a request, with the KV blocks it will hold and its
  // uncached prefill tokens; first_byte() when the response starts (prefill
  // is over); end_request() when the response completes or fails.
  // end_request() also releases prefill tokens whose first_byte() was not
  // reported (a failed request, or one answered all at once).
  // begin_request() returns the TTFT model's features as the request found
  // the worker; first_byte() with that sample teaches the worker's model the
  // observed time; `prefilling` in end_request(): first_byte() never came.
  // `kv`: the request's KV (InflightKv). The worker's in-flight KV is the
  // sum of every request's own blocks, plus each distinct chained block
  // once (the worker's InflightBlocks, counted outside the table's lock),
  // plus the largest cached prefix among requests that name one.
  // A chain that would take the worker's distinct blocks past
  // kMaxInflightChainFactor x its KV capacity (kMaxInflightChainUnknown
  // when it reports none) is dropped from `kv` and its blocks counted as
  // the request's own: the worker reads as full either way, and one
  // worker's keys stay bounded whatever its clients send.
  TtftSample begin_request(WorkerId id, InflightKv& kv, uint64_t prefill_tokens);
  // Every block the request's own, or a cached prefix of `cached_blocks`.
  TtftSample begin_request(WorkerId id, uint64_t blocks, uint64_t prefill_tokens, uint64_t cached_blocks = 0) {
    InflightKv kv{blocks, cached_blocks, {}, 0, {}};
    return begin_request(id, kv, prefill_tokens);
  }
  void first_byte(WorkerId id, uint64_t prefill_tokens, const TtftSample* sample = nullptr);
  // `started`: begin_request()'s time (TtftSample::start); when the last load
  // report came after it, that report counted the request and the predicted
  // load drops it at once (until the next report). {}: not known.
  // `kv` as begin_request() left it.
  void end_request(WorkerId id, const InflightKv& kv, uint64_t prefill_tokens = 0, bool prefilling = false,
                   TimePoint started = {});
  void end_request(WorkerId id, uint64_t blocks, uint64_t prefill_tokens = 0, bool prefilling = false,
                   TimePoint started = {}, uint64_t cached_blocks = 0) {
    end_request(id, InflightKv{blocks, cached_blocks, {}, 0, {}}, prefill_tokens, prefilling, started);
  }
  // Bounds of a worker's distinct in-flight blocks (begin_request()).
  static constexpr uint64_t kMaxInflightChainFactor = 2;
  static constexpr uint64_t kMaxInflightChainUnknown = 1 << 16;
  // Prediction error of every worker's TTFT model so far (MAPE metric).
  TtftStats ttft_stats() const;

  // --- other router replicas' in-flight work ------------------------------
  // Replaces what the other replicas (summed, events/replica_sync.h) have in
  // flight on `id`, and the KV they have parked there (their answered
  // prompts, as faded when they sent it; at most the worker's KV capacity,
  // ignored while the parked KV is off). It adds to the router's own counts
  // in every view (inflight_*, predicted, parked_blocks) and in the fast
  // path's rankings, and is reported apart in WorkerView::remote_*.
  void set_remote_inflight(WorkerId id, uint32_t requests, uint64_t blocks, uint64_t prefill_tokens,
                           double parked_blocks = 0);
  // Changes each time this router's own in-flight counts change (begin_request,
  // first_byte, end_request): replica sync publishes as soon as it moves.
  uint64_t inflight_generation() const { return inflight_generation_.load(std::memory_order_relaxed); }

  // Called when a worker may have room for more work: a request ended, a
  // load report or heartbeat came, a worker joined, was undrained or came
  // back, another replica's in-flight work changed; once per name the
  // worker serves (its model, each LoRA adapter). The router's admission
  // queue wakes that model's waiters on it (router/flow/flow_queue.h)
  // instead of polling. Called with the registry's lock held: it must only
  // signal (take no lock that is ever held while calling into the registry).
  // `f` must outlive the registry's use; set it before serving.
  using CapacityListener = std::function<void(std::string_view model)>;
  void set_capacity_listener(const CapacityListener* f) { capacity_listener_.store(f); }

 private:
  struct Entry {
    std::shared_ptr<const WorkerAnnouncement> info;
    bool draining = false;
    TimePoint last_seen{};         // last heartbeat (heartbeat-only workers expire on it)
    TimePoint last_load{};         // last load report (heartbeat or scrape)
    bool has_load = false;
    HealthState health = HealthState::Ok;
    uint32_t consecutive_failures = 0;
    uint32_t ejections_in_a_row = 0;
    TimePoint ejected_until{};
    uint64_t failures_total = 0;
    uint32_t inflight_requests = 0;
    // This router's in-flight KV (begin_request()): the requests' own
    // blocks, their cached prefixes' sizes (size -> requests), their
    // chained blocks (key -> requests holding it), and the total.
    uint64_t inflight_own_blocks = 0;
    std::map<uint64_t, uint32_t> inflight_prefixes;
    std::shared_ptr<InflightBlocks> inflight_chained = std::make_shared<InflightBlocks>();
    int64_t inflight_chained_blocks = 0;  // its size as the deltas applied so far give it
    uint64_t inflight_blocks = 0;
    uint64_t pending_prefill_tokens = 0;
    uint32_t remote_requests = 0;  // other replicas' (set_remote_inflight)
    uint64_t remote_blocks = 0;
    uint64_t remote_prefill_tokens = 0;
    uint32_t pending_prefill_requests = 0;
    // This router's requests that ended after the last load report although
    // it was taken while they ran: the report still counts them, so the
    // predicted load leaves them out (reset by the next report).
    uint32_t ended_requests = 0;
    uint64_t ended_blocks = 0;
    double parked_blocks = 0;  // as of parked_at (set_parked_kv_seconds())
    double remote_parked_blocks = 0;  // other replicas' (set_remote_inflight), as of parked_at
    TimePoint parked_at{};
    double evicted_blocks = 0;  // as of evicted_at (set_eviction_seconds())
    TimePoint evicted_at{};
    TtftModel ttft;
    std::vector<std::string> rankings;  // the rankings_ this worker is in (its model, its LoRA names)
  };
  // Reported load raised by the routers' in-flight work (this router's and
  // other replicas'; as view() reports it).
  static WorkerLoad predicted(const Entry& e);
  // Adds (or removes) one request's KV to the entry's in-flight KV; returns
  // how far inflight_blocks moved.
  // `chained`: the keys the request's chain added to (or took from) the
  // worker's InflightBlocks.
  static uint64_t add_inflight_kv(Entry& e, const InflightKv& kv, uint64_t chained);
  static uint64_t remove_inflight_kv(Entry& e, const InflightKv& kv, uint64_t chained);
  // Counts `kv`'s chain in the worker's InflightBlocks, outside mu_ (drops
  // it from `kv` when the worker is unknown or its limit is reached);
  // returns the keys it added.
  uint64_t count_chain(WorkerId id, InflightKv& kv);
  static void total_inflight_kv(Entry& e);  // sets inflight_blocks from its parts
  static uint64_t pending_prefill(const Entry& e);  // this router's + other replicas' (view())
  // The slot wait (set_slot_wait_tokens()) of a worker with this predicted load.
  uint64_t slot_wait(const WorkerLoad& predicted) const;
  // Fades the entry's parked KV (its own and the other replicas') to `now`.
  void fade_parked(Entry& e, TimePoint now) const;
  static double parked_total(const Entry& e) { return e.parked_blocks + e.remote_parked_blocks; }
  // Fades the entry's evictions to `now`.
  void fade_evicted(Entry& e, TimePoint now) const;
  // `parked` as much as the worker's KV capacity (when reported) holds beside `beside`.
  static double parked_room(const Entry& e, double parked, double beside);
  // Puts the worker into (or takes it out of) the rankings of the names it
  // serves, with its current state; call after every change of `e`.
  void sync(WorkerId id, Entry& e, TimePoint now);
  void unsync(WorkerId id, Entry& e);  // out of every ranking (before erasing)
  // Re-syncs workers whose ejection has ended (health is read lazily).
  void end_ejections(TimePoint now);
  // Fills `v` (default-constructed, in place in the caller's vector).
  void view(const Entry& e, WorkerView& v, TimePoint now) const;
  // Current state; an ejection whose time has passed reads as ok (lazily).
  static HealthState state(const Entry& e, TimePoint now) {
    return e.health == HealthState::Ejected && now >= e.ejected_until ? HealthState::Ok : e.health;
  }
  static bool serves(const WorkerAnnouncement& a, std::string_view model);

  // holders(MatchLayers): a set's members that serve a model, sorted by
  // owner, with their entries (valid while members_gen_ is unchanged: an
  // entry is erased only by a change that bumps it).
  struct SetMember {
    CacheOwner owner;
    const Entry* entry;
    // Its announcement when resolved: the URL, model and approximate flag
    // are current while members_gen_ is.
    std::shared_ptr<const WorkerAnnouncement> info;
  };
  using SetMembers = std::vector<SetMember>;
  struct HolderSet {
    uint64_t serial = 0;
    uint64_t gen = 0;
    std::string model;
    std::shared_ptr<const SetMembers> members;
  };
  // The members of `set` serving `model`: kept (large sets) or made now.
  std::shared_ptr<const SetMembers> set_members(const OwnerSet& set, std::string_view model) const;  // mu_ held
  std::shared_ptr<SetMembers> resolve(std::span<const CacheOwner> owners, std::string_view model) const;  // mu_ held
  // A change of who is in the table or what a worker serves (mu_ held).
  void membership_changed() { ++members_gen_; }
  uint64_t members_gen_ = 0;
  mutable std::vector<HolderSet> holder_sets_;  // at most kMaxHolderSets
  mutable size_t holder_sets_next_ = 0;         // the next one replaced when full
  mutable size_t holder_set_members_ = 0;       // members of every kept set

  const Clock& clock_;
  std::atomic<uint64_t> inflight_generation_{0};  // see inflight_generation()
  std::atomic<const CapacityListener*> capacity_listener_{nullptr};
  static void capacity_may_be_free(const Entry& e, const CapacityListener* f);  // mu_ held
  void capacity_may_be_free(const Entry& e) const {  // mu_ held
    if (const auto* f = capacity_listener_.load(std::memory_order_acquire)) capacity_may_be_free(e, f);
  }
  mutable std::mutex mu_;
  std::map<WorkerId, Entry> workers_;
  size_t bus_workers_ = 0;  // entries whose source is Heartbeat
  std::map<std::string, RankedCandidates, std::less<>> rankings_;  // by served model / LoRA name
  std::set<std::pair<TimePoint, WorkerId>> ejections_;     // ejected workers by end of ejection
  HealthPolicy policy_;
  double parked_kv_seconds_ = 0;  // set_parked_kv_seconds(); 0 = no parked KV
  double eviction_seconds_ = 30;  // set_eviction_seconds()
  double slot_wait_tokens_ = 0;   // set_slot_wait_tokens(); 0 = off
  std::array<uint64_t, kNumHealthSignals> failures_by_signal_{};
  // LoRA adapter names of every worker with the base model of the first
  // worker serving each (by id), sorted by name; rebuilt on membership changes.
  using LoraNames = std::vector<std::pair<std::string, std::string>>;
  std::shared_ptr<const LoraNames> lora_names_ = std::make_shared<const LoraNames>();
  void rebuild_lora_names();  // mu_ held; refreshes pd_roles_ too
  void refresh_pd_roles();    // mu_ held
  std::atomic<bool> pd_roles_{false};
  // kv_capacity() by served name, rebuilt when capacity_dirty_ (mu_ held).
  mutable std::map<std::string, uint64_t, std::less<>> capacity_;
  mutable bool capacity_dirty_ = true;
  // Smallest capacity any worker reported (unknown = unbounded), a lower
  // bound of kv_capacity() of every served name; 0 until rebuilt.
  mutable std::atomic<uint64_t> capacity_floor_{0};
  void capacity_changed();  // mu_ held
  TtftStats ttft_stats_;
};

// RAII in-flight accounting for one dispatched request. Not thread-safe
// itself (owned by one request); the registry it updates is.
class InflightGuard {
 public:
  InflightGuard() = default;
  // `cached_blocks`, `resumed_blocks`: as InflightKv; `prompt` (optional):
  // the prompt's complete blocks, counted once per worker (InflightKv::chain).
  InflightGuard(WorkerRegistry& r, WorkerId id, uint64_t blocks, uint64_t prefill_tokens, uint64_t cached_blocks = 0,
                std::span<const LocalBlockHash> prompt = {}, uint64_t resumed_blocks = 0)
      : r_(&r),
        id_(id),
        kv_{blocks, std::min(cached_blocks, blocks), inflight_chain(prompt.first(std::min<size_t>(prompt.size(), blocks))),
            std::min(resumed_blocks, blocks), {}},
        prefill_(prefill_tokens) {
    sample_ = r.begin_request(id, kv_, prefill_tokens);
  }
  InflightGuard(WorkerRegistry& r, WorkerId id, InflightKv kv, uint64_t prefill_tokens)
      : r_(&r), id_(id), kv_(std::move(kv)), prefill_(prefill_tokens) {
    sample_ = r.begin_request(id, kv_, prefill_tokens);
  }
  InflightGuard(const InflightGuard&) = delete;
  InflightGuard& operator=(const InflightGuard&) = delete;
  ~InflightGuard() { release(); }
  // The worker answered: its prefill for this request is over.
  void first_byte() {
    if (r_ && prefilling_) r_->first_byte(id_, prefill_, &sample_);
    prefill_ = 0;
    prefilling_ = false;
  }
  // The same for an answer whose first byte is not its first token (a
  // response sent whole, after its generation): its prefill is over and its
  // prompt cached (parked KV at its end), but the time is not a TTFT.
  void answered() {
    if (r_ && prefilling_) r_->first_byte(id_, prefill_, nullptr);
    prefill_ = 0;
    prefilling_ = false;
  }
  void release() {
    if (r_) r_->end_request(id_, kv_, prefill_, prefilling_, sample_.start);  // one update for both
    prefill_ = 0;
    prefilling_ = false;
    r_ = nullptr;
  }
  // Released without the request having reached the worker (a slot claimed
  // for it that it did not use): no load report can have counted it.
  void withdraw() {
    sample_.start = {};
    release();
  }

 private:
  WorkerRegistry* r_ = nullptr;
  WorkerId id_;
  InflightKv kv_;
  uint64_t prefill_ = 0;
  bool prefilling_ = true;
  TtftSample sample_;
};

}  // namespace kvroute
