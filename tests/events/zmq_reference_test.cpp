// The ZMQ path against an independent publisher: tests/events/
// vllm_reference_publisher.py (python3-zmq + python3-msgpack, written from
// vLLM's message definitions, not from our encoder) feeds ZmqEventSource ->
// EventPipeline (writer thread) -> RadixIndexer, as the daemon wires them.
// The index must equal what the publisher says its engine caches; the
// phase-1 batches arrive only by replay (published before the subscriber
// exists) and phase 2 has a frame dropped on the PUB socket that replay fills.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <csignal>
#include <cstdio>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "events/event_pipeline.h"
#include "events/zmq_source.h"
#include "indexer/block_hash.h"
#include "indexer/radix_indexer.h"
#include "tests/support/zmq_fleet.h"

using namespace kvroute;
using namespace kvroute::testing;

namespace {

// A child process with its stdin and stdout on pipes.
struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;
  std::string buf;
  Child(const char* python, const char* script) {
    int to[2], from[2];
    REQUIRE(pipe(to) == 0);
    REQUIRE(pipe(from) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      dup2(to[0], 0);
      dup2(from[1], 1);
      close(to[1]);
      close(from[0]);
      execl(python, python, script, static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    in = to[1];
    out = from[0];
  }
  ~Child() {
    if (in >= 0) close(in);  // EOF: the publisher exits
    if (pid > 0) {
      for (int i = 0; i < 200; ++i) {
        if (waitpid(pid, nullptr, WNOHANG) == pid) { pid = -1; break; }
        usleep(10000);
      }
      if (pid > 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
    }
    if (out >= 0) close(out);
  }
  void send(const std::string& line) {
    std::string l = line + "\n";
    REQUIRE(write(in, l.data(), l.size()) == static_cast<ssize_t>(l.size()));
  }
  // Reads until a line starting with `prefix` (blocking; the ctest TIMEOUT bounds it).
  std::string line_starting(const std::string& prefix) {
    for (;;) {
      size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        std::string l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        if (l.rfind(prefix, 0) == 0) return l.substr(prefix.size());
      }
      char tmp[65536];
      const ssize_t n = read(out, tmp, sizeof tmp);
      REQUIRE_MESSAGE(n > 0, "the reference publisher exited before printing " << prefix);
      buf.append(tmp, static_cast<size_t>(n));
    }
  }
};

struct Expected {
  struct Chain {
    std::vector<TokenId> tokens;
    std::string lora, salt;
    std::array<uint32_t, kNumStorageTiers> tiers{};
    uint32_t blocks = 0;
  };
  uint64_t blocks = 0;
  std::vector<Chain> chains;
};

Expected parse_expected(const std::string& json) {
  simdjson::dom::parser p;
  simdjson::dom::element root = p.parse(json);
  Expected e;
  e.blocks = root["blocks"].get_uint64();
  for (simdjson::dom::element c : root["chains"].get_array()) {
    Expected::Chain ch;
    for (simdjson::dom::element t : c["tokens"].get_array()) ch.tokens.push_back(static_cast<TokenId>(t.get_uint64()));
    ch.lora = std::string(std::string_view(c["lora"].get_string()));
    ch.salt = std::string(std::string_view(c["salt"].get_string()));
    for (simdjson::dom::element t : c["tiers"].get_array()) {
      StorageTier tier;
      REQUIRE(parse_storage_tier(std::string_view(t.get_string()), tier));
      ++ch.tiers[static_cast<size_t>(tier)];
      ++ch.blocks;
    }
    e.chains.push_back(std::move(ch));
  }
  return e;
}

// Empty when the index holds exactly what was sent; else what differs.
std::string differences(const Indexer& index, const Expected& e, CacheOwner owner) {
  std::string diff;
  for (const auto& c : e.chains) {
    std::vector<LocalBlockHash> h;
    hash_blocks(c.tokens, 4, HashNamespace{c.lora, c.salt}, h);
    OwnerOverlap got;
    for (const auto& o : index.find_matches(h).owners)
      if (o.owner == owner) got = o;
    if (got.blocks != c.blocks || got.by_tier != c.tiers)
      diff += "chain of " + std::to_string(c.blocks) + " blocks (lora '" + c.lora + "', salt '" + c.salt +
              "'): matched " + std::to_string(got.blocks) + "; ";
  }
  if (index.stats().entries != e.blocks)
    diff += "entries " + std::to_string(index.stats().entries) + " != " + std::to_string(e.blocks);
  return diff;
}

}  // namespace

TEST_CASE("the index equals what an independent vLLM publisher sent; replay fills a late join and a dropped frame") {
  Child pub(KVROUTE_PYTHON, KVROUTE_REFERENCE_PUBLISHER);
  const std::string eps = pub.line_starting("ENDPOINTS ");
  const size_t sp = eps.find(' ');
  REQUIRE(sp != std::string::npos);

  EventsConfig ecfg;
  // Heartbeat expiry (NATS workers) has no say here: a ZMQ worker's liveness
  // is its /metrics scrape (fleet/), not part of this test.
  ecfg.worker_ttl_ms = 3600000;
  RadixIndexer index;
  WorkerRegistry registry{SteadyClock::instance()};
  EventPipeline pipeline(ecfg, 4, index, registry, SteadyClock::instance());
  pipeline.start_writer();
  ZmqConfig zcfg;
  zcfg.topic = "kv";
  zcfg.replay_min_interval_ms = 20;
  ZmqEventSource src(zcfg, 4, [&](std::vector<KvEvent>&& e) { return pipeline.enqueue_events(std::move(e)); });
  src.start();
  const CacheOwner owner{WorkerId{42}, 0};
  REQUIRE(src.add_worker(owner.worker, {eps.substr(0, sp), eps.substr(sp + 1), 1}));

  // Phase 1 (5 batches) only exists in the publisher's replay buffer.
  REQUIRE(eventually([&] { return src.stats().batches_applied_total >= 5; }));
  pub.send("go");
  const Expected want = parse_expected(pub.line_starting("EXPECT "));
  CHECK(want.chains.size() == want.blocks);
  std::string diff;
  const bool equal = eventually([&] {
    pipeline.drain();
    diff = differences(index, want, owner);
    return diff.empty();
  });
  CHECK_MESSAGE(equal, diff);
  const auto& st = src.stats();
  CHECK_FALSE(src.is_partial(owner));
  CHECK(st.gaps_total >= 1);             // the dropped frame...
  CHECK(st.replay_requests_total >= 2);  // ...was replayed (after the first-sight replay)
  CHECK(st.skipped_total[static_cast<size_t>(VllmSkip::UnknownType)] == 1);
  CHECK(st.skipped_total[static_cast<size_t>(VllmSkip::NotFullAttention)] == 2);
  for (size_t i = 1; i < st.rejected_total.size(); ++i) CHECK(st.rejected_total[i] == 0);
  src.stop();
  pipeline.stop();
  pub.send("quit");
}
