// The offload mode's stores: the shared pool directory (one creator and one
// remover per block across processes, oldest evicted first, parents listed
// first) and the host tier (LRU).
#include "mocker/kv_pool.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>

using namespace kvroute;
using namespace kvroute::mocker;

namespace {

std::string temp_dir() {
  std::random_device rd;
  auto p = std::filesystem::temp_directory_path() / ("kvroute-pool-test-" + std::to_string(rd()));
  return p.string();
}

std::string hex16(uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

}  // namespace

TEST_CASE("pool directory: a block is created once and removed once, whoever asks; two views share it") {
  const std::string dir = temp_dir();
  KvPoolDir a(dir), b(dir);
  std::string err;
  REQUIRE(a.open(&err));
  REQUIRE(b.open(&err));
  const BlockMeta root{LocalBlockHash{11}, std::nullopt}, child{LocalBlockHash{12}, SequenceHash{1}};
  CHECK(a.put(SequenceHash{1}, root));
  CHECK_FALSE(b.put(SequenceHash{1}, root));  // another mocker stored it first: it announces, this one does not
  CHECK(b.put(SequenceHash{2}, child));
  CHECK(a.contains(SequenceHash{2}));
  CHECK_FALSE(a.contains(SequenceHash{3}));
  // Listed parents first, with their meta.
  const auto all = b.list();
  REQUIRE(all.size() == 2);
  CHECK(all[0].first == SequenceHash{1});
  CHECK_FALSE(all[0].second.parent.has_value());
  CHECK(all[1].second.local == LocalBlockHash{12});
  CHECK(all[1].second.parent == SequenceHash{1});
  CHECK(a.remove(SequenceHash{2}));
  CHECK_FALSE(b.remove(SequenceHash{2}));
  std::filesystem::remove_all(dir);
}

TEST_CASE("pool directory: over capacity, the oldest blocks go first") {
  const std::string dir = temp_dir();
  KvPoolDir p(dir);
  REQUIRE(p.open(nullptr));
  for (uint64_t id = 1; id <= 5; ++id) {
    REQUIRE(p.put(SequenceHash{id}, BlockMeta{LocalBlockHash{id}, std::nullopt}));
    // Distinct modification times (the filesystem's clock may be coarse).
    std::filesystem::last_write_time(p.dir() + "/" + hex16(id), std::filesystem::file_time_type::clock::now() +
                                                                      std::chrono::seconds(id));
  }
  CHECK(p.over_capacity(5).empty());
  CHECK(p.over_capacity(3) == std::vector<SequenceHash>{SequenceHash{1}, SequenceHash{2}});
  std::filesystem::remove_all(dir);
}

TEST_CASE("host tier: least recently offloaded dropped first; a block taken back leaves it") {
  HostTier h(2);
  CHECK(h.put(SequenceHash{1}, BlockMeta{}).empty());
  CHECK(h.put(SequenceHash{2}, BlockMeta{}).empty());
  CHECK(h.put(SequenceHash{3}, BlockMeta{}) == std::vector<SequenceHash>{SequenceHash{1}});
  CHECK(h.take(SequenceHash{2}));
  CHECK_FALSE(h.contains(SequenceHash{2}));
  CHECK(h.size() == 1);
  HostTier none(0);
  CHECK(none.put(SequenceHash{1}, BlockMeta{}).empty());
  CHECK_FALSE(none.contains(SequenceHash{1}));
}

TEST_CASE("load time: blocks x block size x KV bytes per token over the bandwidth") {
  // 8 blocks of 16 tokens of 131,072 B = 16 MiB at 100 Gbit/s: 1.34 ms.
  CHECK(load_ms(8, 16, 131072, 100) == doctest::Approx(8.0 * 16 * 131072 * 8 / 100e9 * 1000));
  CHECK(load_ms(8, 16, 131072, 0) == 0);
}
