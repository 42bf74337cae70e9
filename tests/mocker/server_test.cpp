#include "mocker/server.h"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "tests/mocker/http_client.h"
#include "tokenizer/placeholder.h"

using namespace kvroute;
using namespace kvroute::mocker;
using kvroute::testing::HttpConnection;
using kvroute::testing::HttpResponse;
using kvroute::testing::http_request;

namespace {

// A mocker server on 127.0.0.1:0 without NATS, on its own io thread.
struct Mocker {
  MockerServer server;
  std::thread io;
  uint16_t port = 0;
  explicit Mocker(MockerOptions o) : server(std::move(o), nullptr) {
    std::string err;
    REQUIRE_MESSAGE(server.listen(&err), err);
    port = server.port();
    io = std::thread([this] { server.run(); });
  }
  ~Mocker() {
    server.stop();
    io.join();
  }
  HttpResponse post(const std::string& path, const std::string& body) { return http_request(port, "POST", path, body); }
  HttpResponse get(const std::string& path) { return http_request(port, "GET", path); }
  simdjson::dom::element stats(simdjson::dom::parser& p) { return p.parse(get("/mocker/stats").body).value(); }
};

MockerOptions fast_options() {
  MockerOptions o;
  o.worker_id = 3;
  o.speedup = 200;  // a 16-token prompt's prefill ~0.1 ms, a decode step ~40 us
  return o;
}

simdjson::dom::element parse(simdjson::dom::parser& p, const std::string& s) {
  auto doc = p.parse(s);
  REQUIRE_MESSAGE(!doc.error(), s);
  return doc.value();
}

int64_t num(simdjson::dom::element e) { return e.get_int64().value(); }
std::string str(simdjson::dom::element e) { return std::string(e.get_string().value()); }

template <class F>
bool wait_until(F f, int ms = 3000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return f();
}

const std::string kPrompt =
    "The quick brown fox jumps over the lazy dog while the router keeps every prefix it has seen in mind. ";

}  // namespace

TEST_CASE("non-streaming completion: OpenAI shape and usage; a repeated prompt hits the cache") {
  Mocker m(fast_options());
  simdjson::dom::parser p;
  const std::string body = R"({"model":"mock-model","prompt":")" + kPrompt + R"(","max_tokens":5})";
  auto r = m.post("/v1/completions", body);
  REQUIRE(r.status == 200);
  CHECK(r.header("content-type") == "application/json");
  auto j = parse(p, r.body);
  CHECK(str(j["object"]) == "text_completion");
  CHECK(str(j["model"]) == "mock-model");
  CHECK(str(j["id"]).starts_with("cmpl-"));
  CHECK(j["created"].is_int64());
  CHECK(str(j["choices"].at(0)["finish_reason"]) == "length");
  CHECK_FALSE(str(j["choices"].at(0)["text"]).empty());
  const int64_t prompt_tokens = static_cast<int64_t>(placeholder_tokenize(kPrompt).size());
  CHECK(num(j["usage"]["prompt_tokens"]) == prompt_tokens);
  CHECK(num(j["usage"]["completion_tokens"]) == 5);
  CHECK(num(j["usage"]["total_tokens"]) == prompt_tokens + 5);
  CHECK(num(j["usage"]["prompt_tokens_details"]["cached_tokens"]) == 0);

  auto again = parse(p, m.post("/v1/completions", body).body);
  CHECK(num(again["usage"]["prompt_tokens_details"]["cached_tokens"]) == (prompt_tokens - 1) / 16 * 16);  // vLLM: at most prompt - 1, whole blocks
  CHECK(num(again["usage"]["prompt_tokens_details"]["cached_tokens"]) > 0);

  // Token-id prompts are used as they are.
  std::string ids;
  for (int i = 0; i < 40; ++i) ids += (i ? "," : "") + std::to_string(1000 + i);
  auto t = parse(p, m.post("/v1/completions", R"({"model":"mock-model","prompt":[)" + ids + R"(],"max_tokens":1})").body);
  CHECK(num(t["usage"]["prompt_tokens"]) == 40);
  CHECK(num(t["usage"]["completion_tokens"]) == 1);

  auto st = m.stats(p);
  CHECK(num(st["requests_total"]) == 3);
  CHECK(num(st["active"]) == 0);
  CHECK(num(st["kv_active_blocks"]) == 0);
  CHECK(num(st["kv_cached_blocks"]) == prompt_tokens / 16 + 40 / 16);
  CHECK(num(st["last_event_id"]) == 2);  // two stored chains, no eviction
  CHECK(num(st["events_published"]) == 0);  // no NATS
}

