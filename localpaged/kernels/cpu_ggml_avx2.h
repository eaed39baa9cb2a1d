// Part of kernels/cpu_ggml.cpp, which includes it inside its anonymous namespace (after the plain C++ tiles, built with AVX2):
// the AVX2 (and AVX-VNNI) formats and tiles over GGUF's rows.
#pragma once

// ---------------------------------------------------------------------------------------------
// AVX2: a format is a struct that decodes one block (scales, d) on construction and hands out
// its codes 32 at a time as bytes; the tile loops below are shared.

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }

// Shift each 16-bit lane left by s >= 0 or right by -s (s a constant once inlined).
inline __m256i shift16(__m256i v, int s) {
  return s > 0 ? _mm256_slli_epi16(v, s) : s < 0 ? _mm256_srli_epi16(v, -s) : v;
}

// 16 bytes of nibbles -> 32 bytes: the low nibbles, then the high nibbles.
inline __m256i split_nibbles(const uint8_t* p) {
  const __m128i v = load16(p);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), bytes(0x0F));
}

// Bit j of the 32-bit word at p -> 0x10 in byte j (the fifth bit of Q5_0 / Q5_1).
inline __m256i fifth_bits(const uint8_t* p) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(u32(p))),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), bytes(0x10));
}

inline __m256i iq4_lookup(__m256i idx) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values));
  return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), idx);
}

// An empty asm that takes v in a register: the compiler may not move the sums across it. Without
// it GCC re-associates a tile's 8 x TM integer sums into trees and spills the partial products.
inline void keep(__m256i& v) { asm("" : "+x"(v)); }

// The integer products, with or without VNNI (same integers either way; no sum below saturates:
// a 4-element sum of unsigned codes <= 63, or of |code| <= 127 by |a| <= 127, is below 2^15):
// dot4: int32 lane i = sum of u[4i .. 4i + 3] * s[4i .. 4i + 3] (u unsigned, s signed bytes).
// dot4_acc: acc + dot4(u, s), one dpbusd with VNNI.
inline __m256i dot4_acc(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#elif defined(LOCALPAGED_GGML_VNNI)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

inline __m256i dot4(__m256i u, __m256i s) { return dot4_acc(_mm256_setzero_si256(), u, s); }

// dot4 of two chunks as int16, in hadd_epi16's order: per 128-bit half, the 4 sums of chunk 0
// then the 4 of chunk 1. Codes <= 63 only (the 4-element sums must fit int16).
inline __m256i dot4_pair16(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
#ifdef LOCALPAGED_GGML_VNNI
  return _mm256_packs_epi32(dot4(u0, s0), dot4(u1, s1));
#else
  return _mm256_hadd_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1));
#endif
}

// acc + madd_epi16(v, s).
inline __m256i madd_acc(__m256i acc, __m256i v, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, v, s);
#elif defined(LOCALPAGED_GGML_VNNI)
  return _mm256_dpwssd_epi32(acc, v, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(v, s));
#endif
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// The 8 lanes' sum in one fixed order: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// K formats. Members: kBytes; kSigned (codes are signed bytes: the sign trick); kScalePer (the
// sub-block: 32 -> sc holds 8 scales, 16 -> 16); kOffset (codes are q + kOffset, unsigned);
// kMins (0, or the sub-block of the mins: 32 -> mn holds 8 mins, 16 -> 16).
// d, sc (int8 scales), dmin and mn (unsigned byte mins) where kMins; weights(c) = codes of
// elements 32c .. 32c + 31.

struct AvxQ4K {
  static constexpr int64_t kBytes = 144;
  static constexpr bool kSigned = false;
  static constexpr int kScalePer = 32, kOffset = 0, kMins = 32;
  const uint8_t* p;
  float d, dmin;
  __m128i sc, mn;
  explicit AvxQ4K(const uint8_t* p_) : p(p_) {
    d = half(p);
    dmin = half(p + 2);
    // the 12 scale bytes as 3 words: scales 0-3 and mins 0-3 are the low 6 bits of words 0
    // and 1; scales 4-7 (mins 4-7) the low (high) nibbles of word 2 with bits 6-7 of word 0 (1)
    const uint32_t w0 = u32(p + 4), w1 = u32(p + 8), w2 = u32(p + 12);
    const uint64_t s = (w0 & 0x3F3F3F3F) | uint64_t((w2 & 0x0F0F0F0F) | ((w0 >> 2) & 0x30303030)) << 32;
    const uint64_t m = (w1 & 0x3F3F3F3F) | uint64_t(((w2 >> 4) & 0x0F0F0F0F) | ((w1 >> 2) & 0x30303030)) << 32;
    sc = _mm_cvtsi64_si128(static_cast<int64_t>(s));
    mn = _mm_cvtsi64_si128(static_cast<int64_t>(m));
  }
  __m256i weights(int c) const {
    const __m256i q = load32(p + 16 + 32 * (c / 2));
    return _mm256_and_si256(c % 2 ? _mm256_srli_epi16(q, 4) : q, bytes(0x0F));
  }
};

