// The common part of the CPU GGUF kernels (cpu_ggml.cpp and its parts, the .inc files):
// the instruction-set macros, the GGML types' table, constants, byte readers, the
// activations' quantization (Acts), the x8 layout's moves and the kernels' function types.
// Self-contained: a part includes it first, and cpu_ggml.cpp includes it once, at file scope,
// before it opens the anonymous namespace its parts are included into.

#pragma once

#include "cpu_ggml.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LOCALPAGED_GGML_AVX2 1
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define LOCALPAGED_GGML_VNNI 1   // 256-bit dpbusd / dpwssd (AVX-VNNI, or AVX512-VNNI with VL)
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define LOCALPAGED_GGML_AVX512 1   // the 512-bit tiles of the K formats for 2-9 rows
#endif
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define LOCALPAGED_GGML_AMX 1
#endif
#endif

using at::Tensor;

namespace {

// GGML type numbers (gguf.GGMLQuantizationType).
enum : int {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12,
  kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23,
};

struct TypeInfo {
  int id;
  const char* name;
  int64_t elems, bytes;   // elements and bytes per block
};

constexpr TypeInfo kTypes[] = {
    {kQ4_0, "Q4_0", 32, 18},    {kQ4_1, "Q4_1", 32, 20},    {kQ5_0, "Q5_0", 32, 22},
    {kQ5_1, "Q5_1", 32, 24},    {kQ8_0, "Q8_0", 32, 34},    {kQ2_K, "Q2_K", 256, 84},
    {kQ3_K, "Q3_K", 256, 110},  {kQ4_K, "Q4_K", 256, 144},  {kQ5_K, "Q5_K", 256, 176},
    {kQ6_K, "Q6_K", 256, 210},  {kIQ4_NL, "IQ4_NL", 32, 18}, {kIQ4_XS, "IQ4_XS", 256, 136},
};

// Names of the other GGML types, for error messages only.
const char* other_type_name(int64_t id) {
  switch (id) {
    case 0: return "F32";      case 1: return "F16";      case 9: return "Q8_1";
    case 15: return "Q8_K";    case 16: return "IQ2_XXS"; case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS"; case 19: return "IQ1_S";   case 21: return "IQ3_S";
    case 22: return "IQ2_S";   case 24: return "I8";      case 25: return "I16";
    case 26: return "I32";     case 27: return "I64";     case 28: return "F64";
    case 29: return "IQ1_M";   case 30: return "BF16";    case 34: return "TQ1_0";
    case 35: return "TQ2_0";   case 39: return "MXFP4";
    default: return "unknown";
  }
}

const TypeInfo* find_type(int64_t id) {
  for (const TypeInfo& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

std::string supported_list() {
  std::ostringstream s;
  for (const TypeInfo& t : kTypes) s << (&t == kTypes ? "" : ", ") << t.name << " (" << t.id << ")";
  return s.str();
}

constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};
constexpr int64_t kSuper = 256;       // elements per K block
constexpr int64_t kTileRows = 4;      // rows of x per tile (AVX2: accumulators in registers)
constexpr int64_t kScalarTileRows = 16;
constexpr int64_t kGroupBytes = 64 * 1024;   // weights per group of rows: stays in L2
constexpr int64_t kPrefetchBytes = 8192;     // how far ahead a row's weights are asked for
constexpr int64_t kPrefetchNear = 2048;      // batch 1: into L1 this far ahead, into L2 at kPrefetchBytes
constexpr int64_t kX8 = 8;                   // rows per group of the interleaved layout (x8)
constexpr int64_t kInterleaved = 1 << 8;     // type_id flag: w is in the x8 layout

// How far ahead a loop asks for its weights' lines, in bytes: into L2 `far` ahead (prefetcht2;
// 0: no prefetch) and, where `near` > 0, into L1 `near` ahead (prefetcht0): the line is on its
// way from DRAM early and in L1 when the loads reach it.
struct Prefetch {
  int64_t near = 0, far = 0;
};

// The lines of [p, p + bytes) asked for `d` ahead.
inline void prefetch_ahead(const uint8_t* p, int64_t bytes, Prefetch d) {
  if (d.far == 0) return;
  for (int64_t o = 0; o < bytes; o += 64) {
    if (d.near > 0) __builtin_prefetch(p + o + d.near, 0, 3);
    __builtin_prefetch(p + o + d.far, 0, 1);
  }
}

// Batch 1 over GGUF's rows streams its weights from DRAM: 2 KB into L1, 8 KB into L2. One
// prefetcht0 8 KB ahead streams slower (bench/ggml_kernels.py measures it).
constexpr Prefetch kRowsNearFar{kPrefetchNear, kPrefetchBytes};
// The x8 loops: passes of several rows of x compute more than they stream and take kX8NearFar on
// every CPU (a line in L1 when the loads reach it); passes of one or two rows take
// x8_stream_prefetch() (by the CPU's maker, below).
constexpr Prefetch kX8NearFar{1024, 4096};
constexpr int64_t kStreamRows = 2;   // batches up to this many rows stream: x8_stream_prefetch

// The prefetch of a pass of one or two rows of x over the weights (decode): such a pass
// streams them from DRAM at the rate its requests run ahead of its loads. Which distances stream
// fastest depends on the CPU's maker (bench/ggml_kernels.py measures it, docs/benchmarks.md
// "Prefetch distances per CPU" has the figures): on Intel (Xeon Sapphire Rapids) kX8NearFar; on
// AMD (Zen 4) none into L1, whose requests there hold the loop's own loads up, and 6 KB into L2.
// LOCALPAGED_X8_PREFETCH="near,far" sets them (for the bench); read once per process.
inline Prefetch x8_stream_prefetch() {
  static const Prefetch d = [] {
#if defined(__x86_64__) || defined(__i386__)
    Prefetch p = __builtin_cpu_is("amd") ? Prefetch{0, 6144} : kX8NearFar;
#else
    Prefetch p = kX8NearFar;
#endif
    if (const char* env = std::getenv("LOCALPAGED_X8_PREFETCH")) {
      long long near = 0, far = 0;
      if (std::sscanf(env, "%lld,%lld", &near, &far) == 2 && near >= 0 && far > 0) p = {near, far};
    }
    return p;
  }();
  return d;
}

inline uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float half(const uint8_t* p) {
#ifdef LOCALPAGED_GGML_AVX2
  return _cvtsh_ss(u16(p));
#else
  return c10::detail::fp16_ieee_to_fp32_value(u16(p));
#endif
}

// ---------------------------------------------------------------------------------------------
// Activations: x quantized per row (step 1 above).

// Rows M .. rows - 1 (padding for the AMX tiles of 16 rows) are zeros.
struct Acts {
  int64_t K = 0, blocks = 0;    // blocks per row: K / 256 or K / 32
  std::vector<int8_t> q;        // [rows, K]
  std::vector<float> d;         // [rows, blocks] the scale s of each block
  std::vector<int16_t> sum16;   // K formats: [rows, K / 16] sums of 16 values
  std::vector<int16_t> sum32;   // [rows, K / 32] sums of 32 values (K formats: sum16 in pairs)
  std::vector<float> dsum32;    // 32-element formats: [rows, K / 32] s * (sum of 32 values)
};

// max |x| over a block, NaN where the block holds a NaN (so that its s, and y, are NaN: max
// itself would drop it).
float block_amax(const float* x, int64_t B) {
#ifdef LOCALPAGED_GGML_AVX2
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < B; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(nan)) return std::numeric_limits<float>::quiet_NaN();
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
#else
  float m = 0.0f;
  for (int64_t i = 0; i < B; ++i) {
    if (std::isnan(x[i])) return std::numeric_limits<float>::quiet_NaN();
    m = std::max(m, std::fabs(x[i]));
  }
  return m;
#endif
}

// q = round-half-even(x * id), both paths (|x * id| <= 127 by the choice of id).
void quantize_values(const float* x, int64_t B, float id, int8_t* q) {
#ifdef LOCALPAGED_GGML_AVX2
  const __m256 s = _mm256_set1_ps(id);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < B; i += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), s));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(p, order));
  }
