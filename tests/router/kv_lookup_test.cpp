#include "router/kv_lookup.h"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <numeric>
#include <random>

#include "indexer/block_hash.h"
#include "indexer/pool_index.h"
#include "indexer/radix_indexer.h"
#include "router/admin_api.h"

using namespace kvroute;

namespace {

constexpr uint32_t kBlock = 16;

// The admin token and block size every fixture here runs with.
Config lookup_config() {
  Config c;
  c.admin.token = "s3cret";
  c.indexer.block_size = kBlock;
  return c;
}

struct Fixture {
  ManualClock clock;
  SeededRandom random{1};
  RadixIndexer index;
  WorkerRegistry registry{clock};
  ConfigStore config{lookup_config()};
  RoutingService routing{index, registry, config, random};
  AdminApi api{config, routing, registry, index};
  uint64_t next_id = 1;

  void add_worker(uint32_t id, std::string model, std::vector<std::string> loras = {}) {
    WorkerAnnouncement a;
    a.id = WorkerId{id};
    a.url = "http://127.0.0.1:" + std::to_string(9000 + id);
    a.model = std::move(model);
    a.lora_adapters = std::move(loras);
    a.load = WorkerLoad{0, 10, 0, 0, 1000};
    registry.upsert(a);  // a router-known worker (heartbeats carry no LoRA adapters)
  }
  // `owner` stores blocks [from, to) of `tokens` (hashed as the router hashes
  // them, under `lora`) in `tier`, as children of block from-1.
  void store(CacheOwner owner, const std::vector<TokenId>& tokens, size_t from, size_t to, StorageTier tier,
             std::string_view lora = {}) {
    std::vector<LocalBlockHash> h;
    hash_blocks(tokens, kBlock, HashNamespace{lora, {}}, h);
    KvStored s;
    if (from > 0) s.parent = SequenceHash{owner.worker.value * 1000000 + from - 1};
    for (size_t i = from; i < to; ++i) s.blocks.push_back(StoredBlock{SequenceHash{owner.worker.value * 1000000 + i}, h[i]});
    KvEvent e;
    e.owner = owner;
    e.tier = tier;
    e.data = std::move(s);
    REQUIRE(index.apply(e) == ApplyResult::Applied);
  }
};

std::vector<TokenId> prompt(size_t n) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), 100);
  return t;
}

std::string tokens_body(const std::vector<TokenId>& t, std::string_view extra = "") {
  std::string s = R"({"tokens":[)";
  for (size_t i = 0; i < t.size(); ++i) s += (i ? "," : "") + std::to_string(t[i]);
  return s + "]" + std::string(extra) + "}";
}

constexpr std::string_view kAuth = "Bearer s3cret";

// A fleet of model "m" whose workers 1 and 2 mount pool "lmc" (medium LMCache).
struct PoolFixture {
  ManualClock clock;
  SeededRandom random{1};
  RadixIndexer radix;
  PoolIndex index{radix, {PoolSpec{"lmc", "LMCache", {WorkerId{1}, WorkerId{2}}, 0}}};
  WorkerRegistry registry{clock};
  ConfigStore config{lookup_config()};
  RoutingService routing{index, registry, config, random};
  AdminApi api{config, routing, registry, index};
  std::vector<LocalBlockHash> h;  // the hashed prompt's blocks

  PoolFixture(const std::vector<TokenId>& prompt, std::initializer_list<uint32_t> workers, uint32_t dp_size = 1) {
    api.set_pool_names({"lmc"});
    hash_blocks(prompt, kBlock, HashNamespace{}, h);
    for (uint32_t id : workers) {
      WorkerAnnouncement a;
      a.id = WorkerId{id};
      a.url = "http://127.0.0.1:" + std::to_string(9000 + id);
      a.model = "m";
      a.dp_size = dp_size;
      a.load = WorkerLoad{0, 10, 0, 0, 1000};
      registry.upsert(a);
    }
  }
  // `owner` stores the prompt's blocks [from, to) with `medium`.
  void store(CacheOwner owner, size_t from, size_t to, std::string medium) {
    KvStored s;
    if (from > 0) s.parent = SequenceHash{owner.worker.value * 1000 + from - 1};
    for (size_t i = from; i < to; ++i) s.blocks.push_back(StoredBlock{SequenceHash{owner.worker.value * 1000 + i}, h[i]});
    KvEvent e;
    e.owner = owner;
    e.medium = std::move(medium);
    e.data = std::move(s);
    REQUIRE(index.apply(e) == ApplyResult::Applied);
  }
};

}  // namespace