struct AvxQ5K : AvxQ4K {
  static constexpr int64_t kBytes = 176;
  explicit AvxQ5K(const uint8_t* p_) : AvxQ4K(p_) {}
  __m256i weights(int c) const {
    const __m256i q = load32(p + 48 + 32 * (c / 2));
    const __m256i low = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(q, 4) : q, bytes(0x0F));
    // bit c of qh[l] -> bit 4
    return _mm256_or_si256(low, _mm256_and_si256(shift16(load32(p + 16), 4 - c), bytes(0x10)));
  }
};

struct AvxQ6K {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kSigned = false;
  static constexpr int kScalePer = 16, kOffset = 32, kMins = 0;
  const uint8_t* p;
  float d;
  __m128i sc;
  explicit AvxQ6K(const uint8_t* p_) : p(p_), d(half(p_ + 208)), sc(load16(p_ + 192)) {}
  __m256i weights(int c) const {   // c = 4h + t: half h, quarter t
    const int h = c / 4, t = c % 4;
    const __m256i ql = load32(p + 64 * h + 32 * (t % 2));
    const __m256i low = _mm256_and_si256(t < 2 ? ql : _mm256_srli_epi16(ql, 4), bytes(0x0F));
    // bits 2t, 2t + 1 of qh -> bits 4, 5
    return _mm256_or_si256(low, _mm256_and_si256(shift16(load32(p + 128 + 32 * h), 4 - 2 * t), bytes(0x30)));
  }
};

struct AvxQ2K {
  static constexpr int64_t kBytes = 84;
  static constexpr bool kSigned = false;
  static constexpr int kScalePer = 16, kOffset = 0, kMins = 16;
  const uint8_t* p;
  float d, dmin;
  __m128i sc, mn;
  explicit AvxQ2K(const uint8_t* p_) : p(p_), d(half(p_ + 80)), dmin(half(p_ + 82)) {
    const __m128i raw = load16(p), low = _mm_set1_epi8(0x0F);
    sc = _mm_and_si128(raw, low);
    mn = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
  }
  __m256i weights(int c) const {   // c = 4h + s: bits 2s, 2s + 1 of qs[32h + l]
    return _mm256_and_si256(_mm256_srli_epi16(load32(p + 16 + 32 * (c / 4)), 2 * (c % 4)), bytes(0x03));
  }
};

struct AvxQ3K {
  static constexpr int64_t kBytes = 110;
  static constexpr bool kSigned = false;
  static constexpr int kScalePer = 16, kOffset = 4, kMins = 0;
  const uint8_t* p;
  float d;
  __m128i sc;
  explicit AvxQ3K(const uint8_t* p_) : p(p_), d(half(p_ + 108)) {
    // scales i = 0-15: low 4 bits from byte i (i < 8) or the high nibble of byte i - 8, high 2
    // bits from byte 8 + i % 4 at bit 2 (i / 4); minus 32
    const uint32_t w0 = u32(p + 96), w1 = u32(p + 100), w2 = u32(p + 104);
    const uint32_t n = 0x0F0F0F0F, t = 0x03030303;
    const __m128i lo = _mm_setr_epi32(w0 & n, w1 & n, (w0 >> 4) & n, (w1 >> 4) & n);
    const __m128i hi = _mm_setr_epi32(w2 & t, (w2 >> 2) & t, (w2 >> 4) & t, (w2 >> 6) & t);
    sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
  }
  __m256i weights(int c) const {   // c = 4h + s; code = low 2 bits + 4 * (bit c of hmask[l])
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(load32(p + 32 + 32 * (c / 4)), 2 * (c % 4)), bytes(0x03));
    return _mm256_or_si256(low, _mm256_and_si256(shift16(load32(p), 2 - c), bytes(0x04)));
  }
};

