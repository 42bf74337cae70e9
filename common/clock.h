// Time and randomness seams. Production code takes a `Clock&` / `Random&` so
// tests and the simulator can drive virtual time and seeded randomness.
// Thread-safety: SteadyClock and SeededRandom are as documented per class.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>

namespace kvroute {

using Nanos = std::chrono::nanoseconds;
// A point in time as nanoseconds since an arbitrary epoch (steady, monotonic).
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Nanos>;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
};

// Real monotonic time. Thread-safe.
class SteadyClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  static SteadyClock& instance() { static SteadyClock c; return c; }
};

// Manually advanced time for tests and simulation. Not thread-safe.
class ManualClock final : public Clock {
 public:
  TimePoint now() const override { return now_; }
  void advance(Nanos d) { now_ += d; }
  void set(TimePoint t) { now_ = t; }
 private:
  TimePoint now_{};
};

class Random {
 public:
  virtual ~Random() = default;
  // Uniform in [0, n). n > 0.
  virtual uint64_t below(uint64_t n) = 0;
  // Uniform in [0, 1).
  virtual double unit() = 0;
};

// Seeded pseudo-random source. Thread-safe (internally locked).
class SeededRandom final : public Random {
 public:
  explicit SeededRandom(uint64_t seed) : rng_(seed) {}
  uint64_t below(uint64_t n) override {
    std::lock_guard lk(mu_);
    return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_);
  }
  double unit() override {
    std::lock_guard lk(mu_);
    return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  }
 private:
  std::mutex mu_;
  std::mt19937_64 rng_;
};

}  // namespace kvroute
