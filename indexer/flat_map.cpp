#include "indexer/flat_map.h"

#include <sys/random.h>

#include <chrono>

namespace kvroute {

// Zero until the constructor below runs, before any other static
// initialiser of the program (priority 101): no map is filled before it.
SlotHashKey kSlotHashKey{0, 0};

namespace {

__attribute__((constructor(101))) void init_slot_hash_key() {
  uint64_t k[2] = {0, 0};
  if (getrandom(k, sizeof(k), 0) != static_cast<ssize_t>(sizeof(k))) {
    // No entropy source (very early boot): still differs per process.
    k[0] = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
    k[1] = reinterpret_cast<uintptr_t>(&k) ^ 0xD6E8FEB86659FD93ull;
  }
  kSlotHashKey = SlotHashKey{k[0], k[1]};
}

}  // namespace

}  // namespace kvroute
