// The decode limits of the fuzz targets for the NATS JSON decoders: small
// bounds, so that every TooLarge path is reachable by a mutated input.
#pragma once

#include "events/wire.h"

namespace kvroute::fuzz {

inline DecodeLimits small_limits() {
  DecodeLimits l;
  l.max_message_bytes = 1 << 20;
  l.max_blocks_per_event = 64;
  l.max_events_per_message = 64;
  return l;
}

}  // namespace kvroute::fuzz
