// HfTokenizer: see hf_tokenizer.h for the contract and README.md for the
// pipeline. Hot path per encode() call:
//   sanitize UTF-8 -> split on added tokens (raw text) -> normalize each
//   segment -> split on normalized added tokens -> pre-tokenize into
//   string_views -> per piece: per-thread word cache, else BPE on ids.
// All scratch buffers are thread_local; the tokenizer itself is immutable.
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/hf_tokenizer_impl.h"

#include <array>

namespace kvroute {

using namespace hf_detail;

namespace {

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

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

// Splits s on the added tokens of `trie` with the reference's rules
// (leftmost-longest; single_word, lstrip, rstrip).
template <class OnText, class OnToken>
void HfTokenizer::Impl::split_added(const AddedTrie& trie, std::string_view s, OnText&& on_text, OnToken&& on_token) const {
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


// Normalized text of one segment between added tokens -> ids.
void HfTokenizer::Impl::encode_normalized(std::string_view s, std::vector<uint32_t>& ids, WordCache& cache, Scratch& sc, bool first_segment) const {
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


void HfTokenizer::Impl::encode_segment(std::string_view seg, std::vector<uint32_t>& ids, WordCache& cache, Scratch& sc, bool first_segment) const {
  std::string_view s = normalize(seg, sc.norm, sc.norm2);
  if (norm_trie.empty()) { encode_normalized(s, ids, cache, sc, first_segment); return; }
  // The normalized text may live in sc.norm, which pre-tokenization does not touch.
  split_added(norm_trie, s, [&](std::string_view piece, bool first) { encode_normalized(piece, ids, cache, sc, first_segment && first); },
              [&](uint32_t id) { ids.push_back(id); });
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
