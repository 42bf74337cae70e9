#include "sim/pd_fleet.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <queue>
#include <random>

#include "common/prefix_cache.h"
#include "events/evictions.h"
#include "fleet/worker_registry.h"
#include "indexer/radix_indexer.h"
#include "mocker/engine.h"
#include "router/routing.h"
#include "scheduler/pd_decision.h"
#include "sim/policies.h"

namespace kvroute::sim {

const std::vector<std::string>& pd_policies() {
  static const std::vector<std::string> p = {"dynamo_pd", "llmd_pd", "kvroute_pd"};
  return p;
}

double kv_bytes_per_token(const PdOptions& o) {
  if (o.kv_bytes_per_token > 0) return o.kv_bytes_per_token;
  const mocker::EngineProfile* p = mocker::find_profile(o.sim.engine_profile);
  return p && p->kv_bytes_per_token > 0 ? p->kv_bytes_per_token : 131072.0;
}

std::vector<SimRequest> pd_workload(const std::string& name, uint64_t seed, size_t requests) {
  double median = 0, lo = 0, hi = 0, gap_scale = 0;
  if (name == "long_prompt") median = 40, lo = 8, hi = 256, gap_scale = 1;
  else if (name == "long_output") median = 900, lo = 200, hi = 4000, gap_scale = 4;
  else {
    std::fprintf(stderr, "kvroute-sim: unknown PD workload '%s' (trace, long_prompt, long_output)\n", name.c_str());
    std::exit(2);
  }
  auto w = api_workload(seed, requests);
  std::mt19937_64 rng(mix(seed ^ (name == "long_prompt" ? 0x9D01u : 0x9D02u)));
  std::lognormal_distribution<double> out(std::log(median), 0.6);
  for (auto& r : w) {
    r.output_tokens = static_cast<uint32_t>(std::clamp(out(rng), lo, hi));
    r.t_ms *= gap_scale;
  }
  return w;
}

namespace {

TimePoint at(double ms) {
  return TimePoint{} + std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(ms));
}

// kvroute_pd's configuration: the daemon's defaults, plus --set keys (pd.*, scheduler.*).
Config pd_config(const SimOptions& o) {
  Config cfg;
  cfg.indexer.block_size = kBlock;
  for (const auto& [k, v] : o.sets)
    if (auto e = set_key(cfg, k, v)) {
      std::fprintf(stderr, "kvroute-sim: --set %s\n", e->c_str());
      std::exit(2);
    }
  return cfg;
}

// The router's bookkeeping for one engine (what it sent there and has not
// seen finish), as every policy may use it.
struct Tracked {
  uint32_t requests = 0;
  uint64_t prefill_tokens = 0;  // uncached prompt tokens sent, first token not seen
};

struct Live {
  double arrival = 0, last_token = -1;
  bool disaggregate = false, started = false;
  uint32_t p = 0, d = 0;              // engine indices in the fleet
  uint64_t uncached = 0;              // on the engine computing the prompt, as the router predicted
  uint32_t computed_cached = 0;       // cached tokens where the prompt was computed
  std::vector<LocalBlockHash> hashes;  // while in flight
  // kvroute_pd: the router's in-flight accounting (fleet/worker_registry.h) per leg.
  std::unique_ptr<InflightGuard> prefill_guard, decode_guard;
};

class PdSimulation {
 public:
  PdSimulation(const std::vector<SimRequest>& w, const PdOptions& o, const std::string& policy)
      : w_(w), o_(o), policy_(policy), n_(o.prefill + o.decode), rng_(o.sim.seed), random_(o.sim.seed),
        registry_(clock_), config_(pd_config(o.sim)), routing_(index_, registry_, config_, random_), dynamo_(n_),
        tracked_(n_), scraped_(n_), link_free_(n_, 0.0), live_(w.size()) {
    registry_.set_parked_kv_seconds(config_.get()->scheduler.parked_kv_seconds);  // as the daemon's KnownWorkers
    registry_.set_eviction_seconds(config_.get()->scheduler.eviction_seconds);
    registry_.set_slot_wait_tokens(config_.get()->scheduler.slot_wait_tokens);
    ec_ = engine_config(o.sim);
    bytes_ = kv_bytes_per_token(o);
    for (uint32_t i = 0; i < n_; ++i) {
      mocker::EngineConfig ec = ec_;
      ec.owner = CacheOwner{WorkerId{i}, 0};
      engines_.push_back(std::make_unique<mocker::Engine>(ec, [this](const KvEvent& e) {
        index_.apply(e);
        hand_evictions(index_, registry_, removed_);
      }));
    }
  }

  PdResult run();

