// Open-addressing hash map from a 64-bit key to a small value (linear
// probing, backward-shift deletion, no tombstones). Keys come from workers
// (engine block ids, content hashes): they are hashed with a per-process
// random key (keyed_slot_hash), so ids crafted to collide cannot be found
// without that key. Keys and values live in two arrays (no padding): 8 +
// sizeof(V) bytes per slot, load factor at most 0.75, shrinks below 1/8.
// A caller that must bound the time spent in one call (the index writer
// under its exclusive lock) grows and shrinks the map itself with
// needs_grow()/grown() and wants_shrink()/shrunk(), building the copy
// elsewhere, and erases with erase_no_shrink(). Not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

namespace kvroute {

// Per-process random keys of keyed_slot_hash (getrandom at start-up;
// indexer/flat_map.cpp). Readable from any thread.
struct SlotHashKey {
  uint64_t k0, k1;
};
extern SlotHashKey kSlotHashKey;  // set once before main(), then only read

// Keyed 64-bit mix: the key is xored in before each of two full-avalanche
// bijective rounds (the murmur3 finalizer), like XXH3's seeded path for an
// 8-byte input, twice over with independent keys. Not a cryptographic PRF
// (SipHash is; ~10x slower here), but which ids share a slot depends on the
// secret key, so a worker cannot precompute colliding ids.
inline uint64_t keyed_slot_hash(uint64_t x) {
  auto fmix = [](uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
  };
  return fmix(fmix(x ^ kSlotHashKey.k0) ^ kSlotHashKey.k1);
}

template <class V>
class FlatMap64 {
 public:
  FlatMap64() = default;
  FlatMap64(FlatMap64&&) noexcept = default;
  FlatMap64& operator=(FlatMap64&&) noexcept = default;

  size_t size() const { return size_ + (has_empty_key_ ? 1 : 0); }
  // One more put() would grow the table (a rehash of every entry).
  bool needs_grow() const { return (size_ + 1) * 4 > cap_ * 3; }
  // A copy with twice the capacity (so needs_grow() is false on it).
  FlatMap64 grown() const { return resized(cap_ ? cap_ * 2 : 8); }
  // Sparse enough that erase() would shrink it.
  bool wants_shrink() const { return cap_ > 16 && size_ * 8 < cap_; }
  // A copy at the capacity erase() would shrink to.
  FlatMap64 shrunk() const {
    size_t c = cap_;
    while (c > 16 && size_ * 8 < c) c /= 2;
    return resized(c);
  }
  void swap(FlatMap64& o) noexcept {
    std::swap(keys_, o.keys_);
    std::swap(vals_, o.vals_);
    std::swap(cap_, o.cap_);
    std::swap(size_, o.size_);
    std::swap(has_empty_key_, o.has_empty_key_);
    std::swap(empty_key_value_, o.empty_key_value_);
  }
  size_t capacity() const { return cap_; }
  // Grows once so that `n` entries fit without a rehash.
  void reserve(size_t n) {
    size_t c = cap_ ? cap_ : 8;
    while (n * 4 > c * 3) c *= 2;
    if (c != cap_) rehash(c);
  }
  size_t bytes() const { return cap_ * (sizeof(uint64_t) + sizeof(V)); }

  V* find(uint64_t key) {
    if (key == kEmpty) return has_empty_key_ ? &empty_key_value_ : nullptr;
    if (!cap_) return nullptr;
    for (size_t i = index(key);; i = (i + 1) & (cap_ - 1)) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  const V* find(uint64_t key) const { return const_cast<FlatMap64*>(this)->find(key); }

  // Inserts or overwrites; returns true if the key was new.
  bool put(uint64_t key, V value) {
    if (key == kEmpty) {
      const bool fresh = !has_empty_key_;
      has_empty_key_ = true;
      empty_key_value_ = value;
      return fresh;
    }
    if ((size_ + 1) * 4 > cap_ * 3) grow();
    for (size_t i = index(key);; i = (i + 1) & (cap_ - 1)) {
      if (keys_[i] == key) {
        vals_[i] = value;
        return false;
      }
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        vals_[i] = value;
        ++size_;
        return true;
      }
    }
  }

