// router/bounded_lru.h: the bounded memory session affinity and
// previous_response_id affinity share: least recently used dropped first, a
// lookup refreshes, a smaller bound drops at once, keys own their bytes.
#include "router/bounded_lru.h"

#include <doctest/doctest.h>

#include <string>

#include "router/api/response_affinity.h"

using namespace kvroute;

TEST_CASE("bounded LRU: least recently used dropped first; find refreshes; put updates") {
  BoundedLru<int> lru(2);
  lru.put("a", 1);
  lru.put("b", 2);
  REQUIRE(lru.find("a") != nullptr);  // a is now the most recent
  lru.put("c", 3);                    // drops b
  CHECK(lru.size() == 2);
  CHECK(lru.find("b") == nullptr);
  CHECK(*lru.find("a") == 1);
  lru.put("a", 10);
  CHECK(*lru.find("a") == 10);
  CHECK(lru.size() == 2);
  // The key is copied: the caller's buffer may change afterwards.
  std::string key = "dd";
  lru.put(key, 4);  // drops c (a was used last)
  key[0] = 'x';
  CHECK(lru.find("dd") != nullptr);
  CHECK(lru.find("c") == nullptr);
}

TEST_CASE("bounded LRU: a smaller bound drops the least recently used at once; 0 reads as 1") {
  BoundedLru<int> lru(4);
  for (int i = 0; i < 4; ++i) lru.put(std::to_string(i), i);
  lru.find("0");
  lru.set_capacity(2);
  CHECK(lru.size() == 2);
  CHECK(lru.find("0") != nullptr);
  CHECK(lru.find("3") != nullptr);
  CHECK(lru.find("1") == nullptr);
  lru.set_capacity(0);
  CHECK(lru.capacity() == 1);
  CHECK(lru.size() == 1);
}

TEST_CASE("response affinity: router.response_affinity_max_ids applies to the ids already remembered") {
  ResponseAffinity a(8);
  for (int i = 0; i < 8; ++i) a.remember("resp_" + std::to_string(i), WorkerId{static_cast<uint64_t>(i)});
  CHECK(a.size() == 8);
  a.set_max_ids(3);
  CHECK(a.size() == 3);
  CHECK(a.find("resp_7") == WorkerId{7});
  CHECK(a.find("resp_4") == std::nullopt);
}
