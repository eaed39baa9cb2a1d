// Part of kernels/cpu_ggml.cpp, which includes it inside its anonymous namespace (after cpu_ggml_avx2.h):
// the kernels of the interleaved layout (x8; the layout itself and its moves are in cpu_ggml.cpp).
#pragma once

// The x8 batch-1 loops' prefetch, as prefetch_ahead with nearer distances: into L1 1 KB ahead,
// into L2 4 KB ahead. The x8 loops stream faster with these than with prefetch_ahead's 2 KB / 8 KB
// or with none (bench/ggml_kernels.py measures it; docs/benchmarks.md has the figures).
inline void x8_prefetch(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) {
    __builtin_prefetch(p + o + 1024, 0, 3);
    __builtin_prefetch(p + o + 4096, 0, 1);
  }
}

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Lane r: sum_i byte_i(dword r of v) * k_i, bytes unsigned or (Signed) signed, k4 the int16
// k_0 .. k_3 in every 64 bits. Exact in int32.
template <bool Signed>
inline __m256i dword_dot(__m256i v, __m256i k4) {
  const __m256i ext = Signed ? _mm256_cmpgt_epi8(_mm256_setzero_si256(), v) : _mm256_setzero_si256();
  const __m256i lo = _mm256_madd_epi16(_mm256_unpacklo_epi8(v, ext), k4);   // rows 0, 1 | 4, 5
  const __m256i hi = _mm256_madd_epi16(_mm256_unpackhi_epi8(v, ext), k4);   // rows 2, 3 | 6, 7
  return _mm256_hadd_epi32(lo, hi);
}

// Byte k of every dword lane, as int32 (unsigned, or Signed: sign-extended).
template <bool Signed>
inline __m256i dword_byte(__m256i v, int k) {
  if constexpr (Signed) return _mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * k), 24);
  return _mm256_and_si256(_mm256_srli_epi32(v, 8 * k), _mm256_set1_epi32(0xFF));
}

// acc (lane r: row r) + d_r * s * sumi_r: the other paths' fold (d: d, or -dmin with summ).
inline __m256 x8_fold(__m256 acc, __m256 d, float s, __m256i sumi) {
  return _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(s)), _mm256_cvtepi32_ps(sumi), acc);
}

// Q4_K group-block: units 0 (d | dmin << 16), 1-3 (the 12 scale bytes), 4 + t (qs bytes 4t ..
// 4t + 3: low nibbles elements 64j + 4(t % 8) + 0..3 of sub-block 2j, j = t / 8; high nibbles
// the same + 32, sub-block 2j + 1). Its scales, mins, d and -dmin, lane r = row r; codes(g, t):
// the codes of qs unit t, low and high nibbles.
struct X8Q4K {
  static constexpr int64_t kBytes = kX8 * 144;
  static constexpr int64_t kQs = 32 * 4;   // the group-block's bytes before its qs units
  static void codes(const uint8_t* g, int t, __m256i& lo, __m256i& hi) {
    const __m256i w = load32(g + kQs + 32 * t);
    lo = _mm256_and_si256(w, bytes(0x0F));
    hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), bytes(0x0F));
  }
  __m256i sc[2], mn[2];   // bytes of each lane: scales 0-3 / 4-7, mins 0-3 / 4-7 (AvxQ4K's picks)
  __m256 d, neg_dmin;
  explicit X8Q4K(const uint8_t* g) {
    const __m256i w0 = load32(g + 32), w1 = load32(g + 64), w2 = load32(g + 96);
    const __m256i six = _mm256_set1_epi32(0x3F3F3F3F), four = _mm256_set1_epi32(0x0F0F0F0F),
                  top = _mm256_set1_epi32(0x30303030);
    sc[0] = _mm256_and_si256(w0, six);
    sc[1] = _mm256_or_si256(_mm256_and_si256(w2, four), _mm256_and_si256(_mm256_srli_epi32(w0, 2), top));
    mn[0] = _mm256_and_si256(w1, six);
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), four),
                            _mm256_and_si256(_mm256_srli_epi32(w1, 2), top));
    // [d0..3 dmin0..3 | d4..7 dmin4..7] -> [d0..7 | dmin0..7]
    const __m256i dd = load32(g);
    const __m256i halves = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(dd, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(dd, 16)), 0xD8);
    d = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
    neg_dmin = _mm256_xor_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)), _mm256_set1_ps(-0.0f));
  }
  __m256i scale(int j) const { return dword_byte<false>(sc[j / 4], j % 4); }
  // sum_j mn_j * (x's sum over sub-block j), from the block's 16 sums of 16 values of x
  __m256i summ(const int16_t* s16) const {
    // per 128-bit half [xs0..3, xs0..3 | xs4..7, xs4..7]
    const __m256i xs = _mm256_hadd_epi16(load32(reinterpret_cast<const uint8_t*>(s16)), _mm256_setzero_si256());
    return _mm256_add_epi32(dword_dot<false>(mn[0], _mm256_permute4x64_epi64(xs, 0x00)),
                            dword_dot<false>(mn[1], _mm256_permute4x64_epi64(xs, 0xAA)));
  }
};

