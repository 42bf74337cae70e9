#include "indexer/indexer_metrics.h"

#include <memory>
#include <mutex>

#include "indexer/approx_indexer.h"
#include "indexer/event_sequencer.h"
#include "indexer/pool_index.h"
#include "indexer/radix_indexer.h"

namespace kvroute {

using metrics::Samples;
using metrics::Type;

void register_index_metrics(metrics::Registry& r, const EventSequencer& sequencer, const RadixIndexer& exact,
                            const ApproxIndexer& approx) {
  const SequencerCounters& sq = sequencer.counters();
  // counters
  r.counter_fn("kvroute_indexer_event_gaps_total", "event_id gaps (lost events) detected",
               [&sq] { return sq.gaps.load(); });
  r.counter_fn("kvroute_indexer_event_duplicates_total", "events ignored as redelivered",
               [&sq] { return sq.duplicates.load(); });
  r.counter_fn("kvroute_indexer_worker_restarts_total", "event_id went backwards: worker restarted",
               [&sq] { return sq.restarts.load(); });
  r.counter_fn("kvroute_indexer_events_discarded_total",
               "buffered events dropped after a dump: ids the worker cannot have reached (absurd or hostile)",
               [&sq] { return sq.discarded.load(); });
  r.collect(Type::Counter, "kvroute_indexer_blocks_refused_total", "stored blocks refused, by reason", {"reason"},
            [&exact](Samples& s) { s.add({"worker_limit"}, exact.blocks_refused()); });
  // gauges
  r.gauge_fn("kvroute_indexer_stale_owners", "cache owners whose entries are not trusted until a resync",
             [&sq] { return sq.stale_owners.load(); });
  r.gauge_fn("kvroute_indexer_capped_owners",
             "cache owners that had blocks refused over their worker's limit (index partial until cleared)",
             [&exact] { return exact.capped_owners(); });
  // Size by mode: each index's stats() (a walk under its read lock) taken
  // once per scrape, before the samples are rendered, for all three gauges.
  struct Sizes {
    std::mutex mu;
    IndexStats exact, approx;
  };
  auto sizes = std::make_shared<Sizes>();
  r.on_scrape([sizes, &exact, &approx] {
    const IndexStats e = exact.stats(), a = approx.stats();
    std::lock_guard lk(sizes->mu);
    sizes->exact = e;
    sizes->approx = a;
  });
  auto by_mode = [sizes](uint64_t IndexStats::*field) {
    return [sizes, field](Samples& s) {
      std::lock_guard lk(sizes->mu);
      s.add({"exact"}, sizes->exact.*field);
      s.add({"approximate"}, sizes->approx.*field);
    };
  };
  r.collect(Type::Gauge, "kvroute_indexer_blocks", "distinct blocks in the index, by mode", {"mode"},
            by_mode(&IndexStats::blocks));
  r.collect(Type::Gauge, "kvroute_indexer_entries", "(block, owner) entries in the index, by mode", {"mode"},
            by_mode(&IndexStats::entries));
  r.collect(Type::Gauge, "kvroute_indexer_bytes", "memory held by the index, by mode", {"mode"},
            by_mode(&IndexStats::bytes));
}

void register_pool_metrics(metrics::Registry& r, const PoolIndex& pools, const RadixIndexer& exact) {
  const PoolCounters& pc = pools.counters();
  // counters
  r.counter_fn("kvroute_indexer_pool_events_total",
               "KV events of members with their pool's medium, applied to the shared pool",
               [&pc] { return pc.events.load(); });
  r.collect(Type::Counter, "kvroute_indexer_pool_events_refused_total",
            "KV events kept from the shared pools, by reason (not_member: a pool's medium from a worker that does "
            "not mount it, kept as its own; reserved_owner: an event naming a pool's owner id)",
            {"reason"}, [&pc](Samples& s) {
              s.add({"not_member"}, pc.claims_refused.load());
              s.add({"reserved_owner"}, pc.reserved_refused.load());
            });
  r.counter_fn("kvroute_indexer_pools_emptied_total",
               "shared pools emptied (a clear with the pool's medium, its last publishing member gone, a member gone "
               "or restarted with its dump owed after a gap, or too many events to replay after a dump)",
               [&pc] { return pc.emptied.load(); });
  r.counter_fn("kvroute_indexer_pool_resyncs_total",
               "shared pools replaced by a member's resync dump, the pool's events since the request replayed after it",
               [&pc] { return pc.resyncs.load(); });
  // gauges
  r.collect(Type::Gauge, "kvroute_indexer_pools_stale",
            "shared pools whose hits count as none: a member lost KV events and its dump is awaited", {"pool"},
            [&pools](Samples& s) {
              for (uint32_t p = 0; p < pools.pools().size(); ++p) s.add({pools.pools()[p].name}, pools.is_stale(p));
            });
  r.collect(Type::Gauge, "kvroute_indexer_pool_blocks", "blocks indexed in each shared pool", {"pool"},
            [&pools, &exact](Samples& s) {
              const auto by = exact.entries_by_worker();
              for (uint32_t p = 0; p < pools.pools().size(); ++p) {
                uint64_t n = 0;
                for (const auto& [w, e] : by)
                  if (w == PoolIndex::pool_owner(p).worker) n = e;
                s.add({pools.pools()[p].name}, n);
              }
            });
}

}  // namespace kvroute
