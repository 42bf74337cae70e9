// NFC: canonical decomposition (tables + Hangul arithmetic), canonical
// ordering (stable by combining class), canonical composition (primary
// composites, blocking rule of UAX #15 section 3.11.6). Slow path only: most
// text is answered by nfc_quick_check without a copy.
#include "tokenizer/unicode_nfc.h"
#include "tokenizer/utf8.h"

#include <algorithm>
#include <vector>

namespace kvroute {
namespace unicode_tables {
extern const char kUnicodeVersion[];
extern const uint32_t kNfcBlockCount, kDecompCount, kComposeCount;
extern const uint16_t kNfcStage1[];
extern const uint16_t kNfcStage2[];
extern const uint32_t kDecompCp[];
extern const uint16_t kDecompOffset[];
extern const uint8_t kDecompLen[];
extern const uint32_t kDecompPool[];
extern const uint64_t kComposeKey[];
extern const uint32_t kComposeValue[];
}  // namespace unicode_tables

namespace {
namespace t = unicode_tables;

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

inline uint8_t ccc(uint32_t cp) { return uint8_t(nfc_props(cp) & 0xFF); }


inline uint32_t next_cp(std::string_view s, size_t& i) {
  const unsigned char c = s[i];
  auto at = [&](size_t k) -> uint32_t { return i + k < s.size() ? (static_cast<unsigned char>(s[i + k]) & 0x3F) : 0; };
  if (c < 0x80) { ++i; return c; }
  if (c < 0xE0) { uint32_t r = ((c & 0x1F) << 6) | at(1); i += 2; return r; }
  if (c < 0xF0) { uint32_t r = ((c & 0x0F) << 12) | (at(1) << 6) | at(2); i += 3; return r; }
  uint32_t r = ((c & 0x07) << 18) | (at(1) << 12) | (at(2) << 6) | at(3);
  i += 4;
  return r;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (!(nfc_props(cp) & 0x400)) { out.push_back(cp); return; }
  const uint32_t* end = t::kDecompCp + t::kDecompCount;
  const uint32_t* it = std::lower_bound(t::kDecompCp, end, cp);
  if (it == end || *it != cp) { out.push_back(cp); return; }
  const size_t k = size_t(it - t::kDecompCp);
  out.insert(out.end(), t::kDecompPool + t::kDecompOffset[k], t::kDecompPool + t::kDecompOffset[k] + t::kDecompLen[k]);
}

// Primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const uint64_t key = uint64_t(a) * 0x110000 + b;
  const uint64_t* end = t::kComposeKey + t::kComposeCount;
  const uint64_t* it = std::lower_bound(t::kComposeKey, end, key);
  return it != end && *it == key ? t::kComposeValue[it - t::kComposeKey] : 0;
}

}  // namespace

const char* unicode_version() { return t::kUnicodeVersion; }

uint16_t nfc_props(uint32_t cp) {
  if (cp >= 0x110000) return 0;
  return t::kNfcStage2[size_t(t::kNfcStage1[cp >> 8]) * 256 + (cp & 0xFF)];
}

bool nfc_quick_check(std::string_view s) {
  // Code points below U+0300 are all NFC_QC=Yes with class 0; their UTF-8
  // bytes are all below 0xCC.
  size_t i = 0;
  while (i < s.size() && static_cast<unsigned char>(s[i]) < 0xCC) ++i;
  if (i == s.size()) return true;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  uint8_t last = 0;
  while (i < s.size()) {
    const uint32_t cp = next_cp(s, i);
    const uint16_t p = nfc_props(cp);
    if (p & 0x300) return false;
    const uint8_t c = uint8_t(p & 0xFF);
    if (c != 0 && last > c) return false;
    last = c;
  }
  return true;
}

// Appends the NFC form of s to out.
static void normalize_range(std::string_view s, std::string& out) {
  thread_local std::vector<uint32_t> d;
  d.clear();
  for (size_t i = 0; i < s.size();) decompose(next_cp(s, i), d);
  // Canonical ordering: stable sort of each run of non-starters by class.
  for (size_t i = 0; i < d.size();) {
    if (ccc(d[i]) == 0) { ++i; continue; }
    size_t j = i;
    while (j < d.size() && ccc(d[j]) != 0) ++j;
    if (j - i > 1) std::stable_sort(d.begin() + i, d.begin() + j, [](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  // Canonical composition.
  size_t n = 0;          // d[0, n) is the output so far
  long starter = -1;     // index in the output of the last starter
  uint8_t last_cc = 0;   // class of the last output code point after the starter
  for (size_t i = 0; i < d.size(); ++i) {
    const uint32_t c = d[i];
    const uint8_t cc = ccc(c);
    if (starter >= 0) {
      const bool adjacent = size_t(starter) + 1 == n;
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        if (const uint32_t comp = compose(d[size_t(starter)], c)) { d[size_t(starter)] = comp; continue; }
      }
    }
    if (cc == 0) { starter = long(n); last_cc = 0; }
    else last_cc = cc;
    d[n++] = c;
  }
  for (size_t i = 0; i < n; ++i) append_utf8(out, d[i]);
}

// Only the regions around code points that fail the quick check are
// normalized, each from the last stable starter (class 0, NFC_QC=Yes) before
// it to the next one after it; everything else is copied.
void nfc_normalize(std::string_view s, std::string& out) {
  out.clear();
  out.reserve(s.size() + 8);
  size_t copied = 0;    // s[0, copied) is in out
  size_t boundary = 0;  // start of the last stable starter
  uint8_t last = 0;
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) { boundary = i++; last = 0; continue; }
    const size_t start = i;
    const uint16_t p = nfc_props(next_cp(s, i));
    const uint8_t cc = uint8_t(p & 0xFF);
    if (!(p & 0x300) && !(cc != 0 && last > cc)) {
      if (cc == 0) boundary = start;
      last = cc;
      continue;
    }
    size_t end = i;
    while (end < s.size()) {
      size_t k = end;
      if ((nfc_props(next_cp(s, k)) & 0x3FF) == 0) break;
      end = k;
    }
    out.append(s.substr(copied, boundary - copied));
    normalize_range(s.substr(boundary, end - boundary), out);
    copied = i = boundary = end;
    last = 0;
  }
  out.append(s.substr(copied));
}

}  // namespace kvroute