// Q5_K: as Q4_K with the fifth bits between: units 4-11 (qh bytes 4u .. 4u + 3: bit s of qh[l]
// is bit 4 of element 32s + l), then the qs units from 12.
struct X8Q5K : X8Q4K {
  static constexpr int64_t kBytes = kX8 * 176;
  static constexpr int64_t kQs = 32 * 12;
  using X8Q4K::X8Q4K;
  static void codes(const uint8_t* g, int t, __m256i& lo, __m256i& hi) {
    const __m256i w = load32(g + kQs + 32 * t), qh = load32(g + 32 * (4 + t % 8));
    const int j = t / 8;   // sub-blocks 2j (lo) and 2j + 1 (hi): qh bits 2j and 2j + 1 -> bit 4
    lo = _mm256_or_si256(_mm256_and_si256(w, bytes(0x0F)), _mm256_and_si256(shift16(qh, 4 - 2 * j), bytes(0x10)));
    hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), bytes(0x0F)),
                         _mm256_and_si256(shift16(qh, 3 - 2 * j), bytes(0x10)));
  }
};

// Q4_K / Q5_K, one row of x (batch 1): the 32 qs units of a block feed 8 chains of products, one
// per sub-block.
template <class F>
void x8_k4_one(const uint8_t* g, const Acts& a, int64_t m0, float* y) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.blocks; ++b, g += F::kBytes) {
    x8_prefetch(g, F::kBytes);
    const int8_t* x = a.q.data() + m0 * a.K + b * kSuper;
    __m256i s[8];   // lane r: row r's codes . x over sub-block j
    for (int j = 0; j < 8; ++j) s[j] = _mm256_setzero_si256();
#pragma GCC unroll 32
    for (int i = 0; i < 32; ++i) {   // sub-blocks in turn
      const int t = 8 * (i % 4) + i / 4, j = t / 8, e = 64 * j + 4 * (t % 8);
      __m256i lo, hi;
      F::codes(g, t, lo, hi);
      s[2 * j] = dot4_acc(s[2 * j], lo, bcast4(x + e));
      s[2 * j + 1] = dot4_acc(s[2 * j + 1], hi, bcast4(x + e + 32));
    }
    const F blk(g);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(s[j], blk.scale(j)));
    const float da = a.d[m0 * a.blocks + b];
    acc = x8_fold(acc, blk.d, da, sumi);
    acc = x8_fold(acc, blk.neg_dmin, da, blk.summ(a.sum16.data() + m0 * a.K / 16 + 16 * b));
  }
  _mm256_storeu_ps(y, acc);
}

