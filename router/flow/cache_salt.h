// A tenant's pinned cache_salt written into the request body kvroute
// forwards (flow.tenants cache_salt): tenants never share prefix cache even
// when their clients send no salt, or another tenant's.
//
// Threading: a pure function.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "router/flow/pin_member.h"

namespace kvroute::flow {

// The tenant's pinned salt into the forwarded body (pin_member(): the
// client's `cache_salt` members removed, the pinned one appended last). False
// (the body unchanged) when a top-level key holds an escape: it might spell
// cache_salt, so the caller refuses the request. The salt is validated at
// config load (no quotes, backslashes, controls).
inline bool pin_cache_salt(std::string& body, std::string_view salt) {
  return pin_member(body, "cache_salt", fmt::format("\"{}\"", salt));
}

}  // namespace kvroute::flow
