// Part of kernels/cpu_ggml.cpp, which includes it inside its anonymous namespace (after cpu_ggml_avx512.h, built with AMX):
// the AMX int8 tiles for batches of 10 rows and more.
#pragma once

// ---------------------------------------------------------------------------------------------
// AMX (Intel since Sapphire Rapids), K formats, batches of kAmxMinRows rows and more: the same
// integers as every other path, so bitwise the same y (see avx_k_rows).
//
// Per weight block, sumi is a plain K-dimension dot product once the sub-block scales are folded
// into the weights: sumi = sum_k w'_k x_k with w'_k = sc_j(k) * (q_k - kOffset) (|w'| <= 4096),
// split as w' = 128 * hi + lo (lo in 0..127, hi in -32..32: both int8), so sumi = 128 * (hi . x)
// + (lo . x): two signed int8 tile products (TDPBSSD) over the block's 256 elements, exact in
// int32 (|sumi| <= 256 * 127 * 4096 < 2^31). summ = sum_j m_j * xs_j (xs_j: the sum of x's
// codes over sub-block j) in float32 fused multiply-adds, exact: every product and partial sum
// is an integer below 2^24. The weights are the tiles' A operand (16 weight rows x 64 bytes,
// row-major: a panel of 16 rows is unpacked once into the two int8 planes), x the B operand (its
// rows interleaved 4 bytes at a time, once per call), so a tile of sums is [16 weight rows][16
// rows of x]. Two tiles of x share each load of the weight planes (8 tile registers: 4 sums, 2
// x, 2 w), since moving tiles from the caches, not the multiplies, bounds this loop.

constexpr int64_t kAmxRows = 16;       // rows of x and of w per tile
// Batches from kAmxMinRows rows on (below: the AVX2 tiles). A K format's panels are unpacked once
// per call, a fixed cost that few rows of x do not pay back; a 32-element format's matmul alone
// gains on the tiles from fewer rows, but the engine's steps do not: steps that use the tiles run
// the element-wise ops around them (silu, mul) slower. bench/ggml_kernels.py times the tiles.
constexpr int64_t kAmxMinRows = 10;
// Weights in the x8 layout: each panel is moved back to GGUF's rows first, and the x8 tiles are
// faster than the AVX2 tiles, so the AMX tiles pay from more rows: Q4_K from 32, the others from
// 20, where the two cross (docs/benchmarks.md has the figures).
inline int64_t amx_min_rows(int id, bool x8) { return !x8 ? kAmxMinRows : id == kQ4_K ? 32 : 20; }
constexpr int64_t kPlane = 16 * kSuper;   // bytes of one int8 plane of one block of a panel

// Linux hands a process the AMX tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM).
bool amx_ready() {
  static const bool ok = [] {
    if (const char* off = std::getenv("LOCALPAGED_GGML_AMX"); off && std::string(off) == "0") return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) {   // 0-3: int32 sums (hi, lo of two x tiles); 4-5: x; 6-7: w
      colsb[t] = 64;
      rows[t] = 16;
    }
  }
};

// x for the B operand: per tile of 16 rows, [K / 4][16 rows][4 bytes] (row r of x's k = 4i .. 4i
// + 3 at dword 16i + r); its block scales as [blocks][16 rows]; with mins, the sums of its codes
// over each sub-block of J as float [blocks][J][16 rows].
struct AmxActs {
  int64_t J = 0;             // sub-blocks of a block that carry a min (0: none)
  std::vector<int8_t> q;     // [rows / 16][K / 4][64]
  std::vector<float> d;      // [rows / 16][blocks][16]
  std::vector<float> xs;     // [rows / 16][blocks][J][16]
};

