#include "sim/simulate.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <queue>
#include <random>
#include <span>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "common/prefix_cache.h"
#include "events/evictions.h"
#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"
#include "mocker/engine.h"
#include "router/routing.h"
#include "router/session_affinity.h"
#include "sim/policies.h"

namespace kvroute::sim {

const std::vector<std::string>& known_policies() {
  static const std::vector<std::string> p = {"round_robin", "random",  "least_loaded",     "dynamo_v01",
                                             "dynamo",      "llmd",    "kvroute",          "kvroute_weighted",
                                             "oracle"};
  return p;
}

mocker::EngineConfig engine_config(const SimOptions& o) {
  mocker::EngineConfig ec;
  const mocker::EngineProfile* p = mocker::find_profile(o.engine_profile);
  assert(p);
  ec.profile = *p;
  ec.block_size = kBlock;
  ec.kv_blocks = o.kv_blocks ? o.kv_blocks : p->kv_blocks(kBlock) ? p->kv_blocks(kBlock) : kDefaultKvBlocks;
  ec.max_seqs = o.max_seqs;
  ec.max_batched_tokens = o.max_batched_tokens;
  return ec;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

namespace {

TimePoint at(double ms) {
  return TimePoint{} + std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(ms));
}

Config policy_config(const SimOptions& o, const std::string& policy, const SchedulerConfig* scheduler) {
  Config cfg;
  cfg.indexer.block_size = kBlock;
  if (policy == "kvroute" || policy == "kvroute_weighted")
    for (const auto& [k, v] : o.sets)
      if (auto e = set_key(cfg, k, v)) {
        std::fprintf(stderr, "kvroute-sim: --set %s\n", e->c_str());
        std::exit(2);
      }
  if (scheduler) cfg.scheduler = *scheduler;
  if (policy == "kvroute_weighted") cfg.scheduler.cost = "weighted";
  if (policy == "dynamo_v01") {  // the baseline weighted cost with its default weights (Dynamo v0.1)
    cfg.scheduler = SchedulerConfig{};
    cfg.scheduler.cost = "weighted";
    cfg.scheduler.pending_prefill_weight = 0;
    cfg.scheduler.pending_prefill_excess = false;
  }
  // Peers decide with their own formulas; the scheduler only collects
  // candidates for them, so nobody is excluded as busy there.
  if (policy == "dynamo" || policy == "llmd") cfg.scheduler.busy_slot_usage = cfg.scheduler.busy_kv_usage = 1.0;
  // The peers' overlap is their indexers' (KV events): a prefix in flight is
  // unknown to them, and to the baseline formula; nor do they lift a slot
  // test when the fleet is nearly full.
  if (policy != "kvroute" && policy != "kvroute_weighted") {
    cfg.scheduler.inflight_prefix_weight = 0;
    cfg.scheduler.busy_slot_fleet_usage = 1;
  }
  return cfg;
}

// Engine request ids with this bit set are tier loads' placeholders (enqueue).
constexpr uint64_t kLoaderBit = uint64_t{1} << 63;

// One simulated request in flight.
struct Live {
  double arrival = 0, first = -1, last_token = -1;
  uint32_t worker = 0, blocks = 0, cached = 0;
  std::unique_ptr<InflightGuard> guard;
};

class Simulation {
 public:
  Simulation(const std::vector<SimRequest>& w, const SimOptions& o, const std::string& policy,
             const SchedulerConfig* scheduler)
      : w_(w), o_(o), policy_(policy), random_(o.seed), rng_(o.seed), registry_(clock_),
        config_(policy_config(o, policy, scheduler)), routing_(index_, registry_, config_, random_),
        dynamo_(o.workers), live_(w.size()), per_worker_(o.workers, 0) {
    registry_.set_parked_kv_seconds(config_.get()->scheduler.parked_kv_seconds);  // as the daemon's KnownWorkers
    registry_.set_eviction_seconds(config_.get()->scheduler.eviction_seconds);
    registry_.set_slot_wait_tokens(config_.get()->scheduler.slot_wait_tokens);
    for (uint32_t i = 0; i < o.workers; ++i) {
      mocker::EngineConfig ec = engine_config(o);
      ec.owner = CacheOwner{WorkerId{i}, 0};
      engines_.push_back(std::make_unique<mocker::Engine>(ec, [this, i](const KvEvent& e) { on_device_event(i, e); }));
    }
    if (o.tiers.any()) init_tiers();
  }

  PolicyResult run(bool progress);

 private:
  void report(double now);
  // Advances engine `which` to `now`; true if a request finished there (its
  // slot is free).
  bool on_engine(uint32_t which, double now);
  // A request arrives: routed at once, or it waits in the router's queue.
  void arrive(size_t id, double now);
  // The router's wait queue (scheduler.queue_size > 0), as the daemon runs it
  // (router/http/admission.cpp wait_in_queue()): a request finding every
  // worker busy waits; each freed slot and each load report offers the head a
  // trial routing, heads routed in order until one finds every worker busy
  // again; a head past scheduler.queue_timeout_ms goes to the best busy
  // worker (reject_when_busy false) or is refused.
  void admit_waiting(double now);
  double next_queue_deadline() const;
  // The policy's pick for request `r`: the engine (its worker id) and, for the
  // policies that ask the router, the router's candidate for it (the index's
  // view of its cached prefix). nullopt: rejected.
  struct Pick {
    uint32_t worker = 0;
    const Candidate* candidate = nullptr;  // into route_; null for round_robin and random
    uint32_t held = 0;  // the candidate's cached prefix as the proxy claims it (route_target_of())
    uint32_t prefill = 0;  // the prefill the proxy counts there (RouteTarget::prefill_tokens)
    uint32_t resumed = 0;  // what it takes back from the parked KV (RouteTarget::resumed_blocks)
  };
  // nullopt with waits() true: every worker is busy and the request may wait
  // in the router's queue.
  std::optional<Pick> choose(const SimRequest& r, const std::vector<LocalBlockHash>& hashes, double now,
                             bool serve_busy = false);
  bool waits() const;
  // Sends request `id` where `pick` says (its arrival time already set);
  // `hashes`: prompt_hashes(id), as `pick` was chosen on.
  void dispatch(size_t id, const Pick& pick, std::vector<LocalBlockHash> hashes, double now);
  std::vector<LocalBlockHash> prompt_hashes(size_t id) const;
  // The oracle policy: the candidate whose engine, forked and run ahead with
  // nothing else arriving, gives `r` its first token soonest (ties: the
  // scheduler's own choice, then the lowest index).
  long oracle(const SimRequest& r, const std::vector<LocalBlockHash>& hashes, double now) const;
  long affinity(const SimRequest& r, long chosen);
  PolicyResult results() const;

  // Tiers below the device (SimOptions::tiers, sim/tiers.h). The index holds
  // one tier per worker and block (the latest stored wins, indexer/README.md),
  // so each worker's view is its best copy: device, else its host tier
  // (HostPinned), else the pool (External: a medium other than GPU, CPU or
  // DISK, as events/vllm_wire.cpp maps it). A block is announced in a tier
  // only while its parent is in the worker's view (the index refuses an
  // unknown parent); blocks moving together are announced root first.
  struct BlockMeta {
    uint64_t parent = 0;
    bool has_parent = false;
    LocalBlockHash local{0};
    uint32_t depth = 0;
    uint8_t category = 0;
    double last_ms = 0;
  };
  // A request whose prefix is being loaded from the tiers: enqueued at `at`.
  struct Load {
    double at = 0;
    size_t id = 0;
    uint32_t blocks = 0;  // the prompt prefix in the device once loaded
    bool operator>(const Load& o) const { return at > o.at || (at == o.at && id > o.id); }
  };
  void init_tiers();
  void on_device_event(uint32_t w, const KvEvent& e);
  // Demotes a block that the device of `w` (from_host false) or its host tier (true) evicted.
  void demote(uint32_t w, uint64_t h, bool from_host, double now, std::vector<std::pair<uint32_t, uint64_t>>& touched);
  void pool_put(uint64_t h, double now, std::vector<std::pair<uint32_t, uint64_t>>& touched);
  // Worker w has a host tier and it is written through (TierOptions::host_write_through).
  bool host_written_through(uint32_t w) const { return host_[w].capacity() > 0 && o_.tiers.host_write_through; }
  // Into worker w's host tier; what it evicts goes down to the pool.
  void host_put(uint32_t w, uint64_t h, double now, std::vector<std::pair<uint32_t, uint64_t>>& touched);
  // Brings worker w's index view of block h in line with where it is.
  void refresh(uint32_t w, uint64_t h);
  void refresh_all(std::vector<std::pair<uint32_t, uint64_t>>& touched);
  TierCache::Block tier_block(uint64_t h) const;
  // Enqueues request `id` on its engine, after a loader for its first
  // `loaded` blocks when any came from the tiers.
  void enqueue(size_t id, uint32_t loaded, double now);
  void on_pool_load(double now);

  std::unordered_map<uint64_t, BlockMeta> meta_;
  // Per worker: the tiers the index holds each block in, as a bit mask (a
  // block loaded from the host is on the device and the host at once).
  std::vector<std::unordered_map<uint64_t, uint8_t>> view_;
  std::vector<std::unordered_set<uint64_t>> device_;             // per worker: blocks its engine holds
  std::vector<TierCache> host_;
  std::unique_ptr<TierCache> pool_;
  std::vector<double> host_link_free_;
  std::unique_ptr<SharedBandwidth> pool_bw_;  // the pool's loads in flight
  // A request loading from the pool: when its host load ends (0: none), the
  // blocks it will hold, when it was dispatched.
  struct PoolLoad {
    double host_done = 0;
    uint32_t blocks = 0;
    double since = 0;
  };
  std::unordered_map<size_t, PoolLoad> pool_loads_;
  std::vector<uint8_t> categories_;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> loads_;
  double bytes_per_token_ = 0, now_ = 0, load_ms_sum_ = 0;
  std::array<uint64_t, kNumStorageTiers> routed_by_tier_{};
  uint64_t host_hits_ = 0, pool_hits_ = 0, dispatched_blocks_ = 0, loading_requests_ = 0;

  const std::vector<SimRequest>& w_;
  const SimOptions& o_;
  const std::string policy_;
  ManualClock clock_;
  SeededRandom random_;
  std::mt19937_64 rng_;
  RadixIndexer index_;
  WorkerRegistry registry_;
  std::vector<std::pair<WorkerId, uint64_t>> removed_;  // hand_evictions' scratch
  ConfigStore config_;
  RoutingService routing_;
  DynamoActive dynamo_;
  std::vector<std::unique_ptr<mocker::Engine>> engines_;
  std::vector<Live> live_;
  std::vector<std::vector<LocalBlockHash>> hashes_;  // per request, while in flight (dynamo's active blocks)
  SessionAffinity sessions_;  // scheduler.session_affinity, as the daemon applies it
  RouteResult route_;
  std::deque<size_t> waiting_;  // the router's queue, oldest first
  std::vector<double> ttft_, e2e_, itl_;
  std::vector<uint64_t> per_worker_;
  uint64_t out_tokens_ = 0, best_cached_ = 0, chosen_cached_ = 0;
  size_t rejected_ = 0, rr_ = 0, decisions_ = 0, uneven_ = 0;
  double end_time_ = 0;
};

void Simulation::report(double now) {
  clock_.set(at(now));
  for (uint32_t i = 0; i < o_.workers; ++i) {
    const auto l = engines_[i]->load();
    WorkerAnnouncement a;
    a.id = WorkerId{i};
    a.url = "sim://" + std::to_string(i);
    a.model = "m";
    a.block_size = kBlock;
    a.load = WorkerLoad{l.request_active_slots, l.request_total_slots, l.num_requests_waiting, l.kv_active_blocks,
                        l.kv_total_blocks};
    registry_.on_heartbeat(a);
  }
}

bool Simulation::on_engine(uint32_t which, double now) {
  clock_.set(at(now));  // first_byte() times the TTFT model's observation
  now_ = now;
  bool freed = false;
  for (const auto& out : engines_[which]->advance_to(now)) {
    if (out.request & kLoaderBit) continue;  // a tier load's placeholder (enqueue)
    Live& l = live_[out.request];
    const auto& r = w_[out.request];
    if (out.kind == mocker::EngineOutput::Kind::FirstToken) {
      l.first = l.last_token = now;
      l.cached = out.cached_tokens;
      ttft_.push_back(now - l.arrival);
      if (l.guard) l.guard->first_byte();
    } else if (out.kind == mocker::EngineOutput::Kind::Token) {
      itl_.push_back(now - l.last_token);
      l.last_token = now;
    } else if (out.kind == mocker::EngineOutput::Kind::Finished) {
      e2e_.push_back(now - l.arrival);
      out_tokens_ += r.output_tokens;
      end_time_ = std::max(end_time_, now);
      l.guard.reset();
      dynamo_.remove(l.worker, hashes_[out.request], r.input_tokens % kBlock != 0);
      hashes_[out.request] = {};
      freed = true;
    }
  }
  return freed;
}

std::optional<Simulation::Pick> Simulation::choose(const SimRequest& r, const std::vector<LocalBlockHash>& hashes,
                                                   double now, bool serve_busy) {
  if (policy_ == "round_robin") return Pick{static_cast<uint32_t>(rr_++ % o_.workers)};
  if (policy_ == "random") return Pick{static_cast<uint32_t>(rng_() % o_.workers)};
  routing_.route_blocks("m", r.input_tokens, hashes, true, route_);
  if (serve_busy && waits()) routing_.reroute("m", route_, false, /*serve_busy=*/true);
  if (route_.candidates.empty() || waits()) return std::nullopt;
  if (route_.ok) {  // the scheduler decided: did it read the KV load as uneven (alpha_imbalanced)?
    ++decisions_;
    uneven_ += load_uneven(route_.decision.load_std, route_.decision.load_mean, config_.get()->scheduler);
  }
  // Decision quality: the longest cached prefix among eligible workers.
  uint64_t best = 0;
  for (size_t i = 0; i < route_.candidates.size(); ++i)
    if (route_.decision.scores[i].excluded == Exclusion::None)
      best = std::max<uint64_t>(best, route_.candidates[i].overlap_blocks);
  best_cached_ += best;
  long pick = -1;
  if (policy_ == "least_loaded") pick = static_cast<long>(pick_least_loaded(route_.workers, rng_));
  else if (policy_ == "dynamo")
    pick = static_cast<long>(
        pick_dynamo(route_, dynamo_, hashes, r.input_tokens % kBlock != 0, r.input_tokens, kBlock, rng_));
  else if (policy_ == "llmd") pick = static_cast<long>(pick_llmd(route_, hashes.size(), rng_));
  else if (policy_ == "oracle") pick = oracle(r, hashes, now);
  else if (route_.ok) pick = affinity(r, static_cast<long>(*route_.decision.chosen));
  // Every policy below returns an index into route_.candidates (and its
  // parallel route_.workers), not a worker id.
  if (pick < 0) return std::nullopt;
  const Candidate& c = route_.candidates[static_cast<size_t>(pick)];
  chosen_cached_ += std::min<uint64_t>(best, c.overlap_blocks);
  for (int t = 0; t < kNumStorageTiers; ++t) routed_by_tier_[t] += c.overlap_by_tier[t];
  const RouteTarget t = route_target_of(route_, c, *route_.workers[static_cast<size_t>(pick)].info, kBlock);
  return Pick{static_cast<uint32_t>(c.owner.worker.value), &c, t.cached_blocks, t.prefill_tokens, t.resumed_blocks};
}

long Simulation::oracle(const SimRequest& r, const std::vector<LocalBlockHash>& hashes, double now) const {
  constexpr uint64_t kProbe = kLoaderBit >> 1;  // no workload request has this id
  std::vector<size_t> order;
  if (route_.ok) order.push_back(*route_.decision.chosen);
  for (size_t i = 0; i < route_.candidates.size(); ++i)
    if (order.empty() || i != order.front()) order.push_back(i);
  long best = -1;
  double best_ms = std::numeric_limits<double>::infinity();
  for (const size_t i : order) {
    mocker::Engine e = engines_[route_.candidates[i].owner.worker.value]->fork();
    if (!e.add_request_hashed(kProbe, r.input_tokens, hashes, r.output_tokens, now)) continue;
    // Run it ahead step by step, abandoning it once it cannot beat the best.
    for (std::optional<double> t = e.next_event_time(); t && *t < best_ms; t = e.next_event_time()) {
      bool first = false;
      for (const auto& out : e.advance_to(*t))
        first |= out.request == kProbe && out.kind == mocker::EngineOutput::Kind::FirstToken;
      if (first) {
        best = static_cast<long>(i);
        best_ms = *t;
        break;
      }
    }
  }
  return best;
}

// Session affinity (scheduler.session_affinity): router/session_affinity.h,
// the daemon's own code, keyed by the request's session id.
long Simulation::affinity(const SimRequest& r, long chosen) {
  if (r.session == 0 || !config_.get()->scheduler.session_affinity) return chosen;
  sessions_.apply(std::to_string(r.session), kBlock, route_);
  return static_cast<long>(*route_.decision.chosen);
}

std::vector<LocalBlockHash> Simulation::prompt_hashes(size_t id) const {
  const auto& r = w_[id];
  std::vector<LocalBlockHash> hashes;
  const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(r.ids.size()), r.input_tokens / kBlock);
  for (uint32_t i = 0; i < full; ++i) hashes.push_back(LocalBlockHash{mix(r.ids[i])});
  return hashes;
}

// The route found every worker busy and the request may wait for one: only
// the router's own policies have its queue (the peers' formulas always pick).
bool Simulation::waits() const {
  return !route_.ok && may_queue(route_.failure) && config_.get()->scheduler.queue_size > 0 &&
         (policy_ == "kvroute" || policy_ == "kvroute_weighted");
}

// As the daemon's admission (router/http/admission.cpp): routed first, and
// queued only when that finds every worker busy.
void Simulation::arrive(size_t id, double now) {
  live_[id].arrival = now;
  clock_.set(at(now));
  std::vector<LocalBlockHash> hashes = prompt_hashes(id);
  const std::optional<Pick> pick = choose(w_[id], hashes, now);
  if (pick) return dispatch(id, *pick, std::move(hashes), now);
  if (waits() && waiting_.size() < config_.get()->scheduler.queue_size) waiting_.push_back(id);
  else ++rejected_;  // 429 (the queue is full), 503 (every worker busy under reject_when_busy, or drained) or 400 (too large)
}

double Simulation::next_queue_deadline() const {
  return waiting_.empty() ? 1e300 : live_[waiting_.front()].arrival + config_.get()->scheduler.queue_timeout_ms;
}

void Simulation::admit_waiting(double now) {
  clock_.set(at(now));
  while (!waiting_.empty()) {
    const size_t id = waiting_.front();
    const bool timed_out = now >= next_queue_deadline();
    const bool serve_busy = timed_out && !config_.get()->scheduler.reject_when_busy;
    std::vector<LocalBlockHash> hashes = prompt_hashes(id);
    const std::optional<Pick> pick = choose(w_[id], hashes, now, serve_busy);
    if (!pick && waits() && !timed_out) return;  // every worker is still busy: it keeps its place
    waiting_.pop_front();
    if (pick) dispatch(id, *pick, std::move(hashes), now);
    else ++rejected_;  // its deadline passed (reject_when_busy), or it cannot be served
  }
}

void Simulation::dispatch(size_t id, const Pick& pick, std::vector<LocalBlockHash> hashes, double now) {
  const auto& r = w_[id];
  const uint32_t full = static_cast<uint32_t>(hashes.size());
  const uint32_t w = pick.worker;
  Live& l = live_[id];
  l.worker = w;
  l.blocks = full;
  // The router's in-flight accounting, with the chosen worker's overlap as the proxy claims it.
  const uint32_t held = pick.held;
  const SchedulerConfig& sc = config_.get()->scheduler;
  l.guard = std::make_unique<InflightGuard>(registry_, WorkerId{w}, (uint64_t{r.input_tokens} + kBlock - 1) / kBlock,
                                            pick.candidate ? pick.prefill : r.input_tokens, inflight_shared_blocks(sc, held),
                                            inflight_prompt(sc, hashes), pick.resumed);
  if (o_.tiers.any()) {
    now_ = now;
    if (engines_[w]->blocks_needed(r.input_tokens, r.output_tokens) > engines_[w]->config().kv_blocks) {
      ++rejected_;  // larger than a worker's whole cache
      l.guard.reset();
      return;
    }
    // The prompt's blocks: their chain, category and last use.
    const std::vector<SequenceHash> seq = sequence_hashes(std::span(hashes).first(full));
    for (uint32_t i = 0; i < full; ++i) {
      auto [it, fresh] = meta_.try_emplace(seq[i].value);
      if (fresh) {
        it->second.parent = i ? seq[i - 1].value : 0;
        it->second.has_parent = i > 0;
        it->second.local = hashes[i];
        it->second.depth = i;
      }
      it->second.category = categories_[id];
      it->second.last_ms = now;
    }
    // The device's prefix, then what the host tier and the pool continue it with.
    const uint32_t on_device = engines_[w]->cached_prefix(seq);
    uint32_t from_host = 0, from_pool = 0, k = on_device;
    for (; k < full; ++k) {
      if (host_[w].contains(seq[k].value)) {
        ++from_host;
        host_[w].touch(seq[k].value, now, categories_[id]);
      } else if (pool_ && pool_->contains(seq[k].value)) {
        ++from_pool;
        pool_->touch(seq[k].value, now, categories_[id]);
      } else {
        break;
      }
    }
    dispatched_blocks_ += full;
    host_hits_ += from_host;
    pool_hits_ += from_pool;
    dynamo_.add(w, hashes, r.input_tokens % kBlock != 0);
    hashes_[id] = std::move(hashes);
    per_worker_[w]++;
    if (from_host + from_pool == 0) {
      enqueue(id, 0, now);
      return;
    }
    // Each worker's host link carries one load at a time; the pool's loads
    // share its bandwidth (pool_bw_), each worker's one at a time.
    double done = now;
    if (from_host) {
      host_link_free_[w] = std::max(now, host_link_free_[w]) +
                           load_ms(uint64_t{from_host} * kBlock, bytes_per_token_, o_.tiers.host_gb_per_s);
      done = std::max(done, host_link_free_[w]);
    }
    ++loading_requests_;
    if (from_pool) {
      pool_loads_[id] = PoolLoad{done, k, now};
      pool_bw_->start(w, id, double(uint64_t{from_pool} * kBlock) * bytes_per_token_, now);
      return;  // on_pool_load() when it ends
    }
    load_ms_sum_ += done - now;
    loads_.push(Load{done, id, k});
    return;
  }
  if (!engines_[w]->add_request_hashed(id, r.input_tokens, hashes, r.output_tokens, now)) {
    ++rejected_;  // larger than a worker's whole cache
    l.guard.reset();
    return;
  }
  dynamo_.add(w, hashes, r.input_tokens % kBlock != 0);
  hashes_[id] = std::move(hashes);
  per_worker_[w]++;
}

// A pool load ended: the request waits for its host load, if any, then enters its engine.
void Simulation::on_pool_load(double now) {
  const size_t id = pool_bw_->finish(now);
  const auto it = pool_loads_.find(id);
  const PoolLoad pl = it->second;
  pool_loads_.erase(it);
  const double done = std::max(now, pl.host_done);
  load_ms_sum_ += done - pl.since;
  loads_.push(Load{done, id, pl.blocks});
}

void Simulation::enqueue(size_t id, uint32_t loaded, double now) {
  now_ = now;
  const auto& r = w_[id];
  const uint32_t w = live_[id].worker;
  const std::vector<LocalBlockHash>& hashes = hashes_[id];
  // The loaded prefix arrives as a placeholder request whose KV is
  // transferred (every prompt token but its extra last one counts as computed
  // at admission, announced stored) and which the request right behind it in
  // the FIFO queue finds cached: the engine charges the request's prefill for
  // the rest of its prompt only, as vLLM does once a connector has loaded the
  // prefix (the placeholder adds one token to that step).
  if (loaded)
    engines_[w]->add_request_hashed(id | kLoaderBit, loaded * kBlock + 1,
                                    std::span<const LocalBlockHash>(hashes).first(loaded), 1, now, true);
  const bool ok = engines_[w]->add_request_hashed(id, r.input_tokens, hashes, r.output_tokens, now);
  assert(ok);  // its size was checked at dispatch
  (void)ok;
}

void Simulation::init_tiers() {
  const TierOptions& t = o_.tiers;
  view_.resize(o_.workers);
  device_.resize(o_.workers);
  for (uint32_t i = 0; i < o_.workers; ++i) host_.emplace_back(t.host_blocks, t.eviction, &t.profiles);
  if (t.pool_blocks) pool_ = std::make_unique<TierCache>(t.pool_blocks, t.eviction, &t.profiles);
  host_link_free_.assign(o_.workers, 0);
  // GB/s = 10^6 bytes per ms.
  const double link = t.pool_gb_per_s * 1e6, total = (t.pool_total_gb_per_s > 0 ? t.pool_total_gb_per_s : t.pool_gb_per_s) * 1e6;
  pool_bw_ = std::make_unique<SharedBandwidth>(total, link, o_.workers);
  categories_ = request_categories(w_);
  const mocker::EngineProfile* p = mocker::find_profile(o_.engine_profile);
  bytes_per_token_ = t.kv_bytes_per_token > 0                  ? t.kv_bytes_per_token
                     : p && p->kv_bytes_per_token > 0 ? p->kv_bytes_per_token
                                                      : 131072.0;
}

TierCache::Block Simulation::tier_block(uint64_t h) const {
  const BlockMeta& m = meta_.at(h);
  return TierCache::Block{h, m.category, m.depth, m.last_ms};
}

void Simulation::on_device_event(uint32_t w, const KvEvent& e) {
  if (!o_.tiers.any()) {
    index_.apply(e);
    hand_evictions(index_, registry_, removed_);
    return;
  }
  if (const auto* st = std::get_if<KvStored>(&e.data)) {
    for (const auto& b : st->blocks) {
      device_[w].insert(b.block_hash.value);
      view_[w][b.block_hash.value] |= tier_bit(StorageTier::Device);
    }
    index_.apply(e);
    std::vector<std::pair<uint32_t, uint64_t>> touched;
    for (const auto& b : st->blocks) {
      if (host_written_through(w)) host_put(w, b.block_hash.value, now_, touched);
      if (pool_ && o_.tiers.pool_write_through) pool_put(b.block_hash.value, now_, touched);
    }
    refresh_all(touched);
    return;
  }
  const auto* rm = std::get_if<KvRemoved>(&e.data);
  if (!rm) return;  // the engines never clear
  std::vector<std::pair<uint32_t, uint64_t>> touched;
  for (SequenceHash h : rm->block_hashes) {
    device_[w].erase(h.value);
    // Written through, the host already holds what it kept of the block.
    if (host_written_through(w)) touched.emplace_back(w, h.value);
    else demote(w, h.value, false, now_, touched);
  }
  refresh_all(touched);
}

void Simulation::host_put(uint32_t w, uint64_t h, double now, std::vector<std::pair<uint32_t, uint64_t>>& touched) {
  touched.emplace_back(w, h);
  std::vector<TierCache::Block> evicted;
  host_[w].put(tier_block(h), now, evicted);
  for (const auto& v : evicted) demote(w, v.hash, true, now, touched);
}

void Simulation::demote(uint32_t w, uint64_t h, bool from_host, double now,
                        std::vector<std::pair<uint32_t, uint64_t>>& touched) {
  touched.emplace_back(w, h);
  if (!from_host && host_[w].capacity() > 0) {
    host_put(w, h, now, touched);
    return;
  }
  pool_put(h, now, touched);
}

void Simulation::pool_put(uint64_t h, double now, std::vector<std::pair<uint32_t, uint64_t>>& touched) {
  if (!pool_) return;
  std::vector<TierCache::Block> evicted;
  pool_->put(tier_block(h), now, evicted);
  for (uint32_t v = 0; v < o_.workers; ++v) {
    touched.emplace_back(v, h);
    for (const auto& e : evicted) touched.emplace_back(v, e.hash);
  }
}

void Simulation::refresh_all(std::vector<std::pair<uint32_t, uint64_t>>& touched) {
  // Root first, so that a parent is in a worker's view before its child.
  std::sort(touched.begin(), touched.end(), [this](const auto& a, const auto& b) {
    const uint32_t da = meta_.at(a.second).depth, db = meta_.at(b.second).depth;
    return std::tie(da, a.first, a.second) < std::tie(db, b.first, b.second);
  });
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (const auto& [w, h] : touched) refresh(w, h);
}

void Simulation::refresh(uint32_t w, uint64_t h) {
  uint8_t want = 0;
  if (device_[w].count(h)) want |= tier_bit(StorageTier::Device);
  if (host_[w].contains(h)) want |= tier_bit(StorageTier::HostPinned);
  if (pool_ && pool_->contains(h)) want |= tier_bit(StorageTier::External);
  auto& view = view_[w];
  const auto cur_it = view.find(h);
  const uint8_t cur = cur_it == view.end() ? 0 : cur_it->second;
  const BlockMeta& m = meta_.at(h);
  if (want && m.has_parent && !view.count(m.parent)) want = 0;  // the index would refuse it
  if (want == cur) return;
  // As an engine announces its copies: the new tiers first, then the
  // removals from the tiers it left, so a block with a copy never leaves.
  KvEvent ev;
  ev.owner = CacheOwner{WorkerId{w}, 0};
  for (uint8_t bits = want & ~cur; bits; bits &= bits - 1) {
    KvStored st;
    if (m.has_parent) st.parent = SequenceHash{m.parent};
    st.blocks.push_back({SequenceHash{h}, m.local});
    ev.tier = best_tier(bits);
    ev.data = std::move(st);
    index_.apply(ev);
  }
  for (uint8_t bits = cur & ~want; bits; bits &= bits - 1) {
    ev.tier = best_tier(bits);
    ev.data = KvRemoved{{SequenceHash{h}}};
    index_.apply(ev);
  }
  if (want) view[h] = want;
  else view.erase(h);
  hand_evictions(index_, registry_, removed_);
}

PolicyResult Simulation::run(bool progress) {
  hashes_.resize(w_.size());
  report(0);
  size_t next = 0;
  double last_report = 0;
  const size_t step = std::max<size_t>(1, w_.size() / 10);
  while (true) {
    // Next event: an arrival, an engine step end, or a load report.
    const double t_arrival = next < w_.size() ? w_[next].t_ms / o_.rate : 1e300;
    double t_engine = 1e300;
    uint32_t which = 0;
    for (uint32_t i = 0; i < o_.workers; ++i)
      if (auto t = engines_[i]->next_event_time(); t && *t < t_engine) t_engine = *t, which = i;
    const double t_pool = pool_bw_ ? pool_bw_->next_done() : 1e300;  // a pool load ending
    const double t_load = std::min(loads_.empty() ? 1e300 : loads_.top().at, t_pool);  // a tier load completing
    const double t_queue = next_queue_deadline();  // the queue's head timing out
    if (t_arrival == 1e300 && t_engine == 1e300 && t_load == 1e300 && t_queue == 1e300) break;
    const double t_report = last_report + o_.report_ms;
    if (t_queue < t_arrival && t_queue < t_engine && t_queue < t_load && t_queue <= t_report) {
      admit_waiting(t_queue);
    } else if (t_report < t_arrival && t_report < t_engine && t_report < t_load) {
      report(last_report = t_report);
      admit_waiting(t_report);
    } else if (t_engine <= t_arrival && t_engine <= t_load) {
      if (on_engine(which, t_engine)) admit_waiting(t_engine);
    } else if (t_load <= t_arrival && t_pool == t_load) {
      on_pool_load(t_pool);
    } else if (t_load <= t_arrival) {
      const Load ld = loads_.top();
      loads_.pop();
      clock_.set(at(ld.at));
      enqueue(ld.id, ld.blocks, ld.at);
    } else {
      if (progress && next % step == 0) std::fprintf(stderr, "\r  %-16s %3zu%%", policy_.c_str(), next * 100 / w_.size());
      arrive(next++, t_arrival);
    }
  }
  if (progress) std::fprintf(stderr, "\r  %-16s 100%%\n", policy_.c_str());
  return results();
}

PolicyResult Simulation::results() const {
  uint64_t prompt_blocks = 0, hit_blocks = 0;
  for (const auto& l : live_) {
    if (l.first < 0) continue;
    prompt_blocks += l.blocks;
    hit_blocks += std::min<uint64_t>(l.cached / kBlock, l.blocks);
  }
  PolicyResult res;
  res.policy = policy_;
  res.completed = e2e_.size();
  res.rejected = rejected_;
  res.decisions = decisions_;
  res.uneven_decisions = uneven_;
  res.hit_rate = prompt_blocks ? double(hit_blocks) / double(prompt_blocks) : 0;
  if (dispatched_blocks_) {
    res.host_hit_rate = double(host_hits_) / double(dispatched_blocks_);
    res.pool_hit_rate = double(pool_hits_) / double(dispatched_blocks_);
  }
  res.routed_overlap_by_tier = routed_by_tier_;
  res.load_ms_mean = loading_requests_ ? load_ms_sum_ / double(loading_requests_) : 0;
  res.ttft_p50 = percentile(ttft_, 0.5);
  res.ttft_p90 = percentile(ttft_, 0.9);
  res.ttft_p99 = percentile(ttft_, 0.99);
  res.e2e_p50 = percentile(e2e_, 0.5);
  res.e2e_p99 = percentile(e2e_, 0.99);
  res.itl_p50 = percentile(itl_, 0.5);
  res.itl_p99 = percentile(itl_, 0.99);
  res.ttft_ms = ttft_;
  for (size_t i = 0; i < live_.size(); ++i)
    if (live_[i].first >= 0)
      res.requests.push_back({i, live_[i].arrival, live_[i].first - live_[i].arrival,
                              live_[i].last_token - live_[i].arrival, live_[i].worker,
                              live_[i].cached, live_[i].blocks, w_[i].session});
  res.ttft_mape = registry_.ttft_stats().mape();
  res.cache_gap = best_cached_ ? 1.0 - double(chosen_cached_) / double(best_cached_) : 0;
  res.throughput_tok_s = end_time_ > 0 ? double(out_tokens_) / (end_time_ / 1000.0) : 0;
  const double mean = double(std::accumulate(per_worker_.begin(), per_worker_.end(), uint64_t{0})) / o_.workers;
  res.imbalance = mean > 0 ? double(*std::max_element(per_worker_.begin(), per_worker_.end())) / mean : 0;
  return res;
}

}  // namespace

PolicyResult simulate(const std::vector<SimRequest>& w, const SimOptions& o, const std::string& policy,
                      const SchedulerConfig* scheduler, bool progress) {
  std::vector<SimRequest> storage;
  Simulation s(at_rate(w, o.rate, storage), o, policy, scheduler);
  return s.run(progress);
}

}  // namespace kvroute::sim
