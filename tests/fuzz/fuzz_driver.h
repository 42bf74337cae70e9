// A seeded, bounded mutation fuzzer for kvroute's decoders of untrusted bytes
// (no libFuzzer needed: the tree builds with GCC). One file per target,
// tests/fuzz/fuzz_<target>.cpp, defines
//   int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);   // libFuzzer-compatible
//   std::vector<std::string> kvroute_fuzz_seeds();                  // the seed corpus
// and links fuzz_driver.cpp, whose main() mutates the seeds (bit flips,
// interesting bytes, msgpack/JSON header bytes, inserts, deletes, duplicated
// and spliced ranges, truncation) and feeds each result to the target:
//   fuzz_<target> [--iterations N] [--seconds S] [--seed X] [--max-len L]
// It stops at N iterations or S seconds, whichever comes first, prints the
// figures and a last JSON line {"target","iterations","seconds","seed"}. A
// crash is a sanitizer report (build with -DKVROUTE_SANITIZE=ON) or an
// abort from the target's own oracle; the input is then written to
// fuzz-crash-<target>.bin (in the working directory) before re-raising.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
std::vector<std::string> kvroute_fuzz_seeds();
extern const char* const kvroute_fuzz_target;
// Inputs the target accepted (decoded without error): a coverage sanity check
// (mutations that never decode would test only the first byte).
extern uint64_t kvroute_fuzz_accepted;
