// Fuzz target: decode_replica_snapshot (events/wire.h), another router
// replica's in-flight load and parked KV on `{prefix}.replicas.inflight`.
// Contract checked on every input:
//   - a refused input leaves the output untouched;
//   - a success has ttl_ms in 1..3,600,000 and at most 65,536 workers, and
//     re-encodes (encode_replica_snapshot) to the same snapshot.
#include <string>

#include "events/wire.h"
#include "tests/fuzz/fuzz_target.h"

using namespace kvroute;

namespace {

bool same(const ReplicaSnapshot& a, const ReplicaSnapshot& b) {
  return a.replica == b.replica && a.seq == b.seq && a.ttl_ms == b.ttl_ms && a.workers == b.workers;
}

ReplicaSnapshot sentinel() { return ReplicaSnapshot{424242, 77, 5, {{WorkerId{1}, 2, 3, 4}}}; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  ReplicaSnapshot s = sentinel();
  if (!decode_replica_snapshot(json, s)) {
    FUZZ_CHECK(same(s, sentinel()));
    return 0;
  }
  FUZZ_CHECK(s.ttl_ms >= 1 && s.ttl_ms <= 3600000);
  FUZZ_CHECK(s.workers.size() <= 65536);
  ReplicaSnapshot again;
  FUZZ_CHECK(decode_replica_snapshot(encode_replica_snapshot(s), again));
  FUZZ_CHECK(same(again, s));
  return 0;
}

std::vector<std::string> kvroute_fuzz_seeds() {
  ReplicaSnapshot s{0x8000000000000001ull, 12345, 3000, {}};
  std::vector<std::string> seeds{encode_replica_snapshot(s)};
  s.workers = {{WorkerId{1}, 3, 120, 4096}, {WorkerId{~0ull}, 4294967295u, ~0ull, 0}};
  seeds.push_back(encode_replica_snapshot(s));
  seeds.push_back(R"({"replica":1,"seq":2,"ttl_ms":10,"w":[[1,2,3,4]],"extra":{"w":[]}})");
  s.workers = {{WorkerId{1}, 3, 120, 4096, 77}, {WorkerId{5}, 0, 0, 0, 1ull << 40}};
  seeds.push_back(encode_replica_snapshot(s));
  seeds.push_back(R"({"replica":1,"seq":2,"ttl_ms":10,"w":[[1,2,3,4],[1,0,0,0]],"p":[[7,3],[1,9]]})");
  return seeds;
}
