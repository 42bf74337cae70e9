// HfTokenizer: see hf_tokenizer.h for the contract and README.md for the
// pipeline. Hot path per encode() call:
//   sanitize UTF-8 -> split on added tokens (raw text) -> normalize each
//   segment -> split on normalized added tokens -> pre-tokenize into
//   string_views -> per piece: per-thread word cache, else BPE on ids.
// All scratch buffers are thread_local; the tokenizer itself is immutable.
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <simdjson.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <unordered_map>

#include "tokenizer/unicode_nfc.h"

namespace kvroute {
namespace {

// ---------------------------------------------------------------- UTF-8 ---

inline size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }


// Decodes one code point of valid UTF-8 at s[i]; advances i.
inline uint32_t decode_utf8(std::string_view s, size_t& i) {
  unsigned char c = s[i];
  if (c < 0x80) { ++i; return c; }
  if (c < 0xE0) { uint32_t r = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F); i += 2; return r; }
  if (c < 0xF0) { uint32_t r = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); i += 3; return r; }
  uint32_t r = ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
  i += 4;
  return r;
}

// Length of the valid UTF-8 sequence at s[i], or 0 if invalid (overlongs,
// surrogates and > U+10FFFF are invalid, as for Rust's str).
size_t valid_seq_len(std::string_view s, size_t i) {
  const unsigned char c = s[i];
  const size_t n = s.size() - i;
  auto cont = [&](size_t k) { return k < n && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    const unsigned char c1 = s[i + 1];
    if (c == 0xE0 && c1 < 0xA0) return 0;
    if (c == 0xED && c1 >= 0xA0) return 0;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    const unsigned char c1 = s[i + 1];
    if (c == 0xF0 && c1 < 0x90) return 0;
    if (c == 0xF4 && c1 >= 0x90) return 0;
    return 4;
  }
  return 0;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const size_t n = valid_seq_len(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

// Like Rust's String::from_utf8_lossy: each maximal invalid prefix becomes U+FFFD.
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = valid_seq_len(s, i);
    if (n) { out.append(s.substr(i, n)); i += n; continue; }
    // Skip the longest prefix of a valid sequence (at least one byte).
    const unsigned char c = s[i];
    size_t skip = 1;
    const size_t want = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 1;
    while (skip < want && i + skip < s.size()) {
      const unsigned char x = s[i + skip];
      bool ok = (x & 0xC0) == 0x80;
      if (skip == 1) {
        if (c == 0xE0 && x < 0xA0) ok = false;
        if (c == 0xED && x >= 0xA0) ok = false;
        if (c == 0xF0 && x < 0x90) ok = false;
        if (c == 0xF4 && x >= 0x90) ok = false;
      }
      if (!ok) break;
      ++skip;
    }
    out += "\xEF\xBF\xBD";
    i += skip;
  }
  return out;
}

// Unicode White_Space (Rust char::is_whitespace).
bool is_white_space(uint32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}


uint32_t last_cp(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i == 0) return 0;
  --i;
  return decode_utf8(s, i);
}

// ---------------------------------------------------------------- regex ---

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Regex() { if (code) pcre2_code_free(code); }
};

// Per-thread PCRE2 state: one match data (1 ovector pair is enough: only the
// whole match is used) and a JIT stack that grows up to 8 MiB.
struct ThreadRegexState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadRegexState() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (mctx && stack) pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~ThreadRegexState() {
    if (md) pcre2_match_data_free(md);
    if (mctx) pcre2_match_context_free(mctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

ThreadRegexState& regex_state() {
  thread_local ThreadRegexState st;
  return st;
}

// Calls f(start, end) for each non-empty, non-overlapping match in s (valid
// UTF-8), left to right; after an empty match the search resumes one code
// point later. On a matcher error (resource limits) the rest of s is left
// unmatched.
template <class F>
void for_each_match(const Regex& re, std::string_view s, F&& f) {
  ThreadRegexState& st = regex_state();
  size_t off = 0;
  while (off < s.size()) {
    int rc = -1;
    if (re.jit) rc = pcre2_jit_match(re.code, (PCRE2_SPTR)s.data(), s.size(), off, 0, st.md, st.mctx);
    if (!re.jit || rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION)
      rc = pcre2_match(re.code, (PCRE2_SPTR)s.data(), s.size(), off, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH or a limit
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    if (ov[1] <= ov[0]) { off = ov[0] + utf8_len(s[std::min<size_t>(ov[0], s.size() - 1)]); continue; }
    f(size_t(ov[0]), size_t(ov[1]));
    off = ov[1];
  }
}

// The reference's regex engine (Oniguruma) defines \s as White_Space
// (\t-\r, U+0085, Zs, Zl, Zp); PCRE2 with UCP adds U+180E (its \h). Rewrite
// \s and \S (outside classes) to the explicit set so both agree.
std::string rewrite_space_classes(std::string_view pat) {
  static const char kWs[] = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  std::string out;
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < pat.size(); ++i) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char d = pat[i + 1];
      if (d == 's') out += in_class ? std::string(kWs) : "[" + std::string(kWs) + "]";
      else if (d == 'S' && !in_class) out += "[^" + std::string(kWs) + "]";
      else { out += c; out += d; }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = out.size() + 1;
      out += c;
      if (i + 1 < pat.size() && pat[i + 1] == '^') { out += '^'; ++i; ++class_start; }
      continue;
    }
    if (in_class && c == '[' && i + 1 < pat.size() && pat[i + 1] == ':') {  // POSIX [:name:]
      const size_t e = pat.find(":]", i + 2);
      if (e != std::string_view::npos) { out.append(pat.substr(i, e + 2 - i)); i = e + 1; continue; }
    }
    if (in_class && c == ']' && out.size() > class_start) in_class = false;
    out += c;
  }
  return out;
}

