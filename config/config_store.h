// The live configuration, swapped atomically on reload. Readers take a
// snapshot (shared_ptr) per request, so an in-flight request keeps the config
// it started with. Updates are serialised, validated, limited to reloadable
// keys, and all-or-nothing. Thread-safe. Readers on the data plane (several
// get() per request on every io thread) take no lock: each thread keeps the
// snapshot it saw last and refreshes it when the store's version moves.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"

namespace kvroute {

class ConfigStore {
 public:
  explicit ConfigStore(Config initial) : current_(std::make_shared<const Config>(std::move(initial))) {}

  std::shared_ptr<const Config> get() const {
    // Per thread: the store it read last (by id, never reused), the version
    // and the snapshot. A hit costs one atomic load and a refcount increment,
    // on a reference count of this thread's own: the snapshot is handed out
    // through a per-thread holder (aliasing shared_ptr), so io threads that
    // read the config on every request do not share one count's cache line.
    struct Cache {
      uint64_t store = 0, version = 0;
      std::shared_ptr<const std::shared_ptr<const Config>> holder;
    };
    thread_local Cache cache;
    const uint64_t v = version_.load(std::memory_order_acquire);
    if (cache.store != id_ || cache.version != v) {
      std::lock_guard lk(mu_);
      cache = Cache{id_, version_.load(std::memory_order_relaxed),
                    std::make_shared<const std::shared_ptr<const Config>>(current_)};
    }
    return std::shared_ptr<const Config>(cache.holder, cache.holder->get());
  }

  // Applies `edit` to a copy of the current config; if it returns no error
  // and the result is valid and changes only reloadable keys, swaps it in and
  // calls the listeners. Returns the error otherwise (nothing changes).
  std::optional<std::string> update(const std::function<std::optional<std::string>(Config&)>& edit) {
    std::lock_guard up(update_mu_);
    const auto cur = get();
    Config next = *cur;
    if (auto e = edit(next)) return e;
    if (auto e = validate(next)) return e;
    if (auto e = check_reload(*cur, next)) return e;
    auto p = std::make_shared<const Config>(std::move(next));
    {
      std::lock_guard lk(mu_);
      current_ = p;
      version_.fetch_add(1, std::memory_order_release);
    }
    for (const auto& l : listeners_) l(*p);
    return std::nullopt;
  }

  // Called (on the updating thread) after every successful update.
  void on_change(std::function<void(const Config&)> listener) {
    std::lock_guard up(update_mu_);
    listeners_.push_back(std::move(listener));
  }

 private:
  static uint64_t next_id() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }
  const uint64_t id_ = next_id();
  std::atomic<uint64_t> version_{1};
  mutable std::mutex mu_;
  std::mutex update_mu_;  // serialises updates; held while listeners run
  std::shared_ptr<const Config> current_;
  std::vector<std::function<void(const Config&)>> listeners_;
};

}  // namespace kvroute
