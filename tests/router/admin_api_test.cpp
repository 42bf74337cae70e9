#include "router/admin_api.h"

#include <doctest/doctest.h>

#include "tests/support/recording_indexer.h"

using namespace kvroute;

namespace {
struct Fixture {
  ManualClock clock;
  SeededRandom random{1};
  testing::RecordingIndexer index;
  WorkerRegistry registry{clock};
  ConfigStore config{[] {
    Config c;
    c.admin.token = "s3cret";
    return c;
  }()};
  RoutingService routing{index, registry, config, random};
  AdminApi api{config, routing, registry, index};
  Fixture() {
    WorkerAnnouncement a;
    a.id = WorkerId{4};
    a.url = "http://127.0.0.1:9";
    a.model = "m";
    a.load = WorkerLoad{1, 10, 0, 5, 100};
    registry.on_heartbeat(a);
  }
};
constexpr std::string_view kAuth = "Bearer s3cret";
}  // namespace

TEST_CASE("admin API refuses a missing or wrong token, and everything when none is configured") {
  Fixture f;
  CHECK(f.api.handle("GET", "/admin/config", "", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/config", "Bearer wrong", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/config", "s3cret", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/config", "Bearer s3cret!", "").status == 401);
  CHECK(f.api.handle("GET", "/admin/config", kAuth, "").status == 200);
  CHECK(f.api.stats().auth_failures == 4);
  f.config.update([](Config& c) {
    c.admin.token.clear();
    return std::nullopt;
  });
  auto r = f.api.handle("GET", "/admin/config", kAuth, "");
  CHECK(r.status == 401);
  CHECK(r.body.find("disabled") != std::string::npos);
}

TEST_CASE("PUT /admin/config swaps valid updates and refuses invalid ones with the key") {
  Fixture f;
  auto r = f.api.handle("PUT", "/admin/config", kAuth, "scheduler:\n  gamma: 0.6\n");
  CHECK(r.status == 200);
  CHECK(r.body.find("gamma: 0.6") != std::string::npos);
  CHECK(f.config.get()->scheduler.gamma == doctest::Approx(0.6));
  // JSON is YAML too.
  CHECK(f.api.handle("PUT", "/admin/config", kAuth, R"({"scheduler":{"delta":0.2}})").status == 200);
  CHECK(f.config.get()->scheduler.delta == doctest::Approx(0.2));

  auto before = f.config.get();
  r = f.api.handle("PUT", "/admin/config", kAuth, "scheduler:\n  gamma: -1\n  delta: 0.9\n");
  CHECK(r.status == 400);
  CHECK(r.body.find("scheduler.gamma") != std::string::npos);
  r = f.api.handle("PUT", "/admin/config", kAuth, "router:\n  port: 1234\n");
  CHECK(r.status == 400);
  CHECK(r.body.find("router.port: cannot change at runtime") != std::string::npos);
  CHECK(f.config.get() == before);  // nothing changed
  CHECK(f.api.stats().reloads_ok == 2);
  CHECK(f.api.stats().reloads_rejected == 2);
}

TEST_CASE("explain returns every term for every worker without sending anything") {
  Fixture f;
  auto r = f.api.handle("POST", "/admin/route/explain", kAuth,
                        R"({"model":"m","messages":[{"role":"user","content":"hello there"}]})");
  REQUIRE(r.status == 200);
  for (auto key : {"\"chosen\":4", "\"worker_id\":4", "\"prefill_ratio\":1", "\"cost\":", "\"overlap_by_tier\"",
                   "\"alpha\":0.3", "\"rank\":0", "\"excluded\":null"})
    CHECK_MESSAGE(r.body.find(key) != std::string::npos, key, " in ", r.body);
  CHECK(f.registry.candidates("m").at(0).inflight_requests == 0);
  CHECK(f.api.handle("POST", "/admin/route/explain", kAuth, "{bad").status == 400);
}

TEST_CASE("workers list, drain and undrain, index stats") {
  Fixture f;
  auto r = f.api.handle("GET", "/admin/workers", kAuth, "");
  CHECK(r.body.find("\"worker_id\":4") != std::string::npos);
  CHECK(f.api.handle("POST", "/admin/workers/4/drain", kAuth, "").status == 200);
  CHECK(f.registry.candidates("m").at(0).draining);
  auto e = f.api.handle("POST", "/admin/route/explain", kAuth, R"({"model":"m","prompt":"x"})");
  CHECK(e.body.find("\"excluded\":\"draining\"") != std::string::npos);
  CHECK(f.api.handle("POST", "/admin/workers/4/undrain", kAuth, "").status == 200);
  CHECK_FALSE(f.registry.candidates("m").at(0).draining);
  CHECK(f.api.handle("POST", "/admin/workers/99/drain", kAuth, "").status == 404);
  CHECK(f.api.handle("POST", "/admin/workers/x/drain", kAuth, "").status == 404);
  CHECK(f.api.handle("GET", "/admin/index", kAuth, "").body == R"({"blocks":0,"entries":0,"bytes":0})");
  CHECK(f.api.handle("DELETE", "/admin/config", kAuth, "").status == 404);
}