AmxActs amx_acts(const Acts& a, int64_t rows, int64_t J) {
  AmxActs v;
  const int64_t K = a.K, nb = a.blocks, tiles = rows / kAmxRows, per = kSuper / 16 / std::max<int64_t>(J, 1);
  v.J = J;
  v.q.resize(rows * K);
  v.d.resize(rows * nb);
  v.xs.resize(rows * nb * J);
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    const __m512i row_starts = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                  _mm512_set1_epi32(static_cast<int>(K / 4)));
    for (int64_t t = begin; t < end; ++t) {
      const int8_t* src = a.q.data() + t * kAmxRows * K;
      int8_t* dst = v.q.data() + t * kAmxRows * K;
      for (int64_t i = 0; i < K / 4; ++i)
        _mm512_storeu_si512(dst + 64 * i, _mm512_i32gather_epi32(row_starts, src + 4 * i, 4));
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t r = 0; r < kAmxRows; ++r) {
          const int64_t m = t * kAmxRows + r;
          v.d[(t * nb + b) * kAmxRows + r] = a.d[m * nb + b];
          for (int64_t j = 0; j < J; ++j) {
            int32_t sum = 0;
            for (int64_t i = 0; i < per; ++i) sum += a.sum16[m * K / 16 + b * 16 + j * per + i];
            v.xs[((t * nb + b) * J + j) * kAmxRows + r] = static_cast<float>(sum);
          }
        }
    }
  });
  return v;
}

// 16 weight rows of one K format unpacked: per block b, planes hi and lo (kPlane bytes each, row
// n = the block's 256 values of weight row n), d and -dmin per weight row, the mins as float
// [blocks][16 rows][J].
struct AmxPanel {
  int64_t J;
  std::vector<int8_t> planes;           // [blocks][2][16][256]
  std::vector<float> d, neg_dmin, mn;   // [blocks][16], [blocks][16], [blocks][16][J]
  std::vector<uint8_t> rows;            // x8 weights: the panel's rows back in GGUF's layout
  AmxPanel(int64_t blocks, int64_t J_)
      : J(J_), planes(2 * blocks * kPlane), d(blocks * kAmxRows), neg_dmin(blocks * kAmxRows),
        mn(blocks * kAmxRows * J_) {}
  int8_t* plane(int64_t b, int which) { return planes.data() + (2 * b + which) * kPlane; }
  const int8_t* plane(int64_t b, int which) const { return planes.data() + (2 * b + which) * kPlane; }
};

// int16 [16] x2 -> 32 bytes in element order (packs works per 128-bit half).
inline __m256i pack_bytes(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_packs_epi16(a, b), 0xD8);
}

inline void store32(int8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

template <class F>
void amx_unpack(const uint8_t* w, int64_t stride, int64_t n_rows, int64_t nb, AmxPanel& panel) {
  if (n_rows < kAmxRows) {   // the last panel: rows past N stay zeros
    std::fill(panel.planes.begin(), panel.planes.end(), 0);
    std::fill(panel.d.begin(), panel.d.end(), 0.0f);
    std::fill(panel.neg_dmin.begin(), panel.neg_dmin.end(), 0.0f);
    std::fill(panel.mn.begin(), panel.mn.end(), 0.0f);
  }
  const __m256i low7 = _mm256_set1_epi16(127);
  for (int64_t n = 0; n < n_rows; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      const F blk(w + n * stride + b * F::kBytes);
      alignas(16) int8_t sc[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(sc), blk.sc);
      int8_t *hi = panel.plane(b, 0) + n * kSuper, *lo = panel.plane(b, 1) + n * kSuper;
      for (int c = 0; c < 8; ++c) {
        // scales of elements 0-15 and 16-31 of the chunk
        const int j0 = F::kScalePer == 32 ? c : 2 * c, j1 = F::kScalePer == 32 ? c : 2 * c + 1;
        const __m256i v = _mm256_sub_epi8(blk.weights(c), bytes(F::kOffset));
        const __m256i w0 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)), _mm256_set1_epi16(sc[j0]));
        const __m256i w1 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)), _mm256_set1_epi16(sc[j1]));
        store32(hi + 32 * c, pack_bytes(_mm256_srai_epi16(w0, 7), _mm256_srai_epi16(w1, 7)));
        store32(lo + 32 * c, pack_bytes(_mm256_and_si256(w0, low7), _mm256_and_si256(w1, low7)));
      }
      panel.d[b * kAmxRows + n] = blk.d;
      if constexpr (F::kMins != 0) {
        alignas(16) uint8_t mn[16];
        _mm_store_si128(reinterpret_cast<__m128i*>(mn), blk.mn);
        panel.neg_dmin[b * kAmxRows + n] = -blk.dmin;
        for (int64_t j = 0; j < panel.J; ++j) panel.mn[(b * kAmxRows + n) * panel.J + j] = mn[j];
      }
    }
}

