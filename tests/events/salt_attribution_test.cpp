#include "events/salt_attribution.h"

#include <doctest/doctest.h>

#include "indexer/block_hash.h"

using namespace kvroute;
using How = SaltAttribution::How;

namespace {

const WorkerId kW{7};
const CacheOwner kOwner{kW, 0};
const LocalBlockHash kFirst{0x1234}, kOther{0x9999};

SaltAttribution::Root resolve(SaltAttribution& s, uint64_t engine_block, LocalBlockHash first = kFirst,
                              CacheOwner owner = kOwner) {
  return s.resolve(owner, first, SequenceHash{engine_block});
}

}  // namespace

TEST_CASE("a root block takes the one namespace the router sent its first block with") {
  SaltAttribution s;
  const uint64_t a = salt_hash("tenant-a");
  s.record_dispatch(kW, kFirst, a);
  auto r = resolve(s, 100);
  CHECK(r.how == How::Attributed);
  CHECK(r.salt_hash == a);
  CHECK(s.salt_blind(kW));
  CHECK(s.salt_blind_workers() == 1);
  // Unsalted traffic with the same first block: the tenant's root is held,
  // so the next root with that first block is the unsalted one.
  s.record_dispatch(kW, kFirst, 0);
  CHECK(resolve(s, 101).how == How::Unsalted);
  // Then tenant b: the only namespace not held.
  const uint64_t b = salt_hash("tenant-b");
  s.record_dispatch(kW, kFirst, b);
  r = resolve(s, 102);
  CHECK(r.how == How::Attributed);
  CHECK(r.salt_hash == b);
  CHECK(s.resolved_total(How::Attributed) == 2);
}

TEST_CASE("two namespaces in flight together, or an unknown block after salted traffic: unattributed") {
  SaltAttribution s;
  s.record_dispatch(kW, kFirst, salt_hash("tenant-a"));
  s.record_dispatch(kW, kFirst, salt_hash("tenant-b"));
  CHECK(resolve(s, 100).how == How::Unattributed);
  CHECK(resolve(s, 101).how == How::Unattributed);
  CHECK(resolve(s, 102, kOther).how == How::Unattributed);  // never sent, but salted requests were
  CHECK(s.resolved_total(How::Unattributed) == 3);
}

TEST_CASE("a removed root frees its namespace; a restart clears them all; ranks are apart") {
  SaltAttribution s;
  const uint64_t a = salt_hash("tenant-a");
  s.record_dispatch(kW, kFirst, a);
  s.record_dispatch(kW, kFirst, 0);
  CHECK(resolve(s, 100).how == How::Unattributed);  // both in flight
  // Sequentially: a's root stored and attributed ...
  SaltAttribution t;
  t.record_dispatch(kW, kFirst, a);
  CHECK(resolve(t, 100).how == How::Attributed);
  t.record_dispatch(kW, kFirst, 0);
  CHECK(resolve(t, 101).how == How::Unsalted);
  // ... evicted and stored again later: both namespaces are held but a's was removed.
  const SequenceHash gone[] = {SequenceHash{100}};
  t.removed(kOwner, gone);
  CHECK(resolve(t, 103).salt_hash == a);
  // Rank 1 holds nothing: both namespaces are candidates there.
  CHECK(resolve(t, 200, kFirst, CacheOwner{kW, 1}).how == How::Unattributed);
  t.cleared(kOwner);
  CHECK(resolve(t, 104).how == How::Unattributed);
}

TEST_CASE("events that carry a salt are trusted; workers never sent a salt stay unsalted") {
  SaltAttribution s;
  CHECK(resolve(s, 1, kFirst, CacheOwner{WorkerId{1}, 0}).how == How::Unsalted);  // nothing sent
  s.record_dispatch(kW, kFirst, 0);
  CHECK(resolve(s, 2, kOther).how == How::Unsalted);  // not sent, but no salted request ever was
  s.record_dispatch(kW, kFirst, salt_hash("tenant-a"));
  s.saw_salt_in_events(kW);
  CHECK_FALSE(s.salt_blind(kW));
  CHECK(resolve(s, 3).how == How::Trusted);
  s.remove_worker(kW);
  CHECK(s.salt_blind_workers() == 0);
}

TEST_CASE("the ring keeps the last kDispatchesPerWorker dispatches") {
  SaltAttribution s;
  const uint64_t a = salt_hash("tenant-a");
  s.record_dispatch(kW, kFirst, a);
  for (size_t i = 0; i < SaltAttribution::kDispatchesPerWorker; ++i) s.record_dispatch(kW, kOther, 0);
  // The tenant's dispatch left the ring: its first block is unknown now.
  CHECK(resolve(s, 100).how == How::Unattributed);
  CHECK(resolve(s, 101, kOther).how == How::Unsalted);
}