std::shared_ptr<Regex> compile(std::string_view pattern, std::string* error) {
  int ec;
  PCRE2_SIZE eo;
  auto r = std::make_shared<Regex>();
  const std::string pat = rewrite_space_classes(pattern);
  r->code = pcre2_compile((PCRE2_SPTR)pat.data(), pat.size(), PCRE2_UTF | PCRE2_UCP, &ec, &eo, nullptr);
  if (!r->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ec, msg, sizeof msg);
    *error = "regex compile failed at " + std::to_string(eo) + " (" + reinterpret_cast<char*>(msg) + "): " + std::string(pat);
    return nullptr;
  }
  r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

// Word character for added-token single_word: the reference tests \w of
// Rust's regex crate (Alphabetic, marks, Pc, Nd, Join_Control); approximated
// with general categories (Alphabetic ~ L + Nl + marks).
bool is_word_char(uint32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  static const std::shared_ptr<Regex> re = [] {
    std::string e;
    return compile("^[\\p{L}\\p{Nl}\\p{M}\\p{Pc}\\p{Nd}\\x{200C}\\x{200D}]", &e);
  }();
  if (!re) return false;
  std::string s;
  append_utf8(s, c);
  bool hit = false;
  for_each_match(*re, s, [&](size_t, size_t) { hit = true; });
  return hit;
}

const char* kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ------------------------------------------------------- pipeline steps ---

enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreStep {
  enum Kind { SplitRegex, SplitString, ByteLevel, Metaspace } kind;
  std::shared_ptr<Regex> re;
  std::string literal;  // SplitString: the delimiter; Metaspace: the replacement
  Behavior behavior = Behavior::Isolated;
  bool invert = false;            // Split: matches are kept, gaps are the delimiters
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = false;         // ByteLevel: split with the GPT-2 regex first
  enum Prepend { Never, First, Always } prepend = Always;  // Metaspace
  bool split = true;              // Metaspace
};

struct NormStep {
  enum Kind { Replace, ReplaceRegex, Prepend, Nfc } kind;
  std::string a, b;
  std::shared_ptr<Regex> re;
};

// --------------------------------------------------------- merge table ---

// Open-addressing map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Val { uint32_t rank, id; };
  void build(const std::vector<std::pair<uint64_t, Val>>& entries) {
    size_t cap = 16;
    while (cap < entries.size() * 2) cap <<= 1;
    mask_ = cap - 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Val{UINT32_MAX, 0});
    for (auto& [k, v] : entries) {
      size_t h = hash(k) & mask_;
      while (keys_[h] != kEmpty && keys_[h] != k) h = (h + 1) & mask_;
      if (keys_[h] == k) continue;  // duplicate merge: the first (lowest rank) wins
      keys_[h] = k;
      vals_[h] = v;
    }
  }
  // Returns rank UINT32_MAX when the pair does not merge.
  inline Val find(uint32_t a, uint32_t b) const {
    const uint64_t k = (uint64_t(a) << 32) | b;
    size_t h = hash(k) & mask_;
    while (true) {
      const uint64_t kk = keys_[h];
      if (kk == k) return vals_[h];
      if (kk == kEmpty) return Val{UINT32_MAX, 0};
      h = (h + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static inline size_t hash(uint64_t k) {
    k ^= k >> 31;
    k *= 0x7fb5d329728ea185ull;
    k ^= k >> 27;
    return size_t(k);
  }
  size_t mask_ = 0;
  std::vector<uint64_t> keys_;
  std::vector<Val> vals_;
};

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct SvEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
using Vocab = std::unordered_map<std::string, uint32_t, SvHash, SvEq>;

// ----------------------------------------------------- added-token trie ---

struct AddedToken {
  std::string content;
  uint32_t id;
  bool special, normalized, lstrip, rstrip, single_word;
};

// Byte trie over added-token contents; leftmost-longest matching as the
// reference's Aho-Corasick (MatchKind::LeftmostLongest).
class AddedTrie {
 public:
  void add(std::string_view s, int32_t token) {
    if (s.empty()) return;
    uint32_t n = 0;
    if (nodes_.empty()) nodes_.emplace_back();
    first_[static_cast<unsigned char>(s[0])] = true;
    for (unsigned char c : s) {
      auto& ch = nodes_[n].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, 0u),
                                 [](auto& x, auto& y) { return x.first < y.first; });
      if (it != ch.end() && it->first == c) { n = it->second; continue; }
      const uint32_t nn = uint32_t(nodes_.size());
      ch.insert(it, {c, nn});
      nodes_.emplace_back();
      n = nn;
    }
    if (nodes_[n].token < 0) nodes_[n].token = token;
  }
  bool empty() const { return nodes_.empty(); }
  // Longest match starting at s[i]: returns (token index, length) or (-1, 0).
  std::pair<int32_t, size_t> longest_at(std::string_view s, size_t i) const {
    if (!first_[static_cast<unsigned char>(s[i])]) return {-1, 0};
    uint32_t n = 0;
    std::pair<int32_t, size_t> best{-1, 0};
    for (size_t j = i; j < s.size(); ++j) {
      const unsigned char c = s[j];
      auto& ch = nodes_[n].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, 0u),
                                 [](auto& x, auto& y) { return x.first < y.first; });
      if (it == ch.end() || it->first != c) break;
      n = it->second;
      if (nodes_[n].token >= 0) best = {nodes_[n].token, j + 1 - i};
    }
    return best;
  }
  const bool* first() const { return first_; }

 private:
  struct Node { std::vector<std::pair<unsigned char, uint32_t>> children; int32_t token = -1; };
  std::vector<Node> nodes_;
  bool first_[256] = {};
};

// ------------------------------------------------------ per-thread cache ---

std::atomic<uint64_t> g_next_generation{1};

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xC2B2AE3D27D4EB4Full);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
  }
  h ^= h >> 29;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 32;
  return h | 1;  // 0 marks an empty slot
}

