// kvroute-mocker's vLLM mode and vLLM request semantics: cache_salt and LoRA
// namespaces, vLLM-named /metrics, and the KV events it publishes over ZMQ
// read back by the router's own ZmqEventSource: the router's hash of the
// request must find exactly the blocks the mocker cached.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <thread>

#include "events/zmq_source.h"
#include "mocker/server.h"
#include "mocker/vllm_publisher.h"
#include "tests/mocker/http_client.h"
#include "tests/support/zmq_fleet.h"

using namespace kvroute;
using namespace kvroute::mocker;
using kvroute::testing::eventually;
using kvroute::testing::http_request;
using kvroute::testing::HttpResponse;

namespace {

struct VllmMocker {
  std::unique_ptr<VllmPublisher> pub;
  std::unique_ptr<MockerServer> server;
  std::thread io;
  uint16_t port = 0;
  explicit VllmMocker(MockerOptions o, bool zmq = true) {
    if (zmq) {
      VllmPublisherOptions po;
      po.endpoint = "tcp://127.0.0.1:0";
      po.replay_endpoint = "tcp://127.0.0.1:0";
      po.encoding = VllmEncoding::TaggedMap;
      pub = std::make_unique<VllmPublisher>(po);
      std::string err;
      REQUIRE_MESSAGE(pub->bind(&err), err);
      pub->start();
    }
    server = std::make_unique<MockerServer>(std::move(o), nullptr, pub.get());
    std::string err;
    REQUIRE_MESSAGE(server->listen(&err), err);
    port = server->port();
    io = std::thread([this] { server->run(); });
  }
  ~VllmMocker() {
    server->stop();
    io.join();
    if (pub) pub->stop();
  }
  HttpResponse post(const std::string& body) { return http_request(port, "POST", "/v1/completions", body); }
};

MockerOptions options() {
  MockerOptions o;
  o.worker_id = 5;
  o.speedup = 200;
  o.lora_modules = {"sql-lora"};
  return o;
}

// A prompt as token ids (used as is by the mocker): `blocks` full 16-token blocks + 3 tokens.
std::string token_prompt(uint32_t seed, uint32_t blocks, std::vector<TokenId>* out = nullptr) {
  std::string s = "[";
  for (uint32_t i = 0; i < blocks * 16 + 3; ++i) {
    const TokenId t = seed * 1000 + i;
    if (out) out->push_back(t);
    s += (i ? "," : "") + std::to_string(t);
  }
  return s + "]";
}

int64_t cached_tokens(const HttpResponse& r) {
  simdjson::dom::parser p;
  auto doc = p.parse(r.body);
  REQUIRE_MESSAGE(!doc.error(), r.body);
  return doc.value()["usage"]["prompt_tokens_details"]["cached_tokens"].get_int64().value();
}

std::string body(const std::string& prompt, const std::string& extra = "", const std::string& model = "mock-model") {
  return R"({"model":")" + model + R"(","prompt":)" + prompt + R"(,"max_tokens":2)" + extra + "}";
}

}  // namespace

TEST_CASE("cache_salt isolates tenants; a LoRA adapter has its own cache; cached_tokens reports hits") {
  VllmMocker m(options(), /*zmq=*/false);
  const std::string prompt = token_prompt(1, 4);
  const std::string salt_a = R"(,"cache_salt":"tenant-a")", salt_b = R"(,"cache_salt":"tenant-b")";
  CHECK(cached_tokens(m.post(body(prompt, salt_a))) == 0);
  CHECK(cached_tokens(m.post(body(prompt, salt_a))) == 64);  // its own prefix: 4 blocks
  CHECK(cached_tokens(m.post(body(prompt, salt_b))) == 0);   // the same prompt, another tenant
  CHECK(cached_tokens(m.post(body(prompt))) == 0);           // no salt: another namespace again
  CHECK(cached_tokens(m.post(body(prompt, "", "sql-lora"))) == 0);
  auto r = m.post(body(prompt, "", "sql-lora"));
  CHECK(cached_tokens(r) == 64);
  CHECK(r.body.find(R"("model":"sql-lora")") != std::string::npos);
  CHECK(m.post(body(prompt, "", "other-lora")).status == 404);
  CHECK(m.post(body(prompt, R"(,"cache_salt":7)")).status == 400);
}

TEST_CASE("/metrics speaks vLLM's names, types and labels") {
  VllmMocker m(options(), /*zmq=*/false);
  m.post(body(token_prompt(2, 2)));
  m.post(body(token_prompt(2, 2)));
  const auto r = http_request(m.port, "GET", "/metrics");
  REQUIRE(r.status == 200);
  for (const char* s : {"# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_waiting gauge",
                        "# TYPE vllm:kv_cache_usage_perc gauge", "# TYPE vllm:prefix_cache_queries_total counter",
                        "# TYPE vllm:prefix_cache_hits_total counter", "# TYPE vllm:cache_config_info gauge",
                        "vllm:num_requests_running{engine=\"0\",model_name=\"mock-model\"} 0",
                        "block_size=\"16\"", "num_gpu_blocks=\"16384\"",
                        "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"mock-model\"} 70",
                        "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"mock-model\"} 32"})
    CHECK_MESSAGE(r.body.find(s) != std::string::npos, s);
}

TEST_CASE("vLLM mode: the router's hash of a request finds exactly what the mocker cached (salt, LoRA)") {
  VllmMocker m(options());
  testing::SinkIndex sink;
  ZmqConfig zc;
  zc.replay_min_interval_ms = 20;
  ZmqEventSource src(zc, 16, [&](std::vector<KvEvent>&& e) { return sink.apply(std::move(e)); });
  src.start();
  const CacheOwner owner{WorkerId{5}, 0};
  REQUIRE(src.add_worker(owner.worker, {m.pub->endpoint(), m.pub->replay_endpoint(), 1}));
  std::vector<TokenId> t1, t2;
  const std::string p1 = token_prompt(3, 5, &t1), p2 = token_prompt(4, 3, &t2);
  REQUIRE(m.post(body(p1, R"(,"cache_salt":"tenant-a")")).status == 200);
  REQUIRE(m.post(body(p2, "", "sql-lora")).status == 200);
  auto matched = [&](const std::vector<TokenId>& t, HashNamespace ns) {
    std::vector<LocalBlockHash> h;
    hash_blocks(t, 16, ns, h);
    std::lock_guard lk(sink.mu);
    for (const auto& o : sink.index.find_matches(h).owners)
      if (o.owner == owner) return o.blocks;
    return 0u;
  };
  CHECK(eventually([&] { return matched(t1, {"", "tenant-a"}) == 5 && matched(t2, {"sql-lora", ""}) == 3; }));
  CHECK(matched(t1, {"", "tenant-b"}) == 0);  // another tenant's hash finds nothing
  CHECK(matched(t1, {"", ""}) == 0);
  CHECK(matched(t2, {"", ""}) == 0);          // the base model does not share the adapter's blocks
  CHECK(sink.entries() == 8);
  CHECK_FALSE(src.is_partial(owner));
}
