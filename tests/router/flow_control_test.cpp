// router/flow/flow_control.h and sha256.h: SHA-256 against FIPS 180-4's
// vectors, the keys file (hashed keys -> tenant; both headers; errors keep
// the old keys), bands from vLLM's priority and the header, the token
// buckets' Retry-After, and the config's flow.* parsers.
#include "router/flow/flow_control.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "router/flow/cache_salt.h"
#include "router/flow/sha256.h"
#include "tests/support/temp_file.h"

using namespace kvroute;
using namespace kvroute::flow;
using kvroute::testing::temp_file;

namespace {

std::shared_ptr<const Config> config_with(const std::string& tenants, const std::string& bands,
                                          const std::string& keys_file = "") {
  auto c = std::make_shared<Config>();
  c->flow.tenants = tenants;
  if (!bands.empty()) c->flow.bands = bands;
  c->flow.keys_file = keys_file;
  REQUIRE_FALSE(validate(*c).has_value());
  return c;
}

}  // namespace

TEST_CASE("sha256: FIPS 180-4 vectors, hex round trip, constant-time compare") {
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(to_hex(sha256(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256Digest d;
  REQUIRE(from_hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD", d));
  CHECK(equal_constant_time(d, sha256("abc")));
  CHECK_FALSE(equal_constant_time(d, sha256("abd")));
  CHECK_FALSE(from_hex("xyz", d));
}

TEST_CASE("flow config: bands and tenants parse and validate") {
  std::vector<BandEntry> b;
  REQUIRE_FALSE(parse_band_entries("name=urgent,max_priority=-10;name=high,max_priority=0;name=low", b));
  REQUIRE(b.size() == 3);
  CHECK(b[0].max_priority_value == -10);
  CHECK_FALSE(b[2].bounded);
  CHECK(parse_band_entries("name=a;name=b", b).value().find("must be last") != std::string::npos);
  CHECK(parse_band_entries("name=a,max_priority=5;name=b,max_priority=1", b).value().find("grow") != std::string::npos);
  CHECK(parse_band_entries("name=a,max_priority=x", b).has_value());
  CHECK(parse_band_entries("", b).has_value());
  REQUIRE_FALSE(parse_band_entries("name=high,max_priority=-1;name=normal,reserve_pct=25", b));
  CHECK(b[0].reserve_pct == 0);
  CHECK(b[1].reserve_pct == 25);
  CHECK(parse_band_entries("name=high,max_priority=-1,reserve_pct=10;name=normal", b).value().find("first band") !=
        std::string::npos);
  CHECK(parse_band_entries("name=a,max_priority=-1;name=b,max_priority=0,reserve_pct=30;name=c,reserve_pct=20", b)
            .value()
            .find("below the band above") != std::string::npos);
  CHECK(parse_band_entries("name=a,max_priority=-1;name=b,reserve_pct=100", b).has_value());
  std::vector<TenantEntry> t;
  REQUIRE_FALSE(parse_tenant_entries("name=acme,weight=3,rps=5,tps=1000,cache_salt=acme-1;name=beta", t));
  REQUIRE(t.size() == 2);
  CHECK(t[0].weight == 3);
  CHECK(t[0].cache_salt == "acme-1");
  CHECK(parse_tenant_entries("name=a;name=a", t).has_value());
  CHECK(parse_tenant_entries("name=a b", t).has_value());
  CHECK(parse_tenant_entries("name=a,weight=0", t).has_value());
  Config c;
  c.flow.bands = "name=a;name=b";
  CHECK(validate(c).has_value());
}

TEST_CASE("flow control: vLLM priority (lower = more urgent) and the header pick the band") {
  FlowControl fc;
  const auto t = fc.tables(config_with("", "name=high,max_priority=-1;name=normal,max_priority=0;name=low"));
  CHECK(FlowControl::band_of(*t, std::nullopt, "") == 1u);  // default priority 0
  CHECK(FlowControl::band_of(*t, -5, "") == 0u);
  CHECK(FlowControl::band_of(*t, 7, "") == 2u);
  CHECK(FlowControl::band_of(*t, 7, "high") == 0u);  // the header wins
  CHECK(FlowControl::band_of(*t, 0, "-3") == 0u);
  CHECK_FALSE(FlowControl::band_of(*t, 0, "urgent").has_value());
}

TEST_CASE("flow control: keys file -> tenant, both headers, unknown keys, reload keeps the old on error") {
  FlowControl fc;
  const std::string key_a = "sk-acme-secret", key_b = "sk-beta-secret";
  const std::string path =
      temp_file("# comment\n" + to_hex(sha256(key_a)) + " acme\n\n" + to_hex(sha256(key_b)) + " beta  # trailing\n");
  const auto cfg = config_with("name=acme,weight=2;name=beta", "", path);
  const auto t = fc.tables(cfg);
  uint32_t tenant = 99;
  // No keys loaded yet: unauthenticated mode, the default tenant.
  CHECK(fc.authenticate(*t, "", "", tenant) == AuthResult::Ok);
  CHECK(tenant == t->default_tenant);
  REQUIRE_FALSE(fc.reload_keys(*cfg).has_value());
  CHECK(fc.key_count() == 2);
  CHECK(fc.authenticate(*t, "Bearer " + key_a, "", tenant) == AuthResult::Ok);
  CHECK(t->tenants[tenant].name == "acme");
  CHECK(fc.authenticate(*t, "", key_b, tenant) == AuthResult::Ok);
  CHECK(t->tenants[tenant].name == "beta");
  CHECK(fc.authenticate(*t, "", "", tenant) == AuthResult::Missing);
  CHECK(fc.authenticate(*t, "Bearer nope", "", tenant) == AuthResult::Invalid);
  CHECK(fc.authenticate(*t, "Basic " + key_a, "", tenant) == AuthResult::Missing);
  // A broken file: the error names the line, the keys in force stay.
  std::ofstream(path) << "zz acme\n";
  const auto e = fc.reload_keys(*cfg);
  REQUIRE(e.has_value());
  CHECK(e->find("line 1") != std::string::npos);
  CHECK(fc.authenticate(*t, "Bearer " + key_a, "", tenant) == AuthResult::Ok);
  // A key for a tenant that is not configured is an error too.
  std::ofstream(path) << to_hex(sha256("x")) << " ghost\n";
  CHECK(fc.reload_keys(*cfg).value().find("ghost") != std::string::npos);
  // A good file replaces the keys: key_a is gone.
  std::ofstream(path) << to_hex(sha256("sk-new")) << " beta\n";
  REQUIRE_FALSE(fc.reload_keys(*cfg).has_value());
  CHECK(fc.authenticate(*t, "Bearer " + key_a, "", tenant) == AuthResult::Invalid);
  CHECK(fc.authenticate(*t, "Bearer sk-new", "", tenant) == AuthResult::Ok);
  std::remove(path.c_str());
}

TEST_CASE("flow control: request and token buckets refill at their rate and say when to retry") {
  FlowControl fc;
  const auto t = fc.tables(config_with("name=a,rps=2,burst=2,tps=100", ""));
  const uint32_t a = t->tenant_index.at("a");
  const auto t0 = FlowClock::time_point{} + std::chrono::hours(1);
  uint32_t retry = 0;
  CHECK(fc.take_request(*t, a, t0, retry));
  CHECK(fc.take_request(*t, a, t0, retry));
  CHECK_FALSE(fc.take_request(*t, a, t0, retry));
  CHECK(retry == 1);
  CHECK(fc.take_request(*t, a, t0 + std::chrono::milliseconds(500), retry));  // 2/s: one more after 0.5 s
  // Tokens: 100/s, bucket 100.
  CHECK(fc.take_tokens(*t, a, 80, t0, retry));
  CHECK_FALSE(fc.take_tokens(*t, a, 80, t0, retry));
  CHECK(retry == 1);
  CHECK_FALSE(fc.take_tokens(*t, a, 100, t0 + std::chrono::milliseconds(100), retry));
  CHECK(fc.take_tokens(*t, a, 100, t0 + std::chrono::seconds(1), retry));
  // The default tenant has no limits.
  for (int i = 0; i < 100; ++i) CHECK(fc.take_request(*t, t->default_tenant, t0, retry));
}

TEST_CASE("cache salt pinning: the client's salts go, the tenant's is the only one") {
  std::string b = R"({"model":"m","prompt":"x"})";
  REQUIRE(pin_cache_salt(b, "T"));
  CHECK(b == R"({"model":"m","prompt":"x","cache_salt":"T"})");
  b = R"({ "cache_salt" : "mine", "model":"m", "nested":{"cache_salt":"keep"}, "cache_salt":"again" } )";
  REQUIRE(pin_cache_salt(b, "T"));
  CHECK(b == R"({ "model":"m", "nested":{"cache_salt":"keep"}, "cache_salt":"T"} )");
  b = R"({"cache_salt":"only"})";
  REQUIRE(pin_cache_salt(b, "T"));
  CHECK(b == R"({"cache_salt":"T"})");
  b = R"({"model":"m","s":"a \" } , \"cache_salt\":1","arr":[1,{"a":[2]}]})";
  REQUIRE(pin_cache_salt(b, "T"));
  CHECK(b == R"({"model":"m","s":"a \" } , \"cache_salt\":1","arr":[1,{"a":[2]}],"cache_salt":"T"})");
  // An escaped top-level key might spell cache_salt: refused, unchanged.
  b = R"({"model":"m","cache\u005fsalt":"sneak"})";
  const std::string before = b;
  CHECK_FALSE(pin_cache_salt(b, "T"));
  CHECK(b == before);
}

TEST_CASE("pin_member: any top-level member replaced by kvroute's JSON value") {
  std::string b = R"({"model":"m","priority":0,"nested":{"priority":5}})";
  REQUIRE(pin_member(b, "priority", "-1"));
  CHECK(b == R"({"model":"m","nested":{"priority":5},"priority":-1})");
  b = R"({})";
  REQUIRE(pin_member(b, "priority", "3"));
  CHECK(b == R"({"priority":3})");
  b = R"({"model":"m","prio\u0072ity":0})";
  const std::string before = b;
  CHECK_FALSE(pin_member(b, "priority", "-1"));
  CHECK(b == before);
}

TEST_CASE("engine priority: the band a request joined, as the vLLM priority its engine sees") {
  FlowControl fc;
  const auto t = fc.tables(config_with("", "name=high,max_priority=-1;name=mid,max_priority=5;name=normal"));
  // The body already places it in its band: unchanged.
  CHECK_FALSE(FlowControl::engine_priority(*t, 0, -3).has_value());
  CHECK_FALSE(FlowControl::engine_priority(*t, 1, 2).has_value());
  CHECK_FALSE(FlowControl::engine_priority(*t, 2, 9).has_value());
  // No body priority (vLLM's 0 = band mid): high gets its max_priority; mid is
  // already mid; normal gets one past mid's bound.
  CHECK(FlowControl::engine_priority(*t, 0, std::nullopt) == -1);
  CHECK_FALSE(FlowControl::engine_priority(*t, 1, std::nullopt).has_value());
  CHECK(FlowControl::engine_priority(*t, 2, std::nullopt) == 6);
  // The header moved it out of its body's band.
  CHECK(FlowControl::engine_priority(*t, 0, 4) == -1);
  CHECK(FlowControl::engine_priority(*t, 1, -7) == 5);
  // The default bands: a header-high request without a body priority is -1;
  // header-normal over a body's -1 becomes 0, written since the body has one.
  const auto d = fc.tables(config_with("", ""));
  CHECK(FlowControl::engine_priority(*d, 0, std::nullopt) == -1);
  CHECK_FALSE(FlowControl::engine_priority(*d, 1, std::nullopt).has_value());
  CHECK(FlowControl::engine_priority(*d, 1, -1) == 0);
}

// The status page's queue wait: each band's and tenant's oldest waiter, and
// each band's p99 of the waits that ended (from the wait histogram).
TEST_CASE("flow control status: the oldest wait per band and tenant, the p99 wait per band") {
  FlowControl fc;
  metrics::Registry reg;
  fc.register_metrics(reg, nullptr);
  const auto cfg = config_with("name=acme;name=beta", "name=high,max_priority=-1;name=normal");
  const auto t = fc.tables(cfg);
  const QueueLimits limits{.max_count = 16, .max_bytes = 0, .band_max = {}};
  const auto waiter = [](uint32_t band, uint32_t tenant, int64_t entered_ms) {
    auto w = std::make_shared<Waiter>();
    w->model = "m";
    w->band = band;
    w->tenant = tenant;
    w->entered = entered_ms * 1'000'000;
    w->wake = [](Wake) {};
    return w;
  };
  const uint32_t acme = t->tenant_index.at("acme"), beta = t->tenant_index.at("beta");
  std::string s = fc.status_json(*cfg, 5'000'000'000);
  CHECK(s.find(R"("name":"high","queued":0,"oldest_wait_ms":null,"wait_p99_ms":null)") != std::string::npos);
  CHECK(s.find(R"("name":"acme","weight":1,"rps":0,"tps":0,"cache_salt_pinned":false,"queued":0,"oldest_wait_ms":null)") !=
        std::string::npos);
  auto a1 = waiter(1, acme, 1000), a2 = waiter(1, acme, 1500), b1 = waiter(1, beta, 1200), h1 = waiter(0, beta, 4000);
  for (auto& w : {a1, a2, b1, h1}) REQUIRE(fc.queue().enter(w, limits) == Enter::Queued);
  // 100 waits that ended in the normal band: 99 of ~1 ms, one of ~1 s.
  for (int i = 0; i < 99; ++i) fc.metrics()->queue_wait_seconds.with({"normal", "admitted"}).observe(0.001);
  fc.metrics()->queue_wait_seconds.with({"normal", "timeout"}).observe(1.0);
  s = fc.status_json(*cfg, 5'000'000'000);  // 5 s on the waiters' clock
  INFO(s);
  CHECK(s.find(R"("name":"high","queued":1,"oldest_wait_ms":1000.0,"wait_p99_ms":null)") != std::string::npos);
  CHECK(s.find(R"("name":"normal","queued":3,"oldest_wait_ms":4000.0,"wait_p99_ms":)") != std::string::npos);
  CHECK(s.find(R"("queued":2,"oldest_wait_ms":4000.0,"outcomes")") != std::string::npos);  // acme: a1
  CHECK(s.find(R"("queued":2,"oldest_wait_ms":3800.0,"outcomes")") != std::string::npos);  // beta: b1 (before h1)
  // The p99 of 100 waits is the 99th: in the ~1 ms bucket, not the 1 s outlier.
  const auto p = s.find(R"("name":"normal")");
  const auto v = s.find(R"("wait_p99_ms":)", p) + 14;
  const double p99 = std::stod(s.substr(v));
  CHECK(p99 > 0.5);
  CHECK(p99 < 2.1);
  fc.queue().stop_all();
}
