// Compares HfTokenizer against ids produced by gen_reference.js (HF `tokenizers`).
// Usage: compare_reference MODEL_DIR CORPUS.jsonl REF.jsonl DerivedAge.txt [--verbose]
//
// A string counts as exact when both add_special_tokens=true and =false
// match. A mismatch is "explained" only when the tokens that differ (between
// the longest common prefix and suffix of the two id lists) cover, in the
// reference's offsets, a code point for which the reference and kvroute may
// legitimately disagree, decided from Unicode data (never from a list of
// strings); a newer code point elsewhere in the string excuses nothing:
//   age   assigned after Unicode 14.0 according to DerivedAge.txt (or not
//         assigned at all in it): Debian's PCRE2 has Unicode 14 property
//         tables, the reference 16.
//   nfc   (tokenizers with an NFC normalizer only) a code point NFC can act on
//         (canonical combining class, canonical decomposition or NFC_QC
//         No/Maybe in kvroute's tables) that was assigned after Unicode
//         kNfcTrustedAge: the reference's NFC tables are older than its
//         Unicode 16 regex tables.
// Every explained string is printed with its id (0-based corpus line) and the
// offending code points. Exit status 1 if any mismatch is unexplained.
#include <simdjson.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/unicode_nfc.h"

namespace {

// Newest Unicode version whose NFC data the reference agrees with. Measured:
// every NFC mismatch on the corpus involves a code point NFC acts on that
// was assigned in Unicode 11.0 or later (reference NFC ~ Unicode 10 tables).
constexpr double kNfcTrustedAge = 10.0;

// code point -> age (major.minor as a double); absent = unassigned.
std::map<uint32_t, std::pair<uint32_t, double>> load_ages(const char* path, bool* ok) {
  std::map<uint32_t, std::pair<uint32_t, double>> ranges;  // start -> (end, age)
  std::ifstream f(path);
  *ok = bool(f);
  std::string line;
  while (std::getline(f, line)) {
    line = line.substr(0, line.find('#'));
    const size_t semi = line.find(';');
    if (semi == std::string::npos) continue;
    std::string r = line.substr(0, semi);
    const size_t dots = r.find("..");
    const uint32_t a = std::stoul(r.substr(0, dots), nullptr, 16);
    const uint32_t b = dots == std::string::npos ? a : std::stoul(r.substr(dots + 2), nullptr, 16);
    ranges[a] = {b, std::stod(line.substr(semi + 1))};
  }
  return ranges;
}

double age_of(const std::map<uint32_t, std::pair<uint32_t, double>>& ages, uint32_t cp) {
  auto it = ages.upper_bound(cp);
  if (it == ages.begin()) return -1;
  --it;
  return cp <= it->second.first ? it->second.second : -1;
}

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) { std::fprintf(stderr, "usage: %s MODEL_DIR CORPUS REF DerivedAge.txt [--verbose]\n", argv[0]); return 2; }
  const bool verbose = argc > 5 && std::strcmp(argv[5], "--verbose") == 0;
  std::string err;
  auto tok = kvroute::HfTokenizer::load(argv[1], &err);
  if (!tok) { std::fprintf(stderr, "load: %s\n", err.c_str()); return 2; }
  bool ages_ok = false;
  const auto ages = load_ages(argv[4], &ages_ok);
  if (!ages_ok || ages.empty()) { std::fprintf(stderr, "cannot read %s (package unicode-data)\n", argv[4]); return 2; }
  bool nfc = false;
  {
    std::ifstream tj(std::string(argv[1]) + "/tokenizer.json");
    std::stringstream ss;
    ss << tj.rdbuf();
    const std::string j = ss.str();
    // The normalizer object precedes the pre_tokenizer in tokenizer.json.
    const size_t a = j.find("\"normalizer\""), b = j.find("\"pre_tokenizer\"");
    nfc = a != std::string::npos && j.substr(a, b - a).find("\"NFC\"") != std::string::npos;
  }
  std::ifstream c(argv[2]), r(argv[3]);
  if (!c || !r) { std::fprintf(stderr, "cannot open corpus or reference\n"); return 2; }
  std::string cl, rl;
  simdjson::dom::parser p1, p2;
  size_t strings = 0, exact = 0, explained = 0, unexplained = 0, shown = 0, line_no = 0;
  std::vector<uint32_t> got;
  for (; std::getline(c, cl); ++line_no) {
    if (cl.empty()) continue;
    if (!std::getline(r, rl)) { std::fprintf(stderr, "reference shorter than corpus\n"); return 2; }
    std::string_view text_view;
    simdjson::dom::element ref;
    if (p1.parse(cl).get_string().get(text_view) || p2.parse(rl).get(ref)) {
      std::fprintf(stderr, "bad JSON at corpus line %zu\n", line_no);
      return 2;
    }
    const std::string text(text_view);
    ++strings;
    bool ok = true;
    std::vector<uint32_t> bad_want, bad_got;
    bool bad_sp = false;
    std::vector<std::pair<size_t, size_t>> spans;  // code-point spans of differing tokens
    for (bool sp : {true, false}) {
      std::vector<uint32_t> want;
      simdjson::dom::array arr;
      if (ref[sp ? "special" : "plain"].get(arr)) { std::fprintf(stderr, "bad reference line %zu\n", line_no); return 2; }
      for (auto x : arr) {
        int64_t v;
        if (x.get(v)) { std::fprintf(stderr, "bad id at line %zu\n", line_no); return 2; }
        want.push_back(uint32_t(v));
      }
      tok->encode(text, sp, got);
      if (got == want) continue;
      if (ok) { ok = false; bad_want = want; bad_got = got; bad_sp = sp; }
      simdjson::dom::array offs;
      if (ref[sp ? "special_offsets" : "plain_offsets"].get(offs) || offs.size() != want.size()) {
        std::fprintf(stderr, "reference line %zu has no offsets (regenerate it)\n", line_no);
        return 2;
      }
      std::vector<std::pair<size_t, size_t>> off;
      for (auto o : offs) {
        int64_t a = 0, b = 0;
        if (o.at(0).get(a) || o.at(1).get(b)) { std::fprintf(stderr, "bad offsets at line %zu\n", line_no); return 2; }
        off.emplace_back(size_t(a), size_t(b));
      }
      size_t pre = 0, suf = 0;
      while (pre < want.size() && pre < got.size() && want[pre] == got[pre]) ++pre;
      while (suf < want.size() - pre && suf < got.size() - pre && want[want.size() - 1 - suf] == got[got.size() - 1 - suf]) ++suf;
      const size_t last = want.size() - suf;  // differing reference tokens: [pre, last)
      const size_t from = pre < last ? off[pre].first : pre > 0 ? off[pre - 1].second : 0;
      const size_t to = pre < last ? off[last - 1].second : pre < off.size() ? off[pre].first : SIZE_MAX;
      spans.emplace_back(std::min(from, to), std::max(from, to) + (from == to));  // an insertion: the code point there
    }
    if (ok) { ++exact; continue; }
    std::string why;
    std::set<uint32_t> seen;
    const auto cps = code_points(text);
    size_t spans_explained = 0;
    for (const auto& [from, to] : spans) {
      bool here = false;
      for (size_t k = from; k < std::min(to, cps.size()) && !here; ++k) {
        const double age = age_of(ages, cps[k]);
        here = age < 0 || age > 14.05 || (nfc && kvroute::nfc_props(cps[k]) != 0 && age > kNfcTrustedAge);
      }
      spans_explained += here;
    }
    for (uint32_t cp : spans_explained == spans.size() ? cps : std::vector<uint32_t>{}) {
      if (!seen.insert(cp).second) continue;
      const double age = age_of(ages, cp);
      char buf[64];
      if (age < 0 || age > 14.05) std::snprintf(buf, sizeof buf, " U+%04X(age %s)", cp, age < 0 ? "unassigned-in-UCD" : std::to_string(age).substr(0, 4).c_str());
      else if (nfc && kvroute::nfc_props(cp) != 0 && age > kNfcTrustedAge) std::snprintf(buf, sizeof buf, " U+%04X(nfc, age %.1f)", cp, age);
      else continue;
      why += buf;
    }
    if (!why.empty()) {
      ++explained;
      std::printf("EXPLAINED id=%zu:%s\n", line_no, why.c_str());
      continue;
    }
    ++unexplained;
    if (shown++ < 10 || verbose) {
      std::printf("UNEXPLAINED id=%zu sp=%d text=%s\n  want:", line_no, bad_sp, cl.substr(0, 300).c_str());
      for (auto x : bad_want) std::printf(" %u", x);
      std::printf("\n  got: ");
      for (auto x : bad_got) std::printf(" %u", x);
      std::printf("\n");
    }
  }
  if (std::getline(r, rl) && !rl.empty()) { std::fprintf(stderr, "reference longer than corpus\n"); return 2; }
  std::printf("%zu/%zu exact, %zu explained, %zu unexplained\n", exact, strings, explained, unexplained);
  return unexplained == 0 && strings > 0 ? 0 : 1;
}
