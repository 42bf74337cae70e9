// Replay driver (no libFuzzer, any compiler): runs a target over its seeds and
// over every file given on the command line (files, or directories of files:
// the regression inputs in tests/fuzz/regressions/<target>/). Exit status 0
// when every input kept the decoder's contract; a broken one aborts, and one
// that takes over 30 s ends the run by SIGALRM.
#include <filesystem>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include "tests/fuzz/fuzz_target.h"

namespace fs = std::filesystem;

static size_t run_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay %s (%zu bytes)\n", p.c_str(), bytes.size());
  alarm(30);  // an input that hangs the decoder (as libFuzzer's -timeout) kills the run
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 1;
}

int main(int argc, char** argv) {
  size_t seeds = 0, files = 0;
  for (const auto& s : kvroute_fuzz_seeds()) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++seeds;
  }
  for (int i = 1; i < argc; ++i) {
    fs::path p = argv[i];
    if (!fs::exists(p)) {
      std::fprintf(stderr, "%s: no such file or directory\n", argv[i]);
      return 2;
    }
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) files += run_file(e.path());
    } else {
      files += run_file(p);
    }
  }
  if (seeds == 0) {
    std::fprintf(stderr, "no seeds: the target's kvroute_fuzz_seeds() is empty\n");
    return 1;
  }
  std::printf("replayed %zu seeds and %zu regression inputs: contract held\n", seeds, files);
  return 0;
}
