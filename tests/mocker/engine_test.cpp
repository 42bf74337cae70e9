#include "mocker/engine.h"

#include <doctest/doctest.h>

#include <map>
#include <random>
#include <tuple>

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

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Run {
  EngineConfig cfg;
  std::vector<KvEvent> events;
  std::unique_ptr<Engine> engine;
  explicit Run(EngineConfig c) : cfg(c) {
    cfg.owner = CacheOwner{WorkerId{1}, 0};
    engine = std::make_unique<Engine>(cfg, [this](const KvEvent& e) { events.push_back(e); });
  }
  // Drives the engine until idle; returns outputs per request.
  std::map<uint64_t, std::vector<EngineOutput>> drain(double& now) {
    std::map<uint64_t, std::vector<EngineOutput>> out;
    while (auto t = engine->next_event_time()) {
      now = *t;
      for (auto& o : engine->advance_to(now)) out[o.request].push_back(o);
    }
    return out;
  }
  std::vector<const KvRemoved*> removed() const {
    std::vector<const KvRemoved*> r;
    for (const auto& e : events)
      if (const auto* x = std::get_if<KvRemoved>(&e.data)) r.push_back(x);
    return r;
  }
};

EngineConfig small_cfg() {
  EngineConfig c;
  c.profile = *find_profile("dynamo-mocker");
  c.block_size = 4;
  c.kv_blocks = 64;
  return c;
}

}  // namespace

TEST_CASE("a repeated prefix is served from the cache") {
  Run r(small_cfg());
  double now = 0;
  REQUIRE(r.engine->add_request(1, tokens(1, 40), 3, now));
  auto out = r.drain(now);
  REQUIRE(out[1].size() == 4);  // first token, 2 tokens, finished
  CHECK(out[1][0].kind == EngineOutput::Kind::FirstToken);
  CHECK(out[1][0].cached_tokens == 0);
  CHECK(out[1][1].kind == EngineOutput::Kind::Token);
  CHECK(out[1][3].kind == EngineOutput::Kind::Finished);
  CHECK(out[1][3].time_ms == out[1][2].time_ms);  // finished with its last token
  REQUIRE(r.engine->add_request(2, concat(tokens(1, 40), {99, 98}), 1, now));
  out = r.drain(now);
  CHECK(out[2][0].cached_tokens == 40);
  CHECK(out[2][0].prompt_tokens == 42);
  // A different first block shares nothing, even with equal later tokens.
  auto other = tokens(1, 40);
  other[0] = 12345;
  REQUIRE(r.engine->add_request(3, other, 1, now));
  out = r.drain(now);
  CHECK(out[3][0].cached_tokens == 0);
}

TEST_CASE("add_request refuses bad input and duplicate ids") {
  Run r(small_cfg());
  CHECK_FALSE(r.engine->add_request(1, std::vector<TokenId>{}, 1, 0));
  CHECK_FALSE(r.engine->add_request(1, tokens(1, 4), 0, 0));
  CHECK(r.engine->add_request(1, tokens(1, 4), 5, 0));
  CHECK_FALSE(r.engine->add_request(1, tokens(2, 4), 5, 0));
  std::vector<LocalBlockHash> two(2);
  CHECK_FALSE(r.engine->add_request_hashed(2, 7, two, 1, 0));  // 2 blocks need >= 8 tokens
}

TEST_CASE("stored events carry consecutive ids and a parent chain the index accepts") {
  Run r(small_cfg());
  double now = 0;
  r.engine->add_request(1, tokens(1, 16), 1, now);
  r.drain(now);
  const auto p = concat(tokens(1, 16), tokens(2, 8));
  r.engine->add_request(2, p, 1, now);
  r.drain(now);
  REQUIRE(r.events.size() == 2);
  for (size_t i = 0; i < r.events.size(); ++i) {
    CHECK(r.events[i].event_id == i + 1);
    CHECK(r.events[i].owner == CacheOwner{WorkerId{1}, 0});
  }
  const auto& first = std::get<KvStored>(r.events[0].data);
  const auto& second = std::get<KvStored>(r.events[1].data);
  CHECK_FALSE(first.parent.has_value());
  REQUIRE(first.blocks.size() == 4);
  REQUIRE(second.parent.has_value());
  CHECK(*second.parent == first.blocks.back().block_hash);
  CHECK(second.blocks.size() == 2);
  // Local hashes are the router's block hashes of the same tokens; ids chain.
  const auto locals = hash_blocks(p, 4);
  CHECK(first.blocks[0].tokens_hash == locals[0]);
  CHECK(first.blocks[0].block_hash == sequence_hash(SequenceHash{0}, locals[0]));
  CHECK(first.blocks[1].block_hash == sequence_hash(first.blocks[0].block_hash, locals[1]));
  RadixIndexer idx;
  for (auto& e : r.events) CHECK(idx.apply(e) == ApplyResult::Applied);
  auto m = idx.find_matches(locals);
  REQUIRE(m.owners.size() == 1);
  CHECK(m.owners[0].blocks == 6);
  CHECK(r.engine->cached_blocks() == 6);
}