TEST_CASE("kv lookup: every holder with its prefix and tiers, longest first, LMCache's layout_info") {
  Fixture f;
  f.add_worker(1, "m");
  f.add_worker(2, "m");
  f.add_worker(3, "other");
  const auto t = prompt(5 * kBlock + 3);  // 5 complete blocks and a partial one
  f.store({WorkerId{1}, 0}, t, 0, 2, StorageTier::Device);
  f.store({WorkerId{2}, 0}, t, 0, 2, StorageTier::Device);
  f.store({WorkerId{2}, 0}, t, 2, 4, StorageTier::HostPinned);
  f.store({WorkerId{3}, 0}, t, 0, 5, StorageTier::Device);

  const auto r = f.api.handle("POST", "/v1/kv/lookup", kAuth, tokens_body(t, R"(,"model":"m")"));
  REQUIRE(r.status == 200);
  simdjson::dom::parser p;
  const simdjson::dom::element doc = p.parse(r.body);
  CHECK(doc["prompt_tokens"].get_uint64().value() == 5 * kBlock + 3);
  CHECK(doc["complete_blocks"].get_uint64().value() == 5);
  CHECK(doc["token_source"].get_string().value() == "client");
  const auto workers = doc["workers"].get_array().value();
  REQUIRE(workers.size() == 2);  // worker 3 serves another model
  CHECK(workers.at(0)["worker_id"].get_uint64().value() == 2);
  CHECK(workers.at(0)["matched_tokens"].get_uint64().value() == 4 * kBlock);
  CHECK(workers.at(0)["tiers"]["device"].get_uint64().value() == 2 * kBlock);
  CHECK(workers.at(0)["tiers"]["host_pinned"].get_uint64().value() == 2 * kBlock);
  CHECK(workers.at(0)["url"].get_string().value() == "http://127.0.0.1:9002");
  CHECK(workers.at(1)["worker_id"].get_uint64().value() == 1);
  CHECK(workers.at(1)["matched_tokens"].get_uint64().value() == 2 * kBlock);
  // LMCache's shape: instance -> [location, matched prefix tokens]; the
  // location is the slowest tier the prefix touches.
  CHECK(doc["layout_info"]["2"].at(0).get_string().value() == "host_pinned");
  CHECK(doc["layout_info"]["2"].at(1).get_uint64().value() == 4 * kBlock);
  CHECK(doc["layout_info"]["1"].at(0).get_string().value() == "device");

  CHECK(doc["workers_total"].get_uint64().value() == 2);

  // max_workers keeps the longest matches and says how many there were.
  const auto top = f.api.handle("POST", "/v1/kv/lookup", kAuth, tokens_body(t, R"(,"model":"m","max_workers":1)"));
  REQUIRE(top.status == 200);
  const simdjson::dom::element one = p.parse(top.body);
  CHECK(one["workers"].get_array().value().size() == 1);
  CHECK(one["workers"].at(0)["worker_id"].get_uint64().value() == 2);
  CHECK(one["workers_total"].get_uint64().value() == 2);

  // Without a model (LMCache's shape has none), every worker is looked at.
  const auto any = f.api.handle("POST", "/v1/kv/lookup", kAuth, tokens_body(t));
  REQUIRE(any.status == 200);
  const simdjson::dom::element all = p.parse(any.body);
  CHECK(all["workers"].get_array().value().size() == 3);
  CHECK(all["workers"].at(0)["worker_id"].get_uint64().value() == 3);
}

