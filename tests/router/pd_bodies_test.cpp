#include "router/pd_bodies.h"

#include <doctest/doctest.h>

#include <simdjson.h>

#include <string>

using namespace kvroute;
using namespace kvroute::pd;

namespace {

simdjson::dom::parser& parser() {
  static simdjson::dom::parser p;
  return p;
}

simdjson::dom::object obj(const std::string& json) {
  simdjson::dom::element e;
  REQUIRE_FALSE(parser().parse(json).get(e));
  REQUIRE(e.is_object());
  return e.get_object().value_unsafe();
}

bool has_key(const std::string& json, std::string_view key) {
  simdjson::dom::element v;
  return !obj(json).at_key(key).get(v);
}

// A prefill answer as vLLM's nixl connector returns it (pd-protocols.md §1.3).
std::string answer(std::string_view params) {
  return std::string(R"({"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":)"
                     R"({"role":"assistant","content":"The"},"finish_reason":"length"}],)"
                     R"("usage":{"prompt_tokens":812,"completion_tokens":1,"total_tokens":813},"kv_transfer_params":)") +
         std::string(params) + "}";
}

const char* kParams =
    R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[17,18,19]],)"
    R"("remote_engine_id":"3b6e","remote_request_id":"chatcmpl-7f1c-a1b2c3d4","remote_host":"10.0.0.5",)"
    R"("remote_port":5600,"tp_size":1,"dcp_size":1,"pp_size":1,"remote_num_tokens":812,)"
    R"("remote_blocks_expiry_time":null,"transfer_mode":"pull"})";

}  // namespace

TEST_CASE("pd bodies: a client's transfer fields are stripped, escaped key spellings included") {
  std::string out;
  const std::string body =
      R"({"model":"m","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"evil"},)"
      R"("bootstrap_host":"evil","bootstrap_port":1,"bootstrap_room":7,"bootstrap_pair_key":"k","decode_tp_size":2,)"
      R"("routed_dp_rank":1,"data_parallel_rank":1,"disagg_prefill_dp_rank":1,"kv\u005ftransfer_params":{},)"
      R"("seed":123456789012345678901234567890,"prompt":"a \"b\" }{"})";
  REQUIRE(strip_transfer_fields(body, out) == BodyError::None);
  // Exactly the client's other fields, bytes unchanged (a number beyond 64 bits too).
  CHECK(out == R"({"model":"m","seed":123456789012345678901234567890,"prompt":"a \"b\" }{"})");
  CHECK(strip_transfer_fields("[1]", out) == BodyError::NotObject);
  CHECK(strip_transfer_fields(R"({"a":)", out) == BodyError::NotJson);
}

TEST_CASE("pd bodies: the vLLM NIXL prefill leg (one token, not streamed, do_remote_decode)") {
  std::string out;
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":)"
      R"({"include_usage":true},"max_tokens":256,"max_completion_tokens":256,"min_tokens":4,"n":1,)"
      R"("kv_transfer_params":{"do_remote_prefill":true}})";
  REQUIRE(nixl_prefill_body(body, out) == BodyError::None);
  CHECK_FALSE(has_key(out, "stream_options"));
  CHECK_FALSE(has_key(out, "min_tokens"));
  CHECK_FALSE(has_key(out, "max_output_tokens"));  // not sent by the client: not added
  auto o = obj(out);  // valid until the next obj()/has_key() (one parser)
  CHECK(o["stream"].get_bool().value() == false);
  CHECK(o["max_tokens"].get_int64().value() == 1);
  CHECK(o["max_completion_tokens"].get_int64().value() == 1);
  CHECK(o["n"].get_int64().value() == 1);
  CHECK(std::string(o["messages"].at(0)["content"].get_string().value()) == "hi");
  auto p = o["kv_transfer_params"].get_object().value();
  CHECK(p["do_remote_decode"].get_bool().value() == true);
  CHECK(p["do_remote_prefill"].get_bool().value() == false);
  for (const char* k : {"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"})
    CHECK(p[k].is_null());
  // One kv_transfer_params: the client's is gone.
  CHECK(out.find("kv_transfer_params") == out.rfind("kv_transfer_params"));
}

