// Fuzz target: read_mooncake_query (router/pd_bodies.h), a prefill worker's
// Mooncake bootstrap server answer to GET /query (vLLM mooncake_utils.py
// MooncakeBootstrapServer.query), untrusted: a worker names the engine id
// kvroute puts in every decode leg it sends for that worker's transfers.
// Contract checked on every input, for no rank asked (turns 0 and 1) and for
// rank 1:
//   - on error `out` is untouched and `detail` says why; an answer over
//     kMaxQueryAnswerBytes is too_large whatever it holds;
//   - on success the engine id is 1..kMaxEngineIdBytes bytes, 1..kMaxQueryRanks
//     distinct ranks are listed, the rank is the one asked or else the
//     (turn mod ranks)-th listed rank in ascending order, its entry names the
//     engine id and has a worker_addr object (checked by reading the answer
//     again with simdjson, independently);
//   - reading is deterministic;
//   - the decode leg's kv_transfer_params built with the engine id
//     (mooncake_decode_params) parse as a JSON object carrying it verbatim.
#include <simdjson.h>

#include <optional>
#include <utility>
#include <string>

#include "router/pd_bodies.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;
using namespace kvroute::pd;

namespace {

bool same(const MooncakeEngine& a, const MooncakeEngine& b) {
  return a.rank == b.rank && a.engine_id == b.engine_id && a.ranks == b.ranks;
}

// The answer read again, key by key: whether `rank` is the turn-th listed
// rank in ascending order (when none is asked) and its entry names `id`.
void check_choice(std::string_view answer, std::optional<uint32_t> want, uint64_t turn, const MooncakeEngine& e) {
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  FUZZ_CHECK(!parser.parse(answer.data(), answer.size(), true).get(o));
  bool named = false;
  size_t listed = 0, below = 0;
  for (simdjson::dom::key_value_pair kv : o) {
    ++listed;
    const uint64_t r = std::stoull(std::string(kv.key));  // every key is 1..9 digits (a success says so)
    below += r < e.rank;
    std::string_view id;
    simdjson::dom::object workers;
    if (r == e.rank && !kv.value["engine_id"].get_string().get(id) && id == e.engine_id &&
        !kv.value["worker_addr"].get_object().get(workers))
      named = true;
  }
  FUZZ_CHECK(named);
  FUZZ_CHECK(listed == e.ranks);
  if (!want) FUZZ_CHECK(below == turn % listed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view answer(reinterpret_cast<const char*>(data), size);
  const MooncakeEngine sentinel{7, "sentinel", 3};
  const std::pair<std::optional<uint32_t>, uint64_t> asks[] = {{std::nullopt, 0}, {std::nullopt, 1}, {1u, 1}};
  for (const auto& ask : asks) {
    const std::optional<uint32_t> want = ask.first;  // named copies: a lambda may not capture a structured binding (clang 14)
    const uint64_t turn = ask.second;
    MooncakeEngine e;
    const bool ok = fuzz::decoded_or_untouched(e, sentinel, same, [&](MooncakeEngine& out, std::string* detail) {
      return read_mooncake_query(answer, want, out, detail, turn) == ParamsError::None;
    });
    MooncakeEngine again = sentinel;
    FUZZ_CHECK((read_mooncake_query(answer, want, again, nullptr, turn) == ParamsError::None) == ok);
    FUZZ_CHECK(same(again, e));
    if (size > kMaxQueryAnswerBytes) FUZZ_CHECK(read_mooncake_query(answer, want, again) == ParamsError::TooLarge);
    if (!ok) continue;
    FUZZ_CHECK(!e.engine_id.empty() && e.engine_id.size() <= kMaxEngineIdBytes);
    FUZZ_CHECK(e.ranks >= 1 && e.ranks <= kMaxQueryRanks);
    if (want) FUZZ_CHECK(e.rank == *want);
    check_choice(answer, want, turn, e);
    const std::string params = mooncake_decode_params("http://10.0.0.5:8998", e.engine_id, "xfer-1");
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    std::string_view id;
    FUZZ_CHECK(!parser.parse(params).get(root) && root.is_object());
    FUZZ_CHECK(!root["remote_engine_id"].get_string().get(id) && id == e.engine_id);
  }
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {
      R"({"0":{"engine_id":"5c3e-a1_dp0","worker_addr":{"0":{"0":"tcp://10.0.0.5:40101"}}},)"
      R"("1":{"engine_id":"5c3e-a1_dp1","worker_addr":{"0":{"0":"tcp://10.0.0.5:40102"}}}})",
      R"({"2":{"engine_id":"e_dp2","worker_addr":{"0":{"0":"a"},"1":{"0":"b","1":"c"}}},)"
      R"("0":{"engine_id":"e_dp0","worker_addr":{"0":{"0":"d"}}},"1":{"engine_id":"e_dp1","worker_addr":{"0":{"0":"e"}}}})",
      R"({"0":{"engine_id":"x","worker_addr":{"0":{"0":"a"}}},"00":{"engine_id":"y","worker_addr":{"0":{"0":"a"}}}})",
      R"({"0":{"engine_id":"x","worker_addr":{"t":{"0":"a"}}}})",
      R"({"0":{"engine_id":"2b6ce2b2-f6d3-4b4a-b484-bf5dbd84d8ab","worker_addr":{"0":{"0":"tcp://127.0.0.1:46419"}}}})",
      R"({"3":{"engine_id":"e3"},"1":{"engine_id":"e1"},"1":{"engine_id":"e1b"}})",
      R"({"0":{"engine_id":"quo\"te \u00e9"},"x":{"engine_id":"y"}})",
      R"({"0":{"engine_id":""}})",
      R"({"0":{"engine_id":7}})",
      R"({"000000001":{"engine_id":"padded"}})",
      R"({})",
      R"([])",
  };
}
