// Minimal Prometheus metrics: counters, gauges, histograms with bounded label
// sets, and text exposition (format 0.0.4). No prometheus-cpp in Debian.
//
// Thread-safety: every metric update is a relaxed atomic (lock-free). Creating
// a labelled child takes the family's mutex once; callers on hot paths keep the
// returned reference. Rendering (scrape) takes each family's mutex briefly.
// Metric objects live as long as the Registry; references stay valid.
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvroute::metrics {

// Counters and histograms are striped: each thread adds to its own shard (a
// cache line of its own), and a scrape sums the shards. On the router's hot
// path every io thread updates the same few dozen series per request; one
// shared atomic per series would move its cache line between cores each time.
inline constexpr size_t kShards = 8;
// The calling thread's shard (threads are given shards round-robin).
size_t shard_index();

class Counter {
 public:
  void inc(uint64_t n = 1) { shards_[shard_index()].v.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const {
    uint64_t sum = 0;
    for (const auto& s : shards_) sum += s.v.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  struct alignas(64) Shard {
    std::atomic<uint64_t> v{0};
  };
  Shard shards_[kShards];
};

class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double d) { v_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }
 private:
  std::atomic<double> v_{0};
};

class Histogram {
 public:
  // `bounds` are the upper bounds of the buckets, ascending (+Inf is implicit).
  explicit Histogram(const std::vector<double>& bounds);
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  uint64_t bucket(size_t i) const;  // not cumulative
  uint64_t count() const;
  double sum() const;

 private:
  // Per shard, `lines_per_shard_` cache lines of their own: the buckets
  // (bounds_.size() + 1, the last is +Inf), then the sum (a double's bits).
  struct alignas(64) Line {
    std::atomic<uint64_t> slot[8];
  };
  std::atomic<uint64_t>& slot(size_t shard, size_t i) const {
    return lines_[shard * lines_per_shard_ + i / 8].slot[i % 8];
  }
  std::vector<double> bounds_;
  size_t lines_per_shard_;
  std::unique_ptr<Line[]> lines_;
};

// Exponential bucket bounds: start, start*factor, ... (n bounds).
std::vector<double> exponential_buckets(double start, double factor, size_t n);
std::vector<double> linear_buckets(double start, double width, size_t n);
// Quantile q (0..1) of a histogram with `bounds` and per-bucket `counts`
// (the last is +Inf), interpolated linearly inside the bucket (as
// Prometheus' histogram_quantile()); NaN if empty.
double histogram_quantile(const std::vector<double>& bounds, const std::vector<uint64_t>& counts, double q);

enum class Type { Counter, Gauge, Histogram };

inline std::atomic<uint64_t> next_family_id{1};

// A metric name with a fixed list of label names and one child per label values.
template <class M>
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> labels, std::vector<double> bounds = {})
      : name_(std::move(name)), help_(std::move(help)), labels_(std::move(labels)), bounds_(std::move(bounds)) {
    assert(labels_.size() <= 8 && "at most 8 labels per family (with() pads on the stack)");
    if (labels_.empty()) plain_ = &with({});
  }

  // The child for these label values (in label-name order); created on first use.
  M& with(std::initializer_list<std::string_view> values);
  // The child without labels (for families declared with no label names):
  // no lookup, no lock.
  M& get() { return plain_ ? *plain_ : with({}); }
  // Removes a child (e.g. a worker that left), so label sets stay bounded.
  void remove(std::initializer_list<std::string_view> values);
  // Calls f(label values, child) for every child, under the family's shared
  // lock: f must not call into this family.
  template <class F>
  void for_each(F&& f) const {
    std::shared_lock lk(mu_);
    for (const auto& [labels, child] : children_) f(labels, *child);
  }

  void render(std::string& out) const;
  const std::string& name() const { return name_; }
  // For a caller that remembers a child itself: the family's id (unique, never
  // reused) and its generation (changes whenever a child is removed).
  uint64_t id() const { return id_; }
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

 private:
  std::string name_, help_;
  std::vector<std::string> labels_;
  std::vector<double> bounds_;
  // Label values -> child. Lookups compare against the caller's string_views
  // without allocating, under a shared lock; only a new child takes the
  // exclusive lock.
  struct KeyLess {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                          [](std::string_view x, std::string_view y) { return x < y; });
    }
  };
  mutable std::shared_mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<M>, KeyLess> children_;
  M* plain_ = nullptr;  // the only child of a family without labels
  // Each thread remembers the children it looked up (a small direct-mapped
  // cache, router hot path: no lock, no tree walk). remove() bumps the
  // generation, which invalidates every cached entry, and keeps the removed
  // child alive in `retired_`, so a lookup racing with it never touches freed
  // memory.
  std::atomic<uint64_t> generation_{0};
  std::vector<std::unique_ptr<M>> retired_;
  // Names this family in the caches (not its address: a later family may
  // reuse it); unique across counter, gauge and histogram families.
  const uint64_t id_ = next_family_id.fetch_add(1, std::memory_order_relaxed);
  M& lookup(std::span<const std::string_view> key);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// The samples of a collected metric (Registry::collect()), written straight