 private:
  bool is_prefill(uint32_t e) const { return e < o_.prefill; }
  void report();
  void dispatch(size_t id, double now);
  void on_engine(uint32_t e, double now);
  void start_transfer(size_t id, double now);
  void on_transfer(size_t id, double now);
  // kvroute_pd: decide_pd() over the registry's candidates with their roles; false = no decode worker.
  bool decide(const SimRequest& r, const std::vector<LocalBlockHash>& hashes, PdChoice& c);
  // Bookkeeping when a prompt is sent to engine e / its prefill is seen done there.
  void track_prefill(uint32_t e, const Live& l);
  void untrack_prefill(uint32_t e, const Live& l);
  PdEngineView view(uint32_t e, const OverlapScores& ov, const std::vector<LocalBlockHash>& h, bool partial) const;

  const std::vector<SimRequest>& w_;
  const PdOptions& o_;
  const std::string policy_;
  const uint32_t n_;
  mocker::EngineConfig ec_;
  double bytes_ = 0;
  std::mt19937_64 rng_;
  // kvroute_pd: the production registry (load reports + in-flight + TTFT
  // models), candidates from RoutingService, the decision from decide_pd().
  ManualClock clock_;
  SeededRandom random_;
  RadixIndexer index_;
  WorkerRegistry registry_;
  std::vector<std::pair<WorkerId, uint64_t>> removed_;  // hand_evictions' scratch
  ConfigStore config_;
  RoutingService routing_;
  RouteResult route_;
  DynamoActive dynamo_;
  std::vector<std::unique_ptr<mocker::Engine>> engines_;
  std::vector<Tracked> tracked_;
  std::vector<WorkerLoad> scraped_;
  std::vector<double> link_free_;  // per decode engine: when its ingress link is free
  std::vector<Live> live_;
  using Pending = std::pair<double, size_t>;  // transfer end, request
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> transfers_;
  std::vector<double> ttft_, itl_, e2e_;
  size_t rejected_ = 0, disaggregated_ = 0;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, moved_tokens_ = 0, disagg_prompt_tokens_ = 0;
  double transfer_ms_sum_ = 0;
};

void PdSimulation::report() {
  for (uint32_t i = 0; i < n_; ++i) {
    scraped_[i] = engines_[i]->load();
    WorkerAnnouncement a;
    a.id = WorkerId{i};
    a.url = "sim://" + std::to_string(i);
    a.model = "m";
    a.block_size = kBlock;
    const auto& l = scraped_[i];
    a.load = WorkerLoad{l.request_active_slots, l.request_total_slots, l.num_requests_waiting, l.kv_active_blocks,
                        l.kv_total_blocks};
    registry_.on_heartbeat(a);
  }
}

PdEngineView PdSimulation::view(uint32_t e, const OverlapScores& ov, const std::vector<LocalBlockHash>& h,
                                bool partial) const {
  PdEngineView v;
  for (const auto& o : ov.owners)
    if (o.owner.worker.value == e) v.overlap_blocks = o.blocks;
  const Tracked& t = tracked_[e];
  v.inflight_requests = t.requests;
  v.inflight_prefill_tokens = t.prefill_tokens;
  v.dynamo_active_blocks = dynamo_.potential(e, h, partial);
  v.scraped = scraped_[e];
  return v;
}

void PdSimulation::track_prefill(uint32_t e, const Live& l) { tracked_[e].prefill_tokens += l.uncached; }

void PdSimulation::untrack_prefill(uint32_t e, const Live& l) {
  Tracked& t = tracked_[e];
  t.prefill_tokens -= std::min(t.prefill_tokens, l.uncached);
}

bool PdSimulation::decide(const SimRequest& r, const std::vector<LocalBlockHash>& hashes, PdChoice& c) {
  routing_.route_blocks("m", r.input_tokens, hashes, true, route_);
  for (auto& cand : route_.candidates)
    cand.role = is_prefill(static_cast<uint32_t>(cand.owner.worker.value)) ? WorkerRole::Prefill : WorkerRole::Decode;
  PdRequest req;
  req.isl_tokens = r.input_tokens;
  req.block_size = kBlock;
  req.request_blocks = route_.request_blocks;  // the prompt's blocks, as the router counts them (routing.cpp)
  const auto cfg = config_.get();
  const PdDecision d = decide_pd(route_.candidates, req, cfg->scheduler, cfg->pd, random_);
  if (!d.decode) return false;
  const auto worker = [&](size_t i) { return static_cast<uint32_t>(route_.candidates[i].owner.worker.value); };
  c.decode = worker(*d.decode) - o_.prefill;
  c.disaggregate = d.disaggregate;
  if (d.disaggregate) c.prefill = worker(*d.prefill);
  return true;
}

void PdSimulation::dispatch(size_t id, double now) {
  clock_.set(at(now));
  const SimRequest& r = w_[id];
  Live& l = live_[id];
  l.arrival = now;
  const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(r.ids.size()), r.input_tokens / kBlock);
  for (uint32_t i = 0; i < full; ++i) l.hashes.push_back(LocalBlockHash{mix(r.ids[i])});
  const bool partial = r.input_tokens % kBlock != 0;
  const OverlapScores ov = index_.find_matches(l.hashes);
  PdInput in;
  in.prompt_tokens = r.input_tokens;
  in.request_blocks = full;
  in.block_size = kBlock;
  for (uint32_t e = 0; e < n_; ++e) (is_prefill(e) ? in.prefill : in.decode).push_back(view(e, ov, l.hashes, partial));
  PdChoice c;
  if (policy_ == "dynamo_pd") c = pd_dynamo(in, rng_);
  else if (policy_ == "llmd_pd") c = pd_llmd(in, rng_, o_.llmd_non_cached_tokens);
  else if (!decide(r, l.hashes, c)) {
    ++rejected_;  // no decode worker (every one busy under scheduler.reject_when_busy)
    l.hashes = {};
    return;
  }
  l.disaggregate = c.disaggregate;
  l.d = o_.prefill + static_cast<uint32_t>(c.decode);
  l.p = c.disaggregate ? static_cast<uint32_t>(c.prefill) : l.d;
  const PdEngineView& on = c.disaggregate ? in.prefill[c.prefill] : in.decode[c.decode];
  const uint64_t cached = static_cast<uint64_t>(cached_prefix_tokens(on.overlap_blocks, r.input_tokens, kBlock));
  l.uncached = r.input_tokens - cached;
  const uint32_t max_tokens = c.disaggregate ? 1 : r.output_tokens;
  if (!engines_[l.p]->add_request_hashed(id, r.input_tokens, l.hashes, max_tokens, now)) {
    ++rejected_;  // larger than an engine's whole cache
    l.hashes = {};
    return;
  }
  l.started = true;
  if (policy_ == "kvroute_pd") {  // the router's in-flight accounting for each leg it sends
    const uint64_t blocks = (uint64_t{r.input_tokens} + kBlock - 1) / kBlock;
    // What each shares with its worker's other in-flight requests, by scheduler.inflight_kv
    // (router/routing.h inflight_prompt()).
    const SchedulerConfig& sc = config_.get()->scheduler;
    const std::span<const LocalBlockHash> prompt = inflight_prompt(sc, l.hashes);
    l.prefill_guard = std::make_unique<InflightGuard>(registry_, WorkerId{l.p}, blocks, l.uncached,
                                                      inflight_shared_blocks(sc, on.overlap_blocks), prompt,
                                                      on.overlap_blocks);
    if (c.disaggregate) {
      const uint32_t held = in.decode[c.decode].overlap_blocks;
      l.decode_guard = std::make_unique<InflightGuard>(registry_, WorkerId{l.d}, blocks, 0,
                                                       inflight_shared_blocks(sc, held), prompt, held);
    }
  }
  track_prefill(l.p, l);
  tracked_[l.p].requests += 1;
  if (c.disaggregate) {
    ++disaggregated_;
    tracked_[l.d].requests += 1;  // the decode leg, as the router has committed it
  }
  dynamo_.add(l.d, l.hashes, partial);
}

