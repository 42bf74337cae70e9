// Compares HfTokenizer against ids produced by gen_reference.js.
// Usage: compare_reference MODEL_DIR CORPUS.jsonl REF.jsonl  -> prints "match/total" and first mismatches.
#include <simdjson.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/hf_tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 4) { std::fprintf(stderr, "usage: %s MODEL_DIR CORPUS REF\n", argv[0]); return 2; }
  std::string err;
  auto tok = kvroute::HfTokenizer::load(argv[1], &err);
  if (!tok) { std::fprintf(stderr, "load: %s\n", err.c_str()); return 2; }
  std::ifstream c(argv[2]), r(argv[3]);
  std::string cl, rl;
  simdjson::dom::parser p1, p2;
  size_t total = 0, ok = 0, shown = 0;
  while (std::getline(c, cl) && std::getline(r, rl)) {
    if (cl.empty()) continue;
    std::string text(std::string_view(p1.parse(cl).get_string().value()));
    auto ref = p2.parse(rl);
    for (bool sp : {true, false}) {
      std::vector<uint32_t> want;
      for (auto x : ref[sp ? "special" : "plain"].get_array()) want.push_back(uint32_t(int64_t(x)));
      auto got = tok->encode(text, sp);
      ++total;
      if (got == want) { ++ok; continue; }
      if (shown++ < 5) {
        std::printf("MISMATCH sp=%d text=%s\n  want:", sp, cl.substr(0, 200).c_str());
        for (auto x : want) std::printf(" %u", x);
        std::printf("\n  got: ");
        for (auto x : got) std::printf(" %u", x);
        std::printf("\n");
      }
    }
  }
  std::printf("%zu/%zu exact\n", ok, total);
  return ok == total ? 0 : 1;
}
