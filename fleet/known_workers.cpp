#include "fleet/known_workers.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <map>
#include <set>

#include "common/log.h"
#include "fleet/dns_resolver.h"
#include "fleet/scraper.h"

namespace kvroute {

namespace asio = boost::asio;

namespace {

// "tcp://host:5557" -> "tcp://host:5557" with the port replaced (DNS records).
std::string zmq_endpoint(const std::string& addr, uint32_t port) {
  if (port == 0) return {};
  const bool v6 = addr.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + addr + "]" : addr) + ":" + std::to_string(port);
}

std::string http_authority(const std::string& addr, uint32_t port) {
  const bool v6 = addr.find(':') != std::string::npos;
  return (v6 ? "[" + addr + "]" : addr) + ":" + std::to_string(port);
}

// What the router knows of one worker, plus how to scrape it.
struct Desired {
  WorkerAnnouncement info;
  uint32_t max_seqs = 256;
  uint64_t kv_blocks = 0;
};

Desired from_entry(const WorkerEntry& e, WorkerSource src) {
  Desired d;
  d.info.id = WorkerId{e.id};
  d.info.source = src;
  d.info.url = e.url;
  d.info.model = e.model;
  d.info.dp_size = e.dp_size;
  d.info.metrics_url = e.metrics == "none" ? "" : e.metrics;
  d.info.kv_events = e.kv_events;
  d.info.replay = e.replay;
  d.info.lora_adapters = e.lora;
  parse_worker_role(e.role, d.info.role);  // validated by parse_worker_entries()
  d.info.bootstrap_port = e.bootstrap_port;
  d.info.load.request_total_slots = e.max_seqs;
  d.info.load.kv_total_blocks = e.kv_blocks;
  d.max_seqs = e.max_seqs;
  d.kv_blocks = e.kv_blocks;
  return d;
}

Desired from_dns(const DnsEntry& e, const std::string& addr) {
  WorkerEntry w;
  w.url = e.scheme + "://" + http_authority(addr, e.port);
  w.model = e.model;
  w.metrics = e.metrics_path == "none" ? "none" : w.url + e.metrics_path;
  w.kv_events = zmq_endpoint(addr, e.kv_events_port);
  w.replay = zmq_endpoint(addr, e.replay_port);
  w.dp_size = e.dp_size;
  w.max_seqs = e.max_seqs;
  w.kv_blocks = e.kv_blocks;
  w.lora = e.lora;
  w.role = e.role;
  w.bootstrap_port = e.bootstrap_port;
  w.id = worker_id_for_url(w.url);
  return from_entry(w, WorkerSource::Dns);
}

bool same_endpoints(const WorkerAnnouncement& a, const WorkerAnnouncement& b) {
  return a.kv_events == b.kv_events && a.replay == b.replay && a.dp_size == b.dp_size && a.url == b.url;
}

}  // namespace

struct KnownWorkers::Impl {
  Impl(WorkerRegistry& r, uint32_t bs, KnownWorkerHooks h, KnownWorkerStats& st)
      : registry(r), block_size(bs), hooks(std::move(h)), stats(st), work(asio::make_work_guard(ioc)),
        scraper(ioc, r, [this](WorkerId id) { on_recovered(id); }) {}

  WorkerRegistry& registry;
  const uint32_t block_size;
  KnownWorkerHooks hooks;
  KnownWorkerStats& stats;
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  Scraper scraper;
  std::thread fleet_thread, dns_thread;

  // The kvroute-fleet thread only.
  std::vector<WorkerEntry> statics;
  std::vector<DnsEntry> dns_entries;
  std::vector<std::vector<std::string>> dns_addrs;  // parallel to dns_entries; last answer
  std::map<uint64_t, WorkerEntry> admin_added;
  std::set<uint64_t> admin_removed;
  std::map<uint64_t, Desired> current;
  std::chrono::milliseconds scrape_interval{250}, scrape_timeout{1000};

  // Shared with the DNS thread.
  std::mutex dns_mu;
  std::condition_variable dns_cv;
  std::vector<DnsEntry> dns_todo;
  std::string dns_servers;
  std::chrono::milliseconds dns_interval{5000};
  uint64_t dns_generation = 0;  // bumped by every config change: resolve at once
  bool stopping = false;

