#include "router/status.h"

#include <fmt/format.h>
#include <pthread.h>

#include <cmath>
#include <ctime>
#include <map>

#include "common/json_escape.h"
#include "router/explain.h"

namespace kvroute {

namespace {

std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "null"; }

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void add_into(std::vector<uint64_t>& into, const std::vector<uint64_t>& v) {
  if (into.size() < v.size()) into.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) into[i] += v[i];
}

// The period's sample from two consecutive readings.
StatusSample delta(const StatusCounters& a, const StatusCounters& b, double unix_time, double seconds) {
  StatusSample s;
  s.unix_time = unix_time;
  s.seconds = seconds;
  auto d = [](uint64_t x, uint64_t y) { return y >= x ? y - x : 0; };  // a counter never goes back
  s.routed = d(a.routed, b.routed);
  s.prompt_tokens = d(a.prompt_tokens, b.prompt_tokens);
  s.cached_tokens = d(a.cached_tokens, b.cached_tokens);
  s.events = d(a.events, b.events);
  s.decision_buckets.resize(b.decision_buckets.size());
  for (size_t i = 0; i < b.decision_buckets.size(); ++i)
    s.decision_buckets[i] = d(i < a.decision_buckets.size() ? a.decision_buckets[i] : 0, b.decision_buckets[i]);
  s.index_blocks = b.index_blocks;
  s.index_entries = b.index_entries;
  s.workers = b.workers;
  s.inflight = b.inflight;
  return s;
}

// Rates and quantiles from the summed deltas.
void finish(StatusSample& s) {
  const double secs = s.seconds > 0 ? s.seconds : 1;
  s.requests_per_s = static_cast<double>(s.routed) / secs;
  s.events_per_s = static_cast<double>(s.events) / secs;
  s.hit_rate = s.prompt_tokens ? static_cast<double>(s.cached_tokens) / static_cast<double>(s.prompt_tokens) : NAN;
  s.decision_p50_us = histogram_quantile(decision_time_bounds(), s.decision_buckets, 0.50) * 1e6;
  s.decision_p99_us = histogram_quantile(decision_time_bounds(), s.decision_buckets, 0.99) * 1e6;
}

}  // namespace

const std::vector<double>& decision_time_bounds() {
  static const std::vector<double> bounds = metrics::exponential_buckets(1e-6, 2, 20);  // 1 us .. 0.5 s
  return bounds;
}

// ---- StatusHistory ----------------------------------------------------------

StatusHistory::StatusHistory(std::function<StatusCounters()> read, size_t capacity)
    : read_(std::move(read)), capacity_(capacity) {}

StatusHistory::~StatusHistory() { stop(); }

void StatusHistory::start(std::chrono::milliseconds period) {
  thread_ = std::thread([this, period] {
    pthread_setname_np(pthread_self(), "kvroute-status");
    std::unique_lock lk(mu_);
    auto next = std::chrono::steady_clock::now();
    while (!stop_) {
      lk.unlock();
      sample(unix_now());
      lk.lock();
      next += period;
      cv_.wait_until(lk, next, [this] { return stop_; });
    }
  });
}

void StatusHistory::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StatusHistory::sample(double unix_time) {
  StatusCounters now = read_();
  std::lock_guard lk(mu_);
  if (last_) {
    StatusSample s = delta(*last_, now, unix_time, unix_time - last_time_);
    finish(s);
    ring_.push_back(std::move(s));
    while (ring_.size() > capacity_) ring_.pop_front();
  }
  last_ = std::move(now);
  last_time_ = unix_time;
}

std::vector<StatusSample> StatusHistory::samples() const {
  std::lock_guard lk(mu_);
  return {ring_.begin(), ring_.end()};
}

StatusSample StatusHistory::window(size_t n) const {
  std::lock_guard lk(mu_);
  StatusSample w;
  const size_t from = ring_.size() > n ? ring_.size() - n : 0;
  for (size_t i = from; i < ring_.size(); ++i) {
    const auto& s = ring_[i];
    w.seconds += s.seconds;
    w.routed += s.routed;
    w.prompt_tokens += s.prompt_tokens;
    w.cached_tokens += s.cached_tokens;
    w.events += s.events;
    add_into(w.decision_buckets, s.decision_buckets);
    w.unix_time = s.unix_time;
    w.index_blocks = s.index_blocks;
    w.index_entries = s.index_entries;
    w.workers = s.workers;
    w.inflight = s.inflight;
  }
  finish(w);
  if (w.seconds == 0) w.requests_per_s = w.events_per_s = 0;
  return w;
}