// The float part of one block for one tile of x (sums [weight row][row of x]): acc[n] holds the
// 16 rows of x of weight row n.
template <bool Mins>
inline void amx_fold(const AmxPanel& panel, const AmxActs& x, int64_t t, int64_t nb, int64_t b,
                     const int32_t (*hi)[kAmxRows], const int32_t (*lo)[kAmxRows], __m512* acc) {
  const __m512 da = _mm512_loadu_ps(x.d.data() + (t * nb + b) * kAmxRows);
  const float* xs = x.xs.data() + (t * nb + b) * x.J * kAmxRows;
  for (int n = 0; n < kAmxRows; ++n) {
    const __m512i sumi = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi[n]), 7), _mm512_load_si512(lo[n]));
    const __m512 dw = _mm512_set1_ps(panel.d[b * kAmxRows + n]);
    acc[n] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(sumi), acc[n]);
    if (Mins) {
      const float* mn = panel.mn.data() + (b * kAmxRows + n) * panel.J;
      __m512 summ = _mm512_setzero_ps();
      for (int64_t j = 0; j < panel.J; ++j)
        summ = _mm512_fmadd_ps(_mm512_set1_ps(mn[j]), _mm512_loadu_ps(xs + j * kAmxRows), summ);
      acc[n] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(panel.neg_dmin[b * kAmxRows + n]), da), summ, acc[n]);
    }
  }
}

// acc [weight row][row of x] -> y[row of x][weight row], the rows and columns that exist.
inline void amx_store(const __m512* acc, int64_t tm, int64_t n_rows, float* y, int64_t ldy) {
  alignas(64) float out[kAmxRows][kAmxRows];
  for (int n = 0; n < kAmxRows; ++n) _mm512_store_ps(out[n], acc[n]);
  for (int64_t m = 0; m < tm; ++m)
    for (int64_t n = 0; n < n_rows; ++n) y[m * ldy + n] = out[n][m];
}

// y for x's tiles t and, when Two, t + 1 (rows 16t .. 16t + 31), from one panel.
template <bool Mins, bool Two>
void amx_tiles(const AmxPanel& panel, const AmxActs& x, int64_t t, int64_t K, int64_t nb,
               int64_t M, int64_t n_rows, float* y, int64_t ldy) {
  alignas(64) int32_t sums[4][kAmxRows][kAmxRows];   // [hi, lo of tile t, of t + 1][w row][x row]
  __m512 acc[2][kAmxRows];
  for (auto& tile : acc)
    for (auto& v : tile) v = _mm512_setzero_ps();
  const int8_t* xq = x.q.data() + t * kAmxRows * K;
  for (int64_t b = 0; b < nb; ++b) {
    _tile_zero(0);
    _tile_zero(1);
    if (Two) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int kc = 0; kc < 4; ++kc) {
      const int64_t at = (b * kSuper + 64 * kc) * kAmxRows;
      _tile_loadd(6, panel.plane(b, 0) + 64 * kc, kSuper);
      _tile_loadd(7, panel.plane(b, 1) + 64 * kc, kSuper);
      _tile_loadd(4, xq + at, 64);
      _tile_dpbssd(0, 6, 4);
      _tile_dpbssd(1, 7, 4);
      if (Two) {
        _tile_loadd(5, xq + kAmxRows * K + at, 64);
        _tile_dpbssd(2, 6, 5);
        _tile_dpbssd(3, 7, 5);
      }
    }
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    amx_fold<Mins>(panel, x, t, nb, b, sums[0], sums[1], acc[0]);
    if (Two) {
      _tile_stored(2, sums[2], 64);
      _tile_stored(3, sums[3], 64);
      amx_fold<Mins>(panel, x, t + 1, nb, b, sums[2], sums[3], acc[1]);
    }
  }
  for (int i = 0; i < (Two ? 2 : 1); ++i) {
    const int64_t m0 = (t + i) * kAmxRows;
    amx_store(acc[i], std::min(kAmxRows, M - m0), n_rows, y + m0 * ldy, ldy);
  }
}

