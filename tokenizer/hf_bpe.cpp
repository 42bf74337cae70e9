// HfTokenizer's BPE model: a pre-tokenized word -> initial symbols (bytes,
// characters, byte fallback, unk) -> merges on ids -> ids, memoized in the
// calling thread's word cache.
#include "tokenizer/hf_tokenizer_impl.h"

namespace kvroute {

using namespace hf_detail;


// Initial symbols of a word (ids), as the reference's merge_word.
void HfTokenizer::Impl::initial_symbols(std::string_view w, std::vector<uint32_t>& sym) const {
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

void HfTokenizer::Impl::push_unknown(std::vector<uint32_t>& sym, unsigned char c) const {
  if (byte_fallback && fallback_sym[c] != UINT32_MAX) sym.push_back(fallback_sym[c]);
  else if (unk_id >= 0 && !(fuse_unk && !sym.empty() && sym.back() == uint32_t(unk_id))) sym.push_back(uint32_t(unk_id));
}

// Applies merges, lowest rank first, leftmost first among equal ranks.
void HfTokenizer::Impl::merge(std::vector<uint32_t>& sym, Scratch& sc) const {
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

void HfTokenizer::Impl::encode_word(std::string_view w, std::vector<uint32_t>& ids, WordCache& cache, Scratch& sc) const {
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

}  // namespace kvroute
