// Unit tests of tokenizer/hf_tokenizer.h and tokenizer/unicode_nfc.h:
// NFC against the Unicode NormalizationTest.txt (package unicode-data; skipped
// with a message when absent), and HfTokenizer features on small hand-written
// tokenizer.json files whose expected ids follow the reference's rules
// (added-token lstrip/rstrip/single_word/normalized, Replace with a regex,
// byte fallback, long words, invalid UTF-8). Every expected id list was
// checked against HF `tokenizers` 0.23 on the same tokenizer.json.
#include "tokenizer/hf_tokenizer.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/unicode_nfc.h"

using kvroute::HfTokenizer;
using Ids = std::vector<uint32_t>;

namespace {

std::string utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) s += char(c);
  else if (c < 0x800) { s += char(0xC0 | (c >> 6)); s += char(0x80 | (c & 0x3F)); }
  else if (c < 0x10000) { s += char(0xE0 | (c >> 12)); s += char(0x80 | ((c >> 6) & 0x3F)); s += char(0x80 | (c & 0x3F)); }
  else { s += char(0xF0 | (c >> 18)); s += char(0x80 | ((c >> 12) & 0x3F)); s += char(0x80 | ((c >> 6) & 0x3F)); s += char(0x80 | (c & 0x3F)); }
  return s;
}

std::string nfc(std::string_view s) {
  std::string out;
  kvroute::nfc_normalize(s, out);
  return out;
}

// Writes `json` to a temporary tokenizer.json and loads it.
std::unique_ptr<HfTokenizer> load_json(const std::string& json) {
  static int n = 0;
  auto path = std::filesystem::temp_directory_path() / ("kvroute_hf_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".json");
  std::ofstream(path) << json;
  std::string err;
  auto tok = HfTokenizer::load(path.string(), &err);
  std::filesystem::remove(path);
  INFO(err);
  REQUIRE(tok);
  return tok;
}

// Char-level BPE: a=0 b=1 ' '=2 ab=3 '<'=4 W=5 '>'=6 c=7 abab=8 N=9 q=10
// unk=11, <0xC3>=12 <0xA9>=13; merges a+b, ab+ab.
std::string tokenizer_json(const std::string& added, const std::string& normalizer = "null") {
  return R"({"version":"1.0","added_tokens":[)" + added + R"(],"normalizer":)" + normalizer +
         R"(,"pre_tokenizer":null,"post_processor":null,"decoder":null,
    "model":{"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,
    "fuse_unk":true,"byte_fallback":true,
    "vocab":{"a":0,"b":1," ":2,"ab":3,"<":4,"W":5,">":6,"c":7,"abab":8,"N":9,"q":10,"<unk>":11,"<0xC3>":12,"<0xA9>":13},
    "merges":[["a","b"],["ab","ab"]]}})";
}

std::string added(int id, const char* content, bool special, bool normalized, bool lstrip, bool rstrip, bool single_word) {
  std::ostringstream o;
  o << R"({"id":)" << id << R"(,"content":")" << content << R"(","single_word":)" << (single_word ? "true" : "false")
    << R"(,"lstrip":)" << (lstrip ? "true" : "false") << R"(,"rstrip":)" << (rstrip ? "true" : "false")
    << R"(,"normalized":)" << (normalized ? "true" : "false") << R"(,"special":)" << (special ? "true" : "false") << "}";
  return o.str();
}

}  // namespace

TEST_CASE("NFC: quick check and known compositions") {
  CHECK(kvroute::nfc_quick_check("plain ASCII text"));
  CHECK(kvroute::nfc_quick_check("caf\xC3\xA9 na\xC3\xAFve"));            // precomposed Latin-1: below U+0300
  CHECK_FALSE(kvroute::nfc_quick_check("cafe\xCC\x81"));                  // e + U+0301
  CHECK(nfc("cafe\xCC\x81") == "caf\xC3\xA9");
  CHECK(nfc(utf8(0x1100) + utf8(0x1161) + utf8(0x11A8)) == utf8(0xAC01));  // Hangul L V T -> LVT
  CHECK(nfc(utf8(0x212B)) == utf8(0xC5));                                  // ANGSTROM SIGN (singleton)
  CHECK(nfc("a" + utf8(0x0323) + utf8(0x0307)) == utf8(0x1EA1) + utf8(0x0307));  // a+dot below composes, dot above stays
  CHECK(nfc("q" + utf8(0x0307) + utf8(0x0323)) == "q" + utf8(0x0323) + utf8(0x0307));  // reordered by class
  CHECK(std::string(kvroute::unicode_version()).size() >= 4);
}