// The work over panels of 16 weight rows, taken in order from a shared counter by each thread
// of one parallel region (its tiles configured as Config, its own copy of `panel`):
// fn(panel, n0, n_rows) per panel.
template <class Config, class Panel, class Fn>
void amx_panels(int64_t N, const Panel& prototype, Fn fn) {
  const int64_t items = (N + kAmxRows - 1) / kAmxRows;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    const Config config;
    _tile_loadconfig(&config);
    Panel panel = prototype;
    for (int64_t item; (item = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const int64_t n0 = item * kAmxRows;
      fn(panel, n0, std::min(kAmxRows, N - n0));
    }
    _tile_release();
  });
}

// y = x @ w.T for a K format F, the work split over panels of 16 weight rows.
template <class F>
void amx_matmul(const Acts& a, int64_t M, const uint8_t* w, int64_t stride, bool x8, int64_t N, float* y) {
  constexpr bool kMins = F::kMins != 0;
  const int64_t K = a.K, nb = a.blocks, tiles = (M + kAmxRows - 1) / kAmxRows;
  const int64_t J = kMins ? kSuper / F::kMins : 0;
  const AmxActs x = amx_acts(a, tiles * kAmxRows, J);
  amx_panels<TileConfig>(N, AmxPanel(nb, J), [&](AmxPanel& panel, int64_t n0, int64_t n_rows) {
    const uint8_t* rows = x8_rows(w, stride, x8, n0, n_rows, nb, F::kBytes, panel.rows);
    amx_unpack<F>(rows, x8 ? nb * F::kBytes : stride, n_rows, nb, panel);
    int64_t t = 0;   // x's tiles in pairs that share each load of the weights, then one alone
    for (; t + 1 < tiles; t += 2) amx_tiles<kMins, true>(panel, x, t, K, nb, M, n_rows, y + n0, N);
    if (t < tiles) amx_tiles<kMins, false>(panel, x, t, K, nb, M, n_rows, y + n0, N);
  });
}

// ---- 32-element formats ----------------------------------------------------------------------
// A block's sums are one tile product with a K extent of 32 bytes: A = 16 rows of x over the
// block (straight from Acts, row stride K), B = the block's codes of 16 weight rows in the
// tiles' dword-interleaved layout ([8][16 weight rows][4 bytes], unpacked once per panel),
// C = [row of x][weight row] (unsigned codes: TDPBSUD; signed: TDPBSSD). Each block's float part
// goes into lane b % 8 of 8 accumulators per (row of x, weight row), only for the rows of x that
// exist, and the lanes are summed in hsum's order: the fold of avx_b_rows, so y is bitwise the
// AVX2 tiles' (tests/kernels/test_cpu_ggml.py: a row alone and in a batch, the builds side by side).

// per block parity: tiles 0 / 1 int32 sums, 2 / 3 the x tile (16 rows x 32 bytes), 4 / 5 weights
struct alignas(64) TileConfigB {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 32, 32, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 8, 8};
};

// 16 weight rows: per block, their codes as the tiles' B operand, d and coef (F::coef) per row.
struct AmxBPanel {
  std::vector<int8_t> codes;      // [blocks][8][16][4]
  std::vector<float> d, coef;     // [blocks][16]
  std::vector<uint8_t> rows;      // x8 weights: the panel's rows back in GGUF's layout
  explicit AmxBPanel(int64_t blocks) : codes(blocks * 512), d(blocks * kAmxRows), coef(blocks * kAmxRows) {}
};

