#include "router/api/response_affinity.h"

#include <algorithm>

namespace kvroute {

std::optional<WorkerId> ResponseAffinity::find(std::string_view id) {
  std::lock_guard lk(mu_);
  const auto it = ids_.find(id);
  if (it == ids_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.worker;
}

void ResponseAffinity::remember(std::string_view id, WorkerId worker) {
  if (id.empty() || id.size() > kMaxIdBytes) return;
  std::lock_guard lk(mu_);
  if (const auto it = ids_.find(id); it != ids_.end()) {
    it->second.worker = worker;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return;
  }
  lru_.emplace_front(id);
  ids_.emplace(std::string_view(lru_.front()), Entry{worker, lru_.begin()});
  while (ids_.size() > max_) {
    ids_.erase(std::string_view(lru_.back()));
    lru_.pop_back();
  }
}

size_t ResponseAffinity::size() const {
  std::lock_guard lk(mu_);
  return ids_.size();
}

ResponseAffinity::Pin ResponseAffinity::pin(WorkerId worker, uint32_t block_size, RouteResult& r) {
  if (!r.ok || r.ranked.empty()) return Pin::WorkerGone;
  if (r.ranked.front().worker == worker) return Pin::Pinned;
  size_t i = 0;
  while (i < r.candidates.size() && r.candidates[i].owner.worker != worker) ++i;
  if (i == r.candidates.size() || !r.workers[i].info) return Pin::WorkerGone;
  const auto& c = r.candidates[i];
  const auto it =
      std::find_if(r.ranked.begin(), r.ranked.end(), [&](const RouteTarget& t) { return t.worker == worker; });
  RouteTarget t;
  if (it != r.ranked.end()) {
    t = *it;
    r.ranked.erase(it);
  } else {
    t = route_target(worker, *r.workers[i].info, c.overlap_blocks, c.owner.dp_rank, r.isl_tokens, block_size);
  }
  r.ranked.insert(r.ranked.begin(), t);
  r.decision.chosen = i;
  return Pin::Pinned;
}

std::string_view to_string(ResponseAffinity::Pin p) {
  switch (p) {
    case ResponseAffinity::Pin::Pinned: return "pinned";
    case ResponseAffinity::Pin::Unknown: return "unknown";
    case ResponseAffinity::Pin::WorkerGone: return "worker_gone";
  }
  return "unknown";
}

namespace {

enum class Match : uint8_t { Yes, NeedMore, No };

// A cursor over the scanned bytes: each step matches one token after
// optional JSON whitespace.
struct Cursor {
  std::string_view s;
  size_t i = 0;
  Match ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
    return i < s.size() ? Match::Yes : Match::NeedMore;
  }
  Match lit(std::string_view t) {
    if (Match m = ws(); m != Match::Yes) return m;
    const size_t n = std::min(t.size(), s.size() - i);
    if (s.compare(i, n, t.substr(0, n)) != 0) return Match::No;
    if (n < t.size()) return Match::NeedMore;
    i += n;
    return Match::Yes;
  }
  // `"id" : "<value>"` with no escape in the value.
  Match id_field(std::string& out) {
    for (std::string_view t : {std::string_view("\"id\""), std::string_view(":"), std::string_view("\"")})
      if (Match m = lit(t); m != Match::Yes) return m;
    const size_t end = s.find('"', i);
    const size_t esc = s.find('\\', i);
    if (esc < end) return Match::No;
    if (end == std::string_view::npos) return Match::NeedMore;
    out.assign(s.substr(i, end - i));
    return Match::Yes;
  }
};

}  // namespace

void ResponseIdScanner::feed(std::string_view bytes) {
  if (done_) return;
  head_.append(bytes.substr(0, kMaxScanBytes - head_.size()));
  scan();
  if (!done_ && head_.size() >= kMaxScanBytes) done_ = true;
  if (done_) head_ = std::string();
}

void ResponseIdScanner::scan() {
  std::string id;
  Match m = Match::No;
  if (!stream_) {
    Cursor c{head_};
    m = c.lit("{");
    if (m == Match::Yes) m = c.id_field(id);
  } else {
    // The first `"response"` key followed by an object whose first key is id.
    for (size_t at = head_.find("\"response\""); at != std::string::npos; at = head_.find("\"response\"", at + 1)) {
      Cursor c{head_, at + 10};
      m = c.lit(":");
      if (m == Match::Yes) m = c.lit("{");
      if (m == Match::Yes) m = c.id_field(id);
      if (m != Match::No) break;
    }
    if (m == Match::No) m = Match::NeedMore;  // a later event may hold it, within the scanned bytes
  }
  if (m == Match::NeedMore) return;
  done_ = true;
  if (m == Match::Yes && !id.empty() && id.size() <= ResponseAffinity::kMaxIdBytes) id_ = std::move(id);
}

}  // namespace kvroute
