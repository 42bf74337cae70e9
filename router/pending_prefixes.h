// Prefixes routed but not yet announced: the router knows which worker it sent
// each request to, so until that request's first byte (after which the
// engine's KV events announce the blocks it computed) the worker counts as
// having the request's prefix. A burst of requests sharing a long document
// then follows the first one to the worker computing it instead of spreading
// over workers that would each compute it again. An engine shares blocks that
// are being computed with requests admitted after them (vLLM's prefix cache
// does; mocker/engine.h too), so the credit is real once the first prefill ends.
//
// PendingPrefixIndexer decorates an Indexer: find_matches() reports, per
// worker, the longer of the index's cached prefix and the longest prefix of a
// request in flight there (as device-tier blocks). An entry lives from add()
// to remove() (the first byte, or the request's end if it never had one) and
// at most `ttl` (a lost remove() cannot pin a worker).
//
// Threading: every method is thread-safe (one mutex around the pending map;
// the decorated index keeps its own rules: apply/remove_worker/clear_owner
// from its writer thread only).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "indexer/indexer.h"

namespace kvroute {

class PendingPrefixIndexer : public Indexer {
 public:
  PendingPrefixIndexer(Indexer& base, const Clock& clock, Nanos ttl = std::chrono::seconds(30))
      : base_(base), clock_(clock), ttl_(ttl) {}

  ApplyResult apply(const KvEvent& event) override { return base_.apply(event); }
  void remove_worker(WorkerId worker) override;
  void clear_owner(CacheOwner owner) override { base_.clear_owner(owner); }
  OverlapScores find_matches(std::span<const LocalBlockHash> blocks) const override;
  IndexStats stats() const override { return base_.stats(); }

  // A request of `blocks` routed to `owner`; returns its ticket for remove().
  uint64_t add(CacheOwner owner, std::span<const LocalBlockHash> blocks);
  // Its first byte (or end): idempotent; 0 is ignored.
  void remove(uint64_t ticket);
  size_t pending() const;

 private:
  struct Entry {
    CacheOwner owner;
    std::vector<uint64_t> prefixes;  // chained identities of the request's prefixes
    TimePoint expires;
  };
  // Prefix identity -> owner -> requests in flight with that prefix.
  using Owners = std::vector<std::pair<CacheOwner, uint32_t>>;
  void drop(const Entry& e);  // mu_ held
  void expire(TimePoint now);  // mu_ held

  Indexer& base_;
  const Clock& clock_;
  const Nanos ttl_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Owners> prefixes_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::deque<std::pair<TimePoint, uint64_t>> by_expiry_;  // add() order = expiry order (one ttl)
  uint64_t next_ = 1;
};

}  // namespace kvroute
