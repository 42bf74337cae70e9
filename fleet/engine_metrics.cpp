#include "fleet/engine_metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

namespace kvroute {

namespace {

struct Sample {
  std::string_view name;
  std::string_view labels;  // without braces
  double value = 0;
};

// One exposition line: name[{labels}] value [timestamp]. False for comments,
// blank lines and anything malformed.
bool parse_line(std::string_view line, Sample& s) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  if (line.empty() || line.front() == '#') return false;
  size_t i = line.find_first_of("{ ");
  if (i == std::string_view::npos || i == 0) return false;
  s.name = line.substr(0, i);
  s.labels = {};
  if (line[i] == '{') {
    // Label values may hold '}' inside quotes: scan quoted strings.
    size_t j = i + 1;
    bool quoted = false;
    for (; j < line.size(); ++j) {
      if (quoted && line[j] == '\\') { ++j; continue; }
      if (line[j] == '"') quoted = !quoted;
      else if (!quoted && line[j] == '}') break;
    }
    if (j >= line.size()) return false;
    s.labels = line.substr(i + 1, j - i - 1);
    i = j + 1;
  }
  while (i < line.size() && line[i] == ' ') ++i;
  std::string_view v = line.substr(i);
  v = v.substr(0, v.find(' '));
  if (v == "NaN" || v == "+Inf" || v == "-Inf") return false;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), s.value);
  return ec == std::errc() && p == v.data() + v.size() && std::isfinite(s.value);
}

std::optional<uint64_t> label_u64(std::string_view labels, std::string_view key) {
  const std::string needle = std::string(key) + "=\"";
  size_t at = 0;
  while ((at = labels.find(needle, at)) != std::string_view::npos) {
    if (at == 0 || labels[at - 1] == ',' || labels[at - 1] == ' ') break;
    at += needle.size();
  }
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view v = labels.substr(at + needle.size());
  v = v.substr(0, v.find('"'));
  uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  return x;
}

// Larger values are not believed (the series is skipped): one engine's KV
// capacity in blocks or tokens, so that sums cannot wrap and tokens convert to
// an integer; a block size (the heartbeat's bound).
constexpr uint64_t kMaxCapacity = uint64_t{1} << 32;
constexpr uint64_t kMaxBlockSize = 1 << 20;

// Capacity-weighted usage: sum(usage_i * cap_i) / sum(cap_i); with unknown
// capacities, the plain mean.
struct UsageAcc {
  double sum = 0;
  int n = 0;
  void add(double v) { sum += v, ++n; }
  std::optional<double> mean() const { return n ? std::optional<double>(sum / n) : std::nullopt; }
};

}  // namespace

std::optional<EngineMetrics> parse_engine_metrics(std::string_view text) {
  EngineMetrics m;
  UsageAcc usage, old_usage;
  bool vllm = false, sglang = false;
  uint64_t blocks = 0, tokens = 0;
  bool have_blocks = false, have_tokens = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    Sample s;
    if (parse_line(text.substr(pos, end - pos), s)) {
      const std::string_view n = s.name;
      if (n == "vllm:num_requests_running") m.running += s.value, vllm = true;
      else if (n == "vllm:num_requests_waiting") m.waiting += s.value, vllm = true;
      else if (n == "vllm:kv_cache_usage_perc") usage.add(s.value), vllm = true;
      else if (n == "vllm:gpu_cache_usage_perc") old_usage.add(s.value), vllm = true;
      else if (n == "vllm:cache_config_info") {
        vllm = true;
        if (auto b = label_u64(s.labels, "num_gpu_blocks"); b && *b <= kMaxCapacity) blocks += *b, have_blocks = true;
        if (auto bs = label_u64(s.labels, "block_size"); bs && *bs >= 1 && *bs <= kMaxBlockSize)
          m.block_size = static_cast<uint32_t>(*bs);
      } else if (n == "sglang:num_running_reqs") m.running += s.value, sglang = true;
      else if (n == "sglang:num_queue_reqs") m.waiting += s.value, sglang = true;
      else if (n == "sglang:token_usage") usage.add(s.value), sglang = true;
      else if (n == "sglang:max_total_num_tokens" && s.value <= kMaxCapacity) {
        tokens += static_cast<uint64_t>(std::max(0.0, s.value)), have_tokens = true, sglang = true;
      }
    }
    pos = end + 1;
  }
  if (!vllm && !sglang) return std::nullopt;
  m.kind = vllm ? EngineKind::Vllm : EngineKind::Sglang;
  m.kv_usage = usage.mean() ? usage.mean() : old_usage.mean();
  if (m.kv_usage) m.kv_usage = std::clamp(*m.kv_usage, 0.0, 1.0);
  if (have_blocks && blocks > 0) m.kv_total_blocks = blocks;
  if (have_tokens && tokens > 0) m.kv_total_tokens = tokens;
  m.running = std::max(0.0, m.running);
  m.waiting = std::max(0.0, m.waiting);
  return m;
}

WorkerLoad to_worker_load(const EngineMetrics& m, uint32_t block_size, uint32_t max_seqs, uint64_t kv_blocks) {
  WorkerLoad l;
  l.request_active_slots = static_cast<uint32_t>(std::min(m.running, 4e9));
  l.request_total_slots = max_seqs;
  l.num_requests_waiting = static_cast<uint32_t>(std::min(m.waiting, 4e9));
  uint64_t total = kv_blocks;
  if (m.kv_total_blocks) total = *m.kv_total_blocks;
  else if (m.kv_total_tokens && block_size > 0) total = *m.kv_total_tokens / block_size;
  if (total == 0) total = 10000;  // usage-only: ratios are all the scheduler reads
  l.kv_total_blocks = total;
  l.kv_active_blocks = static_cast<uint64_t>(std::llround(m.kv_usage.value_or(0) * static_cast<double>(total)));
  return l;
}

}  // namespace kvroute