TEST_CASE("chat completion: OpenAI shape; prompt built from the messages as the router does") {
  Mocker m(fast_options());
  simdjson::dom::parser p;
  auto r = m.post("/v1/chat/completions",
                  R"({"model":"mock-model","max_completion_tokens":4,"messages":[{"role":"system","content":"be brief"},)"
                  R"({"role":"user","content":[{"type":"text","text":"hello"},{"type":"text","text":"there"}]}]})");
  REQUIRE(r.status == 200);
  auto j = parse(p, r.body);
  CHECK(str(j["object"]) == "chat.completion");
  CHECK(str(j["id"]).starts_with("chatcmpl-"));
  CHECK(str(j["choices"].at(0)["message"]["role"]) == "assistant");
  CHECK_FALSE(str(j["choices"].at(0)["message"]["content"]).empty());
  CHECK(str(j["choices"].at(0)["finish_reason"]) == "length");
  CHECK(num(j["usage"]["completion_tokens"]) == 4);
  const auto expected = placeholder_tokenize(
      placeholder_chat_prompt({{"system", "be brief"}, {"user", "hello\nthere"}}));
  CHECK(num(j["usage"]["prompt_tokens"]) == static_cast<int64_t>(expected.size()));
}

TEST_CASE("streaming: vLLM-style SSE chunks ending with [DONE]") {
  Mocker m(fast_options());
  simdjson::dom::parser p;
  SUBCASE("chat, with usage") {
    auto r = m.post("/v1/chat/completions",
                    R"({"model":"mock-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,)"
                    R"("messages":[{"role":"user","content":"stream please"}]})");
    REQUIRE(r.status == 200);
    CHECK(r.header("content-type") == "text/event-stream");
    CHECK(r.header("transfer-encoding") == "chunked");
    REQUIRE(r.sse.size() == 1 + 6 + 1 + 1 + 1);  // role, 6 tokens, finish, usage, [DONE]
    CHECK(r.chunks.size() >= r.sse.size());       // one HTTP chunk per event
    CHECK(r.sse.back() == "[DONE]");
    std::string text;
    for (size_t i = 0; i + 1 < r.sse.size(); ++i) {
      simdjson::dom::parser cp;
      auto c = parse(cp, r.sse[i]);
      CHECK(str(c["object"]) == "chat.completion.chunk");
      CHECK(str(c["model"]) == "mock-model");
      if (i == 0) CHECK(str(c["choices"].at(0)["delta"]["role"]) == "assistant");
      if (i >= 1 && i <= 6) {
        CHECK(c["choices"].at(0)["finish_reason"].is_null());
        text += str(c["choices"].at(0)["delta"]["content"]);
      }
      if (i == 7) CHECK(str(c["choices"].at(0)["finish_reason"]) == "length");
      if (i == 8) {
        CHECK(c["choices"].get_array().value().size() == 0);
        CHECK(num(c["usage"]["completion_tokens"]) == 6);
        CHECK(num(c["usage"]["prompt_tokens"]) > 0);
      }
    }
    CHECK_FALSE(text.empty());
  }
  SUBCASE("completions, without usage") {
    auto r = m.post("/v1/completions", R"({"model":"mock-model","stream":true,"prompt":"abc","max_tokens":3})");
    REQUIRE(r.status == 200);
    REQUIRE(r.sse.size() == 3 + 1 + 1);
    CHECK(r.sse.back() == "[DONE]");
    for (size_t i = 0; i < 3; ++i) {
      auto c = parse(p, r.sse[i]);
      CHECK(str(c["object"]) == "text_completion");
      CHECK_FALSE(str(c["choices"].at(0)["text"]).empty());
    }
    CHECK(str(parse(p, r.sse[3])["choices"].at(0)["finish_reason"]) == "length");
  }
}

TEST_CASE("keep-alive: several requests on one connection") {
  Mocker m(fast_options());
  HttpConnection c(m.port);
  for (int i = 0; i < 3; ++i) {
    auto r = c.request("POST", "/v1/completions",
                       R"({"model":"mock-model","stream":)" + std::string(i == 1 ? "true" : "false") +
                           R"(,"prompt":"hello","max_tokens":2})");
    CHECK(r.status == 200);
  }
  CHECK(c.request("GET", "/health").status == 200);
}

