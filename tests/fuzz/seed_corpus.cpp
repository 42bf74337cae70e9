// libFuzzer start-up hook of every target: when the first corpus directory on
// the command line is missing or empty, fill it with kvroute_fuzz_seeds()
// (one file per seed), so a run starts from valid messages.
#include <filesystem>
#include <fstream>
#include <string_view>

#include "tests/fuzz/fuzz_target.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    std::string_view arg = (*argv)[i];
    if (arg.empty() || arg[0] == '-') continue;  // a libFuzzer flag
    std::error_code ec;
    if (fs::exists(arg, ec) && !fs::is_directory(arg, ec)) return 0;  // replaying files
    if (fs::exists(arg, ec) && !fs::is_empty(arg, ec)) return 0;      // corpus already there
    fs::create_directories(arg, ec);
    const auto seeds = kvroute_fuzz_seeds();
    for (size_t n = 0; n < seeds.size(); ++n) {
      std::ofstream f(fs::path(arg) / ("seed-" + std::to_string(n)), std::ios::binary);
      f.write(seeds[n].data(), static_cast<std::streamsize>(seeds[n].size()));
    }
    std::fprintf(stderr, "kvroute fuzz: wrote %zu seeds to %s\n", seeds.size(), std::string(arg).c_str());
    return 0;
  }
  return 0;
}
