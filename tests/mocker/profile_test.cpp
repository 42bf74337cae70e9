// mocker/profile.h: the fitted profiles against every measured row they were
// fitted to (mocker/profiles/h100.json), the KV capacity formula, and the
// dynamo-mocker polynomial.
#include "mocker/profile.h"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <string>

using namespace kvroute::mocker;

namespace {

struct Worst {
  double error = 0;
  std::string row;
};

// Checks one measured row: the model's step time within 10 % of graph_ms.
void check_row(const EngineProfile& p, const StepShape& s, double measured, const std::string& row, Worst& worst) {
  const double model = p.step_ms(s);
  const double error = std::abs(model - measured) / measured;
  INFO(p.name << " " << row << ": measured " << measured << " ms, model " << model << " ms");
  CHECK(error <= 0.10);
  if (error > worst.error) worst = {error, row};
}

uint64_t u(simdjson::dom::element e, const char* key) { return uint64_t(e[key].get_uint64().value()); }

}  // namespace

TEST_CASE("fitted profiles: every measured H100 row within 10 %") {
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.load(std::string(KVROUTE_PROFILES_DIR) + "/h100.json");
  const std::pair<const char*, const char*> fits[] = {{"h100-llama3-8b", "llama3-8b"},
                                                       {"h100-llama3-1b", "llama3.2-1b"}};
  for (const auto& [name, key] : fits) {
    const EngineProfile* p = find_profile(name);
    REQUIRE(p);
    const simdjson::dom::element m = doc["models"][key];
    Worst worst;
    size_t rows = 0;
    for (simdjson::dom::element r : m["prefill"].get_array()) {
      StepShape s;
      s.add_chunk(u(r, "new"), u(r, "cached"));
      check_row(*p, s, r["graph_ms"].get_double(), "prefill new=" + std::to_string(u(r, "new")) + " cached=" +
                                                       std::to_string(u(r, "cached")), worst);
      ++rows;
    }
    for (simdjson::dom::element r : m["decode"].get_array()) {
      StepShape s;
      for (uint64_t i = 0; i < u(r, "batch"); ++i) s.add_decode(u(r, "context"));
      check_row(*p, s, r["graph_ms"].get_double(), "decode batch=" + std::to_string(u(r, "batch")), worst);
      ++rows;
    }
    simdjson::dom::array mixed;
    if (!m["mixed"].get_array().get(mixed))
      for (simdjson::dom::element r : mixed) {
        StepShape s;
        s.add_chunk(u(r, "chunk_new"), u(r, "chunk_cached"));
        for (uint64_t i = 0; i < u(r, "decodes"); ++i) s.add_decode(u(r, "decode_context"));
        check_row(*p, s, r["graph_ms"].get_double(), "mixed chunk=" + std::to_string(u(r, "chunk_new")), worst);
        ++rows;
      }
    MESSAGE(std::string(name) << ": " << rows << " rows, largest error " << worst.error * 100 << " % (" << worst.row << ")");
    CHECK(rows >= 31);
  }
}

TEST_CASE("fitted profiles: a cached prefix is not free, a longer decode context costs more") {
  const EngineProfile& p = *find_profile("h100-llama3-8b");
  CHECK(p.prefill_ms(8192, 16384) > 1.8 * p.prefill_ms(8192, 0));  // measured 462 vs 229 ms
  CHECK(p.prefill_ms(512, 16384) > 1.8 * p.prefill_ms(512, 0));    // measured 28 vs 13 ms
  StepShape short_ctx, long_ctx;
  for (int i = 0; i < 32; ++i) short_ctx.add_decode(1024), long_ctx.add_decode(8192);
  CHECK(p.step_ms(long_ctx) > p.step_ms(short_ctx) + 5);
}

TEST_CASE("KV capacity: the GPU memory left after the weights, over the KV bytes per token") {
  // (81,559 MiB x 0.9 - 8.03e9 params x 2 B - 2 GiB) / 128 KiB = 448,308 tokens.
  const EngineProfile& p8 = *find_profile("h100-llama3-8b");
  CHECK(p8.kv_capacity_tokens == 448308);
  CHECK(p8.kv_blocks(16) == 448308 / 16);
  CHECK(p8.kv_blocks(512) == 875);
  // 1B: (81,559 MiB x 0.9 - 1.50e9 x 2 B - 2 GiB) / 32 KiB = 2,191,903 tokens.
  CHECK(find_profile("h100-llama3-1b")->kv_capacity_tokens == 2191903);
  CHECK(kv_capacity_tokens(10.0 * (1ull << 30), 5e9, 1024) == 0);  // the weights do not even fit
}

TEST_CASE("dynamo-mocker keeps Dynamo's polynomial; unknown names are refused") {
  const EngineProfile& d = *find_profile("dynamo-mocker");
  CHECK(d.kind == EngineProfile::Kind::Polynomial);
  CHECK(d.prefill_ms(100, 5000) == doctest::Approx(4.209989e-7 * 100 * 100 + 1.518344e-2 * 100 + 16.50142));
  StepShape s;
  s.add_chunk(100, 0);
  s.add_decode(50);
  s.kv_occupancy = 0.5;
  CHECK(d.step_ms(s) == doctest::Approx(d.prefill_ms(100, 0) + 8 + 12 * 0.5));
  CHECK(d.kv_capacity_tokens == 0);
  CHECK(find_profile("h100") == nullptr);
  CHECK(profile_list() == "h100-llama3-8b, h100-llama3-1b or dynamo-mocker");
}