TEST_CASE("errors: OpenAI error bodies") {
  Mocker m(fast_options());
  simdjson::dom::parser p;
  auto r = m.post("/v1/completions", "{nope");
  REQUIRE(r.status == 400);
  auto e = parse(p, r.body)["error"];
  CHECK_FALSE(str(e["message"]).empty());
  CHECK(str(e["type"]) == "invalid_request_error");
  CHECK_FALSE(e["param"].error());
  CHECK_FALSE(e["code"].error());

  r = m.post("/v1/completions", R"({"model":"mock-model","prompt":"x","max_tokens":0})");
  CHECK(r.status == 400);
  CHECK(str(parse(p, r.body)["error"]["param"]) == "max_tokens");
  r = m.post("/v1/chat/completions", R"({"model":"mock-model"})");
  CHECK(r.status == 400);
  r = m.post("/v1/completions", R"({"model":"other-model","prompt":"x"})");
  CHECK(r.status == 404);
  CHECK(str(parse(p, r.body)["error"]["code"]) == "model_not_found");
  CHECK(m.get("/nowhere").status == 404);
  CHECK(m.post("/mocker/drop_events", R"({"count":"x"})").status == 400);
  auto st = m.stats(p);
  CHECK(num(st["rejected_total"]) == 4);
  CHECK(num(st["requests_total"]) == 4);
}

TEST_CASE("models and health") {
  Mocker m(fast_options());
  simdjson::dom::parser p;
  auto r = m.get("/v1/models");
  REQUIRE(r.status == 200);
  auto j = parse(p, r.body);
  CHECK(str(j["object"]) == "list");
  CHECK(str(j["data"].at(0)["id"]) == "mock-model");
  CHECK(str(j["data"].at(0)["object"]) == "model");
  CHECK(m.get("/health").status == 200);
}

TEST_CASE("a client that disconnects mid-stream cancels its request and frees its blocks") {
  Mocker m(fast_options());
  simdjson::dom::parser p;
  {
    HttpConnection c(m.port);
    c.send_request("POST", "/v1/completions",
                   R"({"model":"mock-model","stream":true,"prompt":")" + kPrompt + R"(","max_tokens":100000})");
    c.read_until("data: ");
    auto st = m.stats(p);
    CHECK(num(st["active"]) == 1);
    CHECK(num(st["kv_active_blocks"]) > 0);
  }  // closed
  CHECK(wait_until([&] { return num(m.stats(p)["cancels_total"]) == 1; }));
  auto st = m.stats(p);
  CHECK(num(st["active"]) == 0);
  CHECK(num(st["kv_active_blocks"]) == 0);
  CHECK(num(st["kv_cached_blocks"]) == static_cast<int64_t>(placeholder_tokenize(kPrompt).size() / 16));
  // Same for a non-streaming request that is still generating.
  {
    HttpConnection c(m.port);
    c.send_request("POST", "/v1/completions", R"({"model":"mock-model","prompt":"x","max_tokens":100000})");
    CHECK(wait_until([&] { return num(m.stats(p)["active"]) == 1; }));
  }
  CHECK(wait_until([&] { return num(m.stats(p)["cancels_total"]) == 2; }));
  CHECK(num(m.stats(p)["active"]) == 0);
}

TEST_CASE("test hooks: drop_events consumes event ids; hang never answers") {
  Mocker m(fast_options());
  simdjson::dom::parser p;
  auto r = m.post("/mocker/drop_events", R"({"count":1})");
  REQUIRE(r.status == 200);
  CHECK(num(m.stats(p)["drop_pending"]) == 1);
  REQUIRE(m.post("/v1/completions", R"({"model":"mock-model","prompt":")" + kPrompt + R"(","max_tokens":1})").status ==
          200);
  auto st = m.stats(p);
  CHECK(num(st["events_dropped"]) == 1);
  CHECK(num(st["drop_pending"]) == 0);
  CHECK(num(st["last_event_id"]) == 1);

  REQUIRE(m.post("/mocker/hang", R"({"enabled":true})").status == 200);
  {
    HttpConnection c(m.port, 300);
    c.send_request("POST", "/v1/completions", R"({"model":"mock-model","prompt":"x","max_tokens":1})");
    CHECK(c.silent());  // nothing within 300 ms
    CHECK(m.stats(p)["hang"].get_bool().value());
  }
  REQUIRE(m.post("/mocker/hang", R"({"enabled":false})").status == 200);
  CHECK(m.post("/v1/completions", R"({"model":"mock-model","prompt":"x","max_tokens":1})").status == 200);
}