// Word -> ids cache of one tokenizer on one thread: open addressing over a
// key arena and an id arena. Bounded: cleared when it holds kMaxEntries words,
// kMaxIds ids or kMaxKeyBytes key bytes (slots 3 MiB + ids 2 MiB + keys 4 MiB
// at most; typically ~1 MiB).
struct WordCache {
  static constexpr size_t kMaxEntries = 1 << 16;
  static constexpr size_t kSlots = 1 << 17;  // final size; load factor <= 0.5
  static constexpr size_t kMaxIds = 1 << 19;
  static constexpr size_t kMaxWordBytes = 255;
  static constexpr size_t kMaxKeyBytes = 1 << 22;
  struct Slot { uint64_t hash; uint32_t key_off, ids_off; uint16_t key_len, n_ids; };
  uint64_t generation = 0;
  size_t entries = 0;
  std::vector<Slot> slots;
  std::string keys;
  std::vector<uint32_t> ids;
  void reset(uint64_t gen) {
    generation = gen;
    entries = 0;
    slots.assign(4096, Slot{0, 0, 0, 0, 0});
    keys.clear();
    ids.clear();
  }
  // Doubles the slot array (up to kSlots) when more than half full.
  void maybe_grow() {
    if (entries * 2 < slots.size() || slots.size() >= kSlots) return;
    std::vector<Slot> old(slots.size() * 2, Slot{0, 0, 0, 0, 0});
    old.swap(slots);
    const size_t mask = slots.size() - 1;
    for (const Slot& sl : old) {
      if (!sl.hash) continue;
      size_t i = sl.hash & mask;
      while (slots[i].hash) i = (i + 1) & mask;
      slots[i] = sl;
    }
  }
  // Returns the slot holding w, or the empty slot where it belongs.
  Slot& find(std::string_view w, uint64_t h) {
    const size_t mask = slots.size() - 1;
    size_t i = h & mask;
    while (true) {
      Slot& sl = slots[i];
      if (sl.hash == 0) return sl;
      if (sl.hash == h && sl.key_len == w.size() && std::memcmp(keys.data() + sl.key_off, w.data(), w.size()) == 0) return sl;
      i = (i + 1) & mask;
    }
  }
};

// Each thread keeps caches for its 4 most recently used tokenizers, told
// apart by a generation number unique per loaded tokenizer (so a destroyed
// tokenizer's cache is never reused by a new one at the same address).
WordCache& thread_cache(uint64_t generation) {
  thread_local std::array<std::unique_ptr<WordCache>, 4> caches;
  thread_local uint64_t tick = 0;
  thread_local std::array<uint64_t, 4> used{};
  ++tick;
  size_t victim = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] && caches[i]->generation == generation) { used[i] = tick; return *caches[i]; }
    if (!caches[i]) { victim = i; used[i] = 0; }
    else if (used[i] < used[victim] && caches[victim]) victim = i;
  }
  if (!caches[victim]) caches[victim] = std::make_unique<WordCache>();
  caches[victim]->reset(generation);
  used[victim] = tick;
  return *caches[victim];
}

struct Scratch {
  std::vector<std::string_view> pieces, pieces2;
  std::deque<std::string> owned;  // text produced by pre-tokenizers that rewrite (Metaspace, add_prefix_space)
  std::string norm, norm2;
  std::vector<uint32_t> sym, rank, merged;
  std::vector<uint32_t> prev, next;
  struct Cand { uint64_t key; uint32_t a, b; };
  std::vector<Cand> heap;
  std::string mapped;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

// ================================================================= Impl ===

struct HfTokenizer::Impl {
  Vocab vocab;
  MergeTable merges;
  bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
  int64_t unk_id = -1;
  bool byte_level = false;           // symbols are bytes (ByteLevel pre-tokenizer present)
  uint32_t byte_sym[256];            // byte-level: id of the GPT-2 char of each byte, or UINT32_MAX
  uint32_t fallback_sym[256];        // byte_fallback: id of <0xXX>, or UINT32_MAX
  uint32_t ascii_sym[128];           // char-level: id of each ASCII char, or UINT32_MAX
  std::string byte_map[256];         // GPT-2 bytes_to_unicode
  std::vector<NormStep> norms;
  std::vector<PreStep> pres;
  std::shared_ptr<Regex> gpt2;
  std::vector<AddedToken> added;
  AddedTrie raw_trie, norm_trie;  // non-normalized / normalized added tokens
  std::vector<uint32_t> prefix_special, suffix_special;  // TemplateProcessing `single`
  uint64_t generation = 0;
  // Word splitting before U+2581 (see encode_normalized); set at load when
  // the model is not byte-level and "▁" is a vocab token.
  static constexpr std::string_view kMarker = "\xE2\x96\x81";
  static constexpr uint32_t kMarkerCp = 0x2581;
  bool marker_split = false;
  size_t total_vocab = 0;  // vocab + added tokens not in it
  std::vector<uint32_t> marker_joiners;  // sorted: code points c with "c▁" inside some token

  // ---- normalization ----
  // Normalizes s into out; returns a view of the result (s itself when no
  // step changed it).
  std::string_view normalize(std::string_view s, std::string& out, std::string& tmp) const {
    std::string_view cur = s;
    for (auto& n : norms) {
      switch (n.kind) {
        case NormStep::Nfc:
          if (nfc_quick_check(cur)) break;
          nfc_normalize(cur, tmp);
          out.swap(tmp);
          cur = out;
          break;
        case NormStep::Replace: {
          if (n.a.empty() || cur.find(n.a) == std::string_view::npos) break;
          tmp.clear();
          size_t i = 0;
          while (true) {
            const size_t j = cur.find(n.a, i);
            if (j == std::string_view::npos) { tmp.append(cur.substr(i)); break; }
            tmp.append(cur.substr(i, j - i));
            tmp.append(n.b);
            i = j + n.a.size();
          }
          out.swap(tmp);
          cur = out;
          break;
        }
        case NormStep::ReplaceRegex: {
          tmp.clear();
          size_t prev = 0;
          bool any = false;
          for_each_match(*n.re, cur, [&](size_t a, size_t b) {
            tmp.append(cur.substr(prev, a - prev));
            tmp.append(n.b);
            prev = b;
            any = true;
          });
          if (!any) break;
          tmp.append(cur.substr(prev));
          out.swap(tmp);
          cur = out;
          break;
        }
        case NormStep::Prepend:
          if (cur.empty()) break;
          tmp.assign(n.a);
          tmp.append(cur);
          out.swap(tmp);
          cur = out;
          break;
      }
    }
    return cur;
  }

