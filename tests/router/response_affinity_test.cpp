#include "router/api/response_affinity.h"

#include <doctest/doctest.h>

#include <string>

#include "router/api/api_routes.h"

using namespace kvroute;

namespace {

// A routed request over workers 1..n, the scheduler having ranked the first
// `ranked` of them.
RouteResult routed(size_t n, size_t ranked) {
  RouteResult r;
  r.ok = true;
  r.isl_tokens = 100;
  for (size_t i = 0; i < n; ++i) {
    auto info = std::make_shared<WorkerAnnouncement>();
    info->id = WorkerId{i + 1};
    info->url = "http://w" + std::to_string(i + 1);
    WorkerView v;
    v.info = info;
    r.workers.push_back(v);
    Candidate c;
    c.owner.worker = info->id;
    r.candidates.push_back(c);
    r.decision.scores.push_back(WorkerScore{});
    if (i < ranked) r.ranked.push_back(route_target(info->id, *info, 0, {}, 0, 100, 16));
  }
  r.decision.chosen = 0;
  return r;
}

std::optional<std::string> scan(std::string_view body, bool stream, size_t piece) {
  ResponseIdScanner s(stream);
  for (size_t at = 0; at < body.size() && s.wants_more(); at += piece) s.feed(body.substr(at, piece));
  return s.id();
}

}  // namespace

TEST_CASE("ResponseIdScanner: the id of a JSON answer, however the bytes are split") {
  const std::string body = R"({ "id" : "resp_abc123", "object":"response","output":[]})";
  for (size_t piece : {1u, 3u, 7u, 1000u}) CHECK(scan(body, false, piece) == "resp_abc123");
  CHECK(scan(R"({"object":"response","id":"resp_x"})", false, 100) == std::nullopt);  // not the first key
  CHECK(scan(R"({"id":"resp_\"x"})", false, 100) == std::nullopt);                  // escapes: not ours
  CHECK(scan(R"({"id":12})", false, 100) == std::nullopt);
}

TEST_CASE("ResponseIdScanner: the response id of a stream's response.created event") {
  const std::string stream =
      "event: response.created\n"
      R"(data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_s1","object":"response"}})"
      "\n\nevent: response.in_progress\n";
  for (size_t piece : {1u, 5u, 1000u}) CHECK(scan(stream, true, piece) == "resp_s1");
  // Only the first kMaxScanBytes are looked at.
  const std::string late = std::string(ResponseIdScanner::kMaxScanBytes, ' ') + R"("response":{"id":"resp_late"})";
  CHECK(scan(late, true, 512) == std::nullopt);
  // An id over ResponseAffinity::kMaxIdBytes is not taken.
  CHECK(scan(R"({"id":")" + std::string(300, 'x') + "\"}", false, 64) == std::nullopt);
}

TEST_CASE("ResponseAffinity: remembers ids, least recently used dropped first") {
  ResponseAffinity a(2);
  a.remember("r1", WorkerId{1});
  a.remember("r2", WorkerId{2});
  CHECK(a.find("r1") == WorkerId{1});  // r1 is now the most recent
  a.remember("r3", WorkerId{3});       // drops r2
  CHECK(a.size() == 2);
  CHECK(a.find("r2") == std::nullopt);
  CHECK(a.find("r1") == WorkerId{1});
  CHECK(a.find("r3") == WorkerId{3});
  a.remember("r3", WorkerId{1});
  CHECK(a.find("r3") == WorkerId{1});
  a.remember("", WorkerId{1});
  a.remember(std::string(ResponseAffinity::kMaxIdBytes + 1, 'x'), WorkerId{1});
  CHECK(a.size() == 2);
}

TEST_CASE("ResponseAffinity::pin: the response's worker first, wherever it ranked") {
  RouteResult r = routed(4, 2);
  CHECK(ResponseAffinity::pin(WorkerId{4}, 16, r) == ResponseAffinity::Pin::Pinned);
  REQUIRE(r.ranked.size() == 3);
  CHECK(r.ranked[0].worker == WorkerId{4});
  CHECK(r.ranked[1].worker == WorkerId{1});
  CHECK(r.decision.chosen == 3u);
  RouteResult same = routed(4, 2);
  CHECK(ResponseAffinity::pin(WorkerId{2}, 16, same) == ResponseAffinity::Pin::Pinned);
  CHECK(same.ranked.size() == 2);
  CHECK(same.ranked[0].worker == WorkerId{2});
  RouteResult gone = routed(4, 2);
  CHECK(ResponseAffinity::pin(WorkerId{9}, 16, gone) == ResponseAffinity::Pin::WorkerGone);
  CHECK(gone.ranked[0].worker == WorkerId{1});
}

TEST_CASE("api routes: paths, error shapes and the stream's error event per API") {
  CHECK(api_of_path("/v1/responses") == ApiKind::Responses);
  CHECK(api_of_path("/v1/messages") == ApiKind::Messages);
  CHECK(api_of_path("/v1/messages/count_tokens") == ApiKind::CountTokens);
  CHECK(api_of_path("/v1/rerank") == ApiKind::Rerank);
  CHECK(api_of_path("/v1/score") == ApiKind::Score);
  CHECK(api_of_path("/tokenize") == ApiKind::Tokenize);
  CHECK(api_of_path("/detokenize") == ApiKind::Detokenize);
  CHECK(api_of_path("/v1/nope") == std::nullopt);
  for (ApiKind k : {ApiKind::Completions, ApiKind::ChatCompletions, ApiKind::Embeddings, ApiKind::Responses,
                    ApiKind::Messages, ApiKind::Rerank, ApiKind::Score, ApiKind::Tokenize, ApiKind::Detokenize,
                    ApiKind::CountTokens})
    CHECK(api_of_path(api_path(k)) == k);

  const ApiError busy{503, "All busy.", "service_unavailable", "", "workers_busy"};
  CHECK(api_error_body(ApiKind::Messages, busy) ==
        R"({"type":"error","error":{"type":"overloaded_error","message":"All busy."}})");
  CHECK(api_error_body(ApiKind::Responses, busy) ==
        R"({"error":{"message":"All busy.","type":"service_unavailable","param":null,"code":"workers_busy"}})");

  const ApiError cut{502, "The worker failed.", "upstream_error", "", "upstream_failed"};
  CHECK(stream_error_event(ApiKind::ChatCompletions, cut) ==
        "data: " + error_body(cut) + "\n\ndata: [DONE]\n\n");
  CHECK(stream_error_event(ApiKind::Messages, cut) ==
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"The worker "
        "failed.\"}}\n\n");
  CHECK(stream_error_event(ApiKind::Responses, cut) ==
        "event: error\ndata: {\"type\":\"error\",\"code\":\"upstream_failed\",\"message\":\"The worker failed.\","
        "\"param\":null,\"sequence_number\":0}\n\n");
}

TEST_CASE("passthrough bodies: routed by model with no prompt") {
  ParsedRequest p;
  std::string chat;
  ApiError err;
  REQUIRE(parse_api_request(ApiKind::Rerank, R"({"model":"m","query":"q","documents":["a"]})", p, chat, err));
  CHECK(p.model == "m");
  CHECK(p.has_prompt_tokens);
  CHECK(p.prompt_tokens.empty());
  CHECK_FALSE(parse_api_request(ApiKind::Tokenize, R"({"prompt":"x"})", p, chat, err));
  CHECK(err.status == 400);
  CHECK(err.param == "model");
  CHECK_FALSE(parse_api_request(ApiKind::Score, "[1]", p, chat, err));
}