TEST_CASE("NFC: Unicode NormalizationTest.txt") {
  const char* path = "/usr/share/unicode/NormalizationTest.txt.bz2";
  if (!std::filesystem::exists(path)) {
    MESSAGE("skipped: " << path << " missing (install unicode-data)");
    return;
  }
  FILE* f = ::popen((std::string("bzcat ") + path).c_str(), "r");
  REQUIRE(f);
  char buf[4096];
  size_t lines = 0, failures = 0;
  while (std::fgets(buf, sizeof buf, f)) {
    std::string line(buf);
    if (line.empty() || line[0] == '#' || line[0] == '@') continue;
    std::vector<std::string> col;
    std::istringstream ls(line);
    std::string field;
    for (int i = 0; i < 5 && std::getline(ls, field, ';'); ++i) {
      std::istringstream cs(field);
      std::string s, hex;
      while (cs >> hex) s += utf8(uint32_t(std::stoul(hex, nullptr, 16)));
      col.push_back(s);
    }
    if (col.size() < 5) continue;
    ++lines;
    // c2 == NFC(c1) == NFC(c2) == NFC(c3); c4 == NFC(c4) == NFC(c5).
    const bool ok = nfc(col[0]) == col[1] && nfc(col[1]) == col[1] && nfc(col[2]) == col[1] &&
                    nfc(col[3]) == col[3] && nfc(col[4]) == col[3];
    // The quick check may say "maybe", never "yes" wrongly.
    const bool qc_ok = (!kvroute::nfc_quick_check(col[0]) || col[0] == col[1]) && (!kvroute::nfc_quick_check(col[2]) || col[2] == col[1]);
    if (!ok || !qc_ok) {
      if (++failures <= 5) MESSAGE("NFC mismatch: " << line);
    }
  }
  ::pclose(f);
  CHECK(lines > 15000);
  CHECK(failures == 0);
}

TEST_CASE("BPE: merges, long words, byte fallback, unknown") {
  auto tok = load_json(tokenizer_json(""));
  CHECK(tok->encode("ab", false) == Ids{3});
  CHECK(tok->encode("abab", false) == Ids{8});
  CHECK(tok->encode("ababa", false) == Ids{8, 0});
  std::string long_word;
  Ids want;
  for (int i = 0; i < 101; ++i) long_word += "ab";  // > 64 symbols: the heap path
  for (int i = 0; i < 50; ++i) want.push_back(8);
  want.push_back(3);
  CHECK(tok->encode(long_word, false) == want);
  CHECK(tok->encode("\xC3\xA9", false) == Ids{12, 13});  // é -> <0xC3><0xA9>
  CHECK(tok->encode("\xE2\x82\xAC\xE2\x82\xAC", false) == Ids{11});  // €€: no byte tokens -> one fused <unk>
  CHECK(tok->token_to_id("abab") == 8u);
  CHECK_FALSE(tok->token_to_id("zzz").has_value());
}

