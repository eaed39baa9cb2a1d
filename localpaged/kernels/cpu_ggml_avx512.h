// Part of kernels/cpu_ggml.cpp, which includes it inside its anonymous namespace (after cpu_ggml_x8.h, built with AVX-512 VNNI):
// the 512-bit tiles of the K formats for batches of 5-9 rows.
#pragma once

// ---------------------------------------------------------------------------------------------
// AVX-512 VNNI, K formats with unsigned codes (<= 63), tiles of up to kWideRows rows (batched
// decode below the AMX tiles' kAmxMinRows): the same integers and float order as avx_k_rows,
// so bitwise the same y. 64 codes per zmm: W[j] = the codes of chunks 2j and 2j + 1, so a row's
// 64 bytes of x load as they lie; dpbusd makes the 4-element sums, packs_epi32 joins W[j]'s and
// W[j + 1]'s per 128-bit lane (128-bit lane i of the sums: chunk 2j + i / 2, sub-block half
// i % 2), and dpwssd multiplies by the matching scales. 32 registers hold 8 rows' sums. A 512-bit
// dpbusd does more products per cycle than two 256-bit ones (docs/benchmarks.md has the measured
// ratio).
constexpr int64_t kWideRows = 8;

// Which of the widened int16 scales each int16 lane of pair p's packed sums takes: 128-bit lane i
// holds 4 x scale(chunk 4p + i / 2, half i % 2), then 4 x scale(chunk 4p + 2 + i / 2, half i % 2).
template <class F>
constexpr std::array<int16_t, 64> wide_scale_picks() {
  std::array<int16_t, 64> idx{};
  for (int p = 0; p < 2; ++p)
    for (int i = 0; i < 4; ++i)
      for (int t = 0; t < 8; ++t) {
        const int chunk = 4 * p + i / 2 + (t < 4 ? 0 : 2), half = i % 2;
        idx[32 * p + 8 * i + t] = static_cast<int16_t>(F::kScalePer == 32 ? chunk : 2 * chunk + half);
      }
  return idx;
}

template <class F>
struct WideScales {
  __m512i s[2];   // for the pairs (W0, W1) and (W2, W3)
  explicit WideScales(__m128i sc) {
    alignas(64) static constexpr std::array<int16_t, 64> kPicks = wide_scale_picks<F>();
    const __m512i wide = _mm512_cvtepi8_epi16(_mm256_castsi128_si256(sc));
    for (int p = 0; p < 2; ++p) s[p] = _mm512_permutexvar_epi16(_mm512_load_si512(kPicks.data() + 32 * p), wide);
  }
};

template <class F, int TM>
void wide_k_rows(const uint8_t* row, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  static_assert(!F::kSigned && TM <= kWideRows, "unsigned codes, 8 rows in 8 float lanes");
  const int64_t K = a.K, nb = a.blocks;
  __m256 acc = _mm256_setzero_ps();   // lane m: row m0 + m
  for (int64_t b = 0; b < nb; ++b) {
    const F blk(row + b * F::kBytes);
    __m512i w[4];
    for (int j = 0; j < 4; ++j)
      w[j] = _mm512_inserti64x4(_mm512_castsi256_si512(blk.weights(2 * j)), blk.weights(2 * j + 1), 1);
    const WideScales<F> scales(blk.sc);
    __m256i sums[kWideRows], mins[kWideRows];
    const __m256i off = F::kOffset != 0 ? _mm256_mullo_epi16(_mm256_cvtepi8_epi16(blk.sc), _mm256_set1_epi16(-F::kOffset))
                                        : _mm256_setzero_si256();
    __m256i mn = _mm256_setzero_si256();
    if constexpr (F::kMins != 0) mn = mins16(blk);
    for (int m = 0; m < kWideRows; ++m) {
      sums[m] = mins[m] = _mm256_setzero_si256();
      if (m >= TM) continue;
      const int8_t* x = a.q.data() + (m0 + m) * K + b * kSuper;
      const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sum16.data() + (m0 + m) * K / 16 + 16 * b));
      __m512i sum = _mm512_setzero_si512();
      for (int p = 0; p < 2; ++p) {
        const __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[2 * p], _mm512_loadu_si512(x + 128 * p));
        const __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[2 * p + 1], _mm512_loadu_si512(x + 128 * p + 64));
        sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(d0, d1), scales.s[p]);
      }
      sums[m] = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
      if constexpr (F::kOffset != 0) sums[m] = _mm256_add_epi32(sums[m], _mm256_madd_epi16(off, s16));
      if constexpr (F::kMins != 0) mins[m] = _mm256_madd_epi16(mn, s16);
    }
    alignas(32) float da[kWideRows] = {};
    for (int m = 0; m < TM; ++m) da[m] = a.d[(m0 + m) * nb + b];
    const __m256 s = _mm256_load_ps(da);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(blk.d), s), _mm256_cvtepi32_ps(block_sums(sums)), acc);
    if constexpr (F::kMins != 0)
      acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(-blk.dmin), s), _mm256_cvtepi32_ps(block_sums(mins)), acc);
  }
  alignas(32) float out[kWideRows];
  _mm256_store_ps(out, acc);
  for (int m = 0; m < TM; ++m) y[m * ldy] = out[m];
}

// For batches of 5-9 rows (kernel_for): there these tiles stream the weights faster than the
// 256-bit ones; up to 4 rows the 256-bit tiles are faster, and batch 1 stays on the 256-bit row
// loop, which a 512-bit version does not beat (bench/ggml_kernels.py measures the tiles).
template <class F>
void wide_k_tile(const uint8_t* row, const Acts& a, int64_t m0, int64_t tm, float* y, int64_t ldy) {
  switch (tm) {
    case 8: return wide_k_rows<F, 8>(row, a, m0, y, ldy);
    case 7: return wide_k_rows<F, 7>(row, a, m0, y, ldy);
    case 6: return wide_k_rows<F, 6>(row, a, m0, y, ldy);
    case 5: return wide_k_rows<F, 5>(row, a, m0, y, ldy);
    case 4: return wide_k_rows<F, 4>(row, a, m0, y, ldy);
    case 3: return wide_k_rows<F, 3>(row, a, m0, y, ldy);
    case 2: return wide_k_rows<F, 2>(row, a, m0, y, ldy);
    default: return avx_k_rows<F, 1>(row, a, m0, y, ldy);
  }
}
