// Open-addressing hash map from a 64-bit key to a small value (linear
// probing, backward-shift deletion, no tombstones). Keys are already hashes;
// they are mixed once more so sequential ids spread. Keys and values live in
// two arrays (no padding): 8 + sizeof(V) bytes per slot, load factor at most
// 0.75, shrinks below 1/8. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

namespace kvroute {

template <class V>
class FlatMap64 {
 public:
  FlatMap64() = default;
  FlatMap64(FlatMap64&&) noexcept = default;
  FlatMap64& operator=(FlatMap64&&) noexcept = default;

  size_t size() const { return size_ + (has_empty_key_ ? 1 : 0); }
  size_t capacity() const { return cap_; }
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
    if (cap_ > 16 && size_ * 8 < cap_) shrink();
    return true;
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
  size_t index(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h ^ (h >> 32)) & (cap_ - 1);
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
