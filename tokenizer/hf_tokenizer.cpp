#include "tokenizer/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <simdjson.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <unordered_map>

namespace kvroute {
namespace {

struct Regex {
  pcre2_code* code = nullptr;
  ~Regex() { if (code) pcre2_code_free(code); }
};

enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreStep {
  enum Kind { SplitRegex, SplitString, ByteLevel } kind;
  std::shared_ptr<Regex> re;
  std::string literal;
  Behavior behavior = Behavior::Isolated;
  bool byte_level_regex = false;
  bool invert = false;  // matches are the pieces kept; gaps are the delimiters
};

struct NormStep {
  enum Kind { Replace, Prepend } kind;
  std::string a, b;
};

std::string cp_utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) s += char(c);
  else if (c < 0x800) { s += char(0xC0 | (c >> 6)); s += char(0x80 | (c & 0x3F)); }
  else if (c < 0x10000) { s += char(0xE0 | (c >> 12)); s += char(0x80 | ((c >> 6) & 0x3F)); s += char(0x80 | (c & 0x3F)); }
  else { s += char(0xF0 | (c >> 18)); s += char(0x80 | ((c >> 12) & 0x3F)); s += char(0x80 | ((c >> 6) & 0x3F)); s += char(0x80 | (c & 0x3F)); }
  return s;
}

size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  if (from.empty()) return std::string(s);
  size_t i = 0;
  while (true) {
    size_t j = s.find(from, i);
    if (j == std::string_view::npos) { out.append(s.substr(i)); break; }
    out.append(s.substr(i, j - i)); out.append(to); i = j + from.size();
  }
  return out;
}

const char* kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace

struct HfTokenizer::Impl {
  std::unordered_map<std::string, uint32_t> vocab;
  std::unordered_map<std::string, uint32_t> merge_rank;  // "a\x01b" -> rank
  bool byte_fallback = false, ignore_merges = false, byte_level = false;
  std::vector<NormStep> norms;
  std::vector<PreStep> pres;
  std::vector<std::pair<std::string, uint32_t>> added;  // sorted longest first
  std::vector<uint32_t> prefix_special;                  // from TemplateProcessing
  std::string byte_map[256];