TEST_CASE("kv lookup hashes as the data plane: a LoRA adapter's and a salted prompt's blocks are their own") {
  Fixture f;
  f.add_worker(1, "m", {"adapter"});
  const auto t = prompt(3 * kBlock);
  f.store({WorkerId{1}, 0}, t, 0, 3, StorageTier::Device, "adapter");
  auto matched = [&](std::string_view extra) {
    const auto r = f.api.handle("POST", "/v1/kv/lookup", kAuth, tokens_body(t, extra));
    REQUIRE(r.status == 200);
    simdjson::dom::parser p;
    const auto workers = p.parse(r.body)["workers"].get_array().value();
    return workers.size() == 0 ? uint64_t{0} : workers.at(0)["matched_tokens"].get_uint64().value();
  };
  CHECK(matched(R"(,"model":"adapter")") == 3 * kBlock);
  CHECK(matched(R"(,"model":"m")") == 0);  // the base model's blocks hash without the adapter
  CHECK(matched(R"(,"model":"adapter","cache_salt":"tenant-a")") == 0);
  // A completion body with token ids reads the same as LMCache's shape.
  std::string body = R"({"model":"adapter","prompt":[)";
  for (size_t i = 0; i < t.size(); ++i) body += (i ? "," : "") + std::to_string(t[i]);
  body += "]}";
  const auto r = f.api.handle("POST", "/v1/kv/lookup", kAuth, body);
  CHECK(r.status == 200);
  CHECK(r.body.find(R"("matched_tokens":48)") != std::string::npos);
}

TEST_CASE("kv lookup refuses bad bodies with a clear 400 and wants the admin token") {
  Fixture f;
  f.add_worker(1, "m");
  CHECK(f.api.handle("POST", "/v1/kv/lookup", "", R"({"tokens":[1,2]})").status == 401);
  for (std::string_view bad : {R"([1,2])", R"({"tokens":[1,-2]})", R"({"tokens":[1,4294967296]})",
                               R"({"tokens":"1 2"})", R"({"tokens":[1],"prompt":"x","model":"m"})", R"({})",
                               R"({"tokens":[1],"model":7})", R"({"tokens":[1],"cache_salt":""})", "{",
                               R"({"tokens":[1],"max_workers":0})", R"({"tokens":[1],"max_workers":1.5})"}) {
    const auto r = f.api.handle("POST", "/v1/kv/lookup", kAuth, bad);
    INFO(bad);
    CHECK(r.status == 400);
    CHECK(r.body.find("invalid_request_error") != std::string::npos);
  }
}

TEST_CASE("kv lookup of a prompt the engine does not read its cache for (prompt_logprobs) matches nothing") {
  Fixture f;
  f.add_worker(1, "m");
  const auto t = prompt(2 * kBlock);
  f.store({WorkerId{1}, 0}, t, 0, 2, StorageTier::Device);
  std::string body = R"({"model":"m","prompt_logprobs":1,"prompt":[)";
  for (size_t i = 0; i < t.size(); ++i) body += (i ? "," : "") + std::to_string(t[i]);
  body += "]}";
  const auto r = f.api.handle("POST", "/v1/kv/lookup", kAuth, body);
  REQUIRE(r.status == 200);
  CHECK(r.body.find(R"("workers":[])") != std::string::npos);
}

