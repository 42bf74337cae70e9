// HfTokenizer's normalizers (Sequence, NFC, Replace, Prepend) and
// pre-tokenizers (Split, ByteLevel, Metaspace): text -> pieces as views into
// the text or into per-thread scratch.
#include "tokenizer/hf_tokenizer_impl.h"
#include "tokenizer/unicode_nfc.h"

namespace kvroute {

using namespace hf_detail;


std::string_view HfTokenizer::Impl::normalize(std::string_view s, std::string& out, std::string& tmp) const {
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

void HfTokenizer::Impl::split_pieces(const PreStep& st, Scratch& sc) const {
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

void HfTokenizer::Impl::metaspace(const PreStep& st, Scratch& sc, bool first_segment) const {
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

void HfTokenizer::Impl::pre_tokenize(std::string_view seg, Scratch& sc, bool first_segment) const {
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

}  // namespace kvroute
