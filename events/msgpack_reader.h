// A bounded, allocation-free, non-throwing msgpack pull reader for untrusted
// bytes (the ZMQ KV event decoder, events/vllm_wire.cpp). Every read checks
// the remaining length first; a container's element count is checked against
// the bytes left (each element takes at least one byte) before any caller
// reserves memory for it. skip() is iterative (no recursion, so no depth
// limit is needed). msgpack-c (used by the encoder) builds an object tree per
// value; reading 512 token ids per block through it would allocate per token.
//
// Thread-compatible: one reader per payload, on the decoding thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <span>
#include <string_view>

namespace kvroute::mp {

enum class Type : uint8_t { Nil, Bool, UInt, NegInt, Float, Str, Bin, Array, Map, Ext, Invalid };

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : p_(bytes.data()), end_(bytes.data() + bytes.size()) {}

  bool ok() const { return ok_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  void fail() { ok_ = false; p_ = end_; }

  // Type of the next value without consuming it (Invalid at the end or on a
  // reserved byte).
  Type peek() const {
    if (!ok_ || p_ == end_) return Type::Invalid;
    const uint8_t b = *p_;
    if (b <= 0x7f) return Type::UInt;
    if (b <= 0x8f) return Type::Map;
    if (b <= 0x9f) return Type::Array;
    if (b <= 0xbf) return Type::Str;
    if (b >= 0xe0) return Type::NegInt;
    switch (b) {
      case 0xc0: return Type::Nil;
      case 0xc2: case 0xc3: return Type::Bool;
      case 0xc4: case 0xc5: case 0xc6: return Type::Bin;
      case 0xc7: case 0xc8: case 0xc9: case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: return Type::Ext;
      case 0xca: case 0xcb: return Type::Float;
      case 0xcc: case 0xcd: case 0xce: case 0xcf: return Type::UInt;
      case 0xd0: case 0xd1: case 0xd2: case 0xd3: return Type::NegInt;  // signed ints; value may be >= 0
      case 0xd9: case 0xda: case 0xdb: return Type::Str;
      case 0xdc: case 0xdd: return Type::Array;
      case 0xde: case 0xdf: return Type::Map;
      default: return Type::Invalid;  // 0xc1
    }
  }

  bool nil() {
    if (peek() != Type::Nil) return false;
    ++p_;
    return true;
  }

  // Any integer as its 64-bit two's complement pattern; `negative` says
  // whether the value is below zero.
  bool integer(uint64_t& bits, bool& negative) {
    if (!ok_ || p_ == end_) return false;
    const uint8_t b = *p_;
    negative = false;
    if (b <= 0x7f) { bits = b; ++p_; return true; }
    if (b >= 0xe0) { bits = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(b))); negative = true; ++p_; return true; }
    size_t n;
    bool sign;
    switch (b) {
      case 0xcc: n = 1; sign = false; break;
      case 0xcd: n = 2; sign = false; break;
      case 0xce: n = 4; sign = false; break;
      case 0xcf: n = 8; sign = false; break;
      case 0xd0: n = 1; sign = true; break;
      case 0xd1: n = 2; sign = true; break;
      case 0xd2: n = 4; sign = true; break;
      case 0xd3: n = 8; sign = true; break;
      default: return false;
    }
    if (remaining() < 1 + n) return fail_false();
    uint64_t v = be(p_ + 1, n);
    if (sign && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    bits = v;
    negative = sign && static_cast<int64_t>(v) < 0;
    p_ += 1 + n;
    return true;
  }

  // A non-negative integer that fits 32 bits (token ids, sizes).
  bool u32(uint32_t& out) {
    if (ok_ && p_ != end_ && *p_ <= 0x7f) { out = *p_++; return true; }  // fast path: positive fixint
    uint64_t v;
    bool neg;
    const uint8_t* save = p_;
    if (!integer(v, neg)) return false;
    if (neg || v > 0xffffffffu) { p_ = save; return false; }
    out = static_cast<uint32_t>(v);
    return true;
  }