TEST_CASE("blocks count as cached only once their prefill completes") {
  Run r(small_cfg());
  r.engine->add_request(1, tokens(1, 16), 2, 0);
  CHECK(r.engine->load().kv_active_blocks == 5);  // 4 prompt blocks + 1 to generate into
  CHECK(r.engine->cached_blocks() == 0);
  CHECK(r.engine->dump().empty());
  CHECK(r.events.empty());
  r.engine->advance_to(*r.engine->next_event_time());
  CHECK(r.engine->cached_blocks() == 4);
  CHECK(r.engine->dump().size() == 4);
  // Cancelled during prefill: nothing was computed, nothing stays.
  r.engine->add_request(2, tokens(2, 16), 2, r.engine->next_event_time().value());
  r.engine->cancel(2);
  double now = 0;
  r.drain(now);
  CHECK(r.engine->cached_blocks() == 4);
  CHECK(r.events.size() == 1);
}

TEST_CASE("capacity: LRU eviction of unreferenced blocks only, tail first, announced as removed") {
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
  CHECK(r.removed().empty());
  // A third prompt needs 5 blocks: 2 free, so 3 of request 1's (the least
  // recently used) go, its tail first; its head block stays reusable.
  r.engine->add_request(3, tokens(3, 16), 4, now);
  r.drain(now);
  auto rm = r.removed();
  REQUIRE(rm.size() == 1);
  REQUIRE(rm[0]->block_hashes.size() == 3);
  const auto& first = std::get<KvStored>(r.events[0].data);
  CHECK(rm[0]->block_hashes[0] == first.blocks[3].block_hash);
  CHECK(rm[0]->block_hashes[1] == first.blocks[2].block_hash);
  CHECK(rm[0]->block_hashes[2] == first.blocks[1].block_hash);
  CHECK(r.engine->cached_blocks() == 9);
  r.engine->add_request(4, tokens(1, 16), 1, now);
  auto out = r.drain(now);
  CHECK(out[4][0].cached_tokens == 4);
  // Referenced blocks are never evicted: with request 5 running on 5 blocks
  // and the other cached blocks unreferenced, a request needing 6 more waits
  // until 5 finishes.
  r.engine->add_request(5, tokens(5, 16), 4, now);
  r.engine->add_request(6, tokens(6, 20), 4, now);
  CHECK(r.engine->load().request_active_slots == 1);
  CHECK(r.engine->load().num_requests_waiting == 1);
  CHECK(r.engine->load().kv_active_blocks == 5);
  const size_t removed_before = r.removed().size();
  r.engine->advance_to(*r.engine->next_event_time());
  CHECK(r.engine->load().num_requests_waiting == 1);  // still waiting: only 5 blocks free or evictable
  CHECK(r.removed().size() == removed_before);        // and nothing evicted for it
  out = r.drain(now);
  CHECK(out[6].back().kind == EngineOutput::Kind::Finished);
  CHECK(r.engine->load().num_requests_waiting == 0);
  CHECK(r.engine->cached_blocks() <= c.kv_blocks);
}