  void reconcile();
  void on_recovered(WorkerId id) {
    auto it = current.find(id.value);
    if (it != current.end() && hooks.recovered) hooks.recovered(it->second.info);
  }
  void on_dns_answer(uint64_t generation, size_t index, std::vector<std::string> addrs);
  void dns_loop();
  void apply(const Config& cfg);
};

void KnownWorkers::Impl::reconcile() {
  std::map<uint64_t, Desired> next;
  auto put = [&](Desired d) {
    if (admin_removed.count(d.info.id.value)) return;
    next.try_emplace(d.info.id.value, std::move(d));  // first source wins: static, then DNS, then admin
  };
  for (const auto& e : statics) put(from_entry(e, WorkerSource::Static));
  for (size_t i = 0; i < dns_entries.size() && i < dns_addrs.size(); ++i)
    for (const auto& a : dns_addrs[i]) put(from_dns(dns_entries[i], a));
  for (const auto& [id, e] : admin_added) put(from_entry(e, WorkerSource::Admin));

  for (auto& [id, d] : current) {
    if (next.count(id)) continue;
    registry.remove(d.info.id);
    stats.workers_removed.fetch_add(1, std::memory_order_relaxed);
    spdlog::info("worker {} ({}) left the fleet", id, d.info.url);
    if (hooks.removed) hooks.removed(d.info.id);
  }
  std::vector<ScrapeTarget> targets;
  for (auto& [id, d] : next) {
    auto it = current.find(id);
    const bool is_new = it == current.end();
    const bool moved = !is_new && !same_endpoints(it->second.info, d.info);
    registry.upsert(d.info);
    if (moved && hooks.removed) hooks.removed(d.info.id);
    if (is_new || moved) {
      if (is_new) stats.workers_added.fetch_add(1, std::memory_order_relaxed);
      spdlog::info("worker {} joined ({}): {} model '{}'{}", id, to_string(d.info.source), d.info.url, d.info.model,
                   d.info.kv_events.empty() ? "" : ", KV events " + d.info.kv_events);
      if (hooks.added) hooks.added(d.info);
    }
    if (!d.info.metrics_url.empty())
      targets.push_back(ScrapeTarget{d.info.id, d.info.metrics_url, block_size, d.max_seqs, d.kv_blocks});
  }
  current = std::move(next);
  scraper.set_timing(scrape_interval, scrape_timeout);
  scraper.set_targets(targets);
}

void KnownWorkers::Impl::apply(const Config& cfg) {
  std::vector<WorkerEntry> st;
  std::vector<DnsEntry> dns;
  // Validated by the caller; a bad list here keeps the old one.
  if (auto e = parse_worker_entries(cfg.workers.static_list, st)) {
    spdlog::error("workers.static not applied: {}", *e);
    st = statics;
  }
  if (auto e = parse_dns_entries(cfg.discovery.dns, dns)) {
    spdlog::error("discovery.dns not applied: {}", *e);
    dns = dns_entries;
  }
  registry.set_health_policy(
      HealthPolicy{cfg.workers.eject_after_failures, cfg.workers.eject_base_ms, cfg.workers.eject_max_ms});
  registry.set_parked_kv_seconds(cfg.scheduler.parked_kv_seconds);
  registry.set_eviction_seconds(cfg.scheduler.eviction_seconds);
  registry.set_slot_wait_tokens(cfg.scheduler.slot_wait_tokens);
  scrape_interval = std::chrono::milliseconds(cfg.workers.scrape_interval_ms);
  scrape_timeout = std::chrono::milliseconds(cfg.workers.scrape_timeout_ms);
  statics = std::move(st);
  if (dns.size() != dns_entries.size() || !std::equal(dns.begin(), dns.end(), dns_entries.begin(), [](auto& a, auto& b) {
        return a.host == b.host && a.port == b.port && a.model == b.model && a.kv_events_port == b.kv_events_port &&
               a.replay_port == b.replay_port && a.metrics_path == b.metrics_path && a.dp_size == b.dp_size &&
               a.scheme == b.scheme && a.max_seqs == b.max_seqs && a.kv_blocks == b.kv_blocks && a.lora == b.lora &&
               a.role == b.role && a.bootstrap_port == b.bootstrap_port;
      })) {
    dns_entries = dns;
    dns_addrs.assign(dns.size(), {});
  }
  {
    std::lock_guard lk(dns_mu);
    dns_todo = std::move(dns);
    dns_servers = cfg.discovery.dns_servers;
    dns_interval = std::chrono::milliseconds(cfg.discovery.dns_interval_ms);
    ++dns_generation;
  }
  dns_cv.notify_all();
  reconcile();
}