  // ---- pre-tokenization ----
  void split_pieces(const PreStep& st, Scratch& sc) const {
    auto& in = sc.pieces;
    auto& out = sc.pieces2;
    out.clear();
    for (std::string_view p : in) {
      // Fast path: Isolated, not inverted: matches and gaps are all pieces.
      if (st.behavior == Behavior::Isolated && !st.invert && st.kind == PreStep::SplitRegex) {
        size_t prev = 0;
        for_each_match(*st.re, p, [&](size_t a, size_t b) {
          if (a > prev) out.push_back(p.substr(prev, a - prev));
          out.push_back(p.substr(a, b - a));
          prev = b;
        });
        if (prev < p.size()) out.push_back(p.substr(prev));
        continue;
      }
      // General path: segments (start, end, is_delimiter).
      bool pending_next = false;
      const size_t first_out = out.size();
      auto emit = [&](size_t a, size_t b, bool is_m0) {
        const bool is_m = st.invert ? !is_m0 : is_m0;
        std::string_view piece = p.substr(a, b - a);
        const bool have_prev = out.size() > first_out;
        auto extend_prev = [&] { out.back() = std::string_view(out.back().data(), out.back().size() + piece.size()); };
        switch (st.behavior) {
          case Behavior::Isolated: out.push_back(piece); break;
          case Behavior::Removed: if (!is_m) out.push_back(piece); break;
          case Behavior::MergedWithPrevious:
            if (is_m && have_prev && !pending_next) extend_prev(); else out.push_back(piece);
            pending_next = false;
            break;
          case Behavior::MergedWithNext:
            if (pending_next && have_prev) extend_prev(); else out.push_back(piece);
            pending_next = is_m;
            break;
          case Behavior::Contiguous:
            if (is_m && have_prev && pending_next) extend_prev(); else out.push_back(piece);
            pending_next = is_m;
            break;
        }
      };
      size_t prev = 0;
      auto on_match = [&](size_t a, size_t b) {
        if (a > prev) emit(prev, a, false);
        emit(a, b, true);
        prev = b;
      };
      if (st.kind == PreStep::SplitRegex) for_each_match(*st.re, p, on_match);
      else if (!st.literal.empty()) {
        size_t i = 0;
        while ((i = p.find(st.literal, i)) != std::string_view::npos) { on_match(i, i + st.literal.size()); i += st.literal.size(); }
      }
      if (prev < p.size()) emit(prev, p.size(), false);
    }
    in.swap(out);
  }

  void metaspace(const PreStep& st, Scratch& sc, bool first_segment) const {
    auto& in = sc.pieces;
    auto& out = sc.pieces2;
    out.clear();
    for (size_t k = 0; k < in.size(); ++k) {
      std::string_view p = in[k];
      std::string s;
      s.reserve(p.size() + 8);
      const bool prepend = st.prepend == PreStep::Always || (st.prepend == PreStep::First && first_segment && k == 0);
      for (char c : p) { if (c == ' ') s += st.literal; else s += c; }
      if (prepend && s.compare(0, st.literal.size(), st.literal) != 0) s.insert(0, st.literal);
      sc.owned.push_back(std::move(s));
      std::string_view q = sc.owned.back();
      if (!st.split) { out.push_back(q); continue; }
      // MergedWithNext on the replacement.
      size_t start = 0, i = 0;
      while ((i = q.find(st.literal, i)) != std::string_view::npos) {
        if (i > start) { out.push_back(q.substr(start, i - start)); }
        start = i;
        i += st.literal.size();
      }
      if (start < q.size()) out.push_back(q.substr(start));
    }
    in.swap(out);
  }

  void pre_tokenize(std::string_view seg, Scratch& sc, bool first_segment) const {
    sc.pieces.clear();
    sc.pieces.push_back(seg);
    for (auto& st : pres) {
      switch (st.kind) {
        case PreStep::SplitRegex:
        case PreStep::SplitString: split_pieces(st, sc); break;
        case PreStep::Metaspace: metaspace(st, sc, first_segment); break;
        case PreStep::ByteLevel:
          if (st.add_prefix_space) {
            for (auto& p : sc.pieces) {
              if (!p.empty() && p[0] == ' ') continue;
              sc.owned.push_back(" " + std::string(p));
              p = sc.owned.back();
            }
          }
          if (st.use_regex) {
            PreStep g;
            g.kind = PreStep::SplitRegex;
            g.re = gpt2;
            split_pieces(g, sc);
          }
          break;
      }
    }
  }

  // ---- BPE ----
  // Initial symbols of a word (ids), as the reference's merge_word.
  void initial_symbols(std::string_view w, std::vector<uint32_t>& sym) const {
    sym.clear();
    if (byte_level) {
      for (unsigned char c : w) {
        const uint32_t id = byte_sym[c];
        if (id != UINT32_MAX) sym.push_back(id);
        else push_unknown(sym, c);
      }
      return;
    }
    bool last_unk = false;
    for (size_t i = 0; i < w.size();) {
      const unsigned char c = w[i];
      const size_t n = std::min(utf8_len(c), w.size() - i);
      uint32_t id = UINT32_MAX;
      if (c < 0x80) id = ascii_sym[c];
      else if (auto it = vocab.find(w.substr(i, n)); it != vocab.end()) id = it->second;
      if (id != UINT32_MAX) { sym.push_back(id); last_unk = false; i += n; continue; }
      if (byte_fallback) {
        bool all = true;
        for (size_t k = 0; k < n; ++k) all = all && fallback_sym[static_cast<unsigned char>(w[i + k])] != UINT32_MAX;
        if (all) {
          for (size_t k = 0; k < n; ++k) sym.push_back(fallback_sym[static_cast<unsigned char>(w[i + k])]);
          last_unk = false;
          i += n;
          continue;
        }
      }
      if (unk_id >= 0) {
        if (!(fuse_unk && last_unk)) sym.push_back(uint32_t(unk_id));
        last_unk = true;
      }
      i += n;
    }
  }

