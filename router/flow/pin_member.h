// One top-level member of a JSON request body replaced by kvroute's value
// (a tenant's pinned cache_salt, the band's engine priority), the client's
// bytes otherwise unchanged.
//
// Threading: a pure function.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvroute::flow {

// A top-level member pinned in the forwarded body: every top-level `key`
// member the client sent is removed and `key: value` is appended as the
// object's last member, so every JSON parser reads the pinned one
// (first-wins and last-wins alike). False (the body unchanged) when a
// top-level key holds an escape: it might spell `key`, so the caller refuses
// the request. `body` is a JSON object the parser accepted; `key` needs no
// escaping and `value` is valid JSON text (the caller's to check).
inline bool pin_member(std::string& body, std::string_view key_name, std::string_view value) {
  const auto ws = [&](size_t i) {
    while (i < body.size() && (body[i] == ' ' || body[i] == '\n' || body[i] == '\r' || body[i] == '\t')) ++i;
    return i;
  };
  const auto skip_string = [&](size_t i) {  // at '"': past the closing quote
    for (++i; i < body.size(); ++i) {
      if (body[i] == '\\') ++i;
      else if (body[i] == '"') return i + 1;
    }
    return body.size();
  };
  const auto skip_value = [&](size_t i) {  // past one value
    if (i < body.size() && body[i] == '"') return skip_string(i);
    int depth = 0;
    for (; i < body.size(); ++i) {
      const char c = body[i];
      if (c == '"') {
        i = skip_string(i) - 1;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (depth == 0) return i;
        if (--depth == 0) return i + 1;
      } else if (c == ',' && depth == 0) {
        return i;
      }
    }
    return i;
  };
  size_t i = ws(0);
  if (i >= body.size() || body[i] != '{') return false;
  // Members as [start, end) spans (key through value), in order.
  std::vector<std::pair<size_t, size_t>> drop;
  size_t last_end = 0;  // end of the last member kept or not
  bool any = false;
  i = ws(i + 1);
  while (i < body.size() && body[i] == '"') {
    const size_t key_start = i;
    const size_t key_end = skip_string(i);
    const std::string_view key(body.data() + key_start + 1, key_end - key_start - 2);
    if (key.find('\\') != std::string_view::npos) return false;
    i = ws(key_end);
    if (i >= body.size() || body[i] != ':') return false;
    i = skip_value(ws(i + 1));
    if (key == key_name) drop.emplace_back(key_start, i);
    last_end = i;
    any = true;
    i = ws(i);
    if (i < body.size() && body[i] == ',') i = ws(i + 1);
  }
  const size_t close = ws(any ? last_end : i);
  if (close >= body.size() || body[close] != '}') return false;
  // Append first (positions before `close` stay valid), then drop back to front.
  body.insert(close, fmt::format("{}\"{}\":{}", any ? "," : "", key_name, value));
  for (auto it = drop.rbegin(); it != drop.rend(); ++it) {
    // The member and the comma (and space) after it; it is never the last
    // member now: the pinned one follows.
    size_t end = ws(it->second);
    if (end < body.size() && body[end] == ',') end = ws(end + 1);
    body.erase(it->first, end - it->first);
  }
  return true;
}

}  // namespace kvroute::flow