TEST_CASE("the eviction hook hears of the victims before their removed event, which takes the next id after its announcements") {
  EngineConfig c = small_cfg();
  c.kv_blocks = 10;
  Run r(c);
  std::vector<SequenceHash> heard;
  uint64_t removed_events_before_hook = 0;
  r.engine->set_eviction_hook([&](const KvRemoved& rm) {
    heard = rm.block_hashes;
    removed_events_before_hook = r.removed().size();
    // A lower tier announces its copy of the first victim.
    KvEvent copy;
    copy.tier = StorageTier::HostPinned;
    copy.medium = "CPU";
    copy.data = KvRemoved{};  // any event: only its place in the sequence matters here
    r.engine->announce(copy);
  });
  double now = 0;
  r.engine->add_request(1, tokens(1, 16), 4, now);
  r.drain(now);
  r.engine->add_request(2, tokens(2, 16), 4, now);
  r.drain(now);
  CHECK(heard.empty());  // nothing evicted yet
  r.engine->add_request(3, tokens(3, 16), 4, now);
  r.drain(now);
  REQUIRE(heard.size() == 3);
  CHECK(removed_events_before_hook == 0);
  // The announcement, then the device's removal of the same victims, ids consecutive.
  size_t k = 0;
  for (size_t i = 0; i < r.events.size(); ++i)
    if (std::holds_alternative<KvRemoved>(r.events[i].data) && r.events[i].medium.empty()) k = i;
  REQUIRE(k > 0);
  const KvEvent& last = r.events[k];
  const KvEvent& announced = r.events[k - 1];
  CHECK(announced.medium == "CPU");
  CHECK(std::get<KvRemoved>(last.data).block_hashes == heard);
  CHECK(last.event_id == *announced.event_id + 1);
  for (size_t i = 1; i < r.events.size(); ++i) CHECK(r.events[i].event_id == *r.events[i - 1].event_id + 1);
  // A fork does not call it.
  heard.clear();
  Engine f = r.engine->fork();
  f.add_request(9, tokens(9, 32), 4, now);
  while (auto t = f.next_event_time()) f.advance_to(*t);
  CHECK(heard.empty());
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
  CHECK(out[1].back().kind == EngineOutput::Kind::Finished);
  CHECK(out[2].front().time_ms > out[1].back().time_ms);  // ran after 1 freed its blocks
  CHECK(r.engine->load().kv_active_blocks == 0);
}

TEST_CASE("step time follows the prefill polynomial on new tokens, then decode steps") {
  EngineConfig c = small_cfg();
  c.profile.decode_base_ms = 5;
  c.profile.decode_kv_ms = 10;
  Run r(c);
  r.engine->add_request(1, tokens(1, 100), 3, 0);
  const double expected = 4.209989e-7 * 100 * 100 + 1.518344e-2 * 100 + 16.50142;
  REQUIRE(r.engine->next_event_time().has_value());
  CHECK(*r.engine->next_event_time() == doctest::Approx(expected));
  CHECK(r.engine->prefill_ms(100) == doctest::Approx(expected));
  CHECK(r.engine->advance_to(expected - 0.001).empty());
  auto out = r.engine->advance_to(expected);
  REQUIRE(out.size() == 1);
  CHECK(out[0].time_ms == doctest::Approx(expected));
  // Decode: base + kv_ms * active fraction; 26 blocks (25 prompt + 1) of 64 in use.
  const double decode = 5 + 10 * 26.0 / 64.0;
  CHECK(*r.engine->next_event_time() == doctest::Approx(expected + decode));
  CHECK(r.engine->advance_to(expected + decode - 0.01).empty());
  double now = 0;
  auto rest = r.drain(now);
  CHECK(now == doctest::Approx(expected + 2 * decode));
  // The prompt again with 2 more tokens: 100 cached, 2 new.
  r.engine->add_request(2, tokens(1, 102), 1, now);
  CHECK(*r.engine->next_event_time() - now == doctest::Approx(r.engine->prefill_ms(2)));
  now = *r.engine->next_event_time();
  r.engine->advance_to(now);
  // Fully cached and block-aligned: at most 99 tokens hit (vLLM: the last
  // token is computed), in whole blocks: 96, and the last block is prefilled.
  r.engine->add_request(3, tokens(1, 100), 1, now);
  CHECK(*r.engine->next_event_time() - now == doctest::Approx(r.engine->prefill_ms(4)));
  now = *r.engine->next_event_time();
  auto three = r.engine->advance_to(now);
  REQUIRE_FALSE(three.empty());
  CHECK(three[0].cached_tokens == 96);
  // Speed parameters are configurable.
  EngineConfig fast = small_cfg();
  fast.profile.prefill_a = 0;
  fast.profile.prefill_b = 1;
  fast.profile.prefill_c = 2;
  Run f(fast);
  f.engine->add_request(1, tokens(1, 10), 1, 100);
  CHECK(*f.engine->next_event_time() == doctest::Approx(112));
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
  CHECK(*r.engine->next_event_time() == doctest::Approx(r.engine->prefill_ms(30)));
  double now = *r.engine->next_event_time();
  r.engine->advance_to(now);
  // Step 2: request 1 decodes (1 token), request 2 prefills (30): max_seqs reached.
  CHECK(r.engine->load().request_active_slots == 2);
  CHECK(r.engine->load().num_requests_waiting == 2);
  auto out = r.drain(now);
  for (uint64_t i = 1; i <= 4; ++i) CHECK(out[i].back().kind == EngineOutput::Kind::Finished);
  // A prompt above the budget is admitted and prefilled in chunks of the budget.
  Run big(c);
  big.engine->add_request(1, tokens(1, 200), 1, 0);
  CHECK(big.engine->load().request_active_slots == 1);
  CHECK(*big.engine->next_event_time() == doctest::Approx(big.engine->prefill_ms(50)));
}