  void push_unknown(std::vector<uint32_t>& sym, unsigned char c) const {
    if (byte_fallback && fallback_sym[c] != UINT32_MAX) sym.push_back(fallback_sym[c]);
    else if (unk_id >= 0 && !(fuse_unk && !sym.empty() && sym.back() == uint32_t(unk_id))) sym.push_back(uint32_t(unk_id));
  }

  // Applies merges, lowest rank first, leftmost first among equal ranks.
  void merge(std::vector<uint32_t>& sym, Scratch& sc) const {
    const size_t n = sym.size();
    if (n < 2) return;
    if (n <= 64) {
      auto& rank = sc.rank;
      auto& merged = sc.merged;
      rank.resize(n);
      merged.resize(n);
      size_t m = n;
      for (size_t i = 0; i + 1 < m; ++i) { auto v = merges.find(sym[i], sym[i + 1]); rank[i] = v.rank; merged[i] = v.id; }
      rank[m - 1] = UINT32_MAX;
      while (m > 1) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; ++i)
          if (rank[i] < best) { best = rank[i]; bi = i; }
        if (best == UINT32_MAX) break;
        sym[bi] = merged[bi];
        for (size_t i = bi + 1; i + 1 < m; ++i) { sym[i] = sym[i + 1]; rank[i] = rank[i + 1]; merged[i] = merged[i + 1]; }
        --m;
        rank[m - 1] = UINT32_MAX;
        if (bi + 1 < m) { auto v = merges.find(sym[bi], sym[bi + 1]); rank[bi] = v.rank; merged[bi] = v.id; }
        else rank[bi] = UINT32_MAX;
        if (bi > 0) { auto v = merges.find(sym[bi - 1], sym[bi]); rank[bi - 1] = v.rank; merged[bi - 1] = v.id; }
      }
      sym.resize(m);
      return;
    }
    // Long words: linked list + heap of candidate pairs, validated on pop.
    auto& prev = sc.prev;
    auto& next = sc.next;
    prev.resize(n);
    next.resize(n);
    for (size_t i = 0; i < n; ++i) { prev[i] = uint32_t(i) - 1; next[i] = uint32_t(i + 1); }
    next[n - 1] = UINT32_MAX;
    // Candidate pair: key = rank << 32 | left position (min-heap on key =
    // lowest rank, then leftmost); a, b = the ids the pair had when queued.
    auto& heap = sc.heap;
    auto cmp = [](const Scratch::Cand& x, const Scratch::Cand& y) { return x.key > y.key; };
    heap.clear();
    for (size_t i = 0; i + 1 < n; ++i) {
      auto v = merges.find(sym[i], sym[i + 1]);
      if (v.rank != UINT32_MAX) heap.push_back({(uint64_t(v.rank) << 32) | i, sym[i], sym[i + 1]});
    }
    std::make_heap(heap.begin(), heap.end(), cmp);
    constexpr uint32_t kDead = UINT32_MAX;
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), cmp);
      const Scratch::Cand c = heap.back();
      heap.pop_back();
      const uint32_t p = uint32_t(c.key);
      if (sym[p] != c.a) continue;
      const uint32_t q = next[p];
      if (q == UINT32_MAX || sym[q] != c.b) continue;
      // Still the same pair: merge q into p.
      sym[p] = merges.find(c.a, c.b).id;
      sym[q] = kDead;
      next[p] = next[q];
      if (next[q] != UINT32_MAX) prev[next[q]] = p;
      if (prev[p] != UINT32_MAX) {
        const uint32_t l = prev[p];
        auto w = merges.find(sym[l], sym[p]);
        if (w.rank != UINT32_MAX) { heap.push_back({(uint64_t(w.rank) << 32) | l, sym[l], sym[p]}); std::push_heap(heap.begin(), heap.end(), cmp); }
      }
      if (next[p] != UINT32_MAX) {
        const uint32_t r = next[p];
        auto w = merges.find(sym[p], sym[r]);
        if (w.rank != UINT32_MAX) { heap.push_back({(uint64_t(w.rank) << 32) | p, sym[p], sym[r]}); std::push_heap(heap.begin(), heap.end(), cmp); }
      }
    }
    size_t m = 0;
    for (uint32_t i = 0; i != UINT32_MAX; i = next[i]) sym[m++] = sym[i];
    sym.resize(m);
  }

  void encode_word(std::string_view w, std::vector<uint32_t>& ids, WordCache& cache, Scratch& sc) const {
    if (w.size() == 1) {  // one symbol: nothing to merge
      const unsigned char c = w[0];
      const uint32_t id = byte_level ? byte_sym[c] : c < 0x80 ? ascii_sym[c] : UINT32_MAX;
      if (id != UINT32_MAX) { ids.push_back(id); return; }
    }
    const bool cacheable = w.size() <= WordCache::kMaxWordBytes;
    uint64_t h = 0;
    if (cacheable) {
      h = hash_bytes(w);
      const WordCache::Slot& sl = cache.find(w, h);
      if (sl.hash) {
        const uint32_t* p = cache.ids.data() + sl.ids_off;
        ids.insert(ids.end(), p, p + sl.n_ids);
        return;
      }
    }
    const size_t start = ids.size();
    bool done = false;
    if (ignore_merges) {
      std::string_view key = w;
      if (byte_level) {
        sc.mapped.clear();
        for (unsigned char c : w) sc.mapped += byte_map[c];
        key = sc.mapped;
      }
      if (auto it = vocab.find(key); it != vocab.end()) { ids.push_back(it->second); done = true; }
    }
    if (!done) {
      initial_symbols(w, sc.sym);
      merge(sc.sym, sc);
      ids.insert(ids.end(), sc.sym.begin(), sc.sym.end());
    }
    const size_t n = ids.size() - start;
    if (cacheable && n < 65536) {
      if (cache.entries >= WordCache::kMaxEntries || cache.ids.size() + n > WordCache::kMaxIds ||
          cache.keys.size() + w.size() > WordCache::kMaxKeyBytes)
        cache.reset(cache.generation);
      cache.maybe_grow();
      WordCache::Slot& sl = cache.find(w, h);
      sl = WordCache::Slot{h, uint32_t(cache.keys.size()), uint32_t(cache.ids.size()), uint16_t(w.size()), uint16_t(n)};
      cache.keys.append(w);
      cache.ids.insert(cache.ids.end(), ids.begin() + start, ids.end());
      ++cache.entries;
    }
  }

  // Normalized text of one segment between added tokens -> ids.
  void encode_normalized(std::string_view s, std::vector<uint32_t>& ids, WordCache& cache, Scratch& sc, bool first_segment) const {
    if (s.empty()) return;
    pre_tokenize(s, sc, first_segment);
    for (std::string_view p : sc.pieces) {
      if (p.empty()) continue;
      if (!marker_split) { encode_word(p, ids, cache, sc); continue; }
      // SentencePiece-style: no merge can span "c▁" unless some token
      // contains "c▁" (c in marker_joiners), so cut the word there: same ids,
      // short cacheable words instead of one text-sized word.
      size_t start = 0, i = 0;
      while ((i = p.find(kMarker, i + 1)) != std::string_view::npos) {
        const uint32_t prev = last_cp(p.substr(0, i));
        if (prev != kMarkerCp && !std::binary_search(marker_joiners.begin(), marker_joiners.end(), prev)) {
          encode_word(p.substr(start, i - start), ids, cache, sc);
          start = i;
        }
      }
      encode_word(p.substr(start), ids, cache, sc);
    }
  }

  // Raw text between non-normalized added tokens -> ids.
  void encode_segment(std::string_view seg, std::vector<uint32_t>& ids, WordCache& cache, Scratch& sc, bool first_segment) const {
    std::string_view s = normalize(seg, sc.norm, sc.norm2);
    if (norm_trie.empty()) { encode_normalized(s, ids, cache, sc, first_segment); return; }
    // The normalized text may live in sc.norm, which pre-tokenization does not touch.
    split_added(norm_trie, s, [&](std::string_view piece, bool first) { encode_normalized(piece, ids, cache, sc, first_segment && first); },
                [&](uint32_t id) { ids.push_back(id); });
  }

  // Splits s on the added tokens of `trie` with the reference's rules
  // (leftmost-longest; single_word, lstrip, rstrip).
  template <class OnText, class OnToken>
  void split_added(const AddedTrie& trie, std::string_view s, OnText&& on_text, OnToken&& on_token) const {
    size_t start_offset = 0, i = 0;
    bool first = true;
    const bool* first_byte = trie.first();
    while (i < s.size()) {
      if (!first_byte[static_cast<unsigned char>(s[i])]) { ++i; continue; }
      auto [tok, len] = trie.longest_at(s, i);
      if (tok < 0) { ++i; continue; }
      const AddedToken& t = added[size_t(tok)];
      size_t start = i, stop = i + len;
      i = stop;  // the matcher resumes after this match even when it is rejected
      if (t.single_word) {
        const bool start_space = start == 0 || !is_word_char(last_cp(s.substr(0, start)));
        bool stop_space = stop == s.size();
        if (!stop_space) { size_t k = stop; stop_space = !is_word_char(decode_utf8(s, k)); }
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        size_t ns = start;
        while (ns > 0) {
          size_t k = ns;
          while (k > 0 && (static_cast<unsigned char>(s[k - 1]) & 0xC0) == 0x80) --k;
          if (k == 0) break;
          --k;
          size_t kk = k;
          if (!is_white_space(decode_utf8(s, kk))) break;
          ns = k;
        }
        start = std::max(ns, start_offset);
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          size_t k = stop;
          if (!is_white_space(decode_utf8(s, k))) break;
          stop = k;
        }
        i = stop;
      }
      if (start_offset < start) { on_text(s.substr(start_offset, start - start_offset), first); first = false; }
      on_token(t.id);
      first = false;
      start_offset = stop;
    }
    if (start_offset < s.size()) on_text(s.substr(start_offset), first);
  }

  // load()'s phases, in order; each returns false with *error set. JSON
  // access may throw simdjson_error on a malformed file (load() catches it).
  void init_byte_map();
  bool load_model(simdjson::simdjson_result<simdjson::dom::element> model, std::string* error);
  bool load_merges(simdjson::simdjson_result<simdjson::dom::element> model, std::string* error);
  void init_symbols();
  bool add_normalizer(simdjson::dom::element n, std::string* error);
  bool add_pre_tokenizer(simdjson::dom::element n, std::string* error);
  void load_added_tokens(simdjson::dom::element doc);
  void init_marker_split();
  void add_post_processor(simdjson::dom::element n);
};

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

