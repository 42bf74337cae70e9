// A map from string keys to small values, bounded in entries, least recently
// used dropped first: the memory of session affinity (session -> worker,
// session_affinity.h) and of previous_response_id affinity (response id ->
// worker, api/response_affinity.h). O(1) per call; a lookup by string_view
// allocates nothing.
//
// Threading: not thread-safe; each owner locks around it.
#pragma once

#include <cstddef>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace kvroute {

template <class V>
class BoundedLru {
 public:
  explicit BoundedLru(size_t capacity) : capacity_(capacity ? capacity : 1) {}

  // The value of `key`, which becomes the most recently used; null if absent.
  // The pointer is valid until the next put() or set_capacity().
  V* find(std::string_view key) {
    const auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  // Sets `key` to `value` (the most recently used), dropping the least
  // recently used entries beyond the capacity.
  void put(std::string_view key, V value) {
    if (V* v = find(key)) {
      *v = std::move(value);
      return;
    }
    order_.emplace_front(std::string(key), std::move(value));
    map_.emplace(std::string_view(order_.front().first), order_.begin());
    evict();
  }
  // A new bound (0 is read as 1); a smaller one drops the least recently
  // used entries at once.
  void set_capacity(size_t capacity) {
    capacity_ = capacity ? capacity : 1;
    evict();
  }
  size_t capacity() const { return capacity_; }
  size_t size() const { return map_.size(); }

 private:
  using Order = std::list<std::pair<std::string, V>>;  // most recent first; map_'s keys view its strings
  void evict() {
    while (map_.size() > capacity_) {
      map_.erase(std::string_view(order_.back().first));
      order_.pop_back();
    }
  }
  size_t capacity_;
  Order order_;
  std::unordered_map<std::string_view, typename Order::iterator> map_;
};

}  // namespace kvroute