TEST_CASE("scheduling policy: priority admits the lowest priority value first, fcfs by arrival") {
  // One slot: request 1 runs; 2 (priority 0), 3 (priority -1), 4 (priority
  // -1) and 5 (priority 0) wait. vLLM's priority policy pops (priority,
  // arrival): 3, 4, 2, 5; fcfs: 2, 3, 4, 5.
  const auto first_tokens = [](SchedulingPolicy policy) {
    EngineConfig c = small_cfg();
    c.kv_blocks = 1000;
    c.max_seqs = 1;
    c.policy = policy;
    Run r(c);
    r.engine->add_request(1, tokens(1, 8), 2, 0);
    const int64_t prio[] = {0, -1, -1, 0};
    for (uint64_t i = 2; i <= 5; ++i)
      CHECK(r.engine->add_request(i, tokens(static_cast<uint32_t>(i), 8), 1, 1, {}, true, {}, prio[i - 2]));
    double now = 0;
    std::vector<uint64_t> order;
    while (auto t = r.engine->next_event_time()) {
      now = *t;
      for (auto& o : r.engine->advance_to(now))
        if (o.kind == EngineOutput::Kind::FirstToken) order.push_back(o.request);
    }
    return order;
  };
  CHECK(first_tokens(SchedulingPolicy::Priority) == std::vector<uint64_t>{1, 3, 4, 2, 5});
  CHECK(first_tokens(SchedulingPolicy::Fcfs) == std::vector<uint64_t>{1, 2, 3, 4, 5});
}

TEST_CASE("queued_ms: an idle engine schedules at once; a busy one after the step in progress") {
  EngineConfig c = small_cfg();
  c.kv_blocks = 1000;
  Run r(c);
  r.engine->add_request(1, tokens(1, 8), 3, 0);
  const double step1 = *r.engine->next_event_time();
  r.engine->add_request(2, tokens(2, 8), 1, step1 / 4);  // arrives during step 1
  double now = 0;
  auto out = r.drain(now);
  CHECK(out[1].front().kind == EngineOutput::Kind::FirstToken);
  CHECK(out[1].front().queued_ms == 0);
  CHECK(out[2].front().kind == EngineOutput::Kind::FirstToken);
  CHECK(out[2].front().queued_ms == doctest::Approx(step1 - step1 / 4));
}

// Step time = new prompt tokens (1 ms each) + 10 ms if any request decodes.
EngineConfig chunk_cfg() {
  EngineConfig c = small_cfg();
  c.kv_blocks = 1000;
  c.max_seqs = 8;
  c.max_batched_tokens = 50;
  c.profile.prefill_a = 0;
  c.profile.prefill_b = 1;
  c.profile.prefill_c = 0;
  c.profile.decode_base_ms = 10;
  c.profile.decode_kv_ms = 0;
  return c;
}

TEST_CASE("chunked prefill: a hand-computed schedule (budget 50 tokens a step, running requests first)") {
  Run r(chunk_cfg());
  double now = 0;
  std::map<uint64_t, std::vector<EngineOutput>> out;
  auto step = [&](double expect_end) {
    REQUIRE(r.engine->next_event_time().has_value());
    CHECK(*r.engine->next_event_time() == doctest::Approx(expect_end));
    now = *r.engine->next_event_time();
    for (auto& o : r.engine->advance_to(now)) out[o.request].push_back(o);
  };
  REQUIRE(r.engine->add_request(1, tokens(1, 120), 3, 0));  // A: 120 tokens = 30 blocks of 4
  REQUIRE(r.engine->add_request(2, tokens(2, 40), 2, 10));  // B arrives during A's first chunk
  // Step 1 [0, 50): A 0..50. Its 12 complete blocks are announced at the end.
  step(50);
  CHECK(out.empty());
  CHECK(r.engine->cached_blocks() == 12);
  // Step 2 [50, 100): A 50..100 takes the whole budget; B still waits.
  CHECK(r.engine->load().num_requests_waiting == 1);
  step(100);
  CHECK(r.engine->cached_blocks() == 25);
  CHECK(out.empty());
  // Step 3 [100, 150): A's last 20 tokens, then B admitted with the 30 left: 50 ms.
  step(150);
  REQUIRE(out[1].size() == 1);
  CHECK(out[1][0].kind == EngineOutput::Kind::FirstToken);
  CHECK(out[1][0].time_ms == doctest::Approx(150));
  CHECK(out[2].empty());
  CHECK(r.engine->cached_blocks() == 30 + 7);  // all of A, B's first 30 tokens = 7 whole blocks
  // Step 4 [150, 170): A decodes first (1 token), B's last 10 tokens: 10 + 10 ms.
  step(170);
  REQUIRE(out[2].size() == 1);
  CHECK(out[2][0].kind == EngineOutput::Kind::FirstToken);
  CHECK(out[1].back().kind == EngineOutput::Kind::Token);
  // Step 5 [170, 180): both decode; A has its 3 tokens, B its 2.
  step(180);
  CHECK(out[1].back().kind == EngineOutput::Kind::Finished);
  CHECK(out[2].back().kind == EngineOutput::Kind::Finished);
  CHECK_FALSE(r.engine->next_event_time().has_value());
}

