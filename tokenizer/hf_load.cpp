// HfTokenizer::load: tokenizer.json (simdjson) -> an immutable Impl, one
// phase per function (model and merges, symbol tables, normalizers,
// pre-tokenizers, added tokens, SentencePiece word splitting, post-processor).
#include "tokenizer/hf_tokenizer_impl.h"

#include <atomic>
#include <cstdio>
#include <filesystem>

namespace kvroute {

using namespace hf_detail;

namespace {


std::atomic<uint64_t> g_next_generation{1};

const char* kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace

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

}  // namespace kvroute