#else
  for (int64_t i = 0; i < B; ++i) q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, std::rint(x[i] * id))));
#endif
}

Acts quantize_acts(const float* x, int64_t M, int64_t K, int64_t B, int64_t rows) {
  Acts a;
  a.K = K;
  a.blocks = K / B;
  a.q.resize(rows * K);
  a.d.resize(rows * a.blocks);
  a.sum32.resize(rows * K / 32);
  if (B == kSuper) a.sum16.resize(rows * K / 16);
  else a.dsum32.resize(rows * K / 32);
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* xr = x + m * K;
      int8_t* qr = a.q.data() + m * K;
      float* dr = a.d.data() + m * a.blocks;
      for (int64_t b = 0; b < a.blocks; ++b) {
        const float amax = block_amax(xr + b * B, B), id = 127.0f / amax;
        dr[b] = amax / 127.0f;
        // a block of zeros, or with max|x| < 127 / FLT_MAX (~4e-37), counts as zeros
        quantize_values(xr + b * B, B, id <= std::numeric_limits<float>::max() ? id : 0.0f, qr + b * B);
      }
      for (int64_t j = 0; j < K / 32; ++j) {
        int32_t s[2] = {0, 0};
        for (int64_t k = 0; k < 32; ++k) s[k / 16] += qr[32 * j + k];
        a.sum32[m * K / 32 + j] = static_cast<int16_t>(s[0] + s[1]);
        if (B == kSuper)
          for (int h = 0; h < 2; ++h) a.sum16[m * K / 16 + 2 * j + h] = static_cast<int16_t>(s[h]);
        else
          a.dsum32[m * K / 32 + j] = dr[j] * static_cast<float>(s[0] + s[1]);
      }
    }
  });
  return a;
}