// 16 rows of 8 dwords (r[n]) -> 8 rows of 16 dwords at out (row i: dword i of every r[n]).
inline void transpose_16x8(const __m256i* r, int8_t* out) {
  __m512i z[8], t[8], u[8];
  for (int k = 0; k < 8; ++k) z[k] = _mm512_inserti64x4(_mm512_castsi256_si512(r[k]), r[k + 8], 1);
  for (int k = 0; k < 8; k += 2) {   // per 128-bit lane: [a0 b0 a1 b1], [a2 b2 a3 b3]
    t[k] = _mm512_unpacklo_epi32(z[k], z[k + 1]);
    t[k + 1] = _mm512_unpackhi_epi32(z[k], z[k + 1]);
  }
  for (int h = 0; h < 8; h += 4) {   // per 128-bit lane: dword j of 4 rows
    u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
    u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
    u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
    u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
  }
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int j = 0; j < 4; ++j) {      // u[j]: dwords j and j + 4 of rows 0-3 and 8-11; u[j + 4] of 4-7, 12-15
    _mm512_storeu_si512(out + 64 * j, _mm512_permutex2var_epi64(u[j], first, u[j + 4]));
    _mm512_storeu_si512(out + 64 * (j + 4), _mm512_permutex2var_epi64(u[j], second, u[j + 4]));
  }
}

template <class F>
void amx_b_unpack(const uint8_t* w, int64_t stride, int64_t n_rows, int64_t nb, AmxBPanel& panel) {
  __m256i r[kAmxRows];
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t n = 0; n < kAmxRows; ++n) {   // rows past N (the last panel): zeros
      const uint8_t* p = w + n * stride + b * F::kBytes;
      const bool real = n < n_rows;
      r[n] = real ? F::weights(p) : _mm256_setzero_si256();
      const float d = real ? half(p) : 0.0f;
      panel.d[b * kAmxRows + n] = d;
      panel.coef[b * kAmxRows + n] = real ? F::coef(p, d) : 0.0f;
    }
    transpose_16x8(r, panel.codes.data() + 512 * b);
  }
}

// Block b's sums of one x tile (rows m0 .. m0 + tm - 1) into their lanes b % 8.
template <class F>
inline void amx_b_fold(const AmxBPanel& panel, const Acts& a, int64_t m0, int64_t tm, int64_t b,
                       const int32_t (*sums)[kAmxRows], float (*lane)[kAmxRows]) {
  const int64_t nb = a.blocks;
  const __m512 dw = _mm512_loadu_ps(panel.d.data() + b * kAmxRows);
  const __m512 coef = _mm512_loadu_ps(panel.coef.data() + b * kAmxRows);
  for (int64_t m = 0; m < tm; ++m) {
    const int64_t i = (m0 + m) * nb + b;
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[i]));
    __m512 acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[m])), scale, _mm512_load_ps(lane[m]));
    if (F::kOffset) acc = _mm512_fmadd_ps(coef, _mm512_set1_ps(a.dsum32[i]), acc);
    _mm512_store_ps(lane[m], acc);
  }
}

// Block b's tile product for the x tile at xq (amx_b_tiles' locals): C tile C, through A tile A
// and B tile Bt (tile numbers are part of the instructions, hence a macro).
#define LOCALPAGED_AMX_B_PRODUCT(C, A, Bt, b)                    \
  do {                                                          \
    _tile_zero(C);                                              \
    _tile_loadd(Bt, panel.codes.data() + 512 * (b), 64);         \
    _tile_loadd(A, xq + 32 * (b), K);                           \
    if constexpr (F::kSigned) _tile_dpbssd(C, A, Bt);           \
    else _tile_dpbsud(C, A, Bt);                                \
  } while (0)

