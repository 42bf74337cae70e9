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
  bool at_end() const { return p_ == end_; }
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

  // `n` non-negative integers that fit 32 bits (a token id array's body).
  // Runs of uint16 (0xcd, the usual token id with a 32k-64k vocabulary) go 4
  // at a time through SSSE3 where the CPU has it; the other common encodings
  // (positive fixint, uint8/32) take a tight scalar loop.
  bool u32_run(uint32_t n, uint32_t* out) {
    const uint8_t* p = p_;
    for (uint32_t i = 0; i < n; ++i) {
#if defined(__x86_64__)
      if (has_ssse3() && n - i >= 4) {
        const uint32_t k = u16_quads_ssse3(p, end_, out + i, n - i);
        i += k;
        if (i == n) break;
      }
#endif
      if (end_ - p >= 5) {
        const uint8_t b = *p;
        if (b <= 0x7f) { out[i] = b; p += 1; continue; }
        if (b == 0xcd) { out[i] = (uint32_t{p[1]} << 8) | p[2]; p += 3; continue; }
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
    p_ = p;
    return true;
  }

#if defined(__x86_64__)
  static bool has_ssse3() {
    static const bool yes = __builtin_cpu_supports("ssse3");
    return yes;
  }
  // Decodes groups of 4 uint16 values (0xcd hi lo, 12 bytes) while at least
  // 16 bytes remain and all 4 tags are 0xcd; returns how many were decoded.
  __attribute__((target("ssse3"))) static uint32_t u16_quads_ssse3(const uint8_t*& p, const uint8_t* end,
                                                                    uint32_t* out, uint32_t max) {
    const __m128i tags = _mm_setr_epi8(0, 3, 6, 9, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i vals = _mm_setr_epi8(2, 1, -1, -1, 5, 4, -1, -1, 8, 7, -1, -1, 11, 10, -1, -1);
    uint32_t k = 0;
    while (max - k >= 4 && end - p >= 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      if (static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_shuffle_epi8(v, tags))) != 0xcdcdcdcdu) break;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm_shuffle_epi8(v, vals));
      p += 12;
      k += 4;
    }
    return k;
  }
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