TEST_CASE("pd bodies: the vLLM NIXL decode leg keeps the client's limits and carries the prefill's params") {
  std::string out;
  const std::string body = R"({"model":"m","prompt":"x","stream":true,"max_tokens":256,"kv_transfer_params":{"x":1}})";
  std::string params;
  REQUIRE(read_kv_transfer_params(answer(kParams), "10.0.0.5", ParamsLimits{}, params) == ParamsError::None);
  CHECK(params == kParams);  // verbatim
  REQUIRE(nixl_decode_body(body, params, out) == BodyError::None);
  CHECK(out == std::string(R"({"model":"m","prompt":"x","stream":true,"max_tokens":256,"kv_transfer_params":)") +
                   kParams + "}");
}

TEST_CASE("pd bodies: SGLang legs carry the bootstrap fields, the room 63-bit") {
  std::string out;
  REQUIRE(sglang_body(R"({"model":"m","bootstrap_room":1,"stream":true})", "10.0.0.5", 8998, ~0ull, out) ==
          BodyError::None);
  CHECK(out == R"({"model":"m","stream":true,"bootstrap_host":"10.0.0.5","bootstrap_port":8998,)"
               R"("bootstrap_room":9223372036854775807})");
}

TEST_CASE("pd bodies: the prefill answer's kv_transfer_params are untrusted") {
  std::string out = "unchanged", d;
  const ParamsLimits lim;
  auto read = [&](const std::string& a, std::string_view host = "10.0.0.5") {
    return read_kv_transfer_params(a, host, lim, out, &d);
  };
  CHECK(read(R"({"id":"x"})") == ParamsError::Missing);
  CHECK(read(answer("null")) == ParamsError::Missing);
  CHECK(read(answer("[1]")) == ParamsError::NotObject);
  CHECK(read(answer(R"("s")")) == ParamsError::NotObject);
  CHECK(read("not json") == ParamsError::NotJson);
  CHECK(read(answer(R"({"do_remote_prefill":false})")) == ParamsError::NotForDecode);
  CHECK(read(answer(R"({"do_remote_decode":false})")) == ParamsError::NotForDecode);
  CHECK(read(answer(R"({"do_remote_prefill":true,"remote_port":70000})")) == ParamsError::WrongType);
  CHECK(d == "remote_port");
  CHECK(read(answer(R"({"do_remote_prefill":true,"remote_port":-1})")) == ParamsError::WrongType);
  CHECK(read(answer(R"({"do_remote_prefill":true,"remote_host":5})")) == ParamsError::WrongType);
  CHECK(read(answer(R"({"do_remote_prefill":true,"remote_block_ids":[[1,"2"]]})")) == ParamsError::WrongType);
  CHECK(d == "remote_block_ids");
  CHECK(read(answer(R"({"do_remote_prefill":true,"remote_block_ids":[1,-2]})")) == ParamsError::WrongType);
  CHECK(read(answer(R"({"do_remote_prefill":true,"tp_size":"1"})")) == ParamsError::WrongType);
  // A duplicate key: checked in its first occurrence, used by the engine in its last.
  CHECK(read(answer(R"({"do_remote_prefill":true,"remote_host":"10.0.0.5","remote_host":"10.9.9.9"})")) ==
        ParamsError::WrongType);
  CHECK(d == "duplicate key 'remote_host'");
  CHECK(read(answer(R"({"do_remote_prefill":true,"":1,"":2})")) == ParamsError::WrongType);
  CHECK(d == "duplicate key ''");  // the reason is never empty
  CHECK(read(answer(R"({"do_remote_prefill":true,"remote_host":"10.9.9.9"})")) == ParamsError::HostMismatch);
  ParamsLimits small;
  small.max_params_bytes = 16;
  CHECK(read_kv_transfer_params(answer(kParams), "10.0.0.5", small, out, &d) == ParamsError::TooLarge);
  small.max_answer_bytes = 8;
  CHECK(read_kv_transfer_params(answer(kParams), "10.0.0.5", small, out, &d) == ParamsError::TooLarge);
  CHECK(out == "unchanged");  // nothing written on error
  // The older generation's fewer keys and a flat block list are accepted.
  CHECK(read(answer(R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],)"
                    R"("remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.5","remote_port":5600,)"
                    R"("tp_size":1})")) == ParamsError::None);
}