std::string StatusHistory::json() const {
  const auto all = samples();
  std::string out = R"({"period_s":1,"capacity":)" + std::to_string(capacity_);
  auto series = [&](std::string_view name, auto get) {
    out += fmt::format(R"(,"{}":[)", name);
    for (size_t i = 0; i < all.size(); ++i) {
      if (i) out += ',';
      out += num(static_cast<double>(get(all[i])));
    }
    out += ']';
  };
  out += R"(,"t":[)";  // unix seconds to the millisecond (num()'s 6 digits would round them)
  for (size_t i = 0; i < all.size(); ++i) out += fmt::format("{}{:.3f}", i ? "," : "", all[i].unix_time);
  out += ']';
  series("requests_per_s", [](const StatusSample& s) { return s.requests_per_s; });
  series("hit_rate", [](const StatusSample& s) { return s.hit_rate; });
  series("decision_p50_us", [](const StatusSample& s) { return s.decision_p50_us; });
  series("decision_p99_us", [](const StatusSample& s) { return s.decision_p99_us; });
  series("events_per_s", [](const StatusSample& s) { return s.events_per_s; });
  series("index_entries", [](const StatusSample& s) { return s.index_entries; });
  series("index_blocks", [](const StatusSample& s) { return s.index_blocks; });
  series("workers", [](const StatusSample& s) { return s.workers; });
  series("inflight", [](const StatusSample& s) { return s.inflight; });
  return out + "}";
}

// ---- DecisionLog ------------------------------------------------------------

DecisionLog::DecisionLog(size_t capacity, std::chrono::milliseconds min_gap)
    : capacity_(capacity),
      min_gap_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(min_gap).count()),
      decision_time_(decision_time_bounds()) {}

void DecisionLog::on_routed(const ParsedRequest& request, const RouteResult& route, const SchedulerConfig& cfg,
                            uint32_t block_size) {
  routed_.inc();
  decision_time_.observe(route.stage_seconds[0] + route.stage_seconds[1] + route.stage_seconds[2] +
                         route.stage_seconds[3]);
  // A coarse clock (a few ns, no syscall): the gap needs no precision.
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const int64_t now = int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  int64_t due = next_keep_ns_.load(std::memory_order_relaxed);
  if (now < due || !next_keep_ns_.compare_exchange_strong(due, now + min_gap_ns_, std::memory_order_relaxed))
    return;  // kept one recently (or another thread keeps this one)
  if (!route.decision.chosen) return;
  const size_t ch = *route.decision.chosen;
  Entry e;
  e.unix_time = unix_now();
  const ExplainText text = explain_text(route, cfg, block_size);
  e.explain = explain_json(route, request.model, block_size, cfg, &text);
  const std::string& reason = text.choice;
  const double cached = route.decision.scores.empty() ? 0 : route.decision.scores[ch].cached_tokens;
  std::lock_guard lk(mu_);
  e.id = next_id_++;
  e.summary = fmt::format(
      R"({{"id":{},"unix_time":{:.3f},"model":"{}","isl_tokens":{},"tokenization":"{}","chosen":{},"cached_tokens":{:.0f},"reason":"{}"}})",
      e.id, e.unix_time, json_escape(request.model), route.isl_tokens, to_string(route.token_source),
      route.candidates[ch].owner.worker.value, cached, json_escape(reason));
  ring_.push_back(std::move(e));
  while (ring_.size() > capacity_) ring_.pop_front();
}

std::vector<uint64_t> DecisionLog::decision_buckets() const {
  std::vector<uint64_t> out(decision_time_.bounds().size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = decision_time_.bucket(i);
  return out;
}

std::string DecisionLog::list_json() const {
  std::lock_guard lk(mu_);
  std::string out = "[";
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it) {
    if (it != ring_.rbegin()) out += ',';
    out += it->summary;
  }
  return out + "]";
}

std::optional<std::string> DecisionLog::explain(uint64_t id) const {
  std::lock_guard lk(mu_);
  for (const auto& e : ring_)
    if (e.id == id) return e.explain;
  return std::nullopt;
}

// ---- StatusReport ------------------------------------------------------------