struct AvxIQ4XS {
  static constexpr int64_t kBytes = 136;
  static constexpr bool kSigned = true;
  static constexpr int kScalePer = 32, kOffset = 0, kMins = 0;
  const uint8_t* p;
  float d;
  __m128i sc;
  explicit AvxIQ4XS(const uint8_t* p_) : p(p_), d(half(p_)) {
    const uint16_t sh = u16(p + 2);
    uint64_t s = 0;
    for (int j = 0; j < 8; ++j) {
      const int ls = ((p[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
      s |= uint64_t(static_cast<uint8_t>(ls - 32)) << (8 * j);
    }
    sc = _mm_cvtsi64_si128(static_cast<int64_t>(s));
  }
  __m256i weights(int c) const { return iq4_lookup(split_nibbles(p + 8 + 16 * c)); }
};

// The scales of chunk c (elements 32c .. 32c + 31) as 16 int16 lanes, one per pair of elements
// (operator()), or of chunks c, c + 1 for the pairwise sums hadd_epi16(p_c, p_c+1) (pair(c):
// per 128-bit half, 4 lanes of chunk c, then 4 of chunk c + 1). The block's int8 scales are
// widened once to int16 in both 128-bit halves, then one byte shuffle picks them. Where a
// sub-block is 16, the low half of a chunk takes scale 2c and the high half 2c + 1.
template <class F>
struct ChunkScales {
  __m256i lo, hi;   // scales 0-7 and 8-15, each in both halves
  explicit ChunkScales(__m128i sc)
      : lo(_mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc))),
        hi(F::kScalePer == 16 ? _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc, 8))) : lo) {}
  // bytes picking int16 lane i (8 times), or i (4 times) then j (4 times)
  static __m128i pick(int i) { return pick(i, i); }
  static __m128i pick(int i, int j) {
    const uint64_t four = 0x0001000100010001ULL;
    return _mm_set_epi64x(static_cast<int64_t>(four * (0x0202 * j + 0x0100)),
                          static_cast<int64_t>(four * (0x0202 * i + 0x0100)));
  }
  __m256i operator()(int c) const {
    if (F::kScalePer == 32) return _mm256_shuffle_epi8(lo, _mm256_set_m128i(pick(c), pick(c)));
    const int i = 2 * c % 8;
    return _mm256_shuffle_epi8(c < 4 ? lo : hi, _mm256_set_m128i(pick(i + 1), pick(i)));
  }
  __m256i pair(int c) const {   // c even
    if (F::kScalePer == 32) return _mm256_shuffle_epi8(lo, _mm256_set_m128i(pick(c, c + 1), pick(c, c + 1)));
    const int i = 2 * c % 8;
    return _mm256_shuffle_epi8(c < 4 ? lo : hi, _mm256_set_m128i(pick(i + 1, i + 3), pick(i, i + 2)));
  }
};

// The mins of a block as 16 int16 lanes, one per 16 elements (kMins formats).
template <class F>
inline __m256i mins16(const F& blk) {
  return _mm256_cvtepu8_epi16(F::kMins == 32 ? _mm_unpacklo_epi8(blk.mn, blk.mn) : blk.mn);
}

// The totals of two vectors' 8 int32 lanes (exact: int32 sums wrap, and the true totals fit).
inline void totals2(__m256i u, __m256i v, int32_t& tu, int32_t& tv) {
  const __m256i h = _mm256_hadd_epi32(u, v);   // per half: u01, u23, v01, v23
  const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  const __m128i t = _mm_hadd_epi32(q, q);
  tu = _mm_cvtsi128_si32(t);
  tv = _mm_extract_epi32(t, 1);
}

