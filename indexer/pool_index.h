// Shared KV pools in front of an index (config `kv_pools`): a store several
// workers mount (LMCache's remote backend, SGLang HiCache's storage tier, a
// shared host pool), whose blocks any member can load instead of recompute.
//
// Writes: an event from a member with its pool's medium (vLLM's `medium`,
// the NATS event's `medium`; case-insensitive) is re-attributed to the pool,
// an owner of its own (pool_owner(p)) in tier pool_tier(p); every other
// event passes unchanged. So a block stored in the pool is held once, a
// chain stored by one member continues under another member's block, and
// an eviction reported by any member removes it for all.
// Reads: each pool owner in a match is replaced by its members (rank 0), a
// member's own prefix first, then the pool's continuation in the pool tier;
// a member whose own prefix is longer keeps it.
//
// Semantics (indexer/README.md, "Shared pools"):
//   - a member's clear (AllBlocksCleared, restart, resync, removal) drops its
//     own blocks only: the pool outlives it. A clear event with the pool's
//     medium empties the pool.
//   - once every member that published to the pool is removed (expired,
//     deleted), the pool is emptied: nobody is left to report its evictions.
//   - an event with a pool's medium from a worker that does not mount it is
//     that worker's own (its tier from the medium), counted as a refused
//     claim: it never reaches the pool.
//   - events naming a pool owner's id are refused (ReservedOwner).
//   - the pool is bounded by its own block limit (max_blocks), whoever floods it.
//   - gaps and resyncs (the event sequencer's notices, on_stream): a member's
//     gap makes the pool stale (its hits read as zero for every member) until
//     that member's dump, which lists the pool as the member sees it,
//     replaces the pool's blocks; the pool's events that arrived since the
//     dump was asked for (any member's, the stale member's held ones
//     included) are replayed after it in arrival order. So a removal lost in
//     a gap is undone by the dump, and one that arrived meanwhile is not
//     undone by it. A member that leaves or restarts with its dump still
//     owed after a gap empties the pool (its lost removals are unknowable);
//     a log of more than kMaxLogEvents events since the request empties it
//     at the dump instead of replaying part of it.
//
// Threading: as Indexer. The writer thread calls the mutators; find_matches
// and find_match_layers run on any thread (the pool table is immutable; the
// live-member counts and resync logs are the writer's only; the stale mask
// is an atomic).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "indexer/indexer.h"

namespace kvroute {

struct PoolSpec {
  std::string name;
  std::string medium;  // matched case-insensitively
  std::vector<WorkerId> members;
  uint64_t max_blocks = 0;  // 0 = the index's ceiling
};

// What the pools saw, for metrics (kvroute_indexer_pool_*). Any thread reads.
struct PoolCounters {
  std::atomic<uint64_t> events{0};          // events re-attributed to a pool
  std::atomic<uint64_t> claims_refused{0};  // a pool's medium from a worker that does not mount it
  std::atomic<uint64_t> reserved_refused{0};  // events naming a pool owner's id
  std::atomic<uint64_t> emptied{0};         // pools emptied (clear event, last member gone, a resync unable to replay)
  std::atomic<uint64_t> resyncs{0};         // pools replaced by a member's dump (and the events since replayed)
};

class PoolIndex final : public Indexer {
 public:
  // Pool events kept per pool while a member's dump is awaited.
  static constexpr size_t kMaxLogEvents = 65536;

  // Pool owners: worker ids no worker can take (workers' ids are below 2^63;
  // these are refused on every path in here), dp rank kPoolRank.
  static constexpr uint64_t kPoolWorkerBase = ~uint64_t{0} - 0xff;
  static constexpr uint32_t kPoolRank = ~uint32_t{0};
  static constexpr CacheOwner pool_owner(uint32_t p) { return CacheOwner{WorkerId{kPoolWorkerBase + p}, kPoolRank}; }
  static constexpr bool is_reserved(WorkerId w) { return w.value >= kPoolWorkerBase; }