  // The kernels. Both decode from `p` into `out` at most `max` ids, read only
  // below `end`, and decode exactly what u32() would for the ids they take
  // (tests/events/msgpack_reader_test.cpp checks each against the scalar path).
  // u16: ids while each is 0xcd hi lo, whole steps only; stops before the
  //   first step holding another form, when fewer than one step's ids are
  //   left of `max`, or when fewer than the bytes one step loads remain.
  //   Returns the count (the caller advances 3 bytes per id; `p` is by value
  //   so that the caller's cursor stays in a register).
  // mixed: the same with ids that are each 0xcd hi lo or 0xce b3 b2 b1 b0.
  //   Returns ids and bytes decoded.
  struct Step {
    uint32_t ids, bytes;
  };
  static constexpr uint32_t kScalarStretch = 16;
  using U16Kernel = uint32_t (*)(const uint8_t* p, const uint8_t* end, uint32_t* out, uint32_t max);
  using MixedKernel = Step (*)(const uint8_t* p, const uint8_t* end, uint32_t* out, uint32_t max);
  struct Kernels {
    U16Kernel u16 = nullptr;      // null: the CPU has no suitable SIMD
    MixedKernel mixed = nullptr;  // null: the CPU has no AVX-512 VBMI + BMI2
  };

  // `n` non-negative integers that fit 32 bits (a token id array's body),
  // into out[0..n). Same result and same failure point as n calls of u32().
  // Two SIMD kernels, picked once at run time (kernels()), do the work where
  // the CPU has them; the scalar loop is the fallback and takes what they
  // leave (the rare encodings, the payload's last bytes):
  //   u16:   runs of uint16 (0xcd, every token id of a 32k-64k vocabulary),
  //          16 ids per step with AVX-512 VBMI, 8 with AVX2;
  //   mixed: any mix of uint16 and uint32 (a 152k vocabulary: ids >= 65536
  //          are 0xce), 12 ids per step with AVX-512 VBMI and BMI2.
  bool u32_run(uint32_t n, uint32_t* out) {
    static const Kernels k = kernels();
    return u32_run(n, out, k);
  }
  // The same with the given kernels, any combination the CPU can run (the
  // tests run every one; no kernels = the scalar loop alone).
  bool u32_run(uint32_t n, uint32_t* out, const Kernels& k) {
    const uint8_t* p = p_;
    uint32_t i = 0;
    while (i < n) {
      if (k.u16 && n - i >= 16) {
        const uint32_t ids = k.u16(p, end_, out + i, n - i);
        p += 3 * ids;  // every id the u16 kernel decodes is 3 bytes
        i += ids;
        if (i == n) break;
      }
      if (k.mixed) {
        const Step st = k.mixed(p, end_, out + i, n - i);
        p += st.bytes;
        i += st.ids;
      }
      // The scalar loop: the ids the kernels left (another form within the
      // next kScalarStretch ids, or the last ids), or all of them without
      // kernels. kScalarStretch >= the kernels' step (16, 12) after which the
      // u16 kernel is tried again, so a stream with a rare other form (a 32k
      // vocabulary's fixint ids) goes back to SIMD right after it.
      for (const uint32_t stop = std::min(n, i + kScalarStretch); i < stop; ++i) {
        if (end_ - p >= 5) {  // room for the widest form read here
          const uint8_t b = *p;
          if (b == 0xcd) { out[i] = (uint32_t{p[1]} << 8) | p[2]; p += 3; continue; }
          if (b <= 0x7f) { out[i] = b; p += 1; continue; }
          if (b == 0xce) {
            out[i] = (uint32_t{p[1]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 8) | p[4];
            p += 5;
            continue;
          }
          if (b == 0xcc) { out[i] = p[1]; p += 2; continue; }
        }
        p_ = p;  // the rare encodings and the payload's last bytes: the checked path
        if (!u32(out[i])) return false;
        p = p_;
      }
    }
    p_ = p;
    return true;
  }

#if defined(__x86_64__)
  // The payload is read once, mostly from DRAM (a frame just received, or
  // the bench's 280 MB encoded beforehand): asking for the bytes 2 KiB ahead
  // makes the kernels ~15% faster there than the hardware prefetcher alone
  // (bench/events, decode phase). A prefetch never faults; none is issued
  // past `end`.
  static void prefetch_ahead(const uint8_t* q, const uint8_t* end) {
    constexpr ptrdiff_t kAhead = 2048;
    if (end - q > kAhead) _mm_prefetch(reinterpret_cast<const char*>(q + kAhead), _MM_HINT_T0);
  }

  static Kernels kernels() {
    Kernels k;
    if (__builtin_cpu_supports("avx2")) k.u16 = u16_run_avx2;
    if (__builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw")) {
      k.u16 = u16_run_vbmi;
      if (__builtin_cpu_supports("bmi2")) k.mixed = u16_u32_run_vbmi;  // pext, bzhi
    }
    return k;
  }

  // 8 ids (24 bytes) per step: two 12-byte halves, one per 128-bit lane,
  // each lane shuffled like SSSE3 (tags at 0,3,6,9; values big-endian).
  __attribute__((target("avx2"))) static uint32_t u16_run_avx2(const uint8_t* p, const uint8_t* end, uint32_t* out,
                                                                uint32_t max) {
    const __m256i vals = _mm256_setr_epi8(2, 1, -1, -1, 5, 4, -1, -1, 8, 7, -1, -1, 11, 10, -1, -1,
                                          2, 1, -1, -1, 5, 4, -1, -1, 8, 7, -1, -1, 11, 10, -1, -1);
    const __m256i tag_bytes = _mm256_setr_epi8(-1, 0, 0, -1, 0, 0, -1, 0, 0, -1, 0, 0, 0, 0, 0, 0,
                                               -1, 0, 0, -1, 0, 0, -1, 0, 0, -1, 0, 0, 0, 0, 0, 0);
    const __m256i cd = _mm256_set1_epi8(static_cast<char>(0xcd));
    const uint8_t* q = p;
    uint32_t k = 0;
    while (max - k >= 8 && end - q >= 28) {  // loads q[0..16) and q[12..28)
      prefetch_ahead(q, end);
      const __m256i v = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 12)), 1);
      const __m256i bad = _mm256_and_si256(_mm256_xor_si256(v, cd), tag_bytes);
      if (!_mm256_testz_si256(bad, bad)) break;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm256_shuffle_epi8(v, vals));
      q += 24;
      k += 8;
    }
    return k;
  }

  // 16 ids (48 bytes) per step: one 64-byte load, the tags checked with one
  // compare, all 16 values placed with one cross-lane byte permute (VBMI).
  __attribute__((target("avx512f,avx512bw,avx512vbmi"))) static uint32_t u16_run_vbmi(const uint8_t* p,
                                                                                       const uint8_t* end,
                                                                                       uint32_t* out, uint32_t max) {
    const __m512i idx = _mm512_set_epi8(0, 0, 46, 47, 0, 0, 43, 44, 0, 0, 40, 41, 0, 0, 37, 38,  //
                                        0, 0, 34, 35, 0, 0, 31, 32, 0, 0, 28, 29, 0, 0, 25, 26,  //
                                        0, 0, 22, 23, 0, 0, 19, 20, 0, 0, 16, 17, 0, 0, 13, 14,  //
                                        0, 0, 10, 11, 0, 0, 7, 8, 0, 0, 4, 5, 0, 0, 1, 2);
    const __m512i cd = _mm512_set1_epi8(static_cast<char>(0xcd));
    const __mmask64 tags = 0x249249249249ull;         // bytes 0, 3, ..., 45
    const __mmask64 low_halves = 0x3333333333333333ull;  // bytes 0-1 of each uint32 lane
    const uint8_t* q = p;
    uint32_t k = 0;
    while (max - k >= 16 && end - q >= 64) {
      prefetch_ahead(q, end);
      const __m512i v = _mm512_loadu_si512(q);
      if ((_mm512_cmpeq_epi8_mask(v, cd) & tags) != tags) break;
      _mm512_storeu_si512(out + k, _mm512_maskz_permutexvar_epi8(low_halves, idx, v));
      q += 48;
      k += 16;
    }
    return k;
  }

  // u16_u32_run_vbmi's tables, by step shape: bit j of the index is set when
  // id j of the step is a uint32 (5 bytes), else it is a uint16 (3 bytes).
  // perm: the byte of the step each output byte (8 little-endian uint32s)
  // comes from; keep: the output bytes that are not zero (a uint16's top two).
  struct MixedShapes {
    uint8_t perm[256][32];
    uint32_t keep[256];
  };
  static constexpr MixedShapes mixed_shapes() {
    MixedShapes t{};
    for (uint32_t shape = 0; shape < 256; ++shape) {
      uint32_t at = 0;  // the id's tag byte
      for (uint32_t j = 0; j < 8; ++j) {
        const uint32_t nb = (shape >> j) & 1 ? 4 : 2;  // value bytes, big-endian after the tag
        for (uint32_t b = 0; b < nb; ++b) {
          t.perm[shape][4 * j + b] = static_cast<uint8_t>(at + nb - b);
          t.keep[shape] |= 1u << (4 * j + b);
        }
        at += 1 + nb;
      }
    }
    return t;
  }

  // u16_u32_run_vbmi's position table: 4 ids resolved per lookup. Where the
  // 4 ids of a group start depends only on the `wide` (0xce) bits at the
  // bytes where one of them can start (0; 3,5; 6,8,10; 9,11,13,15 from the
  // group's first byte): kQuadBits, gathered with pext into a 10-bit index.
  // bytes: the bytes the 4 ids take (12-20); info: bits 0-3 the group's shape
  // (bit j set: id j is a uint32), bits 4-19 the bytes where the ids start
  // (each must hold a 0xcd/0xce tag: a value byte may equal 0xcd/0xce, so the
  // tags are checked at the resolved starts only). 5 KiB, stays in L1.
  static constexpr uint64_t kQuadBits = 0xaf69;  // bits 0,3,5,6,8,9,10,11,13,15
  struct MixedQuads {
    uint8_t bytes[1024];
    uint32_t info[1024];
  };
  static constexpr MixedQuads mixed_quads() {
    MixedQuads t{};
    for (uint32_t idx = 0; idx < 1024; ++idx) {
      uint32_t wide = 0;  // pdep(idx, kQuadBits)
      for (uint32_t b = 0, i = 0; b < 16; ++b)
        if ((kQuadBits >> b) & 1) wide |= ((idx >> i++) & 1) << b;
      uint32_t at = 0, shape = 0, starts = 0;
      for (uint32_t j = 0; j < 4; ++j) {
        const uint32_t w = (wide >> at) & 1;
        shape |= w << j;
        starts |= 1u << at;
        at += 3 + 2 * w;
      }
      t.bytes[idx] = static_cast<uint8_t>(at);
      t.info[idx] = shape | starts << 4;
    }
    return t;
  }

  // 12 ids per step (at most 60 bytes, so one 64-byte window holds them).
  // The chain from one step to the next is only the step's length: three
  // table lookups (pext of the window's wide mask, kQuadBits) give the 12
  // ids' shape, starts and length, with no per-id work (the old kernel walked
  // the ids one at a time, ~2 ns per id). The tag masks of the 64-byte
  // window at the cursor are carried from step to step (shifted by the
  // step's length, the next 64 bytes' masks shifted in), so the vector loads
  // and compares are off that chain too. Then the starts are checked against the tag mask and two
  // table-driven byte permutes place the 12 values.
  __attribute__((target("avx512f,avx512bw,avx512vbmi,bmi,bmi2"))) static Step u16_u32_run_vbmi(const uint8_t* p,
                                                                                                  const uint8_t* end,
                                                                                                  uint32_t* out,
                                                                                                  uint32_t max) {
    static constexpr MixedShapes kShapes = mixed_shapes();
    static constexpr MixedQuads kQuads = mixed_quads();
    const __m512i cd = _mm512_set1_epi8(static_cast<char>(0xcd));
    const __m512i ce = _mm512_set1_epi8(static_cast<char>(0xce));
    const uint8_t* q = p;
    uint32_t k = 0;
    if (max < 12 || end - q < 64) return {0, 0};
    __m512i v = _mm512_loadu_si512(q);
    uint64_t wide = _mm512_cmpeq_epi8_mask(v, ce);             // the window q[0..64)
    uint64_t tag = wide | _mm512_cmpeq_epi8_mask(v, cd);
    for (;;) {
      prefetch_ahead(q, end);
      // q[64..128)'s masks, zero past `end` (masked-off bytes are not read)
      const ptrdiff_t left = end - q - 64;  // >= 0
      const __m512i nv = _mm512_maskz_loadu_epi8(_bzhi_u64(~uint64_t{0}, left > 64 ? 64u : static_cast<uint32_t>(left)),
                                                 q + 64);
      const uint64_t nwide = _mm512_cmpeq_epi8_mask(nv, ce);
      const uint64_t ntag = nwide | _mm512_cmpeq_epi8_mask(nv, cd);
      const uint32_t i1 = static_cast<uint32_t>(_pext_u64(wide, kQuadBits));
      const uint32_t c1 = kQuads.bytes[i1];
      const uint32_t i2 = static_cast<uint32_t>(_pext_u64(wide >> c1, kQuadBits));
      const uint32_t c2 = c1 + kQuads.bytes[i2];  // 24..40
      const uint32_t i3 = static_cast<uint32_t>(_pext_u64(wide >> c2, kQuadBits));
      const uint32_t c = c2 + kQuads.bytes[i3];  // 36..60
      const uint32_t f1 = kQuads.info[i1], f2 = kQuads.info[i2], f3 = kQuads.info[i3];
      const uint64_t starts = (f1 >> 4) | uint64_t{f2 >> 4} << c1 | uint64_t{f3 >> 4} << c2;
      if (starts & ~tag) break;  // an id that is not 0xcd/0xce: the scalar path
      const uint32_t shape = (f1 & 15) | (f2 & 15) << 4, shape3 = f3 & 15;
      // ids 0-7: 32-byte table row in, 8 uint32 (32 bytes) out (masked 64-byte
      // load / store); ids 8-11: the first 4 ids' row of their shape, moved
      // by c2 bytes, 16 bytes out
      const __m512i idx = _mm512_maskz_loadu_epi8(0xffffffffu, kShapes.perm[shape]);
      _mm512_mask_storeu_epi8(out + k, 0xffffffffu, _mm512_maskz_permutexvar_epi8(kShapes.keep[shape], idx, v));
      const __m128i idx3 = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kShapes.perm[shape3])),
                                        _mm_set1_epi8(static_cast<char>(c2)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k + 8),
                       _mm512_castsi512_si128(_mm512_maskz_permutexvar_epi8(
                           kShapes.keep[shape3] & 0xffffu, _mm512_castsi128_si512(idx3), v)));
      q += c;
      k += 12;
      if (max - k < 12 || end - q < 64) break;
      // the window moves on by c bytes (0 < c < 64)
      wide = (wide >> c) | (nwide << (64 - c));
      tag = (tag >> c) | (ntag << (64 - c));
      v = _mm512_loadu_si512(q);
    }
    return {k, static_cast<uint32_t>(q - p)};
  }