// Lane i: the total of v[i]'s 8 int32 lanes.
inline __m128i totals4(const __m256i* v) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// Per block, the exact integer sums of the plain C++ path (sumi, summ), folded into one float
// per row in the same order: so every path of a K format gives bitwise the same y.
template <class F, int TM>
void avx_k_rows(const uint8_t* row, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  static_assert(TM <= 4, "the rows of a tile are the 4 lanes of the float epilogue");
  const int64_t K = a.K, nb = a.blocks;
  __m128 acc = _mm_setzero_ps();   // lane m: row m0 + m
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (TM == 1)   // batch 1 streams the weights: their lines asked for as it goes
      prefetch_ahead(row + b * F::kBytes, F::kBytes);
    const F blk(row + b * F::kBytes);
    __m256i sum[TM];
    if constexpr (F::kOffset != 0) {   // -kOffset * sum_i sc_i * sum16_i
      const __m256i off = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(blk.sc), _mm256_set1_epi16(-F::kOffset));
      for (int m = 0; m < TM; ++m)
        sum[m] = _mm256_madd_epi16(off, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                            a.sum16.data() + (m0 + m) * K / 16 + 16 * b)));
    } else {
      for (int m = 0; m < TM; ++m) sum[m] = _mm256_setzero_si256();
    }
    const int8_t* x = a.q.data() + m0 * K + b * kSuper;
    const ChunkScales<F> scales(blk.sc);
    if constexpr (!F::kSigned) {
      // unsigned codes (<= 63): the int16 pair sums of two chunks fit one more pairwise add
      // (<= 4 * 63 * 127), so one madd by their scales serves two chunks
#pragma GCC unroll 4
      for (int c = 0; c < 8; c += 2) {
        const __m256i w0 = blk.weights(c), w1 = blk.weights(c + 1), s = scales.pair(c);
        for (int m = 0; m < TM; ++m) {
          sum[m] = madd_acc(sum[m], dot4_pair16(w0, load32(x + m * K + 32 * c), w1, load32(x + m * K + 32 * c + 32)), s);
          keep(sum[m]);
        }
      }
    } else {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m256i w = blk.weights(c), s = scales(c), uw = _mm256_sign_epi8(w, w);
        for (int m = 0; m < TM; ++m) {
          const __m256i v = _mm256_sign_epi8(load32(x + m * K + 32 * c), w);
          sum[m] = _mm256_add_epi32(sum[m], _mm256_madd_epi16(_mm256_maddubs_epi16(uw, v), s));
          keep(sum[m]);
        }
      }
    }
    // per row (lane): acc = fma(d * s, sumi, acc), then fma(-dmin * s, summ, acc), as the
    // plain C++ path does row by row; one row (batch 1) in scalars, the reductions paired
    if constexpr (TM == 1) {
      const float da = a.d[m0 * nb + b];
      __m256i mv = _mm256_setzero_si256();
      if constexpr (F::kMins != 0)
        mv = _mm256_madd_epi16(mins16(blk), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sum16.data() + m0 * K / 16 + 16 * b)));
      int32_t sumi, summ;
      totals2(sum[0], mv, sumi, summ);
      float one = _mm_cvtss_f32(acc);
      one = std::fma(blk.d * da, static_cast<float>(sumi), one);
      if constexpr (F::kMins != 0) one = std::fma(-blk.dmin * da, static_cast<float>(summ), one);
      acc = _mm_set_ss(one);
      continue;
    }
    alignas(16) float da[4] = {};
    __m256i sums[4], mins[4];
    for (int m = 0; m < 4; ++m) {
      sums[m] = m < TM ? sum[m] : _mm256_setzero_si256();
      mins[m] = _mm256_setzero_si256();
      if (m < TM) da[m] = a.d[(m0 + m) * nb + b];
    }
    const __m128 s = _mm_load_ps(da);
    acc = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(blk.d), s), _mm_cvtepi32_ps(totals4(sums)), acc);
    if constexpr (F::kMins != 0) {
      for (int m = 0; m < TM; ++m)
        mins[m] = _mm256_madd_epi16(mins16(blk), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                                     a.sum16.data() + (m0 + m) * K / 16 + 16 * b)));
      acc = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(-blk.dmin), s), _mm_cvtepi32_ps(totals4(mins)), acc);
    }
  }
  alignas(16) float out[4];
  _mm_store_ps(out, acc);
  for (int m = 0; m < TM; ++m) y[m * ldy] = out[m];
}

// 32-element formats. Members: kBytes, kSigned; kOffset: whether a float term coef * s * sum
// is added per block; weights(p) (the 32 codes), coef(p, d), and coef8(p, d8) for the 8 blocks
// from p (d8: their d).

// [lo.low + lo.high, hi.low + hi.high] (128-bit halves: AMD Zen 1 runs a 256-bit cross-lane
// permute as 8 micro-ops).
inline __m256i add_halves(__m256i lo, __m256i hi) {
  const __m128i s0 = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
  const __m128i s1 = _mm_add_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  return _mm256_set_m128i(s1, s0);
}

