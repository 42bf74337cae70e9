#include "common/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

namespace kvroute::metrics {

size_t shard_index() {
  static std::atomic<size_t> next{0};
  thread_local const size_t shard = next.fetch_add(1, std::memory_order_relaxed) % kShards;
  return shard;
}

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds),
      lines_per_shard_((bounds.size() + 2 + 7) / 8),  // buckets and the sum
      lines_(new Line[lines_per_shard_ * kShards]) {
  for (size_t s = 0; s < kShards; ++s)
    for (size_t i = 0; i < lines_per_shard_ * 8; ++i) slot(s, i).store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  const size_t shard = shard_index();
  slot(shard, i).fetch_add(1, std::memory_order_relaxed);
  // Only this thread's shard changes in practice, so the loop ends at once.
  std::atomic<uint64_t>& sum = slot(shard, bounds_.size() + 1);
  uint64_t old = sum.load(std::memory_order_relaxed);
  while (!sum.compare_exchange_weak(old, std::bit_cast<uint64_t>(std::bit_cast<double>(old) + v),
                                    std::memory_order_relaxed)) {
  }
}

uint64_t Histogram::bucket(size_t i) const {
  uint64_t n = 0;
  for (size_t s = 0; s < kShards; ++s) n += slot(s, i).load(std::memory_order_relaxed);
  return n;
}

uint64_t Histogram::count() const {
  uint64_t n = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) n += bucket(i);
  return n;
}

double Histogram::sum() const {
  double total = 0;
  for (size_t s = 0; s < kShards; ++s)
    total += std::bit_cast<double>(slot(s, bounds_.size() + 1).load(std::memory_order_relaxed));
  return total;
}

double histogram_quantile(const std::vector<double>& bounds, const std::vector<uint64_t>& counts, double q) {
  uint64_t total = 0;
  for (auto c : counts) total += c;
  if (total == 0) return NAN;
  const double rank = q * static_cast<double>(total);
  double seen = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    if (seen + static_cast<double>(counts[i]) >= rank) {
      const double lo = i == 0 ? 0 : bounds[i - 1];
      if (i >= bounds.size()) return lo;  // +Inf bucket: its lower bound
      return lo + (bounds[i] - lo) * (rank - seen) / static_cast<double>(counts[i]);
    }
    seen += static_cast<double>(counts[i]);
  }
  return bounds.empty() ? NAN : bounds.back();
}

std::vector<double> exponential_buckets(double start, double factor, size_t n) {
  std::vector<double> b;
  for (size_t i = 0; i < n; ++i, start *= factor) b.push_back(start);
  return b;
}

std::vector<double> linear_buckets(double start, double width, size_t n) {
  std::vector<double> b;
  for (size_t i = 0; i < n; ++i) b.push_back(start + width * static_cast<double>(i));
  return b;
}

namespace {

void escape_label(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
}

std::string label_text(const std::vector<std::string>& names, const std::vector<std::string>& values,
                       std::string_view extra_name = {}, std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return "";
  std::string s = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) s += ',';
    s += names[i];
    s += "=\"";
    escape_label(s, values[i]);
    s += '"';
  }
  if (!extra_name.empty()) {
    if (!names.empty()) s += ',';
    s += fmt::format("{}=\"{}\"", extra_name, extra_value);
  }
  s += '}';
  return s;
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

template <class M>
constexpr std::string_view type_name() {
  if constexpr (std::is_same_v<M, Counter>) return "counter";
  else if constexpr (std::is_same_v<M, Gauge>) return "gauge";
  else return "histogram";
}

}  // namespace

namespace {

// One slot of a thread's child cache: the family, its generation, and the
// label values joined with '\0'.
struct CachedChild {
  uint64_t family = 0;  // Family's id
  uint64_t generation = 0;
  size_t hash = 0;
  std::string key;
  void* child = nullptr;
};
constexpr size_t kCacheSlots = 256;
thread_local std::array<CachedChild, kCacheSlots> t_child_cache;

bool same_key(const std::string& joined, std::span<const std::string_view> key) {
  size_t pos = 0;
  for (std::string_view v : key) {
    if (joined.size() < pos + v.size() + 1 || std::memcmp(joined.data() + pos, v.data(), v.size()) != 0 ||
        joined[pos + v.size()] != '\0')
      return false;
    pos += v.size() + 1;
  }
  return pos == joined.size();
}

// Picks a cache slot from each label value's length and first and last 8
// bytes (two loads, whatever the length). A collision only costs a lookup.
size_t key_hash(uint64_t family, std::span<const std::string_view> key) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = (family + 1) * kMul;
  for (std::string_view v : key) {
    uint64_t head = 0, tail = 0;
    const size_t n = std::min<size_t>(v.size(), 8);
    std::memcpy(&head, v.data(), n);
    std::memcpy(&tail, v.data() + v.size() - n, n);
    h = (std::rotl(h, 23) ^ head ^ (uint64_t{v.size()} << 56)) * kMul;
    h = (std::rotl(h, 23) ^ tail) * kMul;
  }
  return static_cast<size_t>(h ^ (h >> 32));
}

}  // namespace