void KnownWorkers::Impl::on_dns_answer(uint64_t generation, size_t index, std::vector<std::string> addrs) {
  {
    std::lock_guard lk(dns_mu);
    if (generation != dns_generation) return;  // answers for a replaced entry list
  }
  if (index >= dns_addrs.size() || dns_addrs[index] == addrs) return;
  dns_addrs[index] = std::move(addrs);
  reconcile();
}

void KnownWorkers::Impl::dns_loop() {
  pthread_setname_np(pthread_self(), "kvroute-dns");
  std::unique_lock lk(dns_mu);
  while (!stopping) {
    const uint64_t gen = dns_generation;
    const auto entries = dns_todo;
    const std::string servers = dns_servers;
    const auto interval = dns_interval;
    lk.unlock();
    DnsResolver resolver(servers);
    for (size_t i = 0; i < entries.size(); ++i) {
      std::vector<std::string> addrs;
      std::string detail;
      const auto r = resolver.resolve(entries[i].host, std::min(interval, std::chrono::milliseconds(3000)), addrs,
                                      &detail);
      if (r == DnsResolver::Result::Failed) {
        stats.dns_lookups_failed.fetch_add(1, std::memory_order_relaxed);
        static RateLimiter rl;
        if (rl.allow())
          spdlog::warn("discovery.dns: resolving '{}' failed ({}); keeping its last known workers", entries[i].host,
                       detail);
        continue;
      }
      (r == DnsResolver::Result::Ok ? stats.dns_lookups_ok : stats.dns_lookups_not_found)
          .fetch_add(1, std::memory_order_relaxed);
      asio::post(ioc, [this, gen, i, a = std::move(addrs)]() mutable { on_dns_answer(gen, i, std::move(a)); });
    }
    lk.lock();
    dns_cv.wait_for(lk, interval, [&] { return stopping || dns_generation != gen; });
  }
}

KnownWorkers::KnownWorkers(WorkerRegistry& registry, uint32_t block_size, KnownWorkerHooks hooks)
    : impl_(std::make_unique<Impl>(registry, block_size, std::move(hooks), stats_)) {}

KnownWorkers::~KnownWorkers() { stop(); }

void KnownWorkers::start(const Config& cfg) {
  apply_config(cfg);
  impl_->fleet_thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "kvroute-fleet");
    impl_->ioc.run();
  });
  impl_->dns_thread = std::thread([this] { impl_->dns_loop(); });
}

void KnownWorkers::apply_config(const Config& cfg) {
  asio::post(impl_->ioc, [this, cfg] { impl_->apply(cfg); });
}

void KnownWorkers::stop() {
  {
    std::lock_guard lk(impl_->dns_mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  impl_->dns_cv.notify_all();
  impl_->work.reset();
  impl_->ioc.stop();
  if (impl_->fleet_thread.joinable()) impl_->fleet_thread.join();
  if (impl_->dns_thread.joinable()) impl_->dns_thread.join();
}

std::optional<std::string> KnownWorkers::add_worker(std::string_view entry) {
  std::vector<WorkerEntry> parsed;
  if (auto e = parse_worker_entries(entry, parsed)) return e;
  if (parsed.size() != 1) return std::string("workers: exactly one entry expected");
  WorkerEntry w = std::move(parsed[0]);
  asio::post(impl_->ioc, [this, w] {
    impl_->admin_removed.erase(w.id);
    impl_->admin_added[w.id] = w;
    impl_->reconcile();
  });
  sync();
  return std::nullopt;
}

bool KnownWorkers::remove_worker(WorkerId id) {
  auto found = std::make_shared<std::promise<bool>>();
  auto f = found->get_future();
  asio::post(impl_->ioc, [this, id, found] {
    const bool known = impl_->current.count(id.value) > 0;
    impl_->admin_added.erase(id.value);
    if (known) impl_->admin_removed.insert(id.value);
    impl_->reconcile();
    found->set_value(known);
  });
  if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) return false;
  return f.get();
}

const ScraperStats& KnownWorkers::scrape_stats() const { return impl_->scraper.stats(); }

void KnownWorkers::sync() {
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  asio::post(impl_->ioc, [done] { done->set_value(); });
  f.wait_for(std::chrono::seconds(10));
}

}  // namespace kvroute