  bool erase(uint64_t key) {
    if (!erase_no_shrink(key)) return false;
    if (wants_shrink()) shrink();
    return true;
  }

  // Erases without ever shrinking: O(probe run), never a rehash.
  bool erase_no_shrink(uint64_t key) {
    if (key == kEmpty) {
      const bool had = has_empty_key_;
      has_empty_key_ = false;
      return had;
    }
    if (!cap_) return false;
    size_t i = index(key);
    for (;; i = (i + 1) & (cap_ - 1)) {
      if (keys_[i] == kEmpty) return false;
      if (keys_[i] == key) break;
    }
    // Backward-shift: move later entries of the probe run into the hole.
    size_t hole = i;
    for (size_t j = (i + 1) & (cap_ - 1); keys_[j] != kEmpty; j = (j + 1) & (cap_ - 1)) {
      const size_t home = index(keys_[j]);
      // Move j into the hole if its home is not in (hole, j] cyclically.
      const bool between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!between) {
        keys_[hole] = keys_[j];
        vals_[hole] = vals_[j];
        hole = j;
      }
    }
    keys_[hole] = kEmpty;
    --size_;
    return true;
  }

  // Slots examined to find `key` (its distance from its home slot + 1); 0 if
  // absent. Tests: how long the probe runs of a key set are.
  size_t probe_length(uint64_t key) const {
    if (key == kEmpty || !cap_) return 0;
    size_t n = 1;
    for (size_t i = index(key);; i = (i + 1) & (cap_ - 1), ++n) {
      if (keys_[i] == key) return n;
      if (keys_[i] == kEmpty) return 0;
    }
  }

  template <class F>
  void for_each(F&& f) const {
    if (has_empty_key_) f(kEmpty, empty_key_value_);
    for (size_t i = 0; i < cap_; ++i)
      if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
  }

  void clear() {
    keys_.reset();
    vals_.reset();
    cap_ = size_ = 0;
    has_empty_key_ = false;
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  size_t index(uint64_t key) const { return static_cast<size_t>(keyed_slot_hash(key)) & (cap_ - 1); }
  FlatMap64 resized(size_t new_cap) const {
    FlatMap64 m;
    m.keys_.reset(new uint64_t[new_cap]);
    m.vals_.reset(new V[new_cap]);
    for (size_t i = 0; i < new_cap; ++i) m.keys_[i] = kEmpty;
    m.cap_ = new_cap;
    for (size_t i = 0; i < cap_; ++i)
      if (keys_[i] != kEmpty) m.put(keys_[i], vals_[i]);
    m.has_empty_key_ = has_empty_key_;
    m.empty_key_value_ = empty_key_value_;
    return m;
  }
  void rehash(size_t new_cap) {
    std::unique_ptr<uint64_t[]> old_keys = std::move(keys_);
    std::unique_ptr<V[]> old_vals = std::move(vals_);
    const size_t old_cap = cap_;
    keys_.reset(new uint64_t[new_cap]);
    vals_.reset(new V[new_cap]);
    for (size_t i = 0; i < new_cap; ++i) keys_[i] = kEmpty;
    cap_ = new_cap;
    size_ = 0;
    for (size_t i = 0; i < old_cap; ++i)
      if (old_keys[i] != kEmpty) put(old_keys[i], old_vals[i]);
  }
  void grow() { rehash(cap_ ? cap_ * 2 : 8); }
  void shrink() { rehash(cap_ / 2); }

  std::unique_ptr<uint64_t[]> keys_;
  std::unique_ptr<V[]> vals_;
  size_t cap_ = 0;
  size_t size_ = 0;
  bool has_empty_key_ = false;
  V empty_key_value_{};
};

}  // namespace kvroute
