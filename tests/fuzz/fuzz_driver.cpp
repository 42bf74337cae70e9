#include "tests/fuzz/fuzz_driver.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>

namespace {

// The input being run, for the crash file.
const std::string* g_current = nullptr;

void on_crash(int sig) {
  if (g_current) {
    std::string name = std::string("fuzz-crash-") + kvroute_fuzz_target + ".bin";
    if (FILE* f = std::fopen(name.c_str(), "wb")) {
      std::fwrite(g_current->data(), 1, g_current->size(), f);
      std::fclose(f);
      std::fprintf(stderr, "fuzz: crashing input written to %s\n", name.c_str());
    }
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Bytes that change a msgpack or JSON value's meaning.
constexpr uint8_t kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2,
                                    0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf, 0xd0,
                                    0xd3, 0xd4, 0xd8, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff, '"',
                                    '{',  '}',  '[',  ']',  ',',  ':',  '\\', '-',  '0',  '9',  'e'};

class Mutator {
 public:
  Mutator(uint64_t seed, size_t max_len) : rng_(seed), max_len_(max_len) {}

  void mutate(std::string& s, const std::vector<std::string>& corpus) {
    const int rounds = 1 + static_cast<int>(below(4));
    for (int r = 0; r < rounds; ++r) one(s, corpus);
    if (s.size() > max_len_) s.resize(max_len_);
  }

 private:
  uint64_t below(uint64_t n) { return n ? rng_() % n : 0; }

  void one(std::string& s, const std::vector<std::string>& corpus) {
    const size_t pos = s.empty() ? 0 : below(s.size());
    switch (below(10)) {
      case 0:  // flip a bit
        if (!s.empty()) s[pos] = static_cast<char>(s[pos] ^ (1u << below(8)));
        break;
      case 1:  // an interesting byte
      case 2:
        if (!s.empty()) s[pos] = static_cast<char>(kInteresting[below(sizeof kInteresting)]);
        break;
      case 3:  // a random byte
        if (!s.empty()) s[pos] = static_cast<char>(below(256));
        break;
      case 4:  // insert bytes
        s.insert(pos, std::string(1 + below(4), static_cast<char>(kInteresting[below(sizeof kInteresting)])));
        break;
      case 5:  // delete a range
        if (!s.empty()) s.erase(pos, 1 + below(std::min<size_t>(16, s.size() - pos)));
        break;
      case 6: {  // duplicate a range
        if (s.empty()) break;
        const size_t len = 1 + below(std::min<size_t>(64, s.size() - pos));
        s.insert(below(s.size() + 1), s.substr(pos, len));
        break;
      }
      case 7: {  // splice with another corpus entry
        const std::string& o = corpus[below(corpus.size())];
        if (o.empty()) break;
        const size_t from = below(o.size());
        s = s.substr(0, pos) + o.substr(from, 1 + below(o.size() - from));
        break;
      }
      case 8:  // truncate
        s.resize(pos);
        break;
      case 9: {  // a big-endian length field set to an extreme
        if (s.size() < pos + 4) break;
        const uint32_t v = below(2) ? 0xffffffffu : static_cast<uint32_t>(below(70000));
        for (int i = 0; i < 4; ++i) s[pos + i] = static_cast<char>(v >> (24 - 8 * i));
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  size_t max_len_;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 100000, seed = 1;
  double seconds = 1e9;
  size_t max_len = 1 << 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view a = argv[i];
    if (a == "--iterations") iterations = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--seconds") seconds = std::strtod(argv[i + 1], nullptr);
    else if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--max-len") max_len = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: %s [--iterations N] [--seconds S] [--seed X] [--max-len L]\n", argv[0]);
      return 2;
    }
  }
  std::signal(SIGABRT, on_crash);
  std::signal(SIGSEGV, on_crash);
  const std::vector<std::string> corpus = kvroute_fuzz_seeds();
  if (corpus.empty()) return 2;
  Mutator m(seed, max_len);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t n = 0;
  std::string input;
  g_current = &input;
  for (const auto& s : corpus) {  // the seeds themselves first
    input = s;
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  }
  for (; n < iterations; ++n) {
    if ((n & 1023) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= seconds)
      break;
    input = corpus[n % corpus.size()];
    m.mutate(input, corpus);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("fuzz %s: %llu mutated inputs (+%zu seeds) in %.1f s (%.0f/s), %llu accepted by the decoder, seed %llu, "
              "0 crashes\n",
              kvroute_fuzz_target, static_cast<unsigned long long>(n), corpus.size(), secs, n / secs,
              static_cast<unsigned long long>(kvroute_fuzz_accepted), static_cast<unsigned long long>(seed));
  std::printf("{\"target\":\"%s\",\"iterations\":%llu,\"accepted\":%llu,\"seconds\":%.2f,\"seed\":%llu,"
              "\"crashes\":0}\n",
              kvroute_fuzz_target, static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(kvroute_fuzz_accepted), secs, static_cast<unsigned long long>(seed));
  return 0;
}