  // At most kMaxPools pools; a worker in at most one (config validation).
  PoolIndex(Indexer& inner, std::vector<PoolSpec> pools);

  ApplyResult apply(const KvEvent& event) override;
  void remove_worker(WorkerId worker) override;
  void clear_owner(CacheOwner owner) override;
  OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const override;
  void find_match_layers(std::span<const LocalBlockHash> blocks, MatchLayers& out) const override;
  IndexStats stats() const override { return inner_.stats(); }
  // A pool's removals count under its pool owner's id, which no worker has.
  void take_removed(std::vector<std::pair<WorkerId, uint64_t>>& out) override { inner_.take_removed(out); }
  // The workers' limits (reserved ids dropped) plus each pool's.
  void set_block_limits(const std::vector<std::pair<WorkerId, uint64_t>>& limits, uint64_t ceiling) override;

  const std::vector<PoolSpec>& pools() const { return pools_; }
  // The pool `worker` mounts, or -1.
  int pool_of(WorkerId worker) const;
  const PoolCounters& counters() const { return counters_; }
  // Any thread: pool p's hits read as zero (a member lost events; its dump is awaited).
  bool is_stale(uint32_t p) const { return (stale_.load(std::memory_order_acquire) >> p) & 1u; }

  // Writer thread: the event sequencer's notices (Indexer::on_stream; the rules above).
  void on_stream(CacheOwner owner, StreamNotice notice) override;
  void on_event_held(const KvEvent& event) override;

  // Replaces every pool owner in `owners` by the pool's members (the rule
  // above); the pools in the `stale` mask are dropped. `pools` are the pools'
  // member lists, indexed by pool.
  static void expand(const std::vector<PoolSpec>& pools, std::vector<OwnerOverlap>& owners, uint32_t stale = 0);

 private:
  // The pool this event belongs to (its medium and a member), else -1.
  int pool_for(const KvEvent& event);
  void empty_pool(uint32_t p);
  // A pool event as the pool's own (re-attributed; a clear empties the pool).
  ApplyResult apply_to_pool(uint32_t p, const KvEvent& event);

  // One pool's resync state (writer thread, pool_sync.cpp): the members whose
  // dump is awaited, each with the arrival number of the pool's next event
  // when it was asked for, and the pool's events since the first of them.
  struct Awaited {
    uint64_t from = 0;
    bool gap = false;  // events were lost (not a dump asked for while trusted)
  };
  struct PoolSync {
    std::unordered_map<CacheOwner, Awaited> awaited;
    std::vector<KvEvent> log;  // the members' own events (owner, medium), arrival order
    uint64_t log_base = 0;     // arrival number of log[0]
  };
  void await_dump(CacheOwner owner, bool gap);
  void forget_dump(CacheOwner owner);  // restarted with a dump owed
  void forget_dumps(WorkerId worker);  // removed: every rank's
  void begin_dump(CacheOwner owner);
  void replay_log(CacheOwner owner);
  void log_event(uint32_t p, const KvEvent& event);
  void trim_log(uint32_t p);
  void update_stale(uint32_t p);

  Indexer& inner_;
  std::vector<PoolSpec> pools_;
  std::unordered_map<uint64_t, uint32_t> member_of_;  // worker id -> pool (immutable after construction)
  // Writer thread: per pool, the members that published an event and were not removed since.
  std::vector<std::unordered_set<uint64_t>> live_;
  std::vector<PoolSync> sync_;
  // Writer thread: the member whose dump is being applied (its pool events
  // are the pool's new contents), then the one whose held events are being
  // replayed (its pool events were replayed from the log already).
  std::optional<CacheOwner> loading_, replaying_;
  uint64_t loading_from_ = 0;  // the loading member's log position
  std::atomic<uint32_t> stale_{0};  // bit p: pool p is stale
  PoolCounters counters_;
};

}  // namespace kvroute