TEST_CASE("added tokens: lstrip, rstrip, single_word") {
  // Ids are assigned as the reference does: the JSON ids 20.. are not in the
  // 14-token vocab, so the tokens get 14, 15, 16, 17 in order.
  auto tok = load_json(tokenizer_json(added(20, "<L>", true, false, true, false, false) + "," +
                                      added(21, "<R>", true, false, false, true, false) + "," +
                                      added(22, "<W>", false, false, false, false, true) + "," +
                                      added(23, "<P>", true, false, false, false, false)));
  CHECK(tok->token_to_id("<L>") == 14u);
  CHECK(tok->token_to_id("<P>") == 17u);
  CHECK(tok->encode("ab  <L>ab", false) == Ids{3, 14, 3});
  CHECK(tok->encode("ab  <P>ab", false) == Ids{3, 2, 2, 17, 3});
  CHECK(tok->encode("ab<R>  ab", false) == Ids{3, 15, 3});
  CHECK(tok->encode("ab<P>  ab", false) == Ids{3, 17, 2, 2, 3});
  CHECK(tok->encode("ab \xE3\x80\x80<L>", false) == Ids{3, 14});  // lstrip takes any White_Space (U+3000)
  CHECK(tok->encode("ab <W> ab", false) == Ids{3, 2, 16, 2, 3});
  CHECK(tok->encode("ab<W>ab", false) == Ids{3, 4, 5, 6, 3});  // inside a word: not the added token
  CHECK(tok->encode("<W>", false) == Ids{16});
  CHECK(tok->encode("<W>\xC3\xA9", false) == Ids{4, 5, 6, 12, 13});  // é is a word character
  CHECK(tok->encode("<W>_", false) == Ids{4, 5, 6, 11});
  CHECK(tok->encode("<W>\xE2\x80\x94", false) == Ids{16, 11});      // em dash is not
  // lstrip never reaches into the previous added token's text.
  CHECK(tok->encode("<R> <L>", false) == Ids{15, 14});
}

TEST_CASE("added tokens: normalized ones match the normalized text") {
  // Normalizer: q -> N. "<N>" normalized matches "<q>" too; the raw one does not.
  const std::string norm = R"({"type":"Replace","pattern":{"String":"q"},"content":"N"})";
  auto normalized = load_json(tokenizer_json(added(30, "<N>", false, true, false, false, false), norm));
  CHECK(normalized->encode("<q>", false) == Ids{14});
  CHECK(normalized->encode("<N>", false) == Ids{14});
  auto raw = load_json(tokenizer_json(added(30, "<N>", false, false, false, false, false), norm));
  CHECK(raw->encode("<q>", false) == Ids{4, 9, 6});
  CHECK(raw->encode("<N>", false) == Ids{14});
  // Content already in the vocab keeps its vocab id.
  auto in_vocab = load_json(tokenizer_json(added(99, "abab", true, false, false, false, false)));
  CHECK(in_vocab->encode("ababab", false) == Ids{8, 3});
}

TEST_CASE("normalizer: Replace with a regex, Sequence, Prepend") {
  auto tok = load_json(tokenizer_json("", R"({"type":"Sequence","normalizers":[
      {"type":"Replace","pattern":{"Regex":"b+"},"content":"b"},{"type":"Prepend","prepend":"c"}]})"));
  CHECK(tok->encode("abbbb", false) == Ids{7, 3});
  CHECK(tok->encode("abab", false) == Ids{7, 8});
  CHECK(tok->encode("", false).empty());  // Prepend leaves empty text empty
}

TEST_CASE("pre-tokenizer: Metaspace prepend_scheme and split") {
  // Vocab of tokenizer_json plus ▁=14 ▁a=15 ▁ab=16 b▁=17; the added token <L> gets 18.
  auto make = [](const char* scheme, bool split) {
    std::string j = tokenizer_json(added(99, "<L>", true, false, false, false, false));
    auto sub = [&](const std::string& from, const std::string& to) { j.replace(j.find(from), from.size(), to); };
    sub(R"("pre_tokenizer":null)", std::string(R"("pre_tokenizer":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":")") +
                                       scheme + R"(","split":)" + (split ? "true" : "false") + "}");
    sub(R"("<0xA9>":13)", R"("<0xA9>":13,"\u2581":14,"\u2581a":15,"\u2581ab":16,"b\u2581":17)");
    sub(R"(["ab","ab"]])", R"(["ab","ab"],["\u2581","a"],["\u2581a","b"]])");
    return load_json(j);
  };
  auto always = make("always", true), first = make("first", true), never = make("never", false);
  CHECK(always->encode("ab ab", false) == Ids{14, 3, 14, 3});
  CHECK(always->encode("ab<L>ab a", false) == Ids{14, 3, 18, 14, 3, 15});
  CHECK(first->encode("ab<L>ab a", false) == Ids{14, 3, 18, 3, 15});  // only the text at offset 0 gets ▁
  CHECK(never->encode("ab<L>ab a", false) == Ids{3, 18, 3, 15});
  CHECK(never->encode("a\xE2\x96\x81\xE2\x96\x81" "b ab", false) == Ids{0, 14, 14, 1, 14, 3});
  CHECK(always->encode("  ab  a b ", false) == Ids{14, 14, 3, 14, 15, 14, 1, 14});
}