TEST_CASE("a request added after an overdue step end waits for the first step that starts once it has arrived") {
  // kvroute-mocker advances its engine on a timer that fires late on a busy
  // host: a request may be added at a time past the end of a step the engine
  // has not completed yet. Budget 50 tokens, 1 ms per prefill token, 10 ms a decode step.
  Run r(chunk_cfg());
  REQUIRE(r.engine->add_request(1, tokens(1, 20), 3, 0));  // A: step [0, 20)
  CHECK(*r.engine->next_event_time() == doctest::Approx(20));
  // B arrives at 25 while the engine still stands at step [0, 20).
  REQUIRE(r.engine->add_request(2, tokens(2, 8), 1, 25));
  // [0, 20) A's prefill; [20, 30) A decodes alone (B had not arrived at 20);
  // [30, 48) A decodes and B prefills (8 + 10 ms): B's first token at 48, not 38.
  std::map<uint64_t, std::vector<EngineOutput>> out;
  for (auto& o : r.engine->advance_to(1000)) out[o.request].push_back(o);
  REQUIRE(out[2].size() == 2);
  CHECK(out[2][0].kind == EngineOutput::Kind::FirstToken);
  CHECK(out[2][0].time_ms == doctest::Approx(48));
  REQUIRE(out[1].size() == 4);
  CHECK(out[1][1].time_ms == doctest::Approx(30));
  CHECK(out[1][3].time_ms == doctest::Approx(48));  // its last token, in B's first step

  // An idle engine that was not advanced since its last step: the late
  // request's step starts at its arrival, not at that step's end.
  Run idle(chunk_cfg());
  REQUIRE(idle.engine->add_request(1, tokens(3, 8), 1, 0));  // [0, 8), finishes there
  REQUIRE(idle.engine->add_request(2, tokens(4, 8), 1, 100));
  auto late = idle.engine->advance_to(1000);
  REQUIRE(late.size() == 4);
  CHECK(late[2].request == 2);
  CHECK(late[2].time_ms == doctest::Approx(108));
}

TEST_CASE("chunked prefill: a decode batch shares the budget; a later prompt reuses blocks finished by earlier chunks") {
  EngineConfig c = chunk_cfg();
  c.max_batched_tokens = 40;
  Run r(c);
  double now = 0;
  // Three short requests decode for a while. Request 1 starts alone (4 ms);
  // then 1 decodes while 2 and 3 prefill: 8 + 10 ms.
  for (uint64_t i = 1; i <= 3; ++i) REQUIRE(r.engine->add_request(i, tokens(uint32_t(i), 4), 20, 0));
  CHECK(*r.engine->next_event_time() == doctest::Approx(4));
  r.engine->advance_to(4);
  CHECK(*r.engine->next_event_time() == doctest::Approx(22));
  r.engine->advance_to(22);
  // Step 3 [22, 32) is a pure decode step, already started when a 100-token prompt arrives.
  const auto long_prompt = tokens(4, 100);
  REQUIRE(r.engine->add_request(4, long_prompt, 1, 22));
  CHECK(*r.engine->next_event_time() == doctest::Approx(32));
  r.engine->advance_to(32);
  // Step 4: the 3 decodes take 3 tokens of the budget, the prompt's first chunk the other 37.
  CHECK(*r.engine->next_event_time() == doctest::Approx(32 + 37 + 10));
  r.engine->advance_to(79);
  CHECK(r.engine->cached_blocks() == 3 + 9);  // 1 block per short prompt; 37 tokens = 9 whole blocks
  // The long prompt's first 36 tokens + 4 others arrive; step 5 (decodes + the next 37) has started.
  auto five = concat(std::vector<TokenId>(long_prompt.begin(), long_prompt.begin() + 36), tokens(5, 4));
  REQUIRE(r.engine->add_request(5, five, 1, 79));
  CHECK(*r.engine->next_event_time() == doctest::Approx(79 + 37 + 10));
  r.engine->advance_to(126);
  // Step 6: decodes 3, the long prompt's last 26 tokens, then request 5 with its 9 blocks
  // cached computes only its last 4 tokens: 30 + 10 ms; both first tokens at 166.
  CHECK(*r.engine->next_event_time() == doctest::Approx(126 + 30 + 10));
  size_t firsts = 0;
  for (auto& o : r.engine->advance_to(166))
    if (o.kind == EngineOutput::Kind::FirstToken) {
      ++firsts;
      CHECK(o.time_ms == doctest::Approx(166));
      CHECK(o.cached_tokens == (o.request == 5 ? 36u : 0u));
    }
  CHECK(firsts == 2);
}

