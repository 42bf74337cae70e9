// Approximate mode: for workers that publish no KV events, the router
// predicts their cache from its own decisions. Each routed request records
// its blocks for the chosen owner; a record expires after `ttl` unless the
// same prefix is routed there again, and at most `max_entries` (block, owner)
// entries are kept (oldest dropped first).
//
// Backed by a RadixIndexer (same lookups, same memory layout). Thread-safe:
// record() from any request thread (serialised by an internal mutex),
// find_matches() from any thread, remove_worker()/clear_owner() from the
// index writer thread. Expiry runs in record() and expire(), and in
// find_matches() when the oldest record has passed the TTL (only if the
// mutex is free at once: a lookup never waits for a writer here), so an
// expired prediction is not served even when no request is being routed.
#pragma once

#include <atomic>
#include <deque>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "common/clock.h"
#include "indexer/radix_indexer.h"

namespace kvroute {

class ApproxIndexer final : public Indexer {
 public:
  static constexpr Nanos kDefaultTtl = std::chrono::seconds(120);
  static constexpr uint64_t kDefaultMaxEntries = 1'000'000;

  // `clock` must outlive the index. ttl > 0; max_entries > 0 ((block, owner) pairs).
  explicit ApproxIndexer(const Clock& clock, Nanos ttl = kDefaultTtl, uint64_t max_entries = kDefaultMaxEntries)
      : clock_(clock), ttl_(ttl), max_entries_(max_entries) {}

  // Records that `owner` will hold the prefix `blocks` from `now` on.
  void record(CacheOwner owner, std::span<const LocalBlockHash> blocks, TimePoint now);
  // Drops records older than the TTL (also done by record()).
  void expire(TimePoint now);

  // Events are not used in approximate mode; apply() only honours `cleared`.
  ApplyResult apply(const KvEvent& event) override;
  void remove_worker(WorkerId worker) override;
  void clear_owner(CacheOwner owner) override;
  OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const override;
  IndexStats stats() const override { return tree_.stats(); }

 private:
  struct Key {
    CacheOwner owner;
    uint64_t block;  // synthetic sequence hash of the prefix up to this block
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      // Keyed (flat_map.h): block hashes come from clients' prompts.
      return std::hash<CacheOwner>{}(k.owner) ^ keyed_slot_hash(k.block);
    }
  };
  void evict_front_locked();
  void expire_locked(TimePoint now);
  void note_oldest_locked();  // refreshes oldest_ from order_

  const Clock& clock_;
  const Nanos ttl_;
  const uint64_t max_entries_;
  mutable std::mutex mu_;
  RadixIndexer tree_;
  // Time of the oldest queued record (ns since the clock's epoch), max when
  // none; written under mu_, read lock-free by find_matches().
  std::atomic<int64_t> oldest_{std::numeric_limits<int64_t>::max()};
  std::unordered_map<Key, TimePoint, KeyHash> touched_;  // last record time per entry
  std::deque<std::pair<TimePoint, Key>> order_;          // record times, oldest first (may hold stale ones)
};

}  // namespace kvroute
