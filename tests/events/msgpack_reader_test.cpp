// mp::Reader::u32_run (token id arrays): every SIMD kernel combination the
// CPU can run must give exactly what n calls of u32() give - the same values,
// the same success, the same failure point and the same position - on every
// msgpack integer form, at the value boundaries, with the payload cut at any
// byte (in the middle of a run, of a SIMD step, of an id). Buffers are
// allocated at their exact size, so an ASan build (scripts/fuzz.sh) catches
// any read past the end.
#include "events/msgpack_reader.h"

#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

using kvroute::mp::Reader;

namespace {

// An id in msgpack: its minimal form, or (`loose`) any form that holds it,
// as some encoders write (signed ints for non-negative values, wider ints).
void put(std::vector<uint8_t>& b, uint64_t v, std::mt19937_64& rng, bool loose) {
  auto be = [&](uint8_t tag, int n) {
    b.push_back(tag);
    for (int i = n - 1; i >= 0; --i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  if (loose && rng() % 4 == 0) {
    // a wider form than needed (still a valid u32 when v < 2^32)
    switch (rng() % 5) {
      case 0: if (v <= 0xffff) return be(0xcd, 2); break;
      case 1: if (v <= 0xffffffff) return be(0xce, 4); break;
      case 2: return be(0xcf, 8);
      case 3: if (v <= 0x7fffffff) return be(0xd2, 4); break;
      case 4: if (v <= 0x7fff) return be(0xd1, 2); break;
    }
  }
  if (v <= 0x7f) return b.push_back(static_cast<uint8_t>(v));
  if (v <= 0xff) return be(0xcc, 1);
  if (v <= 0xffff) return be(0xcd, 2);
  if (v <= 0xffffffff) return be(0xce, 4);
  be(0xcf, 8);
}

// Ids drawn like a tokenizer's: uniform in [0, vocab), with some boundary
// values mixed in.
uint64_t draw(std::mt19937_64& rng, uint64_t vocab) {
  static const uint64_t edges[] = {0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff};
  if (rng() % 50 == 0) return edges[rng() % std::size(edges)];
  return rng() % vocab;
}

struct Outcome {
  bool ok = false;
  std::vector<uint32_t> ids;  // all n on success; the ones before the failing id otherwise
  size_t remaining = 0;
  bool reader_ok = false;
};

// The reference: n calls of u32().
Outcome by_u32(const uint8_t* data, size_t len, uint32_t n) {
  Reader r({data, len});
  Outcome o;
  o.ok = true;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t v;
    if (!r.u32(v)) { o.ok = false; break; }
    o.ids.push_back(v);
  }
  o.remaining = r.remaining();
  o.reader_ok = r.ok();
  return o;
}

Outcome by_run(const uint8_t* data, size_t len, uint32_t n, const Reader::Kernels& k) {
  Reader r({data, len});
  std::vector<uint32_t> out(n, 0xdeadbeef);
  Outcome o;
  o.ok = r.u32_run(n, out.data(), k);
  o.ids = out;
  o.remaining = r.remaining();
  o.reader_ok = r.ok();
  return o;
}

// Every kernel combination this CPU can run, named.
std::vector<std::pair<std::string, Reader::Kernels>> combinations() {
  std::vector<std::pair<std::string, Reader::Kernels>> out = {{"scalar", {}}};
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2");
  const bool vbmi = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw");
  const bool bmi2 = __builtin_cpu_supports("bmi2");
  if (avx2) out.push_back({"avx2", {Reader::u16_run_avx2, nullptr}});
  if (vbmi) out.push_back({"vbmi", {Reader::u16_run_vbmi, nullptr}});
  if (vbmi && bmi2) {
    out.push_back({"vbmi+mixed", {Reader::u16_run_vbmi, Reader::u16_u32_run_vbmi}});
    out.push_back({"mixed", {nullptr, Reader::u16_u32_run_vbmi}});
    if (avx2) out.push_back({"avx2+mixed", {Reader::u16_run_avx2, Reader::u16_u32_run_vbmi}});
  }
#endif
  return out;
}

// The same bytes at an allocation of exactly `len` bytes.
std::unique_ptr<uint8_t[]> exact_copy(const std::vector<uint8_t>& b, size_t len) {
  std::unique_ptr<uint8_t[]> p(new uint8_t[len == 0 ? 1 : len]);
  std::copy(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(len), p.get());
  return p;
}

void check_same(const std::vector<uint8_t>& b, size_t len, uint32_t n, const std::string& what) {
  const auto data = exact_copy(b, len);
  const Outcome want = by_u32(data.get(), len, n);
  for (const auto& [name, k] : combinations()) {
    const Outcome got = by_run(data.get(), len, n, k);
    INFO(what << ", kernels " << name << ", " << len << " of " << b.size() << " bytes, n " << n);
    REQUIRE(got.ok == want.ok);
    REQUIRE(got.remaining == want.remaining);
    REQUIRE(got.reader_ok == want.reader_ok);
    for (size_t i = 0; i < want.ids.size(); ++i) REQUIRE(got.ids[i] == want.ids[i]);
  }
}

}  // namespace

TEST_CASE("u32_run equals n calls of u32() with every kernel combination, on every integer form") {
  std::mt19937_64 rng(14);
  struct Mix {
    const char* name;
    uint64_t vocab;
    bool loose;
  };
  const Mix mixes[] = {
      {"32k vocabulary (uint16, a few fixint/uint8)", 32000, false},
      {"uint16 only", 65536, false},
      {"152k vocabulary (uint16 + uint32)", 152000, false},
      {"every form, 2^33 range", uint64_t{1} << 33, false},
      {"non-minimal and signed forms", 200000, true},
      {"small ids (fixint + uint8)", 300, false},
  };
  for (const Mix& m : mixes) {
    for (int round = 0; round < 40; ++round) {
      std::vector<uint8_t> b;
      const uint32_t n = static_cast<uint32_t>(rng() % 300);
      for (uint32_t i = 0; i < n; ++i) put(b, draw(rng, m.vocab), rng, m.loose);
      check_same(b, b.size(), n, m.name);
      // trailing bytes after the array (the rest of the event) change nothing
      std::vector<uint8_t> more = b;
      for (int i = 0; i < 70; ++i) more.push_back(0xcd);
      check_same(more, more.size(), n, std::string(m.name) + " + trailing bytes");
    }
  }
}

TEST_CASE("u32_run: a payload cut at any byte fails where u32() fails, in runs, steps and ids") {
  std::mt19937_64 rng(2);
  for (uint64_t vocab : {uint64_t{32000}, uint64_t{65536}, uint64_t{152000}}) {
    std::vector<uint8_t> b;
    const uint32_t n = 120;  // > several SIMD steps and windows
    for (uint32_t i = 0; i < n; ++i) put(b, draw(rng, vocab), rng, false);
    for (size_t len = 0; len <= b.size(); ++len) check_same(b, len, n, "cut, vocab " + std::to_string(vocab));
  }
}

TEST_CASE("u32_run: an id that is not a u32 stops it at that id, at any position of a run") {
  std::mt19937_64 rng(3);
  // negative fixint, nil, int8 -1, uint64 2^32, float32, str "a", reserved 0xc1
  const std::vector<std::vector<uint8_t>> bad = {
      {0xe0}, {0xc0}, {0xd0, 0xff}, {0xcf, 0, 0, 0, 1, 0, 0, 0, 0}, {0xca, 0, 0, 0, 0}, {0xa1, 'a'}, {0xc1}};
  for (uint64_t vocab : {uint64_t{65536}, uint64_t{152000}}) {
    for (uint32_t at : {0u, 1u, 7u, 8u, 15u, 16u, 17u, 33u, 63u, 64u, 99u}) {
      for (const auto& x : bad) {
        std::vector<uint8_t> b;
        const uint32_t n = 100;
        for (uint32_t i = 0; i < n; ++i) {
          if (i == at) b.insert(b.end(), x.begin(), x.end());
          else put(b, 0x100 + rng() % (vocab - 0x100), rng, false);
        }
        check_same(b, b.size(), n, "bad id at " + std::to_string(at));
      }
    }
  }
}

TEST_CASE("u32_run: value bytes that equal the 0xcd/0xce tags, every shape of a mixed step") {
  // Each id of a step is a uint16 or a uint32; its value bytes are 0xcd, 0xce
  // or other bytes, so the wide/tag masks hold bits at bytes where no id
  // starts. Every 8-id shape, then the next step's shape drawn at random, with
  // an invalid id (uint8 0xcc, nil) at a random position in some of them.
  std::mt19937_64 rng(5);
  const uint8_t lookalike[] = {0xcd, 0xce, 0xcd, 0xce, 0x00, 0x01, 0xff, 0xcc, 0xcf};
  auto value_byte = [&] { return lookalike[rng() % std::size(lookalike)]; };
  for (uint32_t shape = 0; shape < 256; ++shape) {
    for (int round = 0; round < 6; ++round) {
      std::vector<uint8_t> b;
      const uint32_t n = 40;
      const uint32_t bad_at = round >= 4 ? static_cast<uint32_t>(rng() % n) : n;
      for (uint32_t i = 0; i < n; ++i) {
        if (i == bad_at) {
          if (rng() % 2) b.insert(b.end(), {0xcc, value_byte()});
          else b.push_back(0xc0);
          continue;
        }
        const bool wide = i < 8 ? (shape >> i) & 1 : rng() % 2;
        b.push_back(wide ? 0xce : 0xcd);
        for (int j = 0; j < (wide ? 4 : 2); ++j) b.push_back(value_byte());
      }
      check_same(b, b.size(), n, "lookalike value bytes, shape " + std::to_string(shape));
      if (round == 0) {
        for (size_t len = 0; len <= b.size(); len += 7) check_same(b, len, n, "lookalike, cut");
      }
    }
  }
}

#if defined(__x86_64__)
TEST_CASE("the mixed kernel's position table: every index, walked id by id") {
  static constexpr Reader::MixedQuads t = Reader::mixed_quads();
  for (uint32_t window = 0; window < (1u << 16); ++window) {
    uint32_t idx = 0;  // pext(window, kQuadBits)
    for (uint32_t b = 0, i = 0; b < 16; ++b)
      if ((Reader::kQuadBits >> b) & 1) idx |= ((window >> b) & 1) << i++;
    uint32_t at = 0, shape = 0, starts = 0;
    for (uint32_t j = 0; j < 4; ++j) {
      const uint32_t w = (window >> at) & 1;
      shape |= w << j;
      starts |= 1u << at;
      at += w ? 5 : 3;
    }
    INFO("window " << window);
    REQUIRE(t.bytes[idx] == at);
    REQUIRE((t.info[idx] & 15) == shape);
    REQUIRE((t.info[idx] >> 4) == starts);
  }
}
#endif

TEST_CASE("the kernels this CPU has decode whole steps of their forms (the SIMD paths are taken)") {
  std::mt19937_64 rng(4);
  std::vector<uint8_t> u16s, mixed;
  std::vector<uint32_t> want16, wantmix;
  for (int i = 0; i < 64; ++i) {
    const uint32_t a = 0x100 + static_cast<uint32_t>(rng() % 0xff00);
    want16.push_back(a);
    u16s.insert(u16s.end(), {0xcd, static_cast<uint8_t>(a >> 8), static_cast<uint8_t>(a)});
    const uint32_t c = static_cast<uint32_t>(rng() % 152000) | (i % 3 == 0 ? 0x100 : 0);
    put(mixed, c < 0x100 ? c + 0x100 : c, rng, false);
    wantmix.push_back(c < 0x100 ? c + 0x100 : c);
  }
  for (const auto& [name, k] : combinations()) {
    INFO("kernels " << name);
    std::vector<uint32_t> out(64);
    if (k.u16) {
      const uint32_t got = k.u16(u16s.data(), u16s.data() + u16s.size(), out.data(), 64);
      CHECK(got >= 32);  // all but the steps too close to the end
      for (uint32_t i = 0; i < got; ++i) REQUIRE(out[i] == want16[i]);
    }
    if (k.mixed) {
      const Reader::Step got = k.mixed(mixed.data(), mixed.data() + mixed.size(), out.data(), 64);
      CHECK(got.ids >= 32);
      CHECK(got.ids % 12 == 0);
      Reader r({mixed.data(), mixed.size()});
      for (uint32_t i = 0; i < got.ids; ++i) {
        uint32_t v;
        REQUIRE(r.u32(v));
        REQUIRE(out[i] == v);
      }
      CHECK(got.bytes == mixed.size() - r.remaining());
    }
  }
}

TEST_CASE("kernels() picks the widest kernels this CPU runs") {
  const Reader::Kernels k = Reader::kernels();
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw")) {
    CHECK((k.u16 == Reader::u16_run_vbmi));
    if (__builtin_cpu_supports("bmi2")) CHECK((k.mixed == Reader::u16_u32_run_vbmi));
    else CHECK((k.mixed == nullptr));
  } else if (__builtin_cpu_supports("avx2")) {
    CHECK((k.u16 == Reader::u16_run_avx2));
    CHECK((k.mixed == nullptr));
  } else {
    CHECK((k.u16 == nullptr));
    CHECK((k.mixed == nullptr));
  }
#else
  CHECK((k.u16 == nullptr));
  CHECK((k.mixed == nullptr));
#endif
}
