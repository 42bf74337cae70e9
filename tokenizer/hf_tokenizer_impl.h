// Internals of HfTokenizer shared by its parts (tokenizer/hf_*.cpp); not an API.
// HfTokenizer::Impl holds a loaded tokenizer.json; its members are defined by
// phase: hf_load.cpp (tokenizer.json -> Impl), hf_pretokenize.cpp (normalizers,
// pre-tokenizers), hf_bpe.cpp (word -> ids), hf_tokenizer.cpp (the API and the
// encode pipeline), hf_text.cpp (UTF-8 repair, PCRE2 patterns).
// Thread-safety: Impl is immutable after load(); per-thread state (PCRE2 match
// data, word caches, scratch buffers) is thread_local.
#pragma once

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvroute::hf_detail {

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

// Whether s is valid UTF-8 as Rust's str accepts it (no overlongs, surrogates or
// > U+10FFFF) (hf_text.cpp).
bool utf8_valid(std::string_view s);
// Like Rust's String::from_utf8_lossy: each maximal invalid prefix becomes U+FFFD.
std::string utf8_lossy(std::string_view s);
// Unicode White_Space (Rust char::is_whitespace).
bool is_white_space(uint32_t c);

// The last code point of s (valid UTF-8), 0 when s is empty.
inline uint32_t last_cp(std::string_view s) {
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

inline ThreadRegexState& regex_state() {
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

// Compiles a tokenizer.json pattern (UTF, UCP; \s/\S rewritten to White_Space),
// JIT when available; nullptr with *error set when it does not compile (hf_text.cpp).
std::shared_ptr<Regex> compile(std::string_view pattern, std::string* error);
// Word character for added-token single_word (\w of Rust's regex crate) (hf_text.cpp).
bool is_word_char(uint32_t c);

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

}  // namespace kvroute::hf_detail

namespace kvroute {

// ================================================================= Impl ===

struct HfTokenizer::Impl {
  hf_detail::Vocab vocab;
  hf_detail::MergeTable merges;
  bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
  int64_t unk_id = -1;
  bool byte_level = false;           // symbols are bytes (ByteLevel pre-tokenizer present)
  uint32_t byte_sym[256];            // byte-level: id of the GPT-2 char of each byte, or UINT32_MAX
  uint32_t fallback_sym[256];        // byte_fallback: id of <0xXX>, or UINT32_MAX
  uint32_t ascii_sym[128];           // char-level: id of each ASCII char, or UINT32_MAX
  std::string byte_map[256];         // GPT-2 bytes_to_unicode
  std::vector<hf_detail::NormStep> norms;
  std::vector<hf_detail::PreStep> pres;
  std::shared_ptr<hf_detail::Regex> gpt2;
  std::vector<hf_detail::AddedToken> added;
  hf_detail::AddedTrie raw_trie, norm_trie;  // non-normalized / normalized added tokens
  std::vector<uint32_t> prefix_special, suffix_special;  // TemplateProcessing `single`
  uint64_t generation = 0;
  // Word splitting before U+2581 (see encode_normalized); set at load when
  // the model is not byte-level and "▁" is a vocab token.
  static constexpr std::string_view kMarker = "\xE2\x96\x81";
  static constexpr uint32_t kMarkerCp = 0x2581;
  bool marker_split = false;
  size_t total_vocab = 0;  // vocab + added tokens not in it
  std::vector<uint32_t> marker_joiners;  // sorted: code points c with "c▁" inside some token

  // ---- normalization (hf_pretokenize.cpp) ----
  // Normalizes s into out; returns a view of the result (s itself when no
  // step changed it).
  std::string_view normalize(std::string_view s, std::string& out, std::string& tmp) const;

  // ---- pre-tokenization (hf_pretokenize.cpp): sc.pieces <- the pieces of seg ----
  void split_pieces(const hf_detail::PreStep& st, hf_detail::Scratch& sc) const;
  void metaspace(const hf_detail::PreStep& st, hf_detail::Scratch& sc, bool first_segment) const;
  void pre_tokenize(std::string_view seg, hf_detail::Scratch& sc, bool first_segment) const;

  // ---- BPE (hf_bpe.cpp) ----
  // Initial symbols of a word (ids), as the reference's merge_word.
  void initial_symbols(std::string_view w, std::vector<uint32_t>& sym) const;
  void push_unknown(std::vector<uint32_t>& sym, unsigned char c) const;
  // Applies merges, lowest rank first, leftmost first among equal ranks.
  void merge(std::vector<uint32_t>& sym, hf_detail::Scratch& sc) const;
  // One pre-tokenized piece -> ids appended, through the per-thread word cache.
  void encode_word(std::string_view w, std::vector<uint32_t>& ids, hf_detail::WordCache& cache, hf_detail::Scratch& sc) const;

  // ---- encode pipeline (hf_tokenizer.cpp) ----
  // Normalized text of one segment between added tokens -> ids.
  void encode_normalized(std::string_view s, std::vector<uint32_t>& ids, hf_detail::WordCache& cache, hf_detail::Scratch& sc,
                         bool first_segment) const;
  // Raw text between non-normalized added tokens -> ids.
  void encode_segment(std::string_view seg, std::vector<uint32_t>& ids, hf_detail::WordCache& cache, hf_detail::Scratch& sc,
                      bool first_segment) const;
  // Splits s on the added tokens of `trie` with the reference's rules
  // (leftmost-longest; single_word, lstrip, rstrip).
  template <class OnText, class OnToken>
  void split_added(const hf_detail::AddedTrie& trie, std::string_view s, OnText&& on_text, OnToken&& on_token) const;

  // ---- load (hf_load.cpp) ----
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

}  // namespace kvroute