void PdSimulation::start_transfer(size_t id, double now) {
  const SimRequest& r = w_[id];
  Live& l = live_[id];
  // The decode engine pulls only the blocks it does not hold (its cached prefix now).
  const OverlapScores ov = index_.find_matches(l.hashes);
  uint32_t held = 0;
  for (const auto& o : ov.owners)
    if (o.owner.worker.value == l.d) held = o.blocks;
  const uint64_t tokens = r.input_tokens - static_cast<uint64_t>(cached_prefix_tokens(held, r.input_tokens, kBlock));
  const double start = std::max(now, link_free_[l.d]);
  const double end = start + transfer_ms(tokens, bytes_, o_.link_gbps);
  link_free_[l.d] = end;
  moved_tokens_ += tokens;
  disagg_prompt_tokens_ += r.input_tokens;
  transfer_ms_sum_ += end - now;
  transfers_.push({end, id});
}

void PdSimulation::on_transfer(size_t id, double now) {
  const SimRequest& r = w_[id];
  Live& l = live_[id];
  if (!engines_[l.d]->add_request_hashed(id, r.input_tokens, l.hashes, r.output_tokens, now, true)) {
    ++rejected_;
    clock_.set(at(now));
    l.decode_guard.reset();
    tracked_[l.d].requests -= 1;
    dynamo_.remove(l.d, l.hashes, r.input_tokens % kBlock != 0);
    l.hashes = {};
  }
}

