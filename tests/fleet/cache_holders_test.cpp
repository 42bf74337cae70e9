#include "fleet/worker_registry.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>

using namespace kvroute;

namespace {

WorkerAnnouncement ann(uint64_t id, std::string model, bool approximate = false) {
  WorkerAnnouncement a;
  a.id = WorkerId{id};
  a.source = WorkerSource::Static;
  a.url = "http://127.0.0.1:" + std::to_string(9000 + id);
  a.model = std::move(model);
  a.approximate = approximate;
  a.load.request_total_slots = 10;
  a.load.kv_total_blocks = 100;
  return a;
}

std::shared_ptr<const OwnerSet> make_set(std::vector<CacheOwner> owners) {
  static uint64_t serial = 1000;
  auto s = std::make_shared<OwnerSet>();
  s->serial = ++serial;
  std::shuffle(owners.begin(), owners.end(), std::mt19937(static_cast<uint32_t>(serial)));  // any order
  s->owners = std::move(owners);
  return s;
}

// The reference: every owner once (MatchLayers::expand), a table lookup
// each, sorted longest first, then by owner.
size_t reference(const WorkerRegistry& r, std::string_view model, const MatchLayers& m, size_t max,
                 std::vector<WorkerRegistry::CacheHolder>& out) {
  WorkerRegistry::Keep keep;
  r.holders(model, m.expand().owners, out, keep);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.overlap.blocks != b.overlap.blocks ? a.overlap.blocks > b.overlap.blocks
                                                : a.overlap.owner < b.overlap.owner;
  });
  const size_t total = out.size();
  out.resize(std::min(out.size(), max));
  return total;
}

void check_same(const WorkerRegistry& r, std::string_view model, const MatchLayers& m, size_t max) {
  std::vector<WorkerRegistry::CacheHolder> want, got;
  WorkerRegistry::Keep keep;
  const size_t want_total = reference(r, model, m, max, want);
  const size_t got_total = r.holders(model, m, max, got, keep);
  CHECK(got_total == want_total);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("holder " << i << " of " << got.size());
    CHECK(got[i].overlap.owner == want[i].overlap.owner);
    CHECK(got[i].overlap.blocks == want[i].overlap.blocks);
    CHECK(got[i].overlap.by_tier == want[i].overlap.by_tier);
    CHECK(got[i].info->url == want[i].info->url);
    CHECK(got[i].info->model == want[i].info->model);
    CHECK(got[i].info->approximate == want[i].info->approximate);
    CHECK(got[i].health == want[i].health);
    CHECK(got[i].draining == want[i].draining);
  }
}

}  // namespace