// into the exposition while it renders. Valid only inside the collect call.
class Samples {
 public:
  // One sample: its label values in label-name order, and its value
  // (integers printed exactly).
  template <class T>
    requires std::is_arithmetic_v<T>
  void add(std::initializer_list<std::string_view> values, T v) {
    if constexpr (std::is_integral_v<T>) add_text(values, std::to_string(v));
    else add_double(values, static_cast<double>(v));
  }

 private:
  friend class Registry;
  Samples(std::string& out, const std::string& name, const std::vector<std::string>& labels)
      : out_(out), name_(name), labels_(labels) {}
  void add_double(std::initializer_list<std::string_view> values, double v);
  void add_text(std::initializer_list<std::string_view> values, std::string_view v);
  std::string& out_;
  const std::string& name_;
  const std::vector<std::string>& labels_;
};

// Owns families and scrape-time callbacks; renders the exposition.
class Registry {
 public:
  // A metric read at scrape time from state its module keeps anyway (atomic
  // counters in a stats struct, sizes, the fleet): `collect` adds its samples
  // on every render (none: only the HELP and TYPE lines). It runs during
  // render(), on the scraping thread, so what it reads must be thread-safe;
  // it must outlive the registry's renders. Nothing is added to the code that
  // counts, and a series disappears when `collect` stops adding it.
  void collect(Type type, std::string name, std::string help, std::vector<std::string> labels,
               std::function<void(Samples&)> collect);
  // An unlabelled counter or gauge read at scrape time (collect() with one sample).
  template <class F>
  void counter_fn(std::string name, std::string help, F value) {
    collect(Type::Counter, std::move(name), std::move(help), {}, [value](Samples& s) { s.add({}, value()); });
  }
  template <class F>
  void gauge_fn(std::string name, std::string help, F value) {
    collect(Type::Gauge, std::move(name), std::move(help), {}, [value](Samples& s) { s.add({}, value()); });
  }

  CounterFamily& counter(std::string name, std::string help, std::vector<std::string> labels = {});
  GaugeFamily& gauge(std::string name, std::string help, std::vector<std::string> labels = {});
  HistogramFamily& histogram(std::string name, std::string help, std::vector<double> bounds,
                             std::vector<std::string> labels = {});
  // Runs `fn` before every render (to refresh gauges computed from state).
  void on_scrape(std::function<void()> fn);

  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::function<void(std::string&)>> renderers_;
  std::vector<std::unique_ptr<CounterFamily>> counters_;
  std::vector<std::unique_ptr<GaugeFamily>> gauges_;
  std::vector<std::unique_ptr<HistogramFamily>> histograms_;
  std::vector<std::function<void()>> scrape_hooks_;
};

}  // namespace kvroute::metrics
