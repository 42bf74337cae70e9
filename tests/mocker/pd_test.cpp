#include "mocker/pd.h"

#include <doctest/doctest.h>

#include <string>

using namespace kvroute;
using namespace kvroute::mocker;

namespace {

struct Parsed {
  std::optional<KvTransferParams> p;
  PdError err = PdError::None;
  std::string detail;
};

Parsed parse(const std::string& body) {
  static simdjson::dom::parser parser;
  Parsed out;
  simdjson::dom::object o = parser.parse(body).get_object().value();
  out.p = parse_kv_transfer_params(o, out.err, out.detail);
  return out;
}

TransferTable::Held held(std::string id, std::vector<uint64_t> ids) {
  TransferTable::Held h;
  h.request_id = std::move(id);
  h.block_ids = ids;
  for (uint64_t i : ids) h.blocks.push_back(SequenceHash{i * 1000 + 7});
  return h;
}

}  // namespace

TEST_CASE("kv_transfer_params: vLLM's newest (grouped) and older (flat) shapes both parse") {
  auto a = parse(R"({"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,
    "remote_block_ids":[[3,4,5]],"remote_engine_id":"e1","remote_request_id":"cmpl-x-0-abcd1234",
    "remote_host":"127.0.0.1","remote_port":5600,"tp_size":1,"dcp_size":1,"pp_size":1,"remote_num_tokens":40,
    "remote_blocks_expiry_time":null,"transfer_mode":"pull"}})");
  REQUIRE(a.p);
  CHECK(a.p->do_remote_prefill);
  CHECK(*a.p->remote_block_ids == std::vector<uint64_t>{3, 4, 5});
  CHECK(*a.p->remote_port == 5600);
  std::string detail;
  CHECK(check_decode_params(*a.p, detail) == PdError::None);
  auto b = parse(R"({"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[7,8],
    "remote_engine_id":"e1","remote_request_id":"r","remote_host":"localhost","remote_port":1}})");
  REQUIRE(b.p);
  CHECK(*b.p->remote_block_ids == std::vector<uint64_t>{7, 8});
  // The prefill leg's shape: nulls are absent.
  auto c = parse(R"({"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,
    "remote_block_ids":null,"remote_host":null,"remote_port":null}})");
  REQUIRE(c.p);
  CHECK(c.p->do_remote_decode);
  CHECK_FALSE(c.p->remote_block_ids);
  CHECK_FALSE(parse(R"({"prompt":"x"})").p);
  CHECK(parse(R"({"prompt":"x"})").err == PdError::None);
}

TEST_CASE("kv_transfer_params: a decode leg missing a key is told which; bad types and sizes are refused") {
  auto m = parse(R"({"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e",
    "remote_host":"127.0.0.1","remote_port":9}})");
  REQUIRE(m.p);
  std::string detail;
  CHECK(check_decode_params(*m.p, detail) == PdError::Missing);
  CHECK(detail.find("remote_request_id") != std::string::npos);
  for (const char* bad : {R"({"kv_transfer_params":"x"})", R"({"kv_transfer_params":{"do_remote_prefill":"yes"}})",
                          R"({"kv_transfer_params":{"remote_port":0}})", R"({"kv_transfer_params":{"remote_port":70000}})",
                          R"({"kv_transfer_params":{"remote_port":"1"}})", R"({"kv_transfer_params":{"remote_block_ids":[-1]}})",
                          R"({"kv_transfer_params":{"remote_block_ids":{"a":1}}})",
                          R"({"kv_transfer_params":{"remote_block_ids":[[1,"x"]]}})",
                          R"({"kv_transfer_params":{"remote_host":7}})"}) {
    CAPTURE(bad);
    auto r = parse(bad);
    CHECK_FALSE(r.p);
    CHECK(r.err == PdError::Malformed);
    CHECK_FALSE(r.detail.empty());
  }
  auto long_string = parse(R"({"kv_transfer_params":{"remote_engine_id":")" + std::string(300, 'a') + R"("}})");
  CHECK(long_string.err == PdError::TooLarge);
  std::string ids;
  for (size_t i = 0; i <= kMaxRemoteBlocks; ++i) ids += (i ? ",1" : "1");
  CHECK(parse(R"({"kv_transfer_params":{"remote_block_ids":[)" + ids + "]}}").err == PdError::TooLarge);
  std::string pad(kMaxParamsBytes, 'x');
  CHECK(parse(R"({"kv_transfer_params":{"junk":")" + pad + R"("}})").err == PdError::TooLarge);
}