TEST_CASE("kv lookup reports a shared pool's part of each member's prefix, in its own tier, named") {
  const auto t = prompt(6 * kBlock);
  PoolFixture f(t, {1, 2, 3});
  auto& api = f.api;
  auto store = [&](uint64_t worker, size_t from, size_t to, std::string medium) {
    f.store(CacheOwner{WorkerId{worker}, 0}, from, to, std::move(medium));
  };
  store(1, 0, 5, "LMCache");  // worker 1 offloaded 5 blocks to the pool
  store(2, 0, 2, "");         // worker 2 holds 2 on its device
  store(3, 0, 1, "");         // worker 3 mounts no pool

  const auto r = api.handle("POST", "/v1/kv/lookup", kAuth, tokens_body(t, R"(,"model":"m")"));
  REQUIRE(r.status == 200);
  simdjson::dom::parser p;
  const simdjson::dom::element doc = p.parse(r.body);
  const auto workers = doc["workers"].get_array().value();
  REQUIRE(workers.size() == 3);
  // Both members hold the pool's 5 blocks; worker 2 its own 2 first.
  CHECK(workers.at(0)["worker_id"].get_uint64().value() == 1);
  CHECK(workers.at(0)["matched_tokens"].get_uint64().value() == 5 * kBlock);
  CHECK(workers.at(0)["tiers"]["pool"].get_uint64().value() == 5 * kBlock);
  CHECK(workers.at(0)["tiers"]["device"].get_uint64().value() == 0);
  CHECK(workers.at(0)["pool"].get_string().value() == "lmc");
  CHECK(workers.at(1)["worker_id"].get_uint64().value() == 2);
  CHECK(workers.at(1)["tiers"]["device"].get_uint64().value() == 2 * kBlock);
  CHECK(workers.at(1)["tiers"]["pool"].get_uint64().value() == 3 * kBlock);
  CHECK(workers.at(2)["worker_id"].get_uint64().value() == 3);
  CHECK(workers.at(2)["tiers"]["pool"].get_uint64().value() == 0);
  CHECK(workers.at(2)["pool"].error() == simdjson::NO_SUCH_FIELD);
  // LMCache's layout: a pool hit is located in the pool (what loading waits on).
  CHECK(doc["layout_info"]["2"].at(0).get_string().value() == "lmc");
  CHECK(doc["layout_info"]["3"].at(0).get_string().value() == "device");
}

TEST_CASE("kv lookup answers as the reference lookup (find_matches, a table lookup and a sort) on shared prefixes") {
  // 40 workers (every third serving another model, some with two dp
  // ranks) share a system prompt; subsets of them hold longer prefixes, in
  // other tiers; the answer must be the reference's, JSON byte for byte,
  // for every max_workers.
  // With the longest prefixes in another tier, the index lists every owner
  // one by one (layers mix no tiers): that path is compared too.
  bool mixed_tiers = false;
  SUBCASE("one tier: the index's shared layers") {}
  SUBCASE("mixed tiers: every owner listed") { mixed_tiers = true; }
  Fixture f;
  for (uint32_t id = 1; id <= 40; ++id) f.add_worker(id, id % 3 == 0 ? "other" : "m");
  const auto t = prompt(12 * kBlock + 5);
  std::mt19937 rng(11);
  for (uint32_t id = 1; id <= 40; ++id)
    for (uint32_t rank = 0; rank < (id % 4 == 0 ? 2u : 1u); ++rank) {
      const CacheOwner o{WorkerId{id}, rank};
      f.store(o, t, 0, 4, StorageTier::Device);  // the system prompt: one layer of 40+ owners
      const size_t deeper = rng() % 4;             // 0: the system prompt only
      if (deeper == 0) continue;
      f.store(o, t, 4, 4 + 2 * deeper, mixed_tiers && deeper == 3 ? StorageTier::HostPinned : StorageTier::Device);
    }
  MatchLayers layers;
  std::vector<LocalBlockHash> h;
  hash_blocks(t, kBlock, HashNamespace{}, h);
  f.index.find_match_layers(h, layers);
  CHECK(layers.layers.size() == (mixed_tiers ? 0u : 4u));
  const KvLookupSources src{f.routing, f.index, f.registry};
  for (const char* model : {"m", "other", ""})
    for (size_t max : {size_t{1}, size_t{5}, size_t{16}, size_t{17}, size_t{30}, kMaxLookupHolders}) {
      CAPTURE(model);
      CAPTURE(max);
      ParsedRequest req;
      req.model = model;
      req.has_prompt_tokens = true;
      req.prompt_tokens = t;
      RouteResult scratch;
      KvLookupResult got, want;
      kv_lookup_reference(src, req, kBlock, max, scratch, want);
      kv_lookup(src, req, kBlock, max, scratch, got);
      CHECK(got.holders_total == want.holders_total);
      CHECK(got.holders.size() == std::min<size_t>(max, want.holders_total));
      CHECK(kv_lookup_json(got) == kv_lookup_json(want));
    }
  // The kept set follows the worker table: a worker that left is not listed.
  f.registry.remove(WorkerId{1});
  ParsedRequest req;
  req.model = "m";
  req.has_prompt_tokens = true;
  req.prompt_tokens = t;
  RouteResult scratch;
  KvLookupResult got, want;
  kv_lookup_reference(src, req, kBlock, kMaxLookupHolders, scratch, want);
  kv_lookup(src, req, kBlock, kMaxLookupHolders, scratch, got);
  CHECK(kv_lookup_json(got) == kv_lookup_json(want));
  CHECK(kv_lookup_json(got).find(R"("worker_id":1,)") == std::string::npos);
}