// One x tile (rows m0 .. m0 + tm - 1) against a panel: block b + 1's tile product is issued
// before block b's sums are folded (two sets of tiles, by the block's parity), so the tile unit
// and the vector units work side by side.
template <class F>
void amx_b_tiles(const AmxBPanel& panel, const Acts& a, int64_t t, int64_t M, int64_t n_rows,
                 float* y, int64_t ldy) {
  const int64_t K = a.K, nb = a.blocks, m0 = t * kAmxRows, tm = std::min(kAmxRows, M - m0);
  alignas(64) int32_t sums[kAmxRows][kAmxRows];
  alignas(64) float lanes[8][kAmxRows][kAmxRows];   // [lane][row of x][weight row]
  for (auto& lane : lanes) std::memset(lane, 0, tm * sizeof(lane[0]));
  const int8_t* xq = a.q.data() + m0 * K;
  LOCALPAGED_AMX_B_PRODUCT(0, 2, 4, 0);
  for (int64_t b = 0; b < nb; ++b) {
    if (b % 2 == 0) {
      if (b + 1 < nb) LOCALPAGED_AMX_B_PRODUCT(1, 3, 5, b + 1);
      _tile_stored(0, sums, 64);
    } else {
      if (b + 1 < nb) LOCALPAGED_AMX_B_PRODUCT(0, 2, 4, b + 1);
      _tile_stored(1, sums, 64);
    }
    amx_b_fold<F>(panel, a, m0, tm, b, sums, lanes[b % 8]);
  }
  const __mmask16 cols = static_cast<__mmask16>((1u << n_rows) - 1);
  for (int64_t m = 0; m < tm; ++m) {   // hsum's order
    auto L = [&](int j) { return _mm512_load_ps(lanes[j][m]); };
    const __m512 v = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(L(0), L(4)), _mm512_add_ps(L(2), L(6))),
                                   _mm512_add_ps(_mm512_add_ps(L(1), L(5)), _mm512_add_ps(L(3), L(7))));
    _mm512_mask_storeu_ps(y + (m0 + m) * ldy, cols, v);
  }
}

#undef LOCALPAGED_AMX_B_PRODUCT

template <class F>
void amx_b_matmul(const Acts& a, int64_t M, const uint8_t* w, int64_t stride, bool x8, int64_t N, float* y) {
  const int64_t nb = a.blocks, tiles = (M + kAmxRows - 1) / kAmxRows;
  amx_panels<TileConfigB>(N, AmxBPanel(nb), [&](AmxBPanel& panel, int64_t n0, int64_t n_rows) {
    const uint8_t* rows = x8_rows(w, stride, x8, n0, n_rows, nb, F::kBytes, panel.rows);
    amx_b_unpack<F>(rows, x8 ? nb * F::kBytes : stride, n_rows, nb, panel);
    for (int64_t t = 0; t < tiles; ++t) amx_b_tiles<F>(panel, a, t, M, n_rows, y + n0, N);
  });
}

using AmxFn = void (*)(const Acts&, int64_t, const uint8_t*, int64_t, bool, int64_t, float*);

AmxFn amx_kernel_for(int id) {
  switch (id) {
    case kQ2_K: return amx_matmul<AvxQ2K>;
    case kQ3_K: return amx_matmul<AvxQ3K>;
    case kQ4_K: return amx_matmul<AvxQ4K>;
    case kQ5_K: return amx_matmul<AvxQ5K>;
    case kQ6_K: return amx_matmul<AvxQ6K>;
    case kIQ4_XS: return amx_matmul<AvxIQ4XS>;
    case kQ4_0: return amx_b_matmul<AvxQ4_0>;
    case kQ4_1: return amx_b_matmul<AvxQ4_1>;
    case kQ5_0: return amx_b_matmul<AvxQ5_0>;
    case kQ5_1: return amx_b_matmul<AvxQ5_1>;
    case kQ8_0: return amx_b_matmul<AvxQ8_0>;
    case kIQ4_NL: return amx_b_matmul<AvxIQ4NL>;
  }
  return nullptr;
}
