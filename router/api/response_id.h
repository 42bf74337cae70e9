// The id of a Responses API answer, read from the first bytes a worker sends
// (untrusted input) for previous_response_id affinity (response_affinity.h).
// Pure; a scanner belongs to one exchange (one thread).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvroute {

// Finds a Responses answer's id in the first bytes of its body, fed piece by
// piece as they are relayed: the top-level `id` of a JSON body (its first key,
// as vLLM and OpenAI write it), or in an SSE stream the first
// `"response":{"id":...}` (the `response.created` event, which comes first;
// `id` the response object's first key). Only the first kMaxScanBytes are
// looked at and kept. The same bytes give the same id however they are split.
class ResponseIdScanner {
 public:
  static constexpr size_t kMaxScanBytes = 8192;
  static constexpr size_t kMaxIdBytes = 256;  // a longer id is not taken
  explicit ResponseIdScanner(bool stream) : stream_(stream) {}
  // False once the id is found or the scan gave up: nothing more to feed.
  bool wants_more() const { return !done_; }
  void feed(std::string_view bytes);
  // The id, once found.
  const std::optional<std::string>& id() const { return id_; }

 private:
  void scan();
  bool stream_;
  bool done_ = false;
  size_t from_ = 0;  // a stream: where the next search for `"response"` starts
  std::string head_;
  std::optional<std::string> id_;
};

}  // namespace kvroute