  std::vector<std::pair<size_t, size_t>> regex_split(const Regex& re, std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> m;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re.code, nullptr);
    size_t off = 0;
    while (off <= s.size()) {
      int rc = pcre2_jit_match(re.code, (PCRE2_SPTR)s.data(), s.size(), off, 0, md, nullptr);
      if (rc == PCRE2_ERROR_JIT_BADOPTION)
        rc = pcre2_match(re.code, (PCRE2_SPTR)s.data(), s.size(), off, 0, md, nullptr);
      if (rc < 0) break;
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) { off = ov[1] + (ov[1] < s.size() ? utf8_len(s[ov[1]]) : 1); continue; }
      m.push_back({ov[0], ov[1]});
      off = ov[1];
    }
    pcre2_match_data_free(md);
    return m;
  }

  void apply_split(const PreStep& st, std::vector<std::string>& pieces) const {
    std::vector<std::string> out;
    for (auto& p : pieces) {
      std::vector<std::pair<size_t, size_t>> m;
      if (st.kind == PreStep::SplitRegex) m = regex_split(*st.re, p);
      else {
        size_t i = 0;
        while (!st.literal.empty() && (i = p.find(st.literal, i)) != std::string::npos) { m.push_back({i, i + st.literal.size()}); i += st.literal.size(); }
      }
      // (start, end, is_match)
      std::vector<std::tuple<size_t, size_t, bool>> segs;
      size_t prev = 0;
      for (auto [a, b] : m) { if (a > prev) segs.push_back({prev, a, false}); segs.push_back({a, b, true}); prev = b; }
      if (prev < p.size()) segs.push_back({prev, p.size(), false});
      std::vector<std::string> local;
      bool pending_next = false;
      for (auto [a, b, is_m0] : segs) {
        const bool is_m = st.invert ? !is_m0 : is_m0;
        std::string piece = p.substr(a, b - a);
        switch (st.behavior) {
          case Behavior::Isolated: local.push_back(piece); break;
          case Behavior::Removed: if (!is_m) local.push_back(piece); break;
          case Behavior::MergedWithPrevious:
            if (is_m && !local.empty() && !pending_next) local.back() += piece; else local.push_back(piece);
            pending_next = false; break;
          case Behavior::MergedWithNext:
            if (pending_next) local.back() += piece; else local.push_back(piece);
            pending_next = is_m; break;
          case Behavior::Contiguous:
            if (is_m && !local.empty() && pending_next) local.back() += piece; else local.push_back(piece);
            pending_next = is_m; break;
        }
      }
      for (auto& l : local) out.push_back(std::move(l));
    }
    pieces.swap(out);
  }

  void bpe(const std::string& word, std::vector<uint32_t>& ids) const {
    if (ignore_merges) { auto it = vocab.find(word); if (it != vocab.end()) { ids.push_back(it->second); return; } }
    std::vector<std::string> sym;
    for (size_t i = 0; i < word.size();) { size_t n = std::min(utf8_len(word[i]), word.size() - i); sym.push_back(word.substr(i, n)); i += n; }
    while (sym.size() > 1) {
      uint32_t best = UINT32_MAX; size_t bi = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = merge_rank.find(sym[i] + '\x01' + sym[i + 1]);
        if (it != merge_rank.end() && it->second < best) { best = it->second; bi = i; }
      }
      if (best == UINT32_MAX) break;
      sym[bi] += sym[bi + 1]; sym.erase(sym.begin() + bi + 1);
    }
    for (auto& s : sym) {
      auto it = vocab.find(s);
      if (it != vocab.end()) { ids.push_back(it->second); continue; }
      if (byte_fallback) {
        for (unsigned char c : s) { char buf[8]; snprintf(buf, sizeof buf, "<0x%02X>", c); auto f = vocab.find(buf); if (f != vocab.end()) ids.push_back(f->second); }
      }
    }
  }

  void encode_segment(std::string_view seg, std::vector<uint32_t>& ids) const {
    std::string s(seg);
    for (auto& n : norms) s = n.kind == NormStep::Replace ? replace_all(s, n.a, n.b) : (s.empty() ? s : n.a + s);
    std::vector<std::string> pieces{s};
    for (auto& st : pres) {
      if (st.kind == PreStep::ByteLevel) {
        if (st.byte_level_regex) { PreStep g{PreStep::SplitRegex, pres_gpt2, {}, Behavior::Isolated, false}; apply_split(g, pieces); }
        for (auto& p : pieces) { std::string m; for (unsigned char c : p) m += byte_map[c]; p.swap(m); }
      } else apply_split(st, pieces);
    }
    for (auto& p : pieces) if (!p.empty()) bpe(p, ids);
  }
  std::shared_ptr<Regex> pres_gpt2;
};

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

