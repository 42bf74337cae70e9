// Fuzz target: decode_resync_request (events/wire.h), the router's request on
// `{prefix}.kv_resync.{worker_id}` as a worker (kvroute-mocker) reads it.
// Contract checked on every input:
//   - an error leaves the output untouched;
//   - a success re-encodes (encode_resync_request) to the same request.
#include <string>

#include "events/wire.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

bool same(const ResyncRequest& a, const ResyncRequest& b) {
  return a.dp_rank == b.dp_rank && a.snapshot == b.snapshot && a.chunk == b.chunk && a.max_bytes == b.max_bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  const ResyncRequest sentinel{7, 8, 9, 10};
  ResyncRequest r = sentinel;
  if (decode_resync_request(json, r) != DecodeError::None) {
    FUZZ_CHECK(same(r, sentinel));
    return 0;
  }
  ResyncRequest again = sentinel;
  FUZZ_CHECK(decode_resync_request(encode_resync_request(r), again) == DecodeError::None);
  FUZZ_CHECK(same(again, r));
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  return {encode_resync_request(ResyncRequest{}), encode_resync_request(ResyncRequest{3, ~0ull, 4000000000u, 1 << 20}),
          R"({"dp_rank":1})", "", R"({"dp_rank":1,"snapshot":null,"extra":[1,{"a":"b"}]})"};
}