TEST_CASE("chunked prefill on a fitted profile: a chunk pays attention over the tokens before it") {
  EngineConfig c = small_cfg();
  c.profile = *find_profile("h100-llama3-8b");
  c.kv_blocks = 100000;
  c.max_batched_tokens = 2048;
  Run r(c);
  REQUIRE(r.engine->add_request(1, tokens(1, 5000), 1, 0));
  // Chunks 0..2048, 2048..4096, 4096..5000.
  double t = c.profile.prefill_ms(2048, 0);
  CHECK(*r.engine->next_event_time() == doctest::Approx(t));
  r.engine->advance_to(t);
  const double second = c.profile.prefill_ms(2048, 2048);
  CHECK(second > c.profile.prefill_ms(2048, 0));
  CHECK(*r.engine->next_event_time() == doctest::Approx(t + second));
  r.engine->advance_to(t + second);
  t += second + c.profile.prefill_ms(904, 4096);
  CHECK(*r.engine->next_event_time() == doctest::Approx(t));
  auto out = r.engine->advance_to(t);
  REQUIRE(out.size() == 2);
  CHECK(out[0].kind == EngineOutput::Kind::FirstToken);
}

TEST_CASE("cancel releases the request's blocks; dump reflects the cache") {
  Run r(small_cfg());
  double now = 0;
  r.engine->add_request(1, tokens(1, 16), 100, now);
  r.engine->add_request(2, tokens(2, 16), 100, now);
  now = *r.engine->next_event_time();
  r.engine->advance_to(now);  // both prefilled, decoding
  CHECK(r.engine->load().kv_active_blocks > 0);
  CHECK(r.engine->cancel(1));
  CHECK_FALSE(r.engine->cancel(1));
  CHECK(r.engine->load().request_active_slots == 1);
  auto out = r.engine->advance_to(*r.engine->next_event_time());
  REQUIRE(out.size() == 1);
  CHECK(out[0].request == 2);  // no more output for the cancelled one
  CHECK(r.engine->cancel(2));
  CHECK(r.engine->load().kv_active_blocks == 0);
  CHECK(r.engine->load().request_active_slots == 0);
  // A waiting request can be cancelled too.
  EngineConfig one = small_cfg();
  one.max_seqs = 1;
  Run w(one);
  w.engine->add_request(1, tokens(1, 8), 2, 0);
  w.engine->add_request(2, tokens(2, 8), 2, 0);
  CHECK(w.engine->load().num_requests_waiting == 1);
  CHECK(w.engine->cancel(2));
  CHECK(w.engine->load().num_requests_waiting == 0);

  auto dump = r.engine->dump();
  CHECK(dump.size() == 8);
  RadixIndexer from_events, from_dump;
  for (auto& e : r.events) from_events.apply(e);
  for (auto& e : dump) CHECK(from_dump.apply(e) == ApplyResult::Applied);
  CHECK(from_dump.stats().entries == from_events.stats().entries);
  CHECK(r.engine->last_event_id() == r.events.size());
}

