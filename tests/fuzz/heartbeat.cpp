// Fuzz target: decode_heartbeat (events/wire.h), a `{prefix}.workers`
// heartbeat from any NATS publisher.
// Contract checked on every input:
//   - an error leaves the output untouched and names a field in `detail`;
//   - a success has every field in its documented range and re-encodes
//     (encode_heartbeat) to itself, block size 0 ("not announced") included.
#include <string>

#include "events/wire.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

WorkerHeartbeat sentinel() {
  WorkerHeartbeat hb;
  hb.worker_id = WorkerId{424242};
  hb.url = "sentinel";
  hb.block_size = 3;
  hb.load.kv_total_blocks = 5;
  hb.instance_id = 77;
  return hb;
}

bool same(const WorkerHeartbeat& a, const WorkerHeartbeat& b) {
  return a.worker_id == b.worker_id && a.url == b.url && a.model == b.model && a.block_size == b.block_size &&
         a.dp_size == b.dp_size && a.kv_events == b.kv_events &&
         a.load.request_active_slots == b.load.request_active_slots &&
         a.load.request_total_slots == b.load.request_total_slots &&
         a.load.num_requests_waiting == b.load.num_requests_waiting &&
         a.load.kv_active_blocks == b.load.kv_active_blocks && a.load.kv_total_blocks == b.load.kv_total_blocks &&
         a.instance_id == b.instance_id && a.role == b.role && a.bootstrap_port == b.bootstrap_port;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  WorkerHeartbeat hb;
  if (!fuzz::decoded_or_untouched(hb, sentinel(), same, [&](WorkerHeartbeat& o, std::string* detail) {
        return decode_heartbeat(json, o, detail) == DecodeError::None;
      }))
    return 0;
  FUZZ_CHECK(hb.block_size <= 1u << 20);
  FUZZ_CHECK(hb.dp_size >= 1 && hb.dp_size <= 4096);
  WorkerHeartbeat again;
  FUZZ_CHECK(decode_heartbeat(encode_heartbeat(hb), again) == DecodeError::None);
  FUZZ_CHECK(same(again, hb));
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  WorkerHeartbeat hb;
  hb.worker_id = WorkerId{12345678901234ull};
  hb.url = "http://127.0.0.1:8000";
  hb.model = "Qwen/Qwen3-8B";
  hb.block_size = 16;
  hb.dp_size = 2;
  hb.load = {3, 256, 1, 1000, 16384};
  std::vector<std::string> seeds{encode_heartbeat(hb)};
  hb.kv_events = false;
  hb.url = "http://[::1]:9000/\"quoted\"\n";
  hb.model = "mod\xc3\xa9le";
  seeds.push_back(encode_heartbeat(hb));
  hb.block_size = 0;  // not announced
  hb.instance_id = 0xfeedf00d;
  seeds.push_back(encode_heartbeat(hb));
  hb.role = WorkerRole::Prefill;
  hb.bootstrap_port = 9001;
  seeds.push_back(encode_heartbeat(hb));
  seeds.push_back(R"({"worker_id":1,"url":"http://w:1"})");
  seeds.push_back(R"({"worker_id":1,"url":"http://w:1","model":null,"load":{},"extra":[{"a":1}]})");
  return seeds;
}