// ---------------------------------------------------------------------------------------------
// Interleaved rows ("x8", the layout of a decode step): the CPU keeps Q4_K, Q5_K and Q6_K
// matrices whose N is a multiple of 8 with each group of 8 rows' blocks side by side, so that
// batch 1 reads one linear stream and every 32-byte load holds 4 codes of each of the 8 rows:
// lane r of each integer product is row r's (dpbusd against 4 codes of x broadcast), with no
// horizontal sums and one float epilogue for 8 rows. Group g holds the bytes of rows 8g .. 8g + 7
// (the tensor keeps its [N, row_bytes] shape): blocks in order, block b's 8 x kBytes bytes as
// the rows' 4-byte units interleaved, unit u of row r at 4 (8u + r), and a trailing 2-byte unit
// (Q6_K's d) at 32 (kBytes / 4) + 2r. The same bytes, moved (ggml_interleave; the layout in
// torch: kernels/ggml_reference.py's interleave). The x8 loops take 1-4 rows of x at a time
// (x8_tile); the AMX tiles move each panel back to GGUF's rows (x8_rows) and run on those. The
// integers are the other paths' (sumi, summ per block and row, exact) and each lane folds them
// in their order, so y is bitwise the same in either layout.

#ifdef LOCALPAGED_GGML_AVX2
// The 8x8 transpose of dwords, in place: v[i]'s dword j <-> v[j]'s dword i.
inline void transpose8(__m256i* v) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int j = 0; j < 2; ++j) {
      u[i + 2 * j] = _mm256_unpacklo_epi64(t[i + j], t[i + j + 2]);
      u[i + 2 * j + 1] = _mm256_unpackhi_epi64(t[i + j], t[i + j + 2]);
    }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    v[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

#endif

// Group-blocks <-> rows: `groups` groups of 8 rows, each of nb blocks of `bytes`; rows at `rows`
// (row r of group g at rows + (8g + r) * row_bytes), groups at `x8` (the same offsets).
// to_x8: rows -> x8, else back.
void x8_move(uint8_t* rows, uint8_t* x8, int64_t groups, int64_t nb, int64_t bytes, bool to_x8) {
  const int64_t row_bytes = nb * bytes, units = bytes / 4;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* row = rows + g * kX8 * row_bytes + b * bytes;   // row r at row + r * row_bytes
      uint8_t* grp = x8 + g * kX8 * row_bytes + b * kX8 * bytes;
      int64_t u = 0;
#ifdef LOCALPAGED_GGML_AVX2
      for (; u + 8 <= units; u += 8) {   // 8 units of 8 rows: one transpose
        __m256i v[8];
        for (int i = 0; i < 8; ++i)
          v[i] = to_x8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i * row_bytes + 4 * u))
                        : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + 32 * (u + i)));
        transpose8(v);
        for (int i = 0; i < 8; ++i)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(to_x8 ? grp + 32 * (u + i) : row + i * row_bytes + 4 * u), v[i]);
      }