TEST_CASE("random workload: the index fed with the events always equals the cache") {
  EngineConfig c = small_cfg();
  c.kv_blocks = 40;
  c.max_seqs = 4;
  c.max_batched_tokens = 64;
  Run r(c);
  RadixIndexer idx;
  size_t applied = 0;
  std::mt19937_64 rng(7);
  double now = 0;
  uint64_t next_id = 1;
  std::vector<uint64_t> live;
  for (int iter = 0; iter < 3000; ++iter) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4) {
      // Prompts from a few shared prefixes with random tails.
      auto p = tokens(static_cast<uint32_t>(rng() % 5), 4 * (rng() % 6));
      p = concat(p, tokens(1000 + static_cast<uint32_t>(rng() % 50), 1 + rng() % 10));
      if (r.engine->add_request(next_id, p, 1 + static_cast<uint32_t>(rng() % 8), now)) live.push_back(next_id);
      ++next_id;
    } else if (op == 4 && !live.empty()) {
      r.engine->cancel(live[rng() % live.size()]);
    } else if (auto t = r.engine->next_event_time()) {
      now = *t;
      r.engine->advance_to(now);
    }
    for (; applied < r.events.size(); ++applied) {
      REQUIRE(r.events[applied].event_id == applied + 1);
      REQUIRE(idx.apply(r.events[applied]) == ApplyResult::Applied);
    }
    REQUIRE(idx.stats().entries == r.engine->cached_blocks());
    const auto l = r.engine->load();
    REQUIRE(l.kv_active_blocks <= c.kv_blocks);
    REQUIRE(l.request_active_slots <= c.max_seqs);
  }
  CHECK(!r.removed().empty());  // the cache was under pressure
  RadixIndexer from_dump;
  for (auto& e : r.engine->dump()) REQUIRE(from_dump.apply(e) == ApplyResult::Applied);
  CHECK(from_dump.stats().entries == r.engine->cached_blocks());
  CHECK(from_dump.stats().blocks == idx.stats().blocks);
  r.drain(now);
  CHECK(r.engine->load().kv_active_blocks == 0);
}

TEST_CASE("deterministic: the same calls give the same events and outputs") {
  auto run = [] {
    Run r(small_cfg());
    std::vector<double> times;
    double now = 0;
    for (uint64_t i = 1; i <= 20; ++i) {
      r.engine->add_request(i, tokens(static_cast<uint32_t>(i % 3), 8 + i), 3, now);
      if (auto t = r.engine->next_event_time()) {
        now = *t;
        for (auto& o : r.engine->advance_to(now)) times.push_back(o.time_ms + static_cast<double>(o.request));
      }
    }
    r.drain(now);
    std::vector<uint64_t> ids;
    for (auto& e : r.events)
      if (auto* s = std::get_if<KvStored>(&e.data))
        for (auto& b : s->blocks) ids.push_back(b.block_hash.value);
    return std::make_pair(times, ids);
  };
  CHECK(run() == run());
}

TEST_CASE("fork: a what-if copy runs as the engine would, announces nothing and leaves the engine as it was") {
  // A cache of 12 blocks under prompts of 3-6 blocks evicts throughout, so the
  // copy's LRU order is exercised; 6 prompts over 3 prefixes share blocks.
  EngineConfig c = small_cfg();
  c.kv_blocks = 12;
  c.max_seqs = 2;
  const auto feed = [](Engine& e, uint64_t from, uint64_t to, double now) {
    for (uint64_t i = from; i < to; ++i) e.add_request(i, tokens(static_cast<uint32_t>(i % 3), 10 + 2 * i % 14), 3, now);
  };
  const auto outputs = [](Engine& e, double now) {
    std::vector<std::tuple<uint64_t, int, double, uint32_t>> out;
    while (auto t = e.next_event_time()) {
      now = *t;
      for (auto& o : e.advance_to(now)) out.emplace_back(o.request, int(o.kind), o.time_ms, o.cached_tokens);
    }
    return out;
  };
  // Reference: one engine given requests 1-8, run a step, then 9-14.
  Run ref(c);
  feed(*ref.engine, 1, 9, 0);
  const double mid = *ref.engine->next_event_time();
  ref.engine->advance_to(mid);
  feed(*ref.engine, 9, 15, mid);
  const auto want = outputs(*ref.engine, mid);
  REQUIRE(want.size() > 14);

  // The same, forked after the step: the fork runs the rest as the reference.
  Run r(c);
  feed(*r.engine, 1, 9, 0);
  r.engine->advance_to(mid);
  const size_t events = r.events.size();
  Engine f = r.engine->fork();
  CHECK(f.last_event_id() == r.engine->last_event_id());
  feed(f, 9, 15, mid);
  CHECK(outputs(f, mid) == want);
  CHECK(r.events.size() == events);  // the fork announced nothing through the engine's callback
  CHECK(f.cached_blocks() <= c.kv_blocks);
  // The engine itself is untouched by what the fork did, and runs the rest identically.
  feed(*r.engine, 9, 15, mid);
  CHECK(outputs(*r.engine, mid) == want);
  CHECK(r.events.size() == ref.events.size());
  CHECK(r.removed().size() == ref.removed().size());
  CHECK(!r.removed().empty());  // the run evicted
}

