// The mocker's offload tiers (mocker/README.md, "Offload mode"): a shared KV
// pool kept as one file per block in a directory several mockers mount
// (--kv-pool-dir), standing for LMCache's remote backend or SGLang HiCache's
// storage tier; and a per-process host tier (--kv-host-blocks), standing for
// vLLM's CPU offloading. Loading a block from either takes its bytes over the
// tier's bandwidth instead of a prefill.
//
// Threading: not thread-safe; the mocker's io thread owns both. The pool's
// directory is shared with other processes: creating a block file is atomic
// (O_CREAT | O_EXCL), so exactly one mocker announces each block it stores,
// and removing one (unlink) is too, so exactly one announces its eviction.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/types.h"

namespace kvroute::mocker {

struct OffloadConfig {
  std::string pool_dir;                 // shared pool; empty = none
  std::string pool_medium = "SHARED";   // the `medium` of the pool's KV events (kvroute's indexer.kv_pools medium)
  uint64_t pool_blocks = 0;             // pool capacity in blocks; 0 = unbounded
  double pool_gbps = 25;                // load bandwidth from the pool, Gbit/s
  uint64_t host_blocks = 0;             // host tier capacity in blocks; 0 = no host tier
  double host_gbps = 100;               // load bandwidth from the host tier, Gbit/s
  bool enabled() const { return !pool_dir.empty() || host_blocks > 0; }
};

// What a block needs to be announced again (its content hash and parent).
struct BlockMeta {
  LocalBlockHash local;
  std::optional<SequenceHash> parent;
};

// Blocks as files `DIR/<16 hex digits of the block id>` holding the content
// hash and the parent (17 bytes).
class KvPoolDir {
 public:
  explicit KvPoolDir(std::string dir) : dir_(std::move(dir)) {}
  // Creates the directory if needed; false (and `err`) if it cannot.
  bool open(std::string* err);
  bool contains(SequenceHash id) const;
  // True if this call created the block's file (another process may have first).
  bool put(SequenceHash id, const BlockMeta& meta);
  // True if this call removed it.
  bool remove(SequenceHash id);
  // Blocks over `capacity`, oldest first (by modification time): O(pool size).
  std::vector<SequenceHash> over_capacity(uint64_t capacity) const;
  // Every block with its meta (a resync dump), parents before children where both are in.
  std::vector<std::pair<SequenceHash, BlockMeta>> list() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string path(SequenceHash id) const;
  std::string dir_;
};

// The host tier: blocks the device evicted, least recently offloaded dropped first.
class HostTier {
 public:
  explicit HostTier(uint64_t capacity) : capacity_(capacity) {}
  bool contains(SequenceHash id) const { return at_.count(id.value) > 0; }
  // Adds a block; the blocks it pushed out (to announce as removed).
  std::vector<SequenceHash> put(SequenceHash id, const BlockMeta& meta);
  // Takes a block out (loaded back to the device): no removal to announce,
  // its store on the device moves it there.
  bool take(SequenceHash id);
  size_t size() const { return at_.size(); }
  // Every block with its meta, least recently offloaded first.
  std::vector<std::pair<SequenceHash, BlockMeta>> list() const;

 private:
  struct Entry {
    BlockMeta meta;
    std::list<uint64_t>::iterator pos;
  };
  uint64_t capacity_;
  std::list<uint64_t> order_;  // oldest first
  std::unordered_map<uint64_t, Entry> at_;
};

// Milliseconds to load `blocks` blocks at `gbps` (0 = instantaneous).
double load_ms(uint64_t blocks, uint32_t block_size, double kv_bytes_per_token, double gbps);

}  // namespace kvroute::mocker