TEST_CASE("encode never fails on arbitrary bytes") {
  auto tok = load_json(tokenizer_json(added(20, "<L>", true, false, true, false, false)));
  // Invalid UTF-8 is replaced by U+FFFD (here: bytes EF BF BD -> <unk>).
  CHECK(tok->encode("a\xFF" "b", false) == tok->encode("a\xEF\xBF\xBD" "b", false));
  CHECK(tok->encode("\xC3", false) == Ids{11});
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = char(rng() % 4 == 0 ? "ab <L>"[rng() % 6] : rng() & 0xFF);
    auto ids = tok->encode(s, true);
    for (uint32_t id : ids) CHECK(id <= 14u);
  }
}

TEST_CASE("load errors are reported, not thrown") {
  std::string err;
  CHECK_FALSE(HfTokenizer::load("/nonexistent/tokenizer.json", &err));
  CHECK_FALSE(err.empty());
  auto path = std::filesystem::temp_directory_path() / "kvroute_hf_test_bad.json";
  std::ofstream(path) << R"({"model":{"type":"WordPiece","vocab":{}}})";
  err.clear();
  CHECK_FALSE(HfTokenizer::load(path.string(), &err));
  CHECK(err.find("unsupported") != std::string::npos);
  std::ofstream(path) << R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}})";
  err.clear();
  CHECK_FALSE(HfTokenizer::load(path.string(), &err));  // merge of unknown tokens
  CHECK_FALSE(err.empty());
  std::filesystem::remove(path);
}

// The tests below use the reference tokenizers of tests/tokenizer/setup_reference.sh
// when present (skipped with a message otherwise).
namespace {
std::unique_ptr<HfTokenizer> reference_model(const char* name) {
  const std::string dir = std::string(KVROUTE_SOURCE_DIR) + "/tests/reference/data/models/" + name;
  if (!std::filesystem::exists(dir + "/tokenizer.json")) return nullptr;
  std::string err;
  auto tok = HfTokenizer::load(dir, &err);
  INFO(err);
  REQUIRE(tok);
  return tok;
}
}  // namespace

TEST_CASE("reference tokenizers: arbitrary bytes never crash, results are deterministic") {
  std::mt19937 rng(7);
  int loaded = 0;
  for (const char* name : {"qwen3", "llama3_1", "deepseek_v3", "gemma3", "gpt4o", "gptoss", "llama2"}) {
    auto tok = reference_model(name);
    if (!tok) continue;
    ++loaded;
    const size_t n_ids = tok->vocab_size();
    size_t bad = 0;
    for (int i = 0; i < 300; ++i) {
      std::string s(rng() % 200, '\0');
      for (auto& c : s) c = char(rng() % 3 == 0 ? " \n\t'aA1<|>_\xE2\x96\x81"[rng() % 14] : rng() & 0xFF);
      const auto a = tok->encode(s, true);
      if (a != tok->encode(s, true)) ++bad;  // second time from the word cache
      for (uint32_t id : a) bad += id >= n_ids + 1024;
    }
    CHECK(bad == 0);
    // Pathological runs: long words go through the heap merge and PCRE2's JIT stack.
    CHECK_FALSE(tok->encode(std::string(200000, 'a'), false).empty());
    CHECK_FALSE(tok->encode(std::string(100000, ' ') + "x", false).empty());
  }
  if (!loaded) MESSAGE("skipped: no reference tokenizers (tests/tokenizer/setup_reference.sh)");
}

TEST_CASE("reference tokenizers: concurrent encode equals single-thread encode") {
  auto tok = reference_model("qwen3");
  if (!tok) { MESSAGE("skipped: no reference tokenizers"); return; }
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back("Request " + std::to_string(i) + ": caf\xC3\xA9 na\xC3\xAFve, don't stop \xE4\xB8\xAD\xE6\x96\x87 <|im_start|>user\nword" + std::to_string(i * 7919));
  std::vector<std::vector<uint32_t>> want;
  for (auto& t : texts) want.push_back(tok->encode(t, true));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * (t + 1) + rep) % texts.size();
          if (tok->encode(texts[k], true) != want[k]) ++bad;
        }
    });
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
}