std::string_view worker_state(const WorkerView& w, bool partial_index, Nanos stale_after) {
  if (w.health == HealthState::Ejected) return "ejected";
  if (w.health == HealthState::Down) return "down";
  if (w.draining) return "draining";
  if (partial_index) return "partial_index";
  if (stale_after.count() >= 0 && w.load_age > stale_after) return "stale";
  return "ok";
}

std::string StatusReport::workers_json() const {
  std::map<WorkerId, uint64_t> entries;
  if (sources_.index_entries)
    for (const auto& [w, n] : sources_.index_entries()) entries[w] += n;
  std::string out = "[";
  bool first = true;
  for (const auto& w : registry_.all()) {
    const auto& info = *w.info;
    bool partial = false;
    if (sources_.partial_index)
      for (uint32_t r = 0; r < std::max<uint32_t>(info.dp_size, 1); ++r)
        partial = partial || sources_.partial_index(CacheOwner{info.id, r});
    const auto state = worker_state(w, partial, sources_.stale_after ? sources_.stale_after(info) : Nanos{-1});
    const auto [prompt, cached] = sources_.worker_tokens ? sources_.worker_tokens(info.id) : std::pair<uint64_t, uint64_t>{};
    auto usage = [](const WorkerLoad& l) {
      return l.kv_total_blocks ? static_cast<double>(l.kv_active_blocks) / static_cast<double>(l.kv_total_blocks)
                               : NAN;
    };
    if (!first) out += ',';
    first = false;
    out += fmt::format(
        R"({{"worker_id":{},"url":"{}","model":"{}","source":"{}","role":"{}","state":"{}","approximate":{},"draining":{},)"
        R"("kv_usage_reported":{},"kv_usage_predicted":{},"active_slots":{},"total_slots":{},"waiting":{},)"
        R"("inflight":{},"prompt_tokens":{},"cached_tokens":{},"hit_rate":{},"index_entries":{},"salt_blind":{}}})",
        info.id.value, json_escape(info.url), json_escape(info.model), to_string(info.source), to_string(info.role),
        state, info.approximate,
        w.draining, num(usage(info.load)), num(usage(w.predicted)), w.predicted.request_active_slots,
        w.predicted.request_total_slots, info.load.num_requests_waiting, w.inflight_requests, prompt, cached,
        num(prompt ? static_cast<double>(cached) / static_cast<double>(prompt) : NAN),
        entries.count(info.id) ? entries[info.id] : 0, sources_.salt_blind && sources_.salt_blind(info.id));
  }
  return out + "]";
}

std::string StatusReport::pd_json() const {
  uint64_t prefill = 0, decode = 0, both = 0;
  for (const auto& w : registry_.all()) {
    if (w.info->role == WorkerRole::Prefill) ++prefill;
    else if (w.info->role == WorkerRole::Decode) ++decode;
    else ++both;
  }
  if (prefill + decode == 0) return {};
  std::string out = fmt::format(R"({{"roles":{{"prefill":{},"decode":{},"both":{}}})", prefill, decode, both);
  if (sources_.pd_json) {
    const std::string counters = sources_.pd_json();  // an object: its members join "roles"
    if (counters.size() > 2) out.append(",").append(counters, 1, counters.size() - 2);
  }
  return out + "}";
}

std::string StatusReport::status_json(double unix_time) const {
  const StatusSample t = history_.window(10);
  const std::string pd = pd_json();
  return fmt::format(
      R"({{"unix_time":{:.3f},"totals":{{"window_s":{},"requests_per_s":{},"hit_rate":{},"decision_p50_us":{},)"
      R"("decision_p99_us":{},"events_per_s":{},"index_blocks":{},"index_entries":{},"workers":{},"inflight":{},)"
      R"("routed_total":{}}},"workers":{}{}{}{}}})",
      unix_time, num(t.seconds), num(t.requests_per_s), num(t.hit_rate), num(t.decision_p50_us),
      num(t.decision_p99_us), num(t.events_per_s), t.index_blocks, t.index_entries, t.workers, t.inflight,
      decisions_.routed(), workers_json(), sources_.flow_json ? R"(,"flow":)" + sources_.flow_json() : std::string(),
      sources_.pools_json ? R"(,"pools":)" + sources_.pools_json() : std::string(),
      pd.empty() ? std::string() : R"(,"pd":)" + pd);
}

}  // namespace kvroute