#endif
      for (int r = 0; r < kX8; ++r) {
        for (int64_t k = u; k < units; ++k)
          to_x8 ? std::memcpy(grp + 4 * (8 * k + r), row + r * row_bytes + 4 * k, 4)
                : std::memcpy(row + r * row_bytes + 4 * k, grp + 4 * (8 * k + r), 4);
        if (bytes % 4)
          to_x8 ? std::memcpy(grp + 32 * units + 2 * r, row + r * row_bytes + 4 * units, 2)
                : std::memcpy(row + r * row_bytes + 4 * units, grp + 32 * units + 2 * r, 2);
      }
    }
}

// The GGUF rows [n0, n0 + n_rows) of a matrix in the x8 layout (n0, n_rows multiples of 8, or
// n_rows up to N), in `scratch`; w in GGUF rows: a pointer into w.
const uint8_t* x8_rows(const uint8_t* w, int64_t stride, bool x8, int64_t n0, int64_t n_rows,
                       int64_t nb, int64_t bytes, std::vector<uint8_t>& scratch) {
  if (!x8) return w + n0 * stride;
  scratch.resize(n_rows * nb * bytes);
  x8_move(scratch.data(), const_cast<uint8_t*>(w) + n0 * stride, n_rows / kX8, nb, bytes, false);
  return scratch.data();
}

// Rows [m0, m0 + tm) of x (tm <= kX8Rows) against one group of 8 weight rows in the x8 layout:
// y[m * ldy + r]; `prefetch`: how far ahead the group's lines are asked for (its first pass;
// the others Prefetch{}: none).
using X8Fn = void (*)(const uint8_t* group, const Acts& a, int64_t m0, int64_t tm, Prefetch prefetch,
                      float* y, int64_t ldy);
constexpr int64_t kX8Rows = 4;

// Rows [m0, m0 + tm) of x against two groups of the x8 layout at once, g0 and g1 (the next):
// y[m * ldy + i], i < 8 group g0's rows, 8 + i group g1's; `prefetch` as X8Fn's (the 512-bit
// loops of cpu_ggml_avx512.inc).
constexpr int64_t kPairRows = 4;      // rows of x per tile of the pairs' loops
constexpr int64_t kPairMinRows = 2;   // the pairs' loops serve batches from this many rows
// Prefill on panels (min_rows rows of x and more): `rows` weight rows (one x8 group, a pair of
// them, or 16 GGUF rows) unpacked once into a panel (unpack: the first row, the stride between
// rows, blocks, out: 64-byte aligned, blocks * bytes), then tiles of up to kPanelTileRows rows of
// x over the panel (tile: panel, a, m0, tm, y, ldy: y[m * ldy + r] for weight row r). x8: the
// panel reads the x8 layout (else GGUF's rows). unpack nullptr: none.
constexpr int64_t kPanelTileRows = 4;
struct PanelKernels {
  void (*unpack)(const uint8_t*, int64_t, int64_t, uint8_t*) = nullptr;
  void (*tile)(const uint8_t*, const Acts&, int64_t, int64_t, float*, int64_t) = nullptr;
  int64_t bytes = 0;
  int64_t min_rows = 0;
  int64_t rows = 0;
  bool x8 = false;
};
using PairFn = void (*)(const uint8_t* g0, const uint8_t* g1, const Acts& a, int64_t m0, int64_t tm,
                        Prefetch prefetch, float* y, int64_t ldy);

// A whole matmul on the AMX tiles: (activations, M, w, w's row stride, w in x8, N, y).
using AmxFn = void (*)(const Acts&, int64_t, const uint8_t*, int64_t, bool, int64_t, float*);

// One tile: rows [m0, m0 + tm) of x against weight row `row`, results to y[m * ldy].
using TileFn = void (*)(const uint8_t* row, const Acts& a, int64_t m0, int64_t tm, float* y,
                        int64_t ldy);

}  // namespace
