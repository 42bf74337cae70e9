// Ordering, gaps, restarts and resyncs of KV events, in front of any Indexer.
// It is itself an Indexer, so the daemon routes through it.
//
// Per cache owner it tracks the last applied `event_id`:
//   id == last + 1         -> apply
//   id == last             -> duplicate redelivery: ignored (counted)
//   id <  last             -> the worker restarted: drop the owner's blocks, apply (counted)
//   id >  last + 1 (gap)   -> events were lost: the owner becomes stale (its
//                             overlap reads as zero), the resync callback asks
//                             the worker for a full dump; events arriving
//                             meanwhile are buffered (bounded)
//   first event of an owner with id > 1 -> treated as a gap (we joined late)
//   no event_id            -> applied without tracking
// Instance ids (events and heartbeats carry the worker process's instance id,
// new at each start): another instance than the owner's is a restart, whatever
// the event ids say (drop the owner's blocks, start its sequence afresh); with
// instance ids known, an id below the last one is a late duplicate, not a
// restart. Owners without instance ids keep the event-id rule above.
// Hostile or absurd ids: after a dump at N, buffered events are replayed from
// N+1 while contiguous; beyond a hole, events more than kMaxBufferedEvents
// past N (an id the worker cannot have reached) are dropped and counted, and a
// plausible hole asks for one more dump at most once in a row (then its events
// are dropped too): one bad id costs one gap and one resync, never a loop.
// begin_resync(owner) (a dump asked for while the owner is trusted, e.g. after
// a NATS reconnect or at first sight of a worker): events keep applying and are
// also remembered, so the dump can be applied without losing what came after it.
// apply_resync(owner, N, dump) clears the owner, applies the dump, then the
// buffered events with id > N in order; the owner is trusted again unless
// the buffer itself has a gap (then another resync is requested). Until the
// first event after the dump (id N+1) is applied, late events with id <= N
// are already in the dump: ignored (counted as duplicates), not a restart.
//
// The index below hears of each change of an owner's stream (on_stream) and
// of each event held back (on_event_held), so that state several owners write
// (a shared pool, indexer/pool_index.h) can follow the same rules.
//
// Threading: the mutating calls on the single writer thread; find_matches
// and stats from any thread (the stale set has its own lock). The resync
// callback runs on the writer thread and must not block (queue the request).
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "indexer/indexer.h"

namespace kvroute {

// Plain atomics, written by the writer thread, readable from any thread.
struct SequencerCounters {
  // Events handed to the inner index, by type (kEventTypes order) and result
  // (ApplyResult order), dump events included.
  static constexpr const char* kEventTypes[3] = {"stored", "removed", "cleared"};
  std::atomic<uint64_t> applied[3][kNumApplyResults]{};
  std::atomic<uint64_t> duplicates{0};
  std::atomic<uint64_t> gaps{0};
  std::atomic<uint64_t> restarts{0};
  std::atomic<uint64_t> resyncs_requested{0};
  std::atomic<uint64_t> resyncs_completed{0};
  std::atomic<uint64_t> buffer_overflows{0};  // events dropped while waiting for a dump
  std::atomic<uint64_t> stale_owners{0};      // gauge
  std::atomic<uint64_t> discarded{0};         // buffered events dropped beyond a hole after a dump (absurd ids)
};

class EventSequencer final : public Indexer {
 public:
  // Events buffered per stale owner while its dump is awaited.
  static constexpr size_t kMaxBufferedEvents = 65536;

  explicit EventSequencer(Indexer& inner) : inner_(inner) {}

  void set_resync_callback(std::function<void(CacheOwner)> cb) { resync_cb_ = std::move(cb); }

  ApplyResult apply(const KvEvent& event) override;
  void remove_worker(WorkerId worker) override;
  void clear_owner(CacheOwner owner) override;
  OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const override;
  void find_match_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const override;
  IndexStats stats() const override { return inner_.stats(); }
  void take_removed(std::vector<std::pair<WorkerId, uint64_t>>& out) override { inner_.take_removed(out); }
  void set_block_limits(const std::vector<std::pair<WorkerId, uint64_t>>& limits, uint64_t ceiling) override {
    inner_.set_block_limits(limits, ceiling);
  }

  // Writer thread. Replaces the owner's state with a full dump taken after
  // event `last_event_id`.
  // `instance` is the worker's instance when the dump was taken (0 = unknown).
  void apply_resync(CacheOwner owner, uint64_t last_event_id, const std::vector<KvEvent>& dump,
                    uint64_t instance = 0) override;
  // Writer thread. A dump was asked for while the owner may be trusted: keep
  // applying its events but remember them for replay after the dump.
  void begin_resync(CacheOwner owner) override;
  // Writer thread. The worker announced `instance` (heartbeat): if it differs
  // from the one its events carried, the worker restarted: its blocks are dropped.
  // Returns true when that happened.
  bool on_instance(WorkerId worker, uint64_t instance) override;

  bool is_stale(CacheOwner owner) const;
  const SequencerCounters& counters() const { return counters_; }

 private:
  struct OwnerSeq {
    uint64_t last = 0;
    uint64_t instance = 0;      // 0 = not announced
    bool seen = false;          // an event id was seen
    bool stale = false;
    bool resyncing = false;     // trusted, but a dump is awaited: applied events are remembered
    bool after_resync = false;  // ids <= last are old news, not a restart
    bool retried = false;       // the last dump left a hole and asked again
    std::vector<KvEvent> buffer;  // events received while stale or resyncing, in arrival order
  };
  void mark_stale(CacheOwner owner, OwnerSeq& s);
  void restart(CacheOwner owner, OwnerSeq& s, uint64_t instance);
  void remember(OwnerSeq& s, const KvEvent& event);
  void hold(OwnerSeq& s, const KvEvent& event);  // remember a stale owner's event, told to the inner index
  void replay_after_dump(CacheOwner owner, OwnerSeq& s, std::vector<KvEvent> buffered);
  ApplyResult forward(const KvEvent& event);  // inner_.apply, counted
  void set_trusted(CacheOwner owner);

  Indexer& inner_;
  std::function<void(CacheOwner)> resync_cb_;
  std::unordered_map<CacheOwner, OwnerSeq> seq_;  // writer thread only
  std::unordered_map<WorkerId, uint64_t> instances_;  // announced by heartbeats; writer thread only
  mutable std::shared_mutex stale_mu_;
  std::unordered_set<CacheOwner> stale_;          // read by find_matches
  SequencerCounters counters_;
};

}  // namespace kvroute