TEST_CASE("pd bodies: an engine's unreachable default host is pinned to the prefill worker's") {
  std::string out;
  const std::string p =
      R"({"do_remote_prefill":true,"remote_host":"localhost","remote_port":5600,"remote_block_ids":[[1]]})";
  REQUIRE(read_kv_transfer_params(answer(p), "10.0.0.5", ParamsLimits{}, out) == ParamsError::None);
  CHECK(out == R"({"do_remote_prefill":true,"remote_host":"10.0.0.5","remote_port":5600,"remote_block_ids":[[1]]})");
  // A prefill worker on loopback itself (one host): left as reported.
  REQUIRE(read_kv_transfer_params(answer(p), "127.0.0.1", ParamsLimits{}, out) == ParamsError::None);
  CHECK(out == p);
  for (std::string_view h : {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]", "0.0.0.0", "::", ""})
    CHECK(is_loopback_or_unspecified(h));
  for (std::string_view h : {"10.0.0.5", "localhost.evil", "1270.0.0.1", "::2"}) CHECK_FALSE(is_loopback_or_unspecified(h));
}

TEST_CASE("pd bodies: every params error has a distinct name") {
  std::vector<std::string_view> names;
  for (int i = 0; i <= static_cast<int>(ParamsError::HostMismatch); ++i)
    names.push_back(to_string(static_cast<ParamsError>(i)));
  std::sort(names.begin(), names.end());
  CHECK(std::unique(names.begin(), names.end()) == names.end());
}

TEST_CASE("pd bodies: the vLLM Mooncake legs carry the router's transfer id and the prefill's bootstrap server") {
  std::string out;
  const std::string body = R"({"model":"m","prompt":"x","stream":true,"max_completion_tokens":64,)"
                           R"("kv_transfer_params":{"transfer_id":"client-chosen"}})";
  REQUIRE(mooncake_prefill_body(body, "xfer-kvroute-1-1", out) == BodyError::None);
  {
    auto o = obj(out);
    CHECK(o["stream"].get_bool().value() == false);
    CHECK(o["max_tokens"].get_int64().value() == 1);
    CHECK(o["max_completion_tokens"].get_int64().value() == 1);
    auto p = o["kv_transfer_params"].get_object().value();
    CHECK(p["do_remote_decode"].get_bool().value() == true);
    CHECK(p["do_remote_prefill"].get_bool().value() == false);
    CHECK(std::string(p["transfer_id"].get_string().value()) == "xfer-kvroute-1-1");
  }
  CHECK(out.find("client-chosen") == std::string::npos);
  CHECK(out.find("kv_transfer_params") == out.rfind("kv_transfer_params"));
  const std::string params = mooncake_decode_params("http://10.0.0.5:8998", "eng\"1", "xfer-kvroute-1-1");
  CHECK(params == R"({"do_remote_decode":false,"do_remote_prefill":true,"remote_bootstrap_addr":"http://10.0.0.5:8998",)"
                  R"("remote_engine_id":"eng\"1","transfer_id":"xfer-kvroute-1-1"})");
  REQUIRE(nixl_decode_body(body, params, out) == BodyError::None);
  CHECK(out == std::string(R"({"model":"m","prompt":"x","stream":true,"max_completion_tokens":64,"kv_transfer_params":)") +
                   params + "}");
}

TEST_CASE("pd bodies: a Mooncake bootstrap server's /query answer is untrusted") {
  const std::string q = R"({"0":{"engine_id":"e0","worker_addr":{"0":{"0":"tcp://10.0.0.5:1"}}},)"
                        R"("1":{"engine_id":"e1","worker_addr":{"0":{"0":"tcp://10.0.0.5:2"}}}})";
  MooncakeEngine e;
  REQUIRE(read_mooncake_query(q, std::nullopt, e) == ParamsError::None);
  CHECK(e.rank == 0);
  CHECK(e.engine_id == "e0");
  CHECK(e.ranks == 2);
  REQUIRE(read_mooncake_query(q, 1u, e) == ParamsError::None);
  CHECK(e.engine_id == "e1");
  std::string d;
  CHECK(read_mooncake_query(q, 2u, e, &d) == ParamsError::Missing);
  CHECK(d == "rank 2");
  CHECK(read_mooncake_query("{}", std::nullopt, e) == ParamsError::Missing);
  CHECK(read_mooncake_query("[1]", std::nullopt, e) == ParamsError::NotObject);
  CHECK(read_mooncake_query("{", std::nullopt, e) == ParamsError::NotJson);
  CHECK(read_mooncake_query(R"({"r":{"engine_id":"x"}})", std::nullopt, e) == ParamsError::WrongType);
  CHECK(read_mooncake_query(R"({"0":{"engine_id":7}})", std::nullopt, e) == ParamsError::WrongType);
  CHECK(read_mooncake_query(R"({"0":{"engine_id":""}})", std::nullopt, e) == ParamsError::WrongType);
  CHECK(read_mooncake_query(R"({"0":{"engine_id":")" + std::string(kMaxEngineIdBytes + 1, 'a') + "\"}}",
                            std::nullopt, e) == ParamsError::WrongType);
  CHECK(read_mooncake_query(R"({"0":{"engine_id":"x","pad":")" + std::string(kMaxQueryAnswerBytes, 'a') + "\"}}",
                            std::nullopt, e) == ParamsError::TooLarge);
  CHECK(read_mooncake_query(R"({"0":"e"})", std::nullopt, e) == ParamsError::WrongType);
}