TEST_CASE("pd hosts: IP literals and localhost only") {
  CHECK(pd_host_allowed("127.0.0.1"));
  CHECK(pd_host_allowed("::1"));
  CHECK(pd_host_allowed("localhost"));
  CHECK_FALSE(pd_host_allowed("evil.example.com"));
  CHECK_FALSE(pd_host_allowed(""));
}

TEST_CASE("transfer time: blocks x tokens x KV bytes over the link") {
  // 10 blocks of 16 tokens at 131072 B/token = 20,971,520 B = 167,772,160 bit; at 100 Gbit/s: 1.6777 ms.
  CHECK(pd_transfer_ms(10, 16, 131072, 100) == doctest::Approx(1.6777216));
  CHECK(pd_transfer_ms(0, 16, 131072, 100) == 0);
  CHECK(pd_transfer_ms(10, 16, 131072, 0) == 0);  // 0 = an infinitely fast link
}

TEST_CASE("transfer table: a pull takes the held blocks once; forged ids and unknown ids are refused") {
  TransferTable t(4, 1000);
  REQUIRE(t.add(held("r1", {10, 11, 12}), 0));
  CHECK_FALSE(t.add(held("r1", {1}), 0));  // one transfer per request id
  CHECK(t.held_transfers() == 1);
  CHECK(t.held_blocks() == 3);
  TransferTable::Held out;
  std::vector<SequenceHash> hashes;
  CHECK(t.take("r1", {10, 99}, 5, out, hashes) == TransferTable::Take::Forged);
  CHECK(t.held_transfers() == 1);  // a forged read changes nothing
  CHECK(t.take("nope", {}, 5, out, hashes) == TransferTable::Take::Unknown);
  REQUIRE(t.take("r1", {11, 12}, 5, out, hashes) == TransferTable::Take::Ok);
  CHECK(hashes == std::vector<SequenceHash>{SequenceHash{11007}, SequenceHash{12007}});
  CHECK(out.block_ids.size() == 3);
  CHECK(t.held_transfers() == 0);
  CHECK(t.held_blocks() == 0);
  CHECK(t.take("r1", {11}, 6, out, hashes) == TransferTable::Take::Unknown);  // pulled once only
}

TEST_CASE("transfer table: the lease expires held transfers; a late pull is told expired; the table is bounded") {
  TransferTable t(2, 1000);
  REQUIRE(t.add(held("a", {1}), 0));
  REQUIRE(t.add(held("b", {2, 3}), 500));
  CHECK(t.full());
  CHECK_FALSE(t.add(held("c", {4}), 600));
  CHECK(*t.next_expiry() == 1000);
  TransferTable::Held out;
  std::vector<SequenceHash> hashes;
  CHECK(t.take("a", {1}, 1000, out, hashes) == TransferTable::Take::Expired);  // due, even before the sweep
  auto gone = t.expire(1000);
  REQUIRE(gone.size() == 1);
  CHECK(gone[0].request_id == "a");
  CHECK(t.held_blocks() == 2);
  CHECK(t.take("a", {1}, 1001, out, hashes) == TransferTable::Take::Expired);
  CHECK(t.drop("b"));
  CHECK_FALSE(t.drop("b"));
  CHECK(t.held_transfers() == 0);
  CHECK(t.held_blocks() == 0);
  CHECK_FALSE(t.next_expiry());
}