static std::shared_ptr<Regex> compile(std::string_view pat, std::string* error) {
  int ec; PCRE2_SIZE eo;
  auto r = std::make_shared<Regex>();
  r->code = pcre2_compile((PCRE2_SPTR)pat.data(), pat.size(), PCRE2_UTF | PCRE2_UCP, &ec, &eo, nullptr);
  if (!r->code) { *error = "regex compile failed: " + std::string(pat); return nullptr; }
  pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);
  return r;
}

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& dir_or_file, std::string* error) {
  std::string path = dir_or_file;
  if (std::filesystem::is_directory(path)) path += "/tokenizer.json";
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto e = parser.load(path).get(doc)) { *error = path + ": " + simdjson::error_message(e); return nullptr; }
  auto impl = std::make_unique<Impl>();
  // GPT-2 bytes_to_unicode.
  {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      impl->byte_map[b] = cp_utf8(keep ? b : 256 + n++);
    }
  }
  impl->pres_gpt2 = compile(kGpt2Pattern, error);
  auto model = doc["model"];
  std::string_view mtype;
  if (model["type"].get(mtype) || mtype != "BPE") { *error = "unsupported model type"; return nullptr; }
  for (auto [k, v] : model["vocab"].get_object()) impl->vocab.emplace(std::string(k), uint32_t(int64_t(v)));
  bool b;
  if (model["byte_fallback"].get(b) == simdjson::SUCCESS) impl->byte_fallback = b;
  if (!model["ignore_merges"].get(b)) impl->ignore_merges = b;
  uint32_t rank = 0;
  for (auto m : model["merges"].get_array()) {
    std::string key;
    std::string_view sv;
    if (!m.get(sv)) { size_t sp = sv.find(' '); key = std::string(sv.substr(0, sp)) + '\x01' + std::string(sv.substr(sp + 1)); }
    else { auto a = m.get_array(); key = std::string(std::string_view(a.at(0))) + '\x01' + std::string(std::string_view(a.at(1))); }
    impl->merge_rank.emplace(std::move(key), rank++);
  }
  // Normalizer.
  std::function<bool(simdjson::dom::element)> add_norm = [&](simdjson::dom::element n) -> bool {
    if (n.is_null()) return true;
    std::string_view t = n["type"];
    if (t == "Sequence") { for (auto x : n["normalizers"].get_array()) if (!add_norm(x)) return false; return true; }
    if (t == "Replace") { std::string_view p; if (n["pattern"]["String"].get(p)) { *error = "Replace with regex unsupported"; return false; }
      impl->norms.push_back({NormStep::Replace, std::string(p), std::string(std::string_view(n["content"]))}); return true; }
    if (t == "Prepend") { impl->norms.push_back({NormStep::Prepend, std::string(std::string_view(n["prepend"])), {}}); return true; }
    if (t == "NFC") return true;  // TODO: NFC not implemented (identity on already-NFC text)
    *error = "unsupported normalizer " + std::string(t); return false;
  };
  if (!add_norm(doc["normalizer"])) return nullptr;
  std::function<bool(simdjson::dom::element)> add_pre = [&](simdjson::dom::element n) -> bool {
    if (n.is_null()) return true;
    std::string_view t = n["type"];
    if (t == "Sequence") { for (auto x : n["pretokenizers"].get_array()) if (!add_pre(x)) return false; return true; }
    if (t == "ByteLevel") { impl->byte_level = true; bool ur = true; if (n["use_regex"].get(ur) != simdjson::SUCCESS) ur = true;
      impl->pres.push_back({PreStep::ByteLevel, nullptr, {}, Behavior::Isolated, ur}); return true; }
    if (t == "Split") {
      PreStep st{PreStep::SplitRegex, nullptr, {}, Behavior::Isolated, false};
      std::string_view beh = n["behavior"];
      st.behavior = beh == "Removed" ? Behavior::Removed : beh == "MergedWithPrevious" ? Behavior::MergedWithPrevious
                  : beh == "MergedWithNext" ? Behavior::MergedWithNext : beh == "Contiguous" ? Behavior::Contiguous : Behavior::Isolated;
      bool inv = false;
      if (!n["invert"].get(inv)) st.invert = inv;
      std::string_view p;
      if (!n["pattern"]["Regex"].get(p)) { st.re = compile(p, error); if (!st.re) return false; }
      else { st.kind = PreStep::SplitString; st.literal = std::string(std::string_view(n["pattern"]["String"])); }
      impl->pres.push_back(std::move(st)); return true;
    }
    *error = "unsupported pre_tokenizer " + std::string(t); return false;
  };
  if (!add_pre(doc["pre_tokenizer"])) return nullptr;
  for (auto t : doc["added_tokens"].get_array())
    impl->added.push_back({std::string(std::string_view(t["content"])), uint32_t(int64_t(t["id"]))});
  std::sort(impl->added.begin(), impl->added.end(), [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
  // Post-processor: special tokens before the sequence in TemplateProcessing.single.
  std::function<void(simdjson::dom::element)> add_post = [&](simdjson::dom::element n) {
    if (n.is_null()) return;
    std::string_view t = n["type"];
    if (t == "Sequence") { for (auto x : n["processors"].get_array()) add_post(x); return; }
    if (t != "TemplateProcessing") return;
    for (auto piece : n["single"].get_array()) {
      std::string_view id;
      if (piece["SpecialToken"]["id"].get(id)) break;
      auto st = n["special_tokens"][id]["ids"].get_array();
      for (auto x : st) impl->prefix_special.push_back(uint32_t(int64_t(x)));
    }
  };
  add_post(doc["post_processor"]);
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

std::vector<uint32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<uint32_t> ids;
  if (add_special_tokens) ids = im.prefix_special;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    bool hit = false;
    for (auto& [c, id] : im.added) {  // TODO: Aho-Corasick; lstrip/rstrip/single_word
      if (text.compare(i, c.size(), c) == 0) {
        if (i > start) im.encode_segment(text.substr(start, i - start), ids);
        ids.push_back(id); i += c.size(); start = i; hit = true; break;
      }
    }
    if (!hit) ++i;
  }
  if (start < text.size()) im.encode_segment(text.substr(start), ids);
  return ids;
}

}  // namespace kvroute