TEST_CASE("generation takes the engine's time, scaled by the speedup") {
  MockerOptions o = fast_options();
  o.speedup = 10;
  o.engine.profile = *find_profile("dynamo-mocker");
  o.engine.profile.decode_base_ms = 100;  // 10 ms real per token
  o.engine.profile.decode_kv_ms = 0;
  Mocker m(o);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = m.post("/v1/completions", R"({"model":"mock-model","prompt":"hi","max_tokens":6})");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(r.status == 200);
  // prefill ~1.7 ms + 5 decode steps of 10 ms.
  CHECK(ms >= 50);
  CHECK(ms < 2000);
}

TEST_CASE("offload mode: a prompt one mocker computed is loaded from the shared pool by another, not recomputed") {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kvroute-offload-" + std::to_string(std::random_device{}())))
          .string();
  MockerOptions o = fast_options();
  o.offload.pool_dir = dir;
  o.offload.pool_gbps = 100;
  Mocker a(o);
  o.worker_id = 4;
  Mocker b(o);
  simdjson::dom::parser p;
  std::string prompt;
  for (int i = 0; i < 64; ++i) prompt += std::to_string(1000 + i) + ",";
  prompt += "7";  // 65 tokens: 4 complete blocks of 16
  const std::string body = R"({"model":"mock-model","prompt":[)" + prompt + R"(],"max_tokens":2})";
  REQUIRE(a.post("/v1/completions", body).status == 200);
  auto sa = a.stats(p)["offload"];
  CHECK(num(sa["pool_stored_blocks"]) == 4);
  CHECK(num(sa["computed_blocks"]) == 4);
  CHECK(num(sa["pool_loaded_blocks"]) == 0);

  auto r = b.post("/v1/completions", body);
  REQUIRE(r.status == 200);
  CHECK(num(parse(p, r.body)["usage"]["prompt_tokens_details"]["cached_tokens"]) == 64);
  auto sb = b.stats(p)["offload"];
  CHECK(num(sb["pool_loaded_blocks"]) == 4);
  CHECK(num(sb["computed_blocks"]) == 0);
  CHECK(num(sb["pool_stored_blocks"]) == 0);  // already there: mocker 3 announced them
  CHECK(sb["load_ms"].get_double().value() > 0);
  // Now on b's device: a third request loads nothing.
  REQUIRE(b.post("/v1/completions", body).status == 200);
  auto sb2 = b.stats(p)["offload"];
  CHECK(num(sb2["pool_loaded_blocks"]) == 4);
  CHECK(num(sb2["cached_blocks"]) == 4);
  std::filesystem::remove_all(dir);
}

TEST_CASE("offload mode: the device's evictions go to the host tier and are loaded back from it") {
  MockerOptions o = fast_options();
  o.engine.kv_blocks = 8;
  o.offload.host_blocks = 16;
  Mocker m(o);
  simdjson::dom::parser p;
  auto prompt_of = [](int base) {
    std::string s;
    for (int i = 0; i < 64; ++i) s += std::to_string(base + i) + ",";
    return R"({"model":"mock-model","prompt":[)" + s + R"(7],"max_tokens":1})";
  };
  REQUIRE(m.post("/v1/completions", prompt_of(1000)).status == 200);  // 4 blocks + 1 private
  REQUIRE(m.post("/v1/completions", prompt_of(5000)).status == 200);  // evicts the first prompt's blocks
  auto s = m.stats(p)["offload"];
  CHECK(num(s["host_offloaded_blocks"]) >= 1);
  REQUIRE(num(s["host_blocks"]) >= 1);
  const int64_t cached_before = num(s["cached_blocks"]), computed_before = num(s["computed_blocks"]);
  CHECK(computed_before == 8);  // both prompts computed in full
  REQUIRE(m.post("/v1/completions", prompt_of(1000)).status == 200);
  auto s2 = m.stats(p)["offload"];  // (s is void from here: the parser's buffer is reused)
  CHECK(num(s2["host_loaded_blocks"]) >= 1);
  // Every block of the first prompt was on the device or loaded from the host: none computed again.
  CHECK(num(s2["host_loaded_blocks"]) + num(s2["cached_blocks"]) - cached_before == 4);
  CHECK(num(s2["computed_blocks"]) == computed_before);
}
