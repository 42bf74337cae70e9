// The peers' formulas in kvroute-sim (sim/policies.h), on hand-made inputs.
#include "sim/policies.h"

#include <doctest/doctest.h>

#include <set>

using namespace kvroute;
using namespace kvroute::sim;

namespace {

// Two or more workers as routing sees them: overlap blocks, in-flight prefill
// tokens, and reported load (waiting requests, KV blocks in use of 1,000).
RouteResult route_of(const std::vector<uint32_t>& overlap, const std::vector<uint64_t>& pending,
                     const std::vector<uint32_t>& waiting, const std::vector<uint64_t>& kv_active) {
  RouteResult r;
  r.ok = true;
  for (size_t i = 0; i < overlap.size(); ++i) {
    auto info = std::make_shared<WorkerAnnouncement>();
    info->id = WorkerId{i};
    info->load = WorkerLoad{0, 64, waiting[i], kv_active[i], 1000};
    WorkerView v;
    v.info = info;
    v.predicted = info->load;
    r.workers.push_back(v);
    Candidate c;
    c.owner.worker = info->id;
    c.overlap_blocks = overlap[i];
    c.pending_prefill_tokens = pending[i];
    r.candidates.push_back(c);
  }
  return r;
}

std::vector<LocalBlockHash> blocks(uint64_t from, size_t n) {
  std::vector<LocalBlockHash> v;
  for (size_t i = 0; i < n; ++i) v.push_back(LocalBlockHash{from + i});
  return v;
}

}  // namespace

TEST_CASE("dynamo: prefill blocks (in-flight + uncached) plus potential active blocks, lowest wins") {
  std::mt19937_64 rng(1);
  DynamoActive active(2);
  const auto req = blocks(100, 10);  // a 10-block request (block 16, 160 tokens)
  // Worker 0 holds 8 of its blocks; worker 1 none. Nothing active: 0 wins on prefill blocks (2 vs 10).
  auto r = route_of({8, 0}, {0, 0}, {0, 0}, {0, 0});
  CHECK(pick_dynamo(r, active, req, false, 160, 16, rng) == 0);
  // 160 in-flight prefill tokens (10 blocks) on worker 0: logit 0 = 12 + 10, logit 1 = 10 + 10.
  r = route_of({8, 0}, {160, 0}, {0, 0}, {0, 0});
  CHECK(pick_dynamo(r, active, req, false, 160, 16, rng) == 1);
  // Active sequences: 5 distinct blocks on worker 1 push it back over (12 + 10 vs 10 + 15).
  active.add(1, blocks(500, 5), false);
  CHECK(active.potential(1, req, false) == doctest::Approx(15));
  CHECK(pick_dynamo(r, active, req, false, 160, 16, rng) == 0);
  // Shared blocks count once: the request's own blocks already active on worker 0 add nothing.
  active.add(0, req, true);
  CHECK(active.potential(0, req, false) == doctest::Approx(11));  // 10 distinct + 1 private partial
  active.remove(0, req, true);
  CHECK(active.potential(0, req, false) == doctest::Approx(10));
}

TEST_CASE("dynamo: host and disk hits are credited 0.75 and 0.25") {
  std::mt19937_64 rng(1);
  DynamoActive active(2);
  const auto req = blocks(1, 8);
  auto r = route_of({8, 4}, {0, 0}, {0, 0}, {0, 0});
  r.candidates[0].overlap_by_tier = {0, 8, 0, 0};  // 8 host blocks: credit 6 -> 2 prefill blocks
  r.candidates[1].overlap_by_tier = {4, 0, 0, 0};  // 4 device blocks: credit 4 -> 4 prefill blocks
  CHECK(pick_dynamo(r, active, req, false, 128, 16, rng) == 0);
  r.candidates[0].overlap_by_tier = {0, 0, 8, 0};  // 8 disk blocks: credit 2 -> 6 prefill blocks
  CHECK(pick_dynamo(r, active, req, false, 128, 16, rng) == 1);
}

TEST_CASE("llmd: 3 x prefix fraction + 2 x (1 - KV usage) + 2 x queue score, highest wins") {
  std::mt19937_64 rng(1);
  // Worker 0: full prefix (3) but the longest queue (0) and KV half used (1) = 4;
  // worker 1: no prefix, no queue (2), KV empty (2) = 4; worker 2: half prefix (1.5), queue mid (1), KV empty (2) = 4.5.
  auto r = route_of({10, 0, 5}, {0, 0, 0}, {4, 0, 2}, {500, 0, 0});
  CHECK(pick_llmd(r, 10, rng) == 2);
  // Equal queues score 1 for everyone: the prefix decides.
  r = route_of({10, 0, 5}, {0, 0, 0}, {1, 1, 1}, {0, 0, 0});
  CHECK(pick_llmd(r, 10, rng) == 0);
}

TEST_CASE("ties are broken at random in every peer policy") {
  std::mt19937_64 rng(3);
  DynamoActive active(4);
  const auto req = blocks(1, 4);
  std::set<size_t> dynamo, llmd, least;
  const auto r = route_of({0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0});
  for (int i = 0; i < 200; ++i) {
    dynamo.insert(pick_dynamo(r, active, req, false, 64, 16, rng));
    llmd.insert(pick_llmd(r, 4, rng));
    least.insert(pick_least_loaded(r.workers, rng));
  }
  CHECK(dynamo.size() == 4);
  CHECK(llmd.size() == 4);
  CHECK(least.size() == 4);
}
