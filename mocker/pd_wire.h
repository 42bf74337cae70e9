// The disaggregation emulation's shared pieces (pd_server.cpp, pd_sglang.cpp):
// the side channel's JSON readers and error bodies, and the rate limit of its
// warnings.
//
// Threading: plain functions; pd_parser() is one parser per thread.
#pragma once

#include <fmt/format.h>
#include <simdjson.h>

#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "mocker/pd.h"
#include "router/openai_request.h"

namespace kvroute::mocker {

inline simdjson::dom::parser& pd_parser() {
  thread_local simdjson::dom::parser parser;
  return parser;
}

// Degraded input is logged at warn, rate-limited: the 1st, 2nd, 4th, 8th... time per process.
inline bool log_now(uint64_t n) { return (n & (n - 1)) == 0; }

inline std::string join_hashes(const std::vector<SequenceHash>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) fmt::format_to(std::back_inserter(out), "{}{}", i ? "," : "", v[i].value);
  return out;
}

inline PdError pd_error_from_name(std::string_view name) {
  for (PdError e : kPdErrors)
    if (name == pd_error_name(e)) return e;
  return PdError::Unreachable;
}

// A side-channel refusal: OpenAI's error body with the PdError's name as its code.
inline std::string side_error(PdError e, std::string_view message) {
  return error_body(ApiError{400, std::string(message), "invalid_request_error", "", pd_error_name(e)});
}

// Reads {"blocks":[u64...]} from a side-channel answer.
inline bool read_blocks(std::string_view body, std::vector<SequenceHash>& out) {
  simdjson::dom::array a;
  if (pd_parser().parse(body.data(), body.size(), true)["blocks"].get_array().get(a)) return false;
  for (simdjson::dom::element e : a) {
    uint64_t h = 0;
    if (e.get_uint64().get(h) || out.size() >= kMaxRemoteBlocks) return false;
    out.push_back(SequenceHash{h});
  }
  return true;
}

// The PdError named by a side-channel error answer (Unreachable: none).
inline PdError read_error_code(std::string_view body) {
  std::string_view code;
  if (pd_parser().parse(body.data(), body.size(), true)["error"]["code"].get_string().get(code))
    return PdError::Unreachable;
  return pd_error_from_name(code);
}

}  // namespace kvroute::mocker