// ================================================================= load ===

void HfTokenizer::Impl::init_byte_map() {  // GPT-2 bytes_to_unicode.
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    byte_map[b].clear();
    append_utf8(byte_map[b], keep ? b : 256 + n++);
  }
}

bool HfTokenizer::Impl::load_model(simdjson::simdjson_result<simdjson::dom::element> model, std::string* error) {
  std::string_view mtype;
  if (model["type"].get(mtype) || mtype != "BPE") { *error = "unsupported model type (only BPE)"; return false; }
  simdjson::dom::object vocab_obj;
  if (model["vocab"].get(vocab_obj)) { *error = "model.vocab missing"; return false; }
  vocab.reserve(vocab_obj.size());
  for (auto [k, v] : vocab_obj) {
    int64_t id;
    if (v.get(id) || id < 0 || id >= int64_t(UINT32_MAX)) { *error = "bad vocab id for " + std::string(k); return false; }
    vocab.emplace(std::string(k), uint32_t(id));
  }
  bool b;
  if (!model["byte_fallback"].get(b)) byte_fallback = b;
  if (!model["ignore_merges"].get(b)) ignore_merges = b;
  if (!model["fuse_unk"].get(b)) fuse_unk = b;
  std::string_view unk;
  if (!model["unk_token"].get(unk)) {
    auto it = vocab.find(unk);
    if (it != vocab.end()) unk_id = it->second;
  }
  std::string_view s;
  if (!model["continuing_subword_prefix"].get(s) && !s.empty()) { *error = "continuing_subword_prefix unsupported"; return false; }
  if (!model["end_of_word_suffix"].get(s) && !s.empty()) { *error = "end_of_word_suffix unsupported"; return false; }
  return load_merges(model, error);
}

