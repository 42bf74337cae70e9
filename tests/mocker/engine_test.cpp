#include "mocker/engine.h"

#include <doctest/doctest.h>

#include <map>

#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"

using namespace kvroute;
using namespace kvroute::mocker;

namespace {

std::vector<TokenId> tokens(uint32_t seed, size_t n) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = seed * 7919u + static_cast<TokenId>(i);
  return t;
}

struct Run {
  EngineConfig cfg;
  std::vector<KvEvent> events;
  std::unique_ptr<Engine> engine;
  explicit Run(EngineConfig c) : cfg(c) {
    cfg.owner = CacheOwner{WorkerId{1}, 0};
    engine = std::make_unique<Engine>(cfg, [this](const KvEvent& e) { events.push_back(e); });
  }
  // Drives the engine to completion; returns outputs per request.
  std::map<uint64_t, std::vector<EngineOutput>> drain(double& now) {
    std::map<uint64_t, std::vector<EngineOutput>> out;
    while (auto t = engine->next_event_time()) {
      now = *t;
      for (auto& o : engine->advance_to(now)) out[o.request].push_back(o);
    }
    return out;
  }
};

EngineConfig small_cfg() {
  EngineConfig c;
  c.block_size = 4;
  c.kv_blocks = 64;
  return c;
}

}  // namespace

TEST_CASE("a repeated prompt is served from the cache") {
  Run r(small_cfg());
  double now = 0;
  REQUIRE(r.engine->add_request(1, tokens(1, 40), 3, now));
  auto out = r.drain(now);
  REQUIRE(out[1].size() == 4);  // first token, 2 tokens, finished
  CHECK(out[1][0].kind == EngineOutput::Kind::FirstToken);
  CHECK(out[1][0].cached_tokens == 0);
  CHECK(out[1][3].kind == EngineOutput::Kind::Finished);
  auto p = tokens(1, 40);
  p.push_back(99);
  p.push_back(98);
  REQUIRE(r.engine->add_request(2, p, 1, now));
  out = r.drain(now);
  CHECK(out[2][0].cached_tokens == 40);
  CHECK(out[2][0].prompt_tokens == 42);
}

TEST_CASE("stored events carry consecutive ids and a parent chain the index accepts") {
  Run r(small_cfg());
  double now = 0;
  r.engine->add_request(1, tokens(1, 16), 1, now);
  r.drain(now);
  auto p = tokens(1, 16);
  auto more = tokens(2, 8);
  p.insert(p.end(), more.begin(), more.end());
  r.engine->add_request(2, p, 1, now);
  r.drain(now);
  REQUIRE(r.events.size() == 2);
  for (size_t i = 0; i < r.events.size(); ++i) CHECK(r.events[i].event_id == i + 1);
  const auto& first = std::get<KvStored>(r.events[0].data);
  const auto& second = std::get<KvStored>(r.events[1].data);
  CHECK_FALSE(first.parent.has_value());
  CHECK(first.blocks.size() == 4);
  REQUIRE(second.parent.has_value());
  CHECK(*second.parent == first.blocks.back().block_hash);
  CHECK(second.blocks.size() == 2);
  // Local hashes are the router's block hashes of the same tokens.
  CHECK(first.blocks[0].tokens_hash == hash_blocks(tokens(1, 16), 4)[0]);
  RadixIndexer idx;
  for (auto& e : r.events) CHECK(idx.apply(e) == ApplyResult::Applied);
  auto m = idx.find_matches(hash_blocks(p, 4));
  REQUIRE(m.owners.size() == 1);
  CHECK(m.owners[0].blocks == 6);
}

TEST_CASE("capacity: LRU eviction of unreferenced blocks only, announced as removed") {
  EngineConfig c = small_cfg();
  c.kv_blocks = 10;
  Run r(c);
  double now = 0;
  r.engine->add_request(1, tokens(1, 16), 4, now);  // 4 prompt blocks + 1 for generation
  r.drain(now);
  CHECK(r.engine->cached_blocks() == 4);
  r.engine->add_request(2, tokens(2, 16), 4, now);
  r.drain(now);
  CHECK(r.engine->cached_blocks() == 8);
  // A third prompt needs 5 blocks: 2 free, so 3 of request 1's (the oldest) go.
  r.engine->add_request(3, tokens(3, 16), 4, now);
  r.drain(now);
  const KvRemoved* rm = nullptr;
  for (const auto& e : r.events)
    if (const auto* x = std::get_if<KvRemoved>(&e.data)) rm = x;
  REQUIRE(rm != nullptr);
  REQUIRE(rm->block_hashes.size() == 3);
  // The least recently used: request 1's first three blocks.
  const auto& first = std::get<KvStored>(r.events[0].data);
  for (size_t i = 0; i < 3; ++i) CHECK(rm->block_hashes[i] == first.blocks[i].block_hash);
  CHECK(r.engine->cached_blocks() <= c.kv_blocks);
  // Referenced blocks are never evicted: with request 5 running on 5 blocks
  // and 5 cached ones unreferenced, a request needing 6 new blocks waits.
  r.engine->add_request(5, tokens(5, 16), 4, now);
  r.engine->add_request(6, tokens(6, 20), 4, now);
  CHECK(r.engine->load().request_active_slots == 1);
  CHECK(r.engine->load().num_requests_waiting == 1);
  r.drain(now);
  CHECK(r.engine->load().num_requests_waiting == 0);
}

