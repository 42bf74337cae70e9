// common/http_url.h and router/proxy_policy.h: worker URLs (IPv6
// included) and the adaptive first-byte timeout.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "router/proxy_policy.h"
#include "common/http_url.h"

using namespace kvroute;
using std::chrono::milliseconds;

TEST_CASE("worker urls: names, IPv4, bracketed IPv6, base paths; the rest refused") {
  UpstreamUrl u;
  REQUIRE(parse_url("http://127.0.0.1:8000", u));
  CHECK(u.host == "127.0.0.1");
  CHECK(u.port == "8000");
  CHECK(u.base.empty());
  CHECK_FALSE(u.ipv6);
  REQUIRE(parse_url("http://worker-3.svc/v1base/", u));
  CHECK(u.host == "worker-3.svc");
  CHECK(u.port == "80");
  CHECK(u.base == "/v1base");
  REQUIRE(parse_url("http://[::1]:8000", u));
  CHECK(u.host == "::1");
  CHECK(u.port == "8000");
  CHECK(u.ipv6);
  REQUIRE(parse_url("http://[fd00::12:3]/x", u));
  CHECK(u.host == "fd00::12:3");
  CHECK(u.port == "80");
  CHECK(u.base == "/x");
  CHECK_FALSE(parse_url("https://a:1", u));
  CHECK_FALSE(parse_url("http://[::1:8000", u));
  CHECK_FALSE(parse_url("http://[::1]x:80", u));
  CHECK_FALSE(parse_url("http://:80", u));
  CHECK_FALSE(parse_url("http://a:", u));
  CHECK_FALSE(parse_url("http://a:0", u));
  CHECK_FALSE(parse_url("http://a:65536", u));
  CHECK_FALSE(parse_url("http://a:8x", u));
}

// The timeouts both cases below start from: ceiling 60 s, floor 2 s, 4x a
// prediction at 1,000 prefill tokens/s.
RouterConfig timeout_config() {
  RouterConfig r;
  r.first_byte_timeout_ms = 60000;
  r.first_byte_timeout_min_ms = 2000;
  r.first_byte_timeout_factor = 4;
  r.ttft_prefill_tokens_per_s = 1000;
  return r;
}

TEST_CASE("first-byte timeout: a multiple of the predicted TTFT within floor and ceiling") {
  RouterConfig r = timeout_config();
  CHECK(estimated_ttft_seconds(r, 3000) == doctest::Approx(3.0));
  CHECK(adaptive_first_byte_timeout(r, estimated_ttft_seconds(r, 3000)) == milliseconds(12000));
  CHECK(adaptive_first_byte_timeout(r, estimated_ttft_seconds(r, 10)) == milliseconds(2000));        // floor
  CHECK(adaptive_first_byte_timeout(r, estimated_ttft_seconds(r, 1000000)) == milliseconds(60000));  // ceiling
  CHECK(adaptive_first_byte_timeout(r, std::numeric_limits<double>::quiet_NaN()) == milliseconds(2000));
  r.first_byte_timeout_min_ms = 90000;  // a floor above the ceiling: the ceiling wins
  CHECK(adaptive_first_byte_timeout(r, 0) == milliseconds(60000));
}

TEST_CASE("header timeout: an answer not streamed adds its output budget; a full worker gets the ceiling") {
  RouterConfig r = timeout_config();
  r.decode_tokens_per_s = 10;
  r.response_timeout_ms = 600000;
  // Streamed: the adaptive first-byte timeout, whatever the output budget.
  CHECK(header_timeout(r, {.prefill_tokens = 3000, .streamed = true, .max_tokens = 5000}) == milliseconds(12000));
  // Not streamed: 4 x (3 s of prefill + 500 tokens at 10/s) = 212 s, over the streamed ceiling.
  CHECK(header_timeout(r, {.prefill_tokens = 3000, .streamed = false, .max_tokens = 500}) == milliseconds(212000));
  CHECK(header_timeout(r, {.prefill_tokens = 10, .streamed = false, .max_tokens = 0}) == milliseconds(2000));  // floor
  CHECK(header_timeout(r, {.prefill_tokens = 10, .streamed = false, .max_tokens = 100000}) == milliseconds(600000));
  // No budget (chat without a limit: up to the context): the answer's ceiling.
  CHECK(header_timeout(r, {.prefill_tokens = 10, .streamed = false, .max_tokens = std::nullopt}) == milliseconds(600000));
  // A worker with every slot taken queues the request for an unknown time: the ceiling of its kind.
  CHECK(header_timeout(r, {.prefill_tokens = 10, .streamed = true, .max_tokens = std::nullopt, .slot_free = false}) == milliseconds(60000));
  CHECK(header_timeout(r, {.prefill_tokens = 10, .streamed = false, .max_tokens = 2, .slot_free = false}) ==
        milliseconds(600000));
  // A response ceiling under the first-byte one never shortens an answer's wait.
  r.response_timeout_ms = 1000;
  CHECK(header_timeout(r, {.prefill_tokens = 10, .streamed = false, .max_tokens = std::nullopt}) == milliseconds(60000));
}