TEST_CASE("holders from a match's shared layers equal the reference's, whatever the layers, extras and table") {
  ManualClock clock;
  WorkerRegistry r(clock);
  std::mt19937 rng(7);
  const auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  // Workers 1..60 (some serve another model, some have a LoRA adapter);
  // owners 61..70 are nobody the table knows.
  const auto model_of = [](uint64_t id) { return id % 7 == 0 ? std::string("other") : std::string("m"); };
  for (uint64_t id = 1; id <= 60; ++id) {
    WorkerAnnouncement a = ann(id, model_of(id));
    if (id % 5 == 0) a.lora_adapters = {"lora"};
    r.upsert(a);
  }
  std::vector<CacheOwner> everyone;
  for (uint64_t id = 1; id <= 70; ++id)
    for (uint32_t rank = 0; rank < (id % 3 == 0 ? 2u : 1u); ++rank) everyone.push_back(CacheOwner{WorkerId{id}, rank});
  // Sets are reused across matches, so kept sets are read again (and again
  // after the table changed).
  std::vector<std::shared_ptr<const OwnerSet>> sets;
  const auto subset = [&](const std::vector<CacheOwner>& of, size_t n) {
    std::vector<CacheOwner> v = of;
    std::shuffle(v.begin(), v.end(), rng);
    v.resize(std::min(n, v.size()));
    return v;
  };
  for (int round = 0; round < 400; ++round) {
    CAPTURE(round);
    MatchLayers m;
    // Nested layers: the first of up to 60 owners (large sets are kept), a
    // subset each deeper, lengths increasing, tiers alike within a layer.
    const uint32_t depth = pick(4);
    std::vector<CacheOwner> outer = everyone;
    uint32_t blocks = 0;
    std::array<uint32_t, kNumStorageTiers> tiers{};
    for (uint32_t l = 0; l < depth; ++l) {
      std::shared_ptr<const OwnerSet> set;
      if (l == 0 && !sets.empty() && pick(2) == 0) {
        set = sets[pick(static_cast<uint32_t>(sets.size()))];
      } else {
        set = make_set(subset(outer, l == 0 ? 1 + pick(60) : 1 + pick(static_cast<uint32_t>(outer.size()))));
        if (l == 0) sets.push_back(set);
      }
      const uint32_t more = 1 + pick(4);
      tiers[pick(3)] += more;
      blocks += more;
      m.layers.push_back(MatchLayers::Layer{blocks, tiers, set});
      outer = set->owners;
    }
    // Owners listed one by one: some in layers (longer, as long, shorter),
    // some not, some twice.
    const uint32_t extras = pick(3) == 0 ? pick(40) : pick(4);
    for (uint32_t e = 0; e < extras; ++e) {
      OwnerOverlap o;
      o.owner = everyone[pick(static_cast<uint32_t>(everyone.size()))];
      o.blocks = 1 + pick(blocks + 4);
      o.by_tier[pick(4)] = o.blocks;
      m.extra.push_back(o);
    }
    const char* models[] = {"m", "other", "lora", ""};
    const size_t maxes[] = {1, 3, 16, 1000};
    check_same(r, models[pick(4)], m, maxes[pick(4)]);
    // The table changes now and then: a worker leaves, comes back serving
    // another model, goes down, drains, becomes approximate.
    switch (pick(8)) {
      case 0: r.remove(WorkerId{1 + pick(60)}); break;
      case 1: {
        const uint64_t id = 1 + pick(60);
        r.upsert(ann(id, pick(2) ? "m" : "other", pick(2) == 0));
        break;
      }
      case 2: r.report_failure(WorkerId{1 + pick(60)}, HealthSignal::ConnectRefused); break;
      case 3: r.set_draining(WorkerId{1 + pick(60)}, pick(2) == 0); break;
      default: break;
    }
  }
}

TEST_CASE("a kept set of holders follows the table: who left, what it serves, its URL and health now") {
  ManualClock clock;
  WorkerRegistry r(clock);
  std::vector<CacheOwner> owners;
  for (uint64_t id = 1; id <= 20; ++id) {
    r.upsert(ann(id, "m"));
    owners.push_back(CacheOwner{WorkerId{id}, 0});
  }
  MatchLayers m;
  std::array<uint32_t, kNumStorageTiers> tiers{};
  tiers[0] = 4;
  m.layers.push_back(MatchLayers::Layer{4, tiers, make_set(owners)});  // 20 > kSmallHolderSet: kept
  REQUIRE(owners.size() > WorkerRegistry::kSmallHolderSet);
  std::vector<WorkerRegistry::CacheHolder> out;
  WorkerRegistry::Keep keep;
  CHECK(r.holders("m", m, 100, out, keep) == 20);
  CHECK(out.front().overlap.owner.worker == WorkerId{1});
  const auto listed = [&](uint64_t id) {
    return std::any_of(out.begin(), out.end(), [&](const auto& h) { return h.overlap.owner.worker == WorkerId{id}; });
  };

  r.remove(WorkerId{3});
  WorkerAnnouncement other = ann(5, "other");
  r.upsert(other);
  WorkerAnnouncement moved = ann(7, "m");
  moved.url = "http://127.0.0.1:1";
  r.upsert(moved);
  r.report_failure(WorkerId{9}, HealthSignal::ConnectRefused);
  r.set_draining(WorkerId{11}, true);
  CHECK(r.holders("m", m, 100, out, keep) == 18);
  CHECK_FALSE(listed(3));
  CHECK_FALSE(listed(5));
  for (const auto& h : out) {
    if (h.overlap.owner.worker == WorkerId{7}) CHECK(h.info->url == "http://127.0.0.1:1");
    CHECK(h.health == (h.overlap.owner.worker == WorkerId{9} ? HealthState::Down : HealthState::Ok));
    CHECK(h.draining == (h.overlap.owner.worker == WorkerId{11}));
  }
  // The announcements stay readable while `keep` lives, whatever the table does.
  std::vector<std::string> urls;
  for (const auto& h : out) urls.push_back(h.info->url);
  for (uint64_t id = 1; id <= 20; ++id) r.remove(WorkerId{id});
  for (size_t i = 0; i < out.size(); ++i) CHECK(out[i].info->url == urls[i]);
  CHECK(r.holders("m", m, 100, out, keep) == 0);
}
