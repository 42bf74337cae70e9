// Whose cache_salt a stored root block belongs to when the engine's KV events
// do not say: vLLM before its `extra_keys` field (vLLM PR #33304) and SGLang
// (its BlockStored has no salt, python/sglang/srt/disaggregation/kv_events.py,
// while its radix cache keys children by RadixKey.extra_key) keep tenants
// apart in their own cache but publish a tenant's blocks exactly like
// unsalted ones. Indexed as unsalted they would let an unsalted request claim
// a tenant's cache (the engine then computes it all) and hide the tenant's
// own hits.
//
// Only a chain's root block carries the salt (indexer/block_hash.h): its
// children hang under it in the radix index and follow it. So the router
// attributes root blocks from what it sent itself: each dispatch to a worker
// records (digest of the prompt's first block without salt, salt) in that
// worker's ring of the last kDispatchesPerWorker dispatches; a root block
// event without a salt is looked up by the same digest of its first block:
//   - the worker's events have carried a salt before: they are trusted, the
//     root is unsalted (an engine with extra_keys says when it is salted);
//   - the namespaces the ring holds for that digest, less those whose root
//     block with that digest the engine already holds (stored, attributed and
//     not removed on that cache owner: an engine stores a block it holds only
//     once), leave one: that namespace (`attributed` when salted). So tenants
//     sending the same prompt one after the other are told apart;
//   - two or more left (their requests were in flight together): 
//     `unattributed`, the block is indexed in a namespace no request can
//     match: never over-claimed, under-claimed until the engine evicts it;
//   - not in the ring (older than the window, sent by another router
//     replica, replayed after a router restart): unsalted if this router has
//     never sent the worker a salted request, else unattributed.
// A worker this router has sent salted requests to and whose events never
// carried a salt is `salt_blind` (metric, /admin/workers, explain, status
// page). Limits (README "Tenant isolation"): with several router replicas a
// replica that never sent salted requests takes other replicas' tenants'
// root blocks as unsalted.
//
// Bounded: kDispatchesPerWorker entries of 16 bytes per worker (64 KiB) and
// kHeldPerOwner held roots per cache owner, only for workers whose events
// have not carried a salt; workers removed with remove_worker(); resolve()
// scans the ring.
//
// Thread-safe (one mutex): HTTP io threads record, the ZMQ thread resolves,
// the fleet thread removes, metrics read.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/types.h"

namespace kvroute {

class SaltAttribution {
 public:
  static constexpr size_t kDispatchesPerWorker = 4096;

  // How a root block's namespace was decided (metric label `how`).
  enum class How : uint8_t {
    Event,         // the event carried the salt
    Trusted,       // no salt in the event of a worker whose events carry salts: unsalted
    Unsalted,      // the router's dispatches say unsalted (or it never sent the worker a salted request)
    Attributed,    // the router's dispatches say one salt
    Unattributed,  // ambiguous or unknown: indexed where no request matches
  };
  static constexpr size_t kNumHow = 5;

  struct Root {
    How how = How::Unsalted;
    uint64_t salt_hash = 0;  // Attributed: indexer salt_hash() of the salt
  };

  // A request sent to `worker`: `first_block` = hash_block(its first complete
  // block, block_hash_seed(lora)) (no salt), `salt_hash` = salt_hash(its
  // cache_salt) (0: none).
  void record_dispatch(WorkerId worker, LocalBlockHash first_block, uint64_t salt_hash);
  // An event of `worker` carried a salt: its events are trusted from now on.
  void saw_salt_in_events(WorkerId worker);
  // The namespace of a root block without a salt in its event, whose first
  // block's digest is `first_block` (as record_dispatch's), stored by
  // `owner` as its engine block `engine_block`.
  Root resolve(CacheOwner owner, LocalBlockHash first_block, SequenceHash engine_block);
  // `owner` removed these engine blocks / all of its blocks (a removal event,
  // a restart): their namespaces may be stored again.
  void removed(CacheOwner owner, std::span<const SequenceHash> engine_blocks);
  void cleared(CacheOwner owner);
  // Called when the worker leaves the fleet.
  void remove_worker(WorkerId worker);

  bool salt_blind(WorkerId worker) const;
  size_t salt_blind_workers() const;
  uint64_t resolved_total(How how) const { return resolved_[static_cast<size_t>(how)].load(); }

 private:
  struct Dispatch {
    uint64_t digest = 0;
    uint64_t salt_hash = 0;
  };
  // Root blocks an owner holds: by engine block, and counted by (digest, salt).
  struct HeldRoots {
    std::unordered_map<uint64_t, uint64_t> by_block;  // engine block -> key(digest, salt)
    std::unordered_map<uint64_t, uint32_t> count;     // key(digest, salt) -> blocks
    void add(uint64_t block, uint64_t key);
    void remove(uint64_t block);
    bool holds(uint64_t key) const { return count.count(key) != 0; }
  };
  static uint64_t key(uint64_t digest, uint64_t salt_hash) { return digest * 0x9E3779B97F4A7C15ull ^ salt_hash; }
  struct Worker {
    std::vector<Dispatch> ring;  // grows to kDispatchesPerWorker, then wraps
    size_t next = 0;
    bool salted_sent = false;    // this router has sent it a salted request
    bool events_carry_salt = false;
    // Per dp rank: root blocks resolved to a namespace and not removed, by
    // engine block (at most kHeldPerOwner; past that the set is dropped and
    // resolving is more often `unattributed`, never wrong).
    std::unordered_map<uint32_t, HeldRoots> held;
  };
  static constexpr size_t kHeldPerOwner = 1 << 16;

  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<Worker>> workers_;
  std::atomic<uint64_t> resolved_[kNumHow] = {};
};

std::string_view to_string(SaltAttribution::How how);

}  // namespace kvroute