// Merges, either "a b" strings or ["a", "b"] pairs; rank = position.
bool HfTokenizer::Impl::load_merges(simdjson::simdjson_result<simdjson::dom::element> model, std::string* error) {
  std::vector<std::pair<uint64_t, MergeTable::Val>> entries;
  simdjson::dom::array list;
  if (model["merges"].get(list)) { *error = "model.merges missing"; return false; }
  entries.reserve(list.size());
  uint32_t rank = 0;
  std::string joined;
  for (auto m : list) {
    std::string_view a, bb, sv;
    if (!m.get(sv)) {
      const size_t sp = sv.find(' ', 1);  // the first token is never empty
      if (sp == std::string_view::npos) { *error = "bad merge: " + std::string(sv); return false; }
      a = sv.substr(0, sp);
      bb = sv.substr(sp + 1);
    } else {
      simdjson::dom::array arr;
      if (m.get(arr) || arr.size() != 2) { *error = "bad merge entry"; return false; }
      a = arr.at(0).get_string().value();
      bb = arr.at(1).get_string().value();
    }
    auto ia = vocab.find(a), ib = vocab.find(bb);
    joined.assign(a);
    joined.append(bb);
    auto ij = vocab.find(joined);
    if (ia == vocab.end() || ib == vocab.end() || ij == vocab.end()) {
      *error = "merge token not in vocab: " + joined;
      return false;
    }
    entries.push_back({(uint64_t(ia->second) << 32) | ib->second, {rank++, ij->second}});
  }
  merges.build(entries);
  return true;
}

void HfTokenizer::Impl::init_symbols() {
  for (int c = 0; c < 256; ++c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", c);
    auto f = vocab.find(std::string_view(buf));
    fallback_sym[c] = f == vocab.end() ? UINT32_MAX : f->second;
    auto g = vocab.find(byte_map[c]);
    byte_sym[c] = g == vocab.end() ? UINT32_MAX : g->second;
    if (c < 128) {
      const char ch = char(c);
      auto h = vocab.find(std::string_view(&ch, 1));
      ascii_sym[c] = h == vocab.end() ? UINT32_MAX : h->second;
    }
  }
}

bool HfTokenizer::Impl::add_normalizer(simdjson::dom::element n, std::string* error) {
  if (n.is_null()) return true;
  std::string_view t = n["type"];
  if (t == "Sequence") { for (auto x : n["normalizers"].get_array()) if (!add_normalizer(x, error)) return false; return true; }
  if (t == "Replace") {
    std::string_view p, content = n["content"];
    if (!n["pattern"]["String"].get(p)) { norms.push_back({NormStep::Replace, std::string(p), std::string(content), nullptr}); return true; }
    if (!n["pattern"]["Regex"].get(p)) {
      auto re = compile(p, error);
      if (!re) return false;
      norms.push_back({NormStep::ReplaceRegex, std::string(p), std::string(content), re});
      return true;
    }
    *error = "Replace: pattern must be String or Regex";
    return false;
  }
  if (t == "Prepend") { norms.push_back({NormStep::Prepend, std::string(std::string_view(n["prepend"])), {}, nullptr}); return true; }
  if (t == "NFC") { norms.push_back({NormStep::Nfc, {}, {}, nullptr}); return true; }
  *error = "unsupported normalizer " + std::string(t);
  return false;
}

bool HfTokenizer::Impl::add_pre_tokenizer(simdjson::dom::element n, std::string* error) {
  if (n.is_null()) return true;
  std::string_view t = n["type"];
  if (t == "Sequence") { for (auto x : n["pretokenizers"].get_array()) if (!add_pre_tokenizer(x, error)) return false; return true; }
  if (t == "ByteLevel") {
    byte_level = true;
    PreStep st;
    st.kind = PreStep::ByteLevel;
    bool v;
    st.use_regex = n["use_regex"].get(v) ? true : v;
    st.add_prefix_space = n["add_prefix_space"].get(v) ? false : v;
    pres.push_back(std::move(st));
    return true;
  }
  if (t == "Metaspace") {
    PreStep st;
    st.kind = PreStep::Metaspace;
    std::string_view r, scheme;
    st.literal = n["replacement"].get(r) ? "\xE2\x96\x81" : std::string(r);
    if (!n["prepend_scheme"].get(scheme)) st.prepend = scheme == "never" ? PreStep::Never : scheme == "first" ? PreStep::First : PreStep::Always;
    else { bool ap; if (!n["add_prefix_space"].get(ap)) st.prepend = ap ? PreStep::Always : PreStep::Never; }
    bool sp;
    if (!n["split"].get(sp)) st.split = sp;
    pres.push_back(std::move(st));
    return true;
  }
  if (t == "Split") {
    PreStep st;
    st.kind = PreStep::SplitRegex;
    std::string_view beh = n["behavior"];
    st.behavior = beh == "Removed" ? Behavior::Removed : beh == "MergedWithPrevious" ? Behavior::MergedWithPrevious
                : beh == "MergedWithNext" ? Behavior::MergedWithNext : beh == "Contiguous" ? Behavior::Contiguous : Behavior::Isolated;
    bool inv = false;
    if (!n["invert"].get(inv)) st.invert = inv;
    std::string_view p;
    if (!n["pattern"]["Regex"].get(p)) { st.re = compile(p, error); if (!st.re) return false; }
    else { st.kind = PreStep::SplitString; st.literal = std::string(std::string_view(n["pattern"]["String"])); }
    pres.push_back(std::move(st));
    return true;
  }
  *error = "unsupported pre_tokenizer " + std::string(t);
  return false;
}