// Lane sums of 8 int32 vectors: lane j of the result sums the 8 lanes of dots[j].
inline __m256i block_sums(const __m256i* dots) {
  // per 128-bit half: the 4-lane sums of dots 0-3 (lo) and 4-7 (hi)
  const __m256i lo = _mm256_hadd_epi32(_mm256_hadd_epi32(dots[0], dots[1]), _mm256_hadd_epi32(dots[2], dots[3]));
  const __m256i hi = _mm256_hadd_epi32(_mm256_hadd_epi32(dots[4], dots[5]), _mm256_hadd_epi32(dots[6], dots[7]));
  return add_halves(lo, hi);
}

// The same for 4 vectors each holding two blocks, lanes [j, j, j + 1, j + 1] per 128-bit half
// (pairs[j / 2], j even): lane j of the result sums block j's lanes.
inline __m256i pair_block_sums(const __m256i* pairs) {
  return add_halves(_mm256_hadd_epi32(pairs[0], pairs[1]), _mm256_hadd_epi32(pairs[2], pairs[3]));
}

// The float16 at p, p + Bytes, ..., p + 7 Bytes.
template <int64_t Bytes>
inline __m256 halves8(const uint8_t* p) {
  auto h = [p](int j) { return static_cast<short>(u16(p + j * Bytes)); };
  return _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)));
}

struct AvxQ4_0 {
  static constexpr int64_t kBytes = 18;
  static constexpr bool kSigned = false, kOffset = true;
  static __m256i weights(const uint8_t* p) { return split_nibbles(p + 2); }
  static float coef(const uint8_t*, float d) { return -8.0f * d; }
  static __m256 coef8(const uint8_t*, __m256 d8) { return _mm256_mul_ps(_mm256_set1_ps(-8.0f), d8); }
};

struct AvxQ4_1 {
  static constexpr int64_t kBytes = 20;
  static constexpr bool kSigned = false, kOffset = true;
  static __m256i weights(const uint8_t* p) { return split_nibbles(p + 4); }
  static float coef(const uint8_t* p, float) { return half(p + 2); }
  static __m256 coef8(const uint8_t* p, __m256) { return halves8<kBytes>(p + 2); }
};

struct AvxQ5_0 {
  static constexpr int64_t kBytes = 22;
  static constexpr bool kSigned = false, kOffset = true;
  static __m256i weights(const uint8_t* p) { return _mm256_or_si256(split_nibbles(p + 6), fifth_bits(p + 2)); }
  static float coef(const uint8_t*, float d) { return -16.0f * d; }
  static __m256 coef8(const uint8_t*, __m256 d8) { return _mm256_mul_ps(_mm256_set1_ps(-16.0f), d8); }
};

struct AvxQ5_1 {
  static constexpr int64_t kBytes = 24;
  static constexpr bool kSigned = false, kOffset = true;
  static __m256i weights(const uint8_t* p) { return _mm256_or_si256(split_nibbles(p + 8), fifth_bits(p + 4)); }
  static float coef(const uint8_t* p, float) { return half(p + 2); }
  static __m256 coef8(const uint8_t* p, __m256) { return halves8<kBytes>(p + 2); }
};

struct AvxQ8_0 {
  static constexpr int64_t kBytes = 34;
  static constexpr bool kSigned = true, kOffset = false;
  static __m256i weights(const uint8_t* p) { return load32(p + 2); }
  static float coef(const uint8_t*, float) { return 0.0f; }
  static __m256 coef8(const uint8_t*, __m256) { return _mm256_setzero_ps(); }
};

struct AvxIQ4NL {
  static constexpr int64_t kBytes = 18;
  static constexpr bool kSigned = true, kOffset = false;
  static __m256i weights(const uint8_t* p) { return iq4_lookup(split_nibbles(p + 2)); }
  static float coef(const uint8_t*, float) { return 0.0f; }
  static __m256 coef8(const uint8_t*, __m256) { return _mm256_setzero_ps(); }
};

