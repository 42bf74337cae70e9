// The contract every fuzz target in tests/fuzz/ follows (one file per decoder
// of untrusted bytes, as Beast's test/fuzz/). A target defines:
//   - LLVMFuzzerTestOneInput(data, size): feeds the bytes to its decoder and
//     checks the decoder's contract (FUZZ_CHECK); a failed check aborts, so
//     libFuzzer and the replay driver report it like a crash;
//   - kvroute_fuzz_seeds(): valid messages built with the project's own
//     encoders, the seed corpus (nothing is downloaded).
// Two drivers link a target: libFuzzer (clang, ASan+UBSan; seed_corpus.cpp
// writes the seeds into an empty corpus directory) and replay_main.cpp (any
// compiler: runs the seeds and the regression inputs once, no mutation).
// Threading: drivers call a target from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

std::vector<std::string> kvroute_fuzz_seeds();

// A broken decoder contract: print where and abort (libFuzzer saves the input).
#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

namespace kvroute::fuzz {

// The error half of a decoder's contract, for targets that decode into one
// value: `out` starts as `sentinel`; `decode(out, &detail)` returns whether it
// decoded, and when it did not, `out` is untouched and `detail` says why.
// Returns whether it decoded.
template <class T, class Same, class Decode>
bool decoded_or_untouched(T& out, const T& sentinel, Same same, Decode decode) {
  out = sentinel;
  std::string detail;
  if (decode(out, &detail)) return true;
  FUZZ_CHECK(same(out, sentinel));
  FUZZ_CHECK(!detail.empty());
  return false;
}

}  // namespace kvroute::fuzz
