#include "router/api/response_id.h"

#include <algorithm>
#include <cstdint>

namespace kvroute {

namespace {

enum class Match : uint8_t { Yes, NeedMore, No };

// A cursor over the scanned bytes: each step matches one token after
// optional JSON whitespace. Every step looks at a bounded number of bytes
// (at most kMaxSpace of whitespace, an id of at most kMaxIdBytes), so
// scanning again after each piece costs O(1) per piece, however a worker
// splits its answer.
struct Cursor {
  static constexpr size_t kMaxSpace = 64;  // vLLM and OpenAI write none or one
  std::string_view s;
  size_t i = 0;
  Match ws() {
    const size_t start = i;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) {
      if (++i - start > kMaxSpace) return Match::No;
    }
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
  // `"id" : "<value>"`: a value of 1..kMaxIdBytes bytes with no escape.
  Match id_field(std::string& out) {
    for (std::string_view t : {std::string_view("\"id\""), std::string_view(":"), std::string_view("\"")})
      if (Match m = lit(t); m != Match::Yes) return m;
    const std::string_view value = s.substr(i, ResponseIdScanner::kMaxIdBytes + 1);
    const size_t end = value.find_first_of("\"\\");
    if (end == std::string_view::npos)
      return value.size() > ResponseIdScanner::kMaxIdBytes ? Match::No : Match::NeedMore;
    if (value[end] != '"' || end == 0) return Match::No;
    out.assign(value.substr(0, end));
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
    // The first `"response"` key followed by an object whose first key is
    // id. Occurrences decided No are not looked at again (from_).
    constexpr std::string_view kKey = "\"response\"";
    m = Match::NeedMore;
    size_t at = head_.find(kKey, from_);
    for (; at != std::string::npos; at = head_.find(kKey, at + 1)) {
      Cursor c{head_, at + kKey.size()};
      m = c.lit(":");
      if (m == Match::Yes) m = c.lit("{");
      if (m == Match::Yes) m = c.id_field(id);
      if (m != Match::No) break;
      from_ = at + 1;
    }
    if (at == std::string::npos) {
      m = Match::NeedMore;  // a later event may hold it, within the scanned bytes
      if (head_.size() >= kKey.size()) from_ = std::max(from_, head_.size() - kKey.size() + 1);
    } else if (m == Match::NeedMore) {
      from_ = at;
    }
  }
  if (m == Match::NeedMore) return;
  done_ = true;
  if (m == Match::Yes) id_ = std::move(id);
}

}  // namespace kvroute