template <class F, int TM>
void avx_b_rows(const uint8_t* row, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  const int64_t K = a.K, nb = a.blocks, groups = nb / 8;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[TM];
  for (int m = 0; m < TM; ++m) acc[m] = _mm256_setzero_ps();
  const int8_t* x = a.q.data() + m0 * K;
  // 8 blocks at a time: their codes unpacked once into L1 for every row; per row, 8 integer dots
  // reduced to one vector of the 8 block sums, then one multiply-add by d * s for all 8
  alignas(32) int8_t codes[8][32], signs[8][32];
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = row + 8 * g * F::kBytes;
    if constexpr (TM == 1)   // batch 1 streams the weights: their lines asked for as it goes
      prefetch_ahead(p, 8 * F::kBytes);
    for (int j = 0; j < 8; ++j) {
      const __m256i w = F::weights(p + j * F::kBytes);
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes[j]), F::kSigned ? _mm256_sign_epi8(w, w) : w);
      if (F::kSigned) _mm256_store_si256(reinterpret_cast<__m256i*>(signs[j]), w);
    }
    const __m256 d8 = halves8<F::kBytes>(p), coef8 = F::coef8(p, d8);
    for (int m = 0; m < TM; ++m) {
      const int64_t r = m0 + m;
      const int8_t* xg = x + m * K + 256 * g;
      auto code = [&](int j) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(codes[j])); };
      __m256i sums;
      if constexpr (!F::kSigned) {
        // unsigned codes (<= 31): two blocks' int16 pair sums fit one more pairwise add
        // (<= 4 * 31 * 127), so one madd by 1 serves two blocks
        __m256i pairs[4];
        for (int j = 0; j < 8; j += 2) {
          pairs[j / 2] = _mm256_madd_epi16(dot4_pair16(code(j), load32(xg + 32 * j), code(j + 1), load32(xg + 32 * j + 32)), ones);
        }
        sums = pair_block_sums(pairs);
      } else {
        __m256i dots[8];
        for (int j = 0; j < 8; ++j) {
          const __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(signs[j]));
          dots[j] = dot4(code(j), _mm256_sign_epi8(load32(xg + 32 * j), s));
        }
        sums = block_sums(dots);
      }
      const __m256 scale = _mm256_mul_ps(d8, _mm256_loadu_ps(a.d.data() + r * nb + 8 * g));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[m]);
      if (F::kOffset)
        acc[m] = _mm256_fmadd_ps(coef8, _mm256_loadu_ps(a.dsum32.data() + r * nb + 8 * g), acc[m]);
    }
  }
  // the last nb % 8 blocks one at a time, each block's exact sum into its lane b % 8, as a group
  // puts it (so a block's contribution is the same whichever path computes it: see b_lanes_sum)
  alignas(32) float lanes[TM][8];
  for (int m = 0; m < TM; ++m) _mm256_store_ps(lanes[m], acc[m]);
  for (int64_t b = 8 * groups; b < nb; ++b) {
    const uint8_t* p = row + b * F::kBytes;
    const __m256i w = F::weights(p);
    const __m256i uw = F::kSigned ? _mm256_sign_epi8(w, w) : w;
    const float d = half(p), coef = F::coef(p, d);
    for (int m = 0; m < TM; ++m) {
      const int64_t r = m0 + m;
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + m * K + 32 * b));
      if (F::kSigned) v = _mm256_sign_epi8(v, w);
      const int32_t sumi = hsum_epi32(dot4(uw, v));
      float& lane = lanes[m][b % 8];
      lane = std::fma(d * a.d[r * nb + b], static_cast<float>(sumi), lane);
      if (F::kOffset) lane = std::fma(coef, a.dsum32[r * nb + b], lane);
    }
  }
  for (int m = 0; m < TM; ++m) y[m * ldy] = hsum(_mm256_load_ps(lanes[m]));
}

template <class F, bool Super, int TM>
inline void avx_rows(const uint8_t* row, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  if constexpr (Super) avx_k_rows<F, TM>(row, a, m0, y, ldy);
  else avx_b_rows<F, TM>(row, a, m0, y, ldy);
}

template <class F, bool Super>
void avx_tile(const uint8_t* row, const Acts& a, int64_t m0, int64_t tm, float* y, int64_t ldy) {
  static_assert(kTileRows == 4, "one case per tile height");
  switch (tm) {
    case 4: return avx_rows<F, Super, 4>(row, a, m0, y, ldy);
    case 3: return avx_rows<F, Super, 3>(row, a, m0, y, ldy);
    case 2: return avx_rows<F, Super, 2>(row, a, m0, y, ldy);
    default: return avx_rows<F, Super, 1>(row, a, m0, y, ldy);
  }
}
