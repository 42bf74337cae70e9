// The live configuration, swapped atomically on reload. Readers take a
// snapshot (shared_ptr) per request, so an in-flight request keeps the config
// it started with. Thread-safe.
#pragma once

#include <memory>
#include <mutex>

#include "config/config.h"

namespace kvroute {

class ConfigStore {
 public:
  explicit ConfigStore(Config initial) : current_(std::make_shared<const Config>(std::move(initial))) {}
  std::shared_ptr<const Config> get() const {
    std::lock_guard lk(mu_);
    return current_;
  }
  void set(Config next) {
    auto p = std::make_shared<const Config>(std::move(next));
    std::lock_guard lk(mu_);
    current_ = std::move(p);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Config> current_;
};

}  // namespace kvroute