void PdSimulation::on_engine(uint32_t e, double now) {
  clock_.set(at(now));  // first_byte() times the TTFT model's observation
  for (const auto& out : engines_[e]->advance_to(now)) {
    const size_t id = out.request;
    Live& l = live_[id];
    const SimRequest& r = w_[id];
    const bool prefill_leg = l.disaggregate && e == l.p;
    if (out.kind == mocker::EngineOutput::Kind::FirstToken) {
      if (e == l.p) {  // the prompt was computed here
        if (l.prefill_guard) l.prefill_guard->first_byte();
        untrack_prefill(e, l);
        prompt_tokens_ += r.input_tokens;
        cached_tokens_ += out.cached_tokens;
      }
      if (prefill_leg) continue;
      ttft_.push_back(now - l.arrival);
      l.last_token = now;
    } else if (out.kind == mocker::EngineOutput::Kind::Token) {
      itl_.push_back(now - l.last_token);
      l.last_token = now;
    } else {  // Finished
      tracked_[e].requests -= 1;
      if (prefill_leg) {
        l.prefill_guard.reset();
        start_transfer(id, now);
        continue;
      }
      l.prefill_guard.reset();
      l.decode_guard.reset();
      e2e_.push_back(now - l.arrival);
      dynamo_.remove(e, l.hashes, r.input_tokens % kBlock != 0);
      l.hashes = {};
    }
  }
}

PdResult PdSimulation::run() {
  report();
  size_t next = 0;
  double last_report = 0;
  while (true) {
    const double t_arrival = next < w_.size() ? w_[next].t_ms / o_.sim.rate : 1e300;
    double t_engine = 1e300;
    uint32_t which = 0;
    for (uint32_t i = 0; i < n_; ++i)
      if (auto t = engines_[i]->next_event_time(); t && *t < t_engine) t_engine = *t, which = i;
    const double t_transfer = transfers_.empty() ? 1e300 : transfers_.top().first;
    if (t_arrival == 1e300 && t_engine == 1e300 && t_transfer == 1e300) break;
    const double t_report = last_report + o_.sim.report_ms;
    if (t_report < t_arrival && t_report < t_engine && t_report < t_transfer) {
      last_report = t_report;
      report();
    } else if (t_engine <= t_arrival && t_engine <= t_transfer) {
      on_engine(which, t_engine);
    } else if (t_transfer <= t_arrival) {
      const size_t id = transfers_.top().second;
      transfers_.pop();
      on_transfer(id, t_transfer);
    } else {
      dispatch(next++, t_arrival);
    }
  }
  PdResult res;
  res.policy = policy_;
  res.completed = e2e_.size();
  res.rejected = rejected_;
  res.disaggregated = disaggregated_;
  res.ttft_p50 = percentile(ttft_, 0.5);
  res.ttft_p99 = percentile(ttft_, 0.99);
  res.itl_p50 = percentile(itl_, 0.5);
  res.itl_p99 = percentile(itl_, 0.99);
  res.e2e_p50 = percentile(e2e_, 0.5);
  res.e2e_p99 = percentile(e2e_, 0.99);
  res.ttft_ms = ttft_;
  res.hit_rate = prompt_tokens_ ? double(cached_tokens_) / double(prompt_tokens_) : 0;
  res.transfer_ms_mean = disaggregated_ ? transfer_ms_sum_ / double(disaggregated_) : 0;
  res.transferred_share = disagg_prompt_tokens_ ? double(moved_tokens_) / double(disagg_prompt_tokens_) : 0;
  return res;
}

}  // namespace

PdResult simulate_pd(const std::vector<SimRequest>& w, const PdOptions& o, const std::string& policy) {
  if (o.prefill == 0 || o.decode == 0) {
    std::fprintf(stderr, "kvroute-sim: a PD fleet needs at least one prefill and one decode engine\n");
    std::exit(2);
  }
  if (std::find(pd_policies().begin(), pd_policies().end(), policy) == pd_policies().end()) {
    std::fprintf(stderr, "kvroute-sim: unknown PD policy '%s' (dynamo_pd, llmd_pd, kvroute_pd)\n",
                 policy.c_str());
    std::exit(2);
  }
  std::vector<SimRequest> storage;
  PdSimulation s(at_rate(w, o.sim.rate, storage), o, policy);
  return s.run();
}

}  // namespace kvroute::sim
