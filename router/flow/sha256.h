// SHA-256 (FIPS 180-4) of a byte string, and a constant-time comparison:
// API keys are stored as their SHA-256 (hex) and a presented key is checked
// by hashing it and comparing digests without an early exit.
//
// Threading: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvroute::flow {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest sha256(std::string_view data);
// Lower-case hex of a digest (64 characters).
std::string to_hex(const Sha256Digest& d);
// Parses 64 hex digits (either case); false if `hex` is anything else.
bool from_hex(std::string_view hex, Sha256Digest& out);
// Equal digests, in time independent of where they differ.
bool equal_constant_time(const Sha256Digest& a, const Sha256Digest& b);

}  // namespace kvroute::flow