TEST_CASE("a pool member with several dp ranks: each rank's own prefix continues in the pool; a pool-only hit names no rank") {
  const auto t = prompt(6 * kBlock);
  PoolFixture f(t, {1, 2}, 4);
  auto& api = f.api;
  auto& routing = f.routing;
  auto store = [&](CacheOwner owner, size_t from, size_t to, std::string medium) {
    f.store(owner, from, to, std::move(medium));
  };
  store(CacheOwner{WorkerId{1}, 0}, 0, 5, "LMCache");  // the pool: 5 blocks
  store(CacheOwner{WorkerId{2}, 3}, 0, 2, "");         // worker 2's rank 3: 2 on its device

  const auto r = api.handle("POST", "/v1/kv/lookup", kAuth, tokens_body(t, R"(,"model":"m")"));
  REQUIRE(r.status == 200);
  simdjson::dom::parser p;
  const simdjson::dom::element doc = p.parse(r.body);
  const auto workers = doc["workers"].get_array().value();
  REQUIRE(workers.size() == 2);
  // Worker 1 holds nothing itself: the pool's 5 blocks, on whichever rank loads them.
  CHECK(workers.at(0)["worker_id"].get_uint64().value() == 1);
  CHECK(workers.at(0)["dp_rank"].is_null());
  CHECK(workers.at(0)["tiers"]["pool"].get_uint64().value() == 5 * kBlock);
  // Worker 2's rank 3 has its 2 blocks and loads the next 3 from the pool.
  CHECK(workers.at(1)["worker_id"].get_uint64().value() == 2);
  CHECK(workers.at(1)["dp_rank"].get_uint64().value() == 3);
  CHECK(workers.at(1)["matched_tokens"].get_uint64().value() == 5 * kBlock);
  CHECK(workers.at(1)["tiers"]["device"].get_uint64().value() == 2 * kBlock);
  CHECK(workers.at(1)["tiers"]["pool"].get_uint64().value() == 3 * kBlock);

  // Routing: worker 2 goes to its rank 3; worker 1 is sent to no rank in particular.
  ParsedRequest req;
  req.model = "m";
  req.prompt_tokens = t;
  req.has_prompt_tokens = true;
  const RouteResult rr = routing.route(req, true);
  REQUIRE(rr.ok);
  bool saw1 = false, saw2 = false;
  for (const RouteTarget& target : rr.ranked) {
    if (target.worker == WorkerId{1}) {
      saw1 = true;
      CHECK_FALSE(target.dp_rank.has_value());
    }
    if (target.worker == WorkerId{2}) {
      saw2 = true;
      REQUIRE(target.dp_rank.has_value());
      CHECK(*target.dp_rank == 3);
      CHECK(target.pool_tokens == 3 * kBlock);
    }
  }
  CHECK(saw1);
  CHECK(saw2);
  std::string body = tokens_body(t, R"(,"model":"m")");
  body.replace(body.find("\"tokens\""), 8, "\"prompt\"");
  const auto ex = api.handle("POST", "/admin/route/explain", kAuth, body);
  REQUIRE(ex.status == 200);
  simdjson::dom::parser explain_parser;
  const simdjson::dom::element e = explain_parser.parse(ex.body);
  const simdjson::dom::array explained = e["workers"].get_array().value();
  size_t seen = 0;
  for (const auto w : explained) {
    const uint64_t id = w["worker_id"].get_uint64().value();
    if (id == 1) {
      CHECK(w["dp_rank"].is_null());
      ++seen;
    }
    if (id == 2) {
      CHECK(w["dp_rank"].get_uint64().value() == 3);
      ++seen;
    }
  }
  CHECK(seen == 2);
}