TEST_CASE("prefill role: a held request keeps its prompt blocks referenced until released") {
  EngineConfig c = small_cfg();
  c.kv_blocks = 10;
  Run r(c);
  double now = 0;
  REQUIRE(r.engine->add_request(1, tokens(1, 18), 1, now, {}, true, PdOptions{.hold = true}));
  auto out = r.drain(now);
  REQUIRE(out[1].back().kind == EngineOutput::Kind::Finished);
  REQUIRE(r.engine->held(1) != nullptr);
  CHECK(r.engine->held(1)->size() == 4);  // complete prompt blocks only (18 tokens, blocks of 4)
  CHECK(*r.engine->held(1) == r.engine->prompt_blocks(tokens(1, 18)));
  CHECK(r.engine->held_requests() == 1);
  CHECK(r.engine->held_blocks() == 4);
  CHECK(r.engine->load().kv_active_blocks == 4);  // held blocks are in use; the private ones were freed
  // Under pressure the held blocks are not evicted: a request needing the 6
  // other blocks runs, one needing 7 waits.
  REQUIRE(r.engine->add_request(2, tokens(2, 20), 4, now));  // 5 prompt blocks + 1
  r.drain(now);
  REQUIRE(r.engine->add_request(3, tokens(3, 24), 4, now));  // 6 + 1 = 7 > 10 - 4 held
  r.engine->advance_to(now + 1000);
  CHECK(r.engine->load().num_requests_waiting == 1);
  for (const auto* rm : r.removed())
    for (auto h : rm->block_hashes)
      CHECK(std::find(r.engine->held(1)->begin(), r.engine->held(1)->end(), h) == r.engine->held(1)->end());
  // Released: the blocks stay cached, unreferenced, and the waiting request runs.
  CHECK(r.engine->release_held(1));
  CHECK_FALSE(r.engine->release_held(1));
  CHECK(r.engine->held_blocks() == 0);
  CHECK(r.engine->held(1) == nullptr);
  r.engine->advance_to(now);  // nothing due; wake the queue with a step
  REQUIRE(r.engine->add_request(4, tokens(4, 4), 1, now));
  out = r.drain(now);
  CHECK(out[3].back().kind == EngineOutput::Kind::Finished);
}

TEST_CASE("prefill role: a cancelled hold request holds nothing") {
  Run r(small_cfg());
  double now = 0;
  REQUIRE(r.engine->add_request(1, tokens(1, 16), 5, now, {}, true, PdOptions{.hold = true}));
  r.engine->advance_to(*r.engine->next_event_time());  // prefilled, decoding
  CHECK(r.engine->cancel(1));
  CHECK(r.engine->held(1) == nullptr);
  CHECK(r.engine->held_blocks() == 0);
  CHECK(r.engine->load().kv_active_blocks == 0);
}

TEST_CASE("decode role: imported blocks are stored at admission, skip prefill, and locally cached ones are not announced again") {
  EngineConfig c = small_cfg();
  Run r(c);
  double now = 0;
  // The decode worker holds the first 2 blocks of the prompt already.
  REQUIRE(r.engine->add_request(1, tokens(1, 8), 1, now));
  r.drain(now);
  const size_t events_before = r.events.size();
  const auto prompt = tokens(1, 22);  // 5 complete blocks + 2 tokens
  const auto blocks = r.engine->prompt_blocks(prompt);
  CHECK(r.engine->cached_prefix(blocks) == 2);
  const double t0 = now;
  REQUIRE(r.engine->add_request(2, prompt, 1, now, {}, true, PdOptions{.imported_blocks = 5}));
  // Announced at admission: one chain of the 3 pulled blocks under block 1.
  REQUIRE(r.events.size() == events_before + 1);
  const auto& st = std::get<KvStored>(r.events.back().data);
  REQUIRE(st.blocks.size() == 3);
  CHECK(st.parent == blocks[1]);
  CHECK(st.blocks[0].block_hash == blocks[2]);
  CHECK(st.blocks[2].block_hash == blocks[4]);
  CHECK(r.engine->cached_prefix(blocks) == 5);
  auto out = r.drain(now);
  CHECK(out[2][0].cached_tokens == 20);
  // Only the 2 tokens after the pulled blocks are prefilled: the step costs
  // what a 2-token prefill does, far less than 22 tokens would.
  CHECK(out[2][0].time_ms - t0 == doctest::Approx(c.profile.prefill_ms(2, 20)));
  CHECK(r.engine->cached_blocks() == 5);
  // A block-aligned prompt fully imported still computes its last token's block (vLLM's rule).
  const auto aligned = tokens(7, 8);
  REQUIRE(r.engine->add_request(3, aligned, 1, now, {}, true, PdOptions{.imported_blocks = 9}));  // clipped to 2
  out = r.drain(now);
  CHECK(out[3][0].cached_tokens == 4);
}