TEST_CASE("pd bodies: a data-parallel prefill engine's /query names each rank's engine id") {
  // vLLM's answer for DP 2, TP 2 (mooncake_utils.py MooncakeBootstrapServer.query:
  // {dp_rank: {engine_id, worker_addr: {tp_rank: {pp_rank: addr}}}}; every
  // rank's engine id suffixed _dp<rank>, rank 0's too), listed out of order.
  const std::string q =
      R"({"1":{"engine_id":"7f3a_dp1","worker_addr":{"0":{"0":"tcp://10.0.0.5:40103"},"1":{"0":"tcp://10.0.0.5:40104"}}},)"
      R"("0":{"engine_id":"7f3a_dp0","worker_addr":{"0":{"0":"tcp://10.0.0.5:40101"},"1":{"0":"tcp://10.0.0.5:40102"}}}})";
  MooncakeEngine e;
  REQUIRE(read_mooncake_query(q, 1u, e) == ParamsError::None);
  CHECK(e.rank == 1);
  CHECK(e.engine_id == "7f3a_dp1");
  CHECK(e.ranks == 2);
  // Unpinned legs take the ranks in turn, in ascending order (vLLM's proxy
  // cycles over them); a pinned rank ignores the turn.
  for (uint64_t turn : {0u, 1u, 2u, 3u}) {
    REQUIRE(read_mooncake_query(q, std::nullopt, e, nullptr, turn) == ParamsError::None);
    CHECK(e.rank == turn % 2);
    CHECK(e.engine_id == (turn % 2 ? "7f3a_dp1" : "7f3a_dp0"));
  }
  REQUIRE(read_mooncake_query(q, 0u, e, nullptr, 1) == ParamsError::None);
  CHECK(e.engine_id == "7f3a_dp0");
  // A rank the decode engine could not pull from (its workers' addresses
  // missing or unreadable) and a rank listed twice are refused.
  std::string d;
  CHECK(read_mooncake_query(R"({"0":{"engine_id":"e0"}})", std::nullopt, e, &d) == ParamsError::WrongType);
  CHECK(d == "worker_addr of rank 0");
  CHECK(read_mooncake_query(R"({"0":{"engine_id":"e0","worker_addr":{}}})", std::nullopt, e) == ParamsError::WrongType);
  CHECK(read_mooncake_query(R"({"0":{"engine_id":"e0","worker_addr":{"0":{}}}})", std::nullopt, e) ==
        ParamsError::WrongType);
  CHECK(read_mooncake_query(R"({"0":{"engine_id":"e0","worker_addr":{"0":{"0":5}}}})", std::nullopt, e) ==
        ParamsError::WrongType);
  CHECK(read_mooncake_query(R"({"0":{"engine_id":"e0","worker_addr":{"tp":{"0":"tcp://h:1"}}}})", std::nullopt, e) ==
        ParamsError::WrongType);
  const std::string w = R"("worker_addr":{"0":{"0":"tcp://h:1"}})";
  CHECK(read_mooncake_query(R"({"1":{"engine_id":"a",)" + w + R"(},"01":{"engine_id":"b",)" + w + "}}", 1u, e, &d) ==
        ParamsError::WrongType);
  CHECK(d == "rank 1 listed twice");
}