// Added tokens: non-normalized ones match the raw text; normalized ones
// match the normalized text, so their content is normalized too.
// Ids as the reference assigns them (its JSON "id" is only checked, not
// used): the model vocab id when the content is in the vocab, else the
// next id after the vocab and the added tokens so far.
void HfTokenizer::Impl::load_added_tokens(simdjson::dom::element doc) {
  simdjson::dom::array list;
  const uint32_t vocab_n = uint32_t(vocab.size());
  int64_t max_added = -1;
  if (!doc["added_tokens"].get(list)) {
    for (auto t : list) {
      AddedToken a;
      a.content = std::string(std::string_view(t["content"]));
      if (a.content.empty() || std::any_of(added.begin(), added.end(), [&](auto& x) { return x.content == a.content; })) continue;
      if (auto it = vocab.find(a.content); it != vocab.end()) a.id = it->second;
      else a.id = max_added < 0 ? vocab_n : (max_added >= int64_t(vocab_n) || vocab_n == 0) ? uint32_t(max_added + 1) : vocab_n;
      max_added = std::max<int64_t>(max_added, a.id);
      auto flag = [&](const char* k, bool d) { bool v; return t[k].get(v) ? d : v; };
      a.special = flag("special", false);
      a.normalized = flag("normalized", !a.special);
      a.lstrip = flag("lstrip", false);
      a.rstrip = flag("rstrip", false);
      a.single_word = flag("single_word", false);
      added.push_back(std::move(a));
    }
  }
  total_vocab = vocab.size();
  for (auto& a : added) total_vocab += !vocab.count(a.content);
  for (size_t i = 0; i < added.size(); ++i) {
    auto& a = added[i];
    if (!a.normalized) {
      raw_trie.add(a.content, int32_t(i));
    } else {
      std::string o, t2;
      std::string_view nc = normalize(a.content, o, t2);
      norm_trie.add(std::string(nc), int32_t(i));
    }
  }
}

void HfTokenizer::Impl::init_marker_split() {
  if (byte_level || !vocab.count(kMarker)) return;
  marker_split = true;
  for (auto& [tok, id] : vocab) {
    std::string_view t = tok;
    for (size_t i = t.find(kMarker, 1); i != std::string_view::npos; i = t.find(kMarker, i + 1)) {
      const uint32_t prev = last_cp(t.substr(0, i));
      if (prev != kMarkerCp) marker_joiners.push_back(prev);
    }
  }
  std::sort(marker_joiners.begin(), marker_joiners.end());
  marker_joiners.erase(std::unique(marker_joiners.begin(), marker_joiners.end()), marker_joiners.end());
}

// Post-processor: special tokens around the sequence in TemplateProcessing.single.
void HfTokenizer::Impl::add_post_processor(simdjson::dom::element n) {
  if (n.is_null()) return;
  std::string_view t = n["type"];
  if (t == "Sequence") { for (auto x : n["processors"].get_array()) add_post_processor(x); return; }
  if (t != "TemplateProcessing") return;
  bool seen_seq = false;
  for (auto piece : n["single"].get_array()) {
    std::string_view id;
    if (piece["SpecialToken"]["id"].get(id)) { seen_seq = true; continue; }
    for (auto x : n["special_tokens"][id]["ids"].get_array())
      (seen_seq ? suffix_special : prefix_special).push_back(uint32_t(int64_t(x)));
  }
}

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& dir_or_file, std::string* error) {
  std::string ignored;
  if (!error) error = &ignored;
  std::string path = dir_or_file;
  std::error_code fec;
  if (std::filesystem::is_directory(path, fec)) path += "/tokenizer.json";
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto e = parser.load(path).get(doc)) { *error = path + ": " + simdjson::error_message(e); return nullptr; }
  auto impl = std::make_unique<Impl>();
  impl->generation = g_next_generation.fetch_add(1);
  impl->init_byte_map();
  impl->gpt2 = compile(kGpt2Pattern, error);
  if (!impl->gpt2) return nullptr;
  // JSON access below may throw simdjson_error on a malformed file: caught at the end.
  try {
    if (!impl->load_model(doc["model"], error)) return nullptr;
    impl->init_symbols();
    if (!impl->add_normalizer(doc["normalizer"], error)) return nullptr;
    if (!impl->add_pre_tokenizer(doc["pre_tokenizer"], error)) return nullptr;
    impl->load_added_tokens(doc);
    impl->init_marker_split();
    impl->add_post_processor(doc["post_processor"]);
  } catch (const simdjson::simdjson_error& e) {
    *error = path + ": unexpected JSON structure: " + e.what();
    return nullptr;
  }
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

// =============================================================== encode ===

std::vector<uint32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<uint32_t> ids;
  encode(text, add_special_tokens, ids);
  return ids;
}

void HfTokenizer::encode(std::string_view text, bool add_special_tokens, std::vector<uint32_t>& ids) const {
  const Impl& im = *impl_;
  ids.clear();
  std::string repaired;
  if (!utf8_valid(text)) { repaired = utf8_lossy(text); text = repaired; }
  if (add_special_tokens) ids = im.prefix_special;
  ids.reserve(ids.size() + text.size() / 3 + 8);
  Scratch& sc = scratch();
  sc.owned.clear();
  WordCache& cache = thread_cache(im.generation);
  if (im.raw_trie.empty()) {
    im.encode_segment(text, ids, cache, sc, true);
  } else {
    im.split_added(im.raw_trie, text, [&](std::string_view seg, bool first) { im.encode_segment(seg, ids, cache, sc, first); },
                   [&](uint32_t id) { ids.push_back(id); });
  }
  if (add_special_tokens) ids.insert(ids.end(), im.suffix_special.begin(), im.suffix_special.end());
}

std::optional<uint32_t> HfTokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->vocab.find(token);
  if (it != impl_->vocab.end()) return it->second;
  for (auto& a : impl_->added) if (a.content == token) return a.id;
  return std::nullopt;
}

size_t HfTokenizer::vocab_size() const { return impl_->total_vocab; }

}  // namespace kvroute