TEST_CASE("a request that cannot fit now waits; one that can never fit is refused") {
  EngineConfig c = small_cfg();
  c.kv_blocks = 6;
  Run r(c);
  double now = 0;
  CHECK_FALSE(r.engine->add_request(9, tokens(9, 40), 1, now));  // 11 blocks > 6
  REQUIRE(r.engine->add_request(1, tokens(1, 16), 8, now));       // 4 + 2 blocks: all of them
  REQUIRE(r.engine->add_request(2, tokens(2, 8), 1, now));
  CHECK(r.engine->load().request_active_slots == 1);
  CHECK(r.engine->load().num_requests_waiting == 1);
  CHECK(r.engine->load().kv_active_blocks == 6);
  auto out = r.drain(now);
  CHECK(out[2].back().kind == EngineOutput::Kind::Finished);  // ran after 1 freed its blocks
  CHECK(r.engine->load().kv_active_blocks == 0);
}

TEST_CASE("step time follows the prefill polynomial, then decode steps") {
  EngineConfig c = small_cfg();
  c.decode_base_ms = 5;
  c.decode_kv_ms = 0;
  Run r(c);
  r.engine->add_request(1, tokens(1, 100), 3, 0);
  const double expected = 4.209989e-7 * 100 * 100 + 1.518344e-2 * 100 + 16.50142;
  REQUIRE(r.engine->next_event_time().has_value());
  CHECK(*r.engine->next_event_time() == doctest::Approx(expected));
  CHECK(r.engine->prefill_ms(100) == doctest::Approx(expected));
  auto out = r.engine->advance_to(expected);
  REQUIRE(out.size() == 1);
  CHECK(*r.engine->next_event_time() == doctest::Approx(expected + 5));
  CHECK(r.engine->advance_to(expected + 4.9).empty());
}

TEST_CASE("batching limits: max sequences and max batched tokens per step") {
  EngineConfig c = small_cfg();
  c.kv_blocks = 1000;
  c.max_seqs = 2;
  c.max_batched_tokens = 50;
  Run r(c);
  for (uint64_t i = 1; i <= 4; ++i) r.engine->add_request(i, tokens(static_cast<uint32_t>(i), 30), 2, 0);
  // Step 1: request 1 (30 tokens); request 2 would exceed 50 batched tokens.
  CHECK(r.engine->load().request_active_slots == 1);
  CHECK(r.engine->load().num_requests_waiting == 3);
  double now = *r.engine->next_event_time();
  r.engine->advance_to(now);
  CHECK(r.engine->load().request_active_slots == 2);  // max_seqs
  CHECK(r.engine->load().num_requests_waiting == 2);
}

TEST_CASE("cancel releases the request's blocks; dump reflects the cache") {
  Run r(small_cfg());
  double now = 0;
  r.engine->add_request(1, tokens(1, 16), 100, now);
  now = *r.engine->next_event_time();
  r.engine->advance_to(now);  // prefilled, decoding
  CHECK(r.engine->load().kv_active_blocks > 0);
  CHECK(r.engine->cancel(1));
  CHECK_FALSE(r.engine->cancel(1));
  CHECK(r.engine->load().kv_active_blocks == 0);
  CHECK(r.engine->load().request_active_slots == 0);
  auto dump = r.engine->dump();
  CHECK(dump.size() == 4);
  RadixIndexer from_events, from_dump;
  for (auto& e : r.events) from_events.apply(e);
  for (auto& e : dump) CHECK(from_dump.apply(e) == ApplyResult::Applied);
  CHECK(from_dump.stats().entries == from_events.stats().entries);
  CHECK(r.engine->last_event_id() == r.events.size());
}