// Q4_K / Q5_K, TM rows of x (2-4): each qs unit feeds the TM rows; sub-block pairs in turn.
template <class F, int TM>
void x8_k4_rows(const uint8_t* g, const Acts& a, int64_t m0, bool prefetch, float* y, int64_t ldy) {
  __m256 acc[TM];
  for (int m = 0; m < TM; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.blocks; ++b, g += F::kBytes) {
    if (prefetch) x8_prefetch(g, F::kBytes);
    const int8_t* x = a.q.data() + m0 * a.K + b * kSuper;
    const F blk(g);
    __m256i sumi[TM];
    for (int m = 0; m < TM; ++m) sumi[m] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      __m256i lo[TM], hi[TM];
      for (int m = 0; m < TM; ++m) lo[m] = hi[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) {
        __m256i wl, wh;
        F::codes(g, 8 * j + q, wl, wh);
        for (int m = 0; m < TM; ++m) {
          lo[m] = dot4_acc(lo[m], wl, bcast4(x + m * a.K + 64 * j + 4 * q));
          hi[m] = dot4_acc(hi[m], wh, bcast4(x + m * a.K + 64 * j + 32 + 4 * q));
        }
      }
      const __m256i sl = blk.scale(2 * j), sh = blk.scale(2 * j + 1);
      for (int m = 0; m < TM; ++m)
        sumi[m] = _mm256_add_epi32(sumi[m], _mm256_add_epi32(_mm256_mullo_epi32(lo[m], sl), _mm256_mullo_epi32(hi[m], sh)));
    }
    for (int m = 0; m < TM; ++m) {
      const float da = a.d[(m0 + m) * a.blocks + b];
      acc[m] = x8_fold(acc[m], blk.d, da, sumi[m]);
      acc[m] = x8_fold(acc[m], blk.neg_dmin, da, blk.summ(a.sum16.data() + (m0 + m) * a.K / 16 + 16 * b));
    }
  }
  for (int m = 0; m < TM; ++m) _mm256_storeu_ps(y + m * ldy, acc[m]);
}

// Q6_K group-block: units 0-31 (ql bytes 4u .. 4u + 3), 32-47 (qh), 48-51 (the 16 int8 scales),
// then the d's (2 bytes each). Half h, l = 4 l4: ql units 16h + l4 (A: elements 128h + l + 0..3
// in the low nibbles, + 64 in the high) and 16h + 8 + l4 (B: + 32, + 96), their two high bits in
// qh unit 8h + l4 (bits 0-1, 2-3, 4-5, 6-7: + 0, + 32, + 64, + 96).
struct X8Q6K {
  static constexpr int64_t kBytes = kX8 * 210;
  __m256i sc[4];   // int8 scales 4v .. 4v + 3 of each lane
  __m256 d;
  explicit X8Q6K(const uint8_t* g)
      : sc{load32(g + 32 * 48), load32(g + 32 * 49), load32(g + 32 * 50), load32(g + 32 * 51)},
        d(_mm256_cvtph_ps(load16(g + 32 * 52))) {}
  __m256i scale(int i) const { return dword_byte<true>(sc[i / 4], i % 4); }
  // the codes are q + 32: -32 * sum_i sc_i * (x's sum over the 16 values of sub-block i)
  __m256i offset(const int16_t* s16) const {
    const __m256i x16 = load32(reinterpret_cast<const uint8_t*>(s16));
    __m256i t = dword_dot<true>(sc[0], _mm256_permute4x64_epi64(x16, 0x00));
    t = _mm256_add_epi32(t, dword_dot<true>(sc[1], _mm256_permute4x64_epi64(x16, 0x55)));
    t = _mm256_add_epi32(t, dword_dot<true>(sc[2], _mm256_permute4x64_epi64(x16, 0xAA)));
    t = _mm256_add_epi32(t, dword_dot<true>(sc[3], _mm256_permute4x64_epi64(x16, 0xFF)));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(t, 5));
  }
  // The codes of elements 128h + 4 l4 + 32c + 0..3 (c < 4) of the 8 rows.
  static void codes(const uint8_t* g, int h, int l4, __m256i* c) {
    const __m256i low = bytes(0x0F), two = bytes(0x30);
    const __m256i A = load32(g + 32 * (16 * h + l4)), B = load32(g + 32 * (16 * h + 8 + l4)),
                  Q = load32(g + 32 * (32 + 8 * h + l4));
    c[0] = _mm256_or_si256(_mm256_and_si256(A, low), _mm256_and_si256(_mm256_slli_epi16(Q, 4), two));
    c[1] = _mm256_or_si256(_mm256_and_si256(B, low), _mm256_and_si256(_mm256_slli_epi16(Q, 2), two));
    c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), low), _mm256_and_si256(Q, two));
    c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), low),
                           _mm256_and_si256(_mm256_srli_epi16(Q, 2), two));
  }
};

