// Fuzz target: read_kv_transfer_params (router/pd_bodies.h), a prefill
// worker's answer whose kv_transfer_params kvroute relays to a decode worker
// (docs/design/pd-protocols.md §1.3: untrusted input).
// Contract checked on every input:
//   - on error nothing is written; on success the output is a JSON object
//     (simdjson parses it) with do_remote_prefill true, within the size limit
//     (plus the pinned host), and its remote_host, when a string, is the
//     prefill worker's host (a loopback default pinned to it);
//   - the decode leg built from it parses and carries exactly one
//     kv_transfer_params, the relayed one;
//   - reading is deterministic and the output reads back to itself.
// (The Mooncake bootstrap server's GET /query answer has its own target,
// mooncake_query.cpp.)
#include <simdjson.h>

#include <optional>
#include <string>

#include "router/pd_bodies.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;
using namespace kvroute::pd;

namespace {

constexpr std::string_view kHost = "10.0.0.5";

std::string answer_with(std::string_view params) {
  return std::string(R"({"id":"c","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":)") +
         std::string(params) + "}";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view answer(reinterpret_cast<const char*>(data), size);
  ParamsLimits limits;
  limits.max_answer_bytes = 1 << 16;
  limits.max_params_bytes = 1 << 14;
  std::string out = "sentinel", detail;
  const ParamsError e = read_kv_transfer_params(answer, kHost, limits, out, &detail);
  std::string again = "sentinel";
  FUZZ_CHECK(read_kv_transfer_params(answer, kHost, limits, again) == e);
  if (e != ParamsError::None) {
    FUZZ_CHECK(out == "sentinel" && again == "sentinel");
    FUZZ_CHECK(!detail.empty());
    return 0;
  }
  FUZZ_CHECK(out == again);
  FUZZ_CHECK(out.size() <= limits.max_params_bytes + kHost.size() + 2);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  FUZZ_CHECK(!parser.parse(out).get(root) && root.is_object());
  simdjson::dom::element v;
  FUZZ_CHECK(!root.at_key("do_remote_prefill").get(v) && v.is_bool() && v.get_bool().value_unsafe());
  if (!root.at_key("remote_host").get(v) && v.is_string()) {
    const std::string_view h = v.get_string().value_unsafe();
    FUZZ_CHECK(h == kHost);  // the prefill worker's own, or its loopback default pinned to it
  }
  // Read back from a well-formed answer around it: the same object.
  std::string back;
  FUZZ_CHECK(read_kv_transfer_params(answer_with(out), kHost, ParamsLimits{}, back) == ParamsError::None);
  FUZZ_CHECK(back == out);
  std::string decode;
  FUZZ_CHECK(nixl_decode_body(R"({"model":"m","kv_transfer_params":{"do_remote_prefill":true}})", out, decode) ==
             BodyError::None);
  simdjson::dom::element d;
  FUZZ_CHECK(!parser.parse(decode).get(d) && d.is_object());
  // The client's kv_transfer_params are gone: the decode leg's are the relayed ones.
  FUZZ_CHECK(!d.at_key("kv_transfer_params").at_key("do_remote_prefill").get(v) && v.is_bool() &&
             v.get_bool().value_unsafe());
  FUZZ_CHECK(decode.size() == std::string_view(R"({"model":"m","kv_transfer_params":})").size() + out.size());
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {
      answer_with(R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[17,18,19]],)"
                  R"("remote_engine_id":"3b6e","remote_request_id":"chatcmpl-7f1c-a1b2c3d4","remote_host":"10.0.0.5",)"
                  R"("remote_port":5600,"tp_size":1,"dcp_size":1,"pp_size":1,"remote_num_tokens":812,)"
                  R"("remote_blocks_expiry_time":null,"transfer_mode":"pull"})"),
      answer_with(R"({"do_remote_prefill":true,"remote_host":"localhost","remote_port":5600,"remote_block_ids":[1,2]})"),
      answer_with(R"({"do_remote_prefill":true,"remote_host":"10.0.0.5","remote_host":"10.9.9.9"})"),
      answer_with(R"({"do_remote_prefill":false})"),
      answer_with("null"),
      R"({"id":"x"})",
      answer_with(R"( { "do_remote_prefill" : true , "k\u0065y" : [ { "a" : "}" } ] } )"),
  };
}