template <class M>
M& Family<M>::with(std::initializer_list<std::string_view> values) {
  // Pad missing values with "" (a family used without some labels).
  std::array<std::string_view, 8> padded{};
  std::copy_n(values.begin(), std::min(values.size(), padded.size()), padded.begin());
  const std::span<const std::string_view> key(padded.data(), labels_.size());
  const size_t hash = key_hash(id_, key);
  CachedChild& slot = t_child_cache[hash % kCacheSlots];
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  if (slot.family == id_ && slot.hash == hash && slot.generation == generation && same_key(slot.key, key))
    return *static_cast<M*>(slot.child);
  M& child = lookup(key);
  slot.family = id_;
  slot.generation = generation;
  slot.hash = hash;
  slot.key.clear();
  for (std::string_view v : key) (slot.key += v) += '\0';
  slot.child = &child;
  return child;
}

template <class M>
M& Family<M>::lookup(std::span<const std::string_view> key) {
  {
    std::shared_lock lk(mu_);
    auto it = children_.find(key);
    if (it != children_.end()) return *it->second;
  }
  std::unique_lock lk(mu_);
  auto it = children_.find(key);
  if (it != children_.end()) return *it->second;
  std::unique_ptr<M> child;
  if constexpr (std::is_same_v<M, Histogram>) child = std::make_unique<M>(bounds_);
  else child = std::make_unique<M>();
  M& ref = *child;
  children_.emplace(std::vector<std::string>(key.begin(), key.end()), std::move(child));
  return ref;
}

template <class M>
void Family<M>::remove(std::initializer_list<std::string_view> values) {
  std::vector<std::string> key(values.begin(), values.end());
  key.resize(labels_.size());
  std::unique_lock lk(mu_);
  auto it = children_.find(key);
  if (it == children_.end()) return;
  retired_.push_back(std::move(it->second));  // a thread may still hold it from its cache
  children_.erase(it);
  generation_.fetch_add(1, std::memory_order_acq_rel);
}

template <class M>
void Family<M>::render(std::string& out) const {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name_, help_, name_, type_name<M>());
  std::shared_lock lk(mu_);
  for (const auto& [values, m] : children_) {
    if constexpr (std::is_same_v<M, Histogram>) {
      uint64_t cum = 0;
      for (size_t i = 0; i < m->bounds().size(); ++i) {
        cum += m->bucket(i);
        out += fmt::format("{}_bucket{} {}\n", name_, label_text(labels_, values, "le", number(m->bounds()[i])), cum);
      }
      cum += m->bucket(m->bounds().size());
      out += fmt::format("{}_bucket{} {}\n", name_, label_text(labels_, values, "le", "+Inf"), cum);
      out += fmt::format("{}_sum{} {}\n", name_, label_text(labels_, values), number(m->sum()));
      out += fmt::format("{}_count{} {}\n", name_, label_text(labels_, values), cum);  // = the +Inf bucket
    } else {
      out += fmt::format("{}{} {}\n", name_, label_text(labels_, values), number(static_cast<double>(m->value())));
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

void Samples::add_text(std::initializer_list<std::string_view> values, std::string_view v) {
  assert(values.size() == labels_.size() && "one value per label name");
  out_ += name_;
  if (!labels_.empty()) {
    out_ += '{';
    size_t i = 0;
    for (std::string_view value : values) {
      if (i) out_ += ',';
      out_ += labels_[i++];
      out_ += "=\"";
      escape_label(out_, value);
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += v;
  out_ += '\n';
}

void Samples::add_double(std::initializer_list<std::string_view> values, double v) {
  add_text(values, number(v));
}

void Registry::collect(Type type, std::string name, std::string help, std::vector<std::string> labels,
                       std::function<void(Samples&)> collect) {
  const std::string_view type_name = type == Type::Counter ? "counter" : type == Type::Gauge ? "gauge" : "histogram";
  std::string head = fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type_name);
  std::lock_guard lk(mu_);
  renderers_.push_back([name = std::move(name), head = std::move(head), labels = std::move(labels),
                        collect = std::move(collect)](std::string& out) {
    out += head;
    Samples samples(out, name, labels);
    collect(samples);
  });
}

CounterFamily& Registry::counter(std::string name, std::string help, std::vector<std::string> labels) {
  std::lock_guard lk(mu_);
  counters_.push_back(std::make_unique<CounterFamily>(std::move(name), std::move(help), std::move(labels)));
  auto* f = counters_.back().get();
  renderers_.push_back([f](std::string& out) { f->render(out); });
  return *f;
}

GaugeFamily& Registry::gauge(std::string name, std::string help, std::vector<std::string> labels) {
  std::lock_guard lk(mu_);
  gauges_.push_back(std::make_unique<GaugeFamily>(std::move(name), std::move(help), std::move(labels)));
  auto* f = gauges_.back().get();
  renderers_.push_back([f](std::string& out) { f->render(out); });
  return *f;
}

HistogramFamily& Registry::histogram(std::string name, std::string help, std::vector<double> bounds,
                                     std::vector<std::string> labels) {
  std::lock_guard lk(mu_);
  histograms_.push_back(
      std::make_unique<HistogramFamily>(std::move(name), std::move(help), std::move(labels), std::move(bounds)));
  auto* f = histograms_.back().get();
  renderers_.push_back([f](std::string& out) { f->render(out); });
  return *f;
}

void Registry::on_scrape(std::function<void()> fn) {
  std::lock_guard lk(mu_);
  scrape_hooks_.push_back(std::move(fn));
}

std::string Registry::render() const {
  std::vector<std::function<void()>> hooks;
  std::vector<std::function<void(std::string&)>> renderers;
  {
    std::lock_guard lk(mu_);
    hooks = scrape_hooks_;
    renderers = renderers_;
  }
  for (auto& h : hooks) h();
  std::string out;
  for (auto& r : renderers) r(out);
  return out;
}

}  // namespace kvroute::metrics