#else
  static Kernels kernels() { return {}; }
#endif

  // A number (float or integer) as a double.
  bool number(double& out) {
    if (!ok_ || p_ == end_) return false;
    const uint8_t b = *p_;
    if (b == 0xca) {
      if (remaining() < 5) return fail_false();
      uint32_t u = static_cast<uint32_t>(be(p_ + 1, 4));
      float f;
      std::memcpy(&f, &u, 4);
      out = f;
      p_ += 5;
      return true;
    }
    if (b == 0xcb) {
      if (remaining() < 9) return fail_false();
      uint64_t u = be(p_ + 1, 8);
      std::memcpy(&out, &u, 8);
      p_ += 9;
      return true;
    }
    uint64_t v;
    bool neg;
    if (!integer(v, neg)) return false;
    out = neg ? static_cast<double>(static_cast<int64_t>(v)) : static_cast<double>(v);
    return true;
  }

  bool boolean(bool& out) {
    if (peek() != Type::Bool) return false;
    out = *p_++ == 0xc3;
    return true;
  }

  // A str (or, with `allow_bin`, a bin) viewed in place.
  bool str(std::string_view& out, bool allow_bin = false) {
    const Type t = peek();
    if (t != Type::Str && !(allow_bin && t == Type::Bin)) return false;
    const uint8_t b = *p_;
    size_t hdr, len;
    if (b >= 0xa0 && b <= 0xbf) { hdr = 1; len = b & 0x1f; }
    else {
      const size_t n = (b == 0xd9 || b == 0xc4) ? 1 : (b == 0xda || b == 0xc5) ? 2 : 4;
      if (remaining() < 1 + n) return fail_false();
      hdr = 1 + n;
      len = be(p_ + 1, n);
    }
    if (remaining() - hdr < len) return fail_false();
    out = std::string_view(reinterpret_cast<const char*>(p_ + hdr), len);
    p_ += hdr + len;
    return true;
  }
  bool bin(std::span<const uint8_t>& out) {
    std::string_view s;
    if (!str(s, true)) return false;
    out = {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
    return true;
  }

  // Container headers. The count is checked against the bytes left.
  bool array(uint32_t& n) { return container(Type::Array, n); }
  bool map(uint32_t& n) { return container(Type::Map, n); }

  // Skips one complete value of any type (iteratively).
  bool skip() {
    uint64_t pending = 1;
    while (pending > 0) {
      if (!ok_ || p_ == end_) return fail_false();
      --pending;
      const Type t = peek();
      uint32_t n;
      switch (t) {
        case Type::Nil: case Type::Bool: ++p_; break;
        case Type::UInt: case Type::NegInt: { uint64_t v; bool neg; if (!integer(v, neg)) return fail_false(); break; }
        case Type::Float: { double d; if (!number(d)) return fail_false(); break; }
        case Type::Str: case Type::Bin: { std::string_view s; if (!str(s, true)) return fail_false(); break; }
        case Type::Array: if (!array(n)) return fail_false(); pending += n; break;
        case Type::Map: if (!map(n)) return fail_false(); pending += 2ull * n; break;
        case Type::Ext: if (!skip_ext()) return fail_false(); break;
        case Type::Invalid: return fail_false();
      }
      if (pending > remaining()) return fail_false();  // each pending value needs a byte
    }
    return true;
  }

 private:
  static uint64_t be(const uint8_t* q, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v = (v << 8) | q[i];
    return v;
  }
  bool fail_false() { fail(); return false; }

  bool container(Type want, uint32_t& n) {
    if (peek() != want) return false;
    const uint8_t b = *p_;
    size_t hdr;
    uint64_t count;
    if ((b & 0xf0) == (want == Type::Map ? 0x80 : 0x90)) { hdr = 1; count = b & 0x0f; }
    else {
      const size_t w = (b == 0xdc || b == 0xde) ? 2 : 4;
      if (remaining() < 1 + w) return fail_false();
      hdr = 1 + w;
      count = be(p_ + 1, w);
    }
    const uint64_t min_bytes = want == Type::Map ? 2 * count : count;
    if (remaining() - hdr < min_bytes) return fail_false();
    n = static_cast<uint32_t>(count);
    p_ += hdr;
    return true;
  }

  bool skip_ext() {
    const uint8_t b = *p_;
    size_t hdr, len;
    switch (b) {
      case 0xd4: hdr = 2; len = 1; break;
      case 0xd5: hdr = 2; len = 2; break;
      case 0xd6: hdr = 2; len = 4; break;
      case 0xd7: hdr = 2; len = 8; break;
      case 0xd8: hdr = 2; len = 16; break;
      default: {
        const size_t w = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
        if (remaining() < 2 + w) return false;
        hdr = 2 + w;
        len = be(p_ + 1, w);
      }
    }
    if (remaining() < hdr || remaining() - hdr < len) return false;
    p_ += hdr + len;
    return true;
  }

  const uint8_t* p_;
  const uint8_t* end_;
  bool ok_ = true;
};

}  // namespace kvroute::mp