// TM rows of x (1-4): per half and part (l4 < 4 or >= 4), 4 x TM chains of products, c's
// elements 128h + 32c + 4 l4 .. in sub-block 8h + 2c + part.
template <int TM>
void x8_q6k_rows(const uint8_t* g, const Acts& a, int64_t m0, bool prefetch, float* y, int64_t ldy) {
  __m256 acc[TM];
  for (int m = 0; m < TM; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.blocks; ++b, g += X8Q6K::kBytes) {
    if (prefetch) x8_prefetch(g, X8Q6K::kBytes);
    const int8_t* x = a.q.data() + m0 * a.K + b * kSuper;
    const X8Q6K blk(g);
    __m256i sumi[TM];
    for (int m = 0; m < TM; ++m) sumi[m] = blk.offset(a.sum16.data() + (m0 + m) * a.K / 16 + 16 * b);
#pragma GCC unroll 4
    for (int hp = 0; hp < 4; ++hp) {
      const int h = hp / 2, part = hp % 2;
      __m256i s[TM][4];
      for (int m = 0; m < TM; ++m)
        for (int c = 0; c < 4; ++c) s[m][c] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int l4 = 4 * part; l4 < 4 * part + 4; ++l4) {
        __m256i c[4];
        X8Q6K::codes(g, h, l4, c);
        for (int m = 0; m < TM; ++m)
          for (int k = 0; k < 4; ++k) s[m][k] = dot4_acc(s[m][k], c[k], bcast4(x + m * a.K + 128 * h + 32 * k + 4 * l4));
      }
      for (int k = 0; k < 4; ++k) {
        const __m256i sc = blk.scale(8 * h + 2 * k + part);
        for (int m = 0; m < TM; ++m) sumi[m] = _mm256_add_epi32(sumi[m], _mm256_mullo_epi32(s[m][k], sc));
      }
    }
    for (int m = 0; m < TM; ++m) acc[m] = x8_fold(acc[m], blk.d, a.d[(m0 + m) * a.blocks + b], sumi[m]);
  }
  for (int m = 0; m < TM; ++m) _mm256_storeu_ps(y + m * ldy, acc[m]);
}

// TM rows of x against one group: the format's loop (Q4_K / Q5_K at batch 1: their own).
template <class F, int TM>
void x8_rows_of(const uint8_t* g, const Acts& a, int64_t m0, bool prefetch, float* y, int64_t ldy) {
  if constexpr (std::is_same_v<F, X8Q6K>) x8_q6k_rows<TM>(g, a, m0, prefetch, y, ldy);
  else if constexpr (TM == 1) x8_k4_one<F>(g, a, m0, y);
  else x8_k4_rows<F, TM>(g, a, m0, prefetch, y, ldy);
}

// Rows [m0, m0 + tm) of x against one group, y[m * ldy + r]; `prefetch`: the first pass over
// the group (its weights come from DRAM).
template <class F>
void x8_tile(const uint8_t* g, const Acts& a, int64_t m0, int64_t tm, bool prefetch, float* y, int64_t ldy) {
  static_assert(kX8Rows == 4, "one case per tile height");
  switch (tm) {
    case 1: return x8_rows_of<F, 1>(g, a, m0, prefetch, y, ldy);
    case 2: return x8_rows_of<F, 2>(g, a, m0, prefetch, y, ldy);
    case 3: return x8_rows_of<F, 3>(g, a, m0, prefetch, y, ldy);
    default: return x8_rows_of<F, 4>(g, a, m0, prefetch, y, ldy);
  }
}
