// GGUF quantized-block matmul on CPU: y = x @ dequantize(w).T, with w kept as its file bytes.
//
// Layout: w is uint8 [N, row_bytes], row n holding the K / E blocks of output row n in GGUF's
// byte layout (E elements per block; the spec is gguf-py's numpy dequantizer, gguf/quants.py).
// Rows may lie further apart than row_bytes (w.stride(0)). Formats, E and bytes per block:
//   32-element blocks, w = d * (q - o) or d * q + m:   Q4_0 (18 B), Q4_1 (20), Q5_0 (22),
//     Q5_1 (24), Q8_0 (34), IQ4_NL (18, q through a 16-entry int8 table)
//   256-element "K" blocks of 8 or 16 sub-blocks with 4-8 bit integer sub-scales:
//     Q2_K (84 B), Q3_K (110), Q4_K (144), Q5_K (176), Q6_K (210), IQ4_XS (136)
//
// The arithmetic (as llama.cpp's CPU backend does it):
// 1. Each row of x is quantized once per call to int8 per block, a = round(x / s) with
//    s = max|x| / 127 over the block: blocks of 256 for the K formats (with the sums of every 16
//    values, int16, and s times them, for the sub-block mins and offsets), blocks of 32 for the
//    32-element formats (with s times the block's sum).
// 2. Per weight block, the integer dot products of the weights' codes with a, exact in int32:
//    AVX2 `_mm256_maddubs_epi16` (u8 code x s8 a, adjacent pairs summed -> int16: at most
//    2 * 128 * 127 < 2^15), then `_mm256_madd_epi16` by the sub-block scales (K formats) or by 1
//    (pairs summed -> int32). Unsigned codes (<= 63: all but Q8_0, IQ4_NL, IQ4_XS) leave room
//    for one more pairwise add, so `_mm256_hadd_epi16` joins the products of two 32-element
//    chunks (or blocks) and one madd serves both. With VNNI (AVX-VNNI or AVX512-VNNI, 256-bit)
//    `dpbusd` makes the 4-element sums in one instruction, `packs_epi32` joins two chunks' and
//    `dpwssd` multiplies by the scales and adds: the same integers in fewer micro-ops
//    (bench/ggml_kernels.py measures the gain). Signed codes go through the sign trick,
//    maddubs(|w|, a * sign(w)). Integer offsets stay integers: Q6_K's q - 32 and Q3_K's q - 4 as
//    -32 (-4) * sum_i sc_i * sum16_i in the block's int32 sum; Q4_0's q - 8, Q5_0's q - 16 and
//    the mins of Q4_1 / Q5_1 as coefficient * (s * sum) in float.
// 3. K formats: per block the exact int32 sums sumi = sum_j sc_j * (codes_j . a_j) (offsets
//    included) and, for Q2_K, Q4_K, Q5_K, summ = sum_j m_j * (sum of a over j), then one float
//    per row: acc = fma(d * s, sumi, acc); acc = fma(-dmin * s, summ, acc), blocks in order.
//    Every path (plain C++, AVX2, AMX) computes these same integers and float operations, so a
//    K format's y is bitwise the same on every path and build. 32-element formats: block b's
//    exact int32 sum into float lane b % 8: lane = fma(d * s, sum, lane); lane = fma(coefficient,
//    s * (sum of a), lane); then the 8 lanes summed in one order (hsum). The AVX2 tiles gather 8
//    blocks' sums into the 8 lanes of one vector (hadd), the AMX tiles keep the lanes in memory:
//    the same y, bitwise (the plain C++ path keeps one accumulator: within the bound only).
//
// Invariants: each y[m, n] is computed by one thread, from row m of x alone, in a fixed order
// (blocks in order into 8 float lanes, then one fixed lane sum), so it is bitwise the same
// whatever M is, whatever the other rows are, however rows are tiled and on any thread count.
// The work is split over output rows n: groups of rows (~64 KB of weights), each thread of one
// at::parallel_for region taking its own contiguous share of them first (Items). Within a group,
// tiles of up to kTileRows rows of x: each weight block is unpacked once per tile (nibbles ->
// bytes, scales -> int16 lanes) and multiplied with every row of the tile, so each weight byte
// is read once from memory and, for M > 4, again from the L2 cache.
//
// Tolerance against float32 math on the dequantized weights: the quantization of x moves each
// x_k by at most s_k / 2 = max|x over k's block| / 254 (a value below that rounds to 0: by at
// most |x_k|), so |y - x @ W.T| <= sum_k |W[n, k]| * max|x over k's block| / 254, plus float32
// rounding (~1e-6 relative to sum_k |x_k W[n, k]|). Random data stays within 0.1-0.3 of that
// bound (the errors add up like a random walk); tests/kernels/test_cpu_ggml.py checks the bound itself.
// The rounding of x is llama.cpp's: on the same bytes its outputs and these agree to ~3e-8 of
// sum_k |x_k W[n, k]| for the K formats, ~3e-5 for the others (llama.cpp keeps s in float16).
//
// Paths: AVX2 + FMA + F16C (every format; -march=native on x86-64 since Haswell / Zen), else
// plain C++ (any CPU; the compiler vectorizes what it can). On Intel CPUs with AMX (Sapphire
// Rapids on; built with -march=native there), batches of 10 rows and more go through the int8
// tile unit instead, bitwise the AVX2 tiles' y (see the AMX section; LOCALPAGED_GGML_AMX=0 turns it off).
// ggml_kernel_path() says which ("avx2+amx" where the tiles are in use). On the vector paths
// Q4_K, Q5_K and Q6_K matrices with N a multiple of 8 are kept interleaved by groups of 8 rows (x8,
// made once at load: ggml_interleave; type_id | kInterleaved): their own loops for 1-4 rows of
// x at a time, lane r of each product row r's, bitwise the same y (see the x8 section): batch 1
// reads one linear stream with no horizontal sums, and the same loops serve larger batches below
// the AMX tiles (every batch without AMX; bench/ggml_kernels.py measures both layouts).
//
// Files: this one holds the types, the activations' quantization, the x8 layout's moves, the
// dispatch and the entry points; each path's kernels are a part of it, included inside its
// namespace: cpu_ggml_scalar.h (plain C++), cpu_ggml_avx2.h (AVX2 / VNNI over GGUF's rows),
// cpu_ggml_x8.h (the interleaved layout's loops), cpu_ggml_avx512.h (512-bit tiles, 5-9 rows),
// cpu_ggml_amx.h (AMX tiles).
//
// Speed: bench/ggml_kernels.py times this kernel at Qwen2.5-1.5B's shapes (M = 1 streamed from
// DRAM, M = 8, M = 512) beside torch float32 on the dequantized weights and llama.cpp's ggml on
// the same bytes; docs/benchmarks.md ('Real models') has the figures and their machines. On a CPU
// that issues maddubs and madd on one pipe (AMD Zen 1) batch 1 is bound by those multiplies, not
// by memory; the AMX tiles unpack each panel of weights once per call, a fixed cost that batches
// below kAmxMinRows rows do not pay back (see the AMX section).

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

// Batch 1 streams its weights from DRAM: the lines of [p, p + bytes) are asked for twice as the
// loop goes, into L2 kPrefetchBytes ahead (prefetcht2) and into L1 kPrefetchNear ahead
// (prefetcht0): the line is on its way from DRAM early and in L1 when the loads reach it. One
// prefetcht0 8 KB ahead streams slower (bench/ggml_kernels.py measures it).
inline void prefetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) {
    __builtin_prefetch(p + o + kPrefetchNear, 0, 3);
    __builtin_prefetch(p + o + kPrefetchBytes, 0, 1);
  }
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
// y[m * ldy + r]; `prefetch`: the group's lines are to be asked for ahead (its first pass).
using X8Fn = void (*)(const uint8_t* group, const Acts& a, int64_t m0, int64_t tm, bool prefetch,
                      float* y, int64_t ldy);
constexpr int64_t kX8Rows = 4;

// One tile: rows [m0, m0 + tm) of x against weight row `row`, results to y[m * ldy].
using TileFn = void (*)(const uint8_t* row, const Acts& a, int64_t m0, int64_t tm, float* y,
                        int64_t ldy);

#include "cpu_ggml_scalar.h"

#ifdef LOCALPAGED_GGML_AVX2
#include "cpu_ggml_avx2.h"
#include "cpu_ggml_x8.h"
#ifdef LOCALPAGED_GGML_AVX512
#include "cpu_ggml_avx512.h"
#endif
#ifdef LOCALPAGED_GGML_AMX
#include "cpu_ggml_amx.h"
#endif
#endif  // LOCALPAGED_GGML_AVX2

// Asks for a weight row's cache lines ahead of its use: a row streamed from DRAM at batch 1 is
// otherwise read far below the machine's bandwidth (the hardware prefetchers do not run far enough
// ahead of one core's loads). The AVX2 batch-1 loops ask block by block instead, spread over
// their work, which streams faster than whole rows ahead (bench/ggml_kernels.py measures it).
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 3);
}

// The tile function of a type, the rows it takes at once, and whether it asks for its weights'
// lines itself at batch 1 (tm == 1).
struct Kernel {
  TileFn fn;
  int64_t rows;
  bool prefetches = false;
};

Kernel kernel_for(int id, int64_t M) {
#ifdef LOCALPAGED_GGML_AVX512
  const auto wide = [](TileFn fn) { return Kernel{fn, kWideRows, true}; };
  if (M > kTileRows) switch (id) {   // up to 4 rows the 256-bit tiles measured faster
    case kQ2_K: return wide(wide_k_tile<AvxQ2K>);
    case kQ3_K: return wide(wide_k_tile<AvxQ3K>);
    case kQ4_K: return wide(wide_k_tile<AvxQ4K>);
    case kQ5_K: return wide(wide_k_tile<AvxQ5K>);
    case kQ6_K: return wide(wide_k_tile<AvxQ6K>);
  }
#endif
#ifdef LOCALPAGED_GGML_AVX2
  const auto avx = [](TileFn fn) { return Kernel{fn, kTileRows, true}; };   // all prefetch
  switch (id) {
    case kQ4_0: return avx(avx_tile<AvxQ4_0, false>);
    case kQ4_1: return avx(avx_tile<AvxQ4_1, false>);
    case kQ5_0: return avx(avx_tile<AvxQ5_0, false>);
    case kQ5_1: return avx(avx_tile<AvxQ5_1, false>);
    case kQ8_0: return avx(avx_tile<AvxQ8_0, false>);
    case kIQ4_NL: return avx(avx_tile<AvxIQ4NL, false>);
    case kQ2_K: return avx(avx_tile<AvxQ2K, true>);
    case kQ3_K: return avx(avx_tile<AvxQ3K, true>);
    case kQ4_K: return avx(avx_tile<AvxQ4K, true>);
    case kQ5_K: return avx(avx_tile<AvxQ5K, true>);
    case kQ6_K: return avx(avx_tile<AvxQ6K, true>);
    case kIQ4_XS: return avx(avx_tile<AvxIQ4XS, true>);
  }
#endif
  switch (id) {   // plain C++ (every format has an AVX2 kernel: this is for other CPUs)
    case kQ4_0: return {scalar_b_tile<unpack_q4_0, 18>, kScalarTileRows};
    case kQ4_1: return {scalar_b_tile<unpack_q4_1, 20>, kScalarTileRows};
    case kQ5_0: return {scalar_b_tile<unpack_q5_0, 22>, kScalarTileRows};
    case kQ5_1: return {scalar_b_tile<unpack_q5_1, 24>, kScalarTileRows};
    case kQ8_0: return {scalar_b_tile<unpack_q8_0, 34>, kScalarTileRows};
    case kIQ4_NL: return {scalar_b_tile<unpack_iq4_nl, 18>, kScalarTileRows};
    case kQ2_K: return {scalar_k_tile<unpack_q2_k, 84>, kScalarTileRows};
    case kQ3_K: return {scalar_k_tile<unpack_q3_k, 110>, kScalarTileRows};
    case kQ4_K: return {scalar_k_tile<unpack_q4_k, 144>, kScalarTileRows};
    case kQ5_K: return {scalar_k_tile<unpack_q5_k, 176>, kScalarTileRows};
    case kQ6_K: return {scalar_k_tile<unpack_q6_k, 210>, kScalarTileRows};
    case kIQ4_XS: return {scalar_k_tile<unpack_iq4_xs, 136>, kScalarTileRows};
  }
  TORCH_CHECK(false, "ggml_matmul: no kernel for GGML type ", id);
  return {nullptr, 1};
}

// Items [0, n) in one contiguous share per thread: take(t) gives thread t its share's items
// from the front, in order, then the other shares' from their backs; -1 when none is left.
// A share is one linear range of the weights, so each thread's prefetch runs on into its own
// next item; one shared counter (items in turn to whichever thread asks) would interleave the
// threads' reads and streams slower at batch 1 (bench/ggml_kernels.py measures it).
class Items {
 public:
  Items(int64_t n, int64_t shares) : shares_(shares), range_(new Range[shares]) {
    for (int64_t t = 0; t < shares; ++t)
      range_[t].v.store(pack(t * n / shares, (t + 1) * n / shares), std::memory_order_relaxed);
  }
  int64_t take(int64_t t) {
    for (int64_t i = 0; i < shares_; ++i) {
      const int64_t item = i == 0 ? claim(range_[t], true) : claim(range_[(t + i) % shares_], false);
      if (item >= 0) return item;
    }
    return -1;
  }

 private:
  struct alignas(64) Range {
    std::atomic<uint64_t> v;   // front << 32 | back: items [front, back) are left
  };
  static uint64_t pack(int64_t front, int64_t back) { return uint64_t(front) << 32 | uint64_t(back); }
  static int64_t claim(Range& r, bool front) {
    uint64_t v = r.v.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = int64_t(v >> 32), b = int64_t(v & 0xFFFFFFFFu);
      if (f >= b) return -1;
      if (r.v.compare_exchange_weak(v, front ? pack(f + 1, b) : pack(f, b - 1), std::memory_order_relaxed))
        return front ? f : b - 1;
    }
  }
  int64_t shares_;
  std::unique_ptr<Range[]> range_;
};

// The batch-1 kernel of a type in the x8 layout; nullptr: none (the type is not interleaved).
X8Fn x8_kernel(int id) {
#ifdef LOCALPAGED_GGML_AVX2
  switch (id) {
    case kQ4_K: return x8_tile<X8Q4K>;
    case kQ5_K: return x8_tile<X8Q5K>;
    case kQ6_K: return x8_tile<X8Q6K>;
  }
#endif
  (void)id;
  return nullptr;
}

}  // namespace

Tensor ggml_matmul(const Tensor& x, const Tensor& w, int64_t type_id) {
  RECORD_FUNCTION("localpaged::ggml_matmul", std::vector<c10::IValue>());   // named in profiles
  const bool x8 = type_id & kInterleaved;   // w in the x8 layout (ggml_interleave)
  const TypeInfo* t = find_type(type_id & ~kInterleaved);
  TORCH_CHECK(t != nullptr, "ggml_matmul: GGML type ", type_id, " (", other_type_name(type_id),
              ") is not supported; supported: ", supported_list());
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "ggml_matmul: x must be a float32 [M, K] CPU tensor (got ", x.scalar_type(), " ",
              x.sizes(), " on ", x.device(), ")");
  TORCH_CHECK(x.is_contiguous(), "ggml_matmul: x must be contiguous (got strides ", x.strides(), ")");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.device().is_cpu(),
              "ggml_matmul: w must be a uint8 [N, row_bytes] CPU tensor of ", t->name,
              " blocks (got ", w.scalar_type(), " ", w.sizes(), " on ", w.device(), ")");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K > 0 && K % t->elems == 0, "ggml_matmul: K = ", K, " is not a positive multiple of ",
              t->name, "'s block of ", t->elems, " elements");
  const int64_t row_bytes = K / t->elems * t->bytes;
  TORCH_CHECK(w.size(1) == row_bytes, "ggml_matmul: w rows must hold K / ", t->elems, " * ",
              t->bytes, " = ", row_bytes, " bytes of ", t->name, " blocks for K = ", K, " (got ",
              w.size(1), ")");
  TORCH_CHECK(w.stride(1) == 1 && (N <= 1 || w.stride(0) >= row_bytes),
              "ggml_matmul: w rows must be contiguous bytes, one row after another (got strides ",
              w.strides(), ")");
  TORCH_CHECK(!x8 || (x8_kernel(t->id) != nullptr && N % kX8 == 0 && w.is_contiguous()),
              "ggml_matmul: ", t->name, " ", w.sizes(), " is not in a layout this build interleaves "
              "(see ggml_interleaved_types)");
  Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;

  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t stride = w.stride(0);
  float* yp = y.data_ptr<float>();
#ifdef LOCALPAGED_GGML_AMX
  if (const AmxFn amx = M >= amx_min_rows(t->id, x8) ? amx_kernel_for(t->id) : nullptr; amx && amx_ready()) {
    const int64_t rows = (M + kAmxRows - 1) / kAmxRows * kAmxRows;
    amx(quantize_acts(x.data_ptr<float>(), M, K, t->elems == kSuper ? kSuper : 32, rows), M, wp, stride, x8, N, yp);
    return y;
  }
#endif
  const Acts a = quantize_acts(x.data_ptr<float>(), M, K, t->elems == kSuper ? kSuper : 32, M);
  const Kernel kernel = kernel_for(t->id, M);
  const X8Fn x8_fn = x8 ? x8_kernel(t->id) : nullptr;
  // Work items: groups of output rows (~64 KB of weights), each thread of one parallel region
  // taking its own contiguous share from the front, then the others' from their backs (Items):
  // one linear stream through the weights per thread, and a thread that starts late (a busy
  // core) takes fewer instead of holding the others up. Which thread computes a row changes
  // nothing in its result.
  const int64_t group = (std::max<int64_t>(1, kGroupBytes / row_bytes) + kX8 - 1) / kX8 * kX8;
  const int64_t ahead = std::max<int64_t>(1, kPrefetchBytes / row_bytes);   // rows
  const int64_t items = (N + group - 1) / group;
  const int64_t min_macs = int64_t(1) << 17;   // per thread, else fewer threads: less is not worth a thread
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>({at::get_num_threads(), items, M * N * K / min_macs}));
  Items work(items, threads);
  at::parallel_for(0, threads, 1, [&](int64_t thread, int64_t) {
    for (int64_t item; (item = work.take(thread)) >= 0;) {
      const int64_t n0 = item * group, n1 = std::min(N, n0 + group);
      if (x8_fn) {   // a group's passes over x's rows: the first from DRAM, the others from L1 / L2
        for (int64_t n = n0; n < n1; n += kX8)
          for (int64_t m0 = 0; m0 < M; m0 += kX8Rows)
            x8_fn(wp + n * stride, a, m0, std::min(kX8Rows, M - m0), m0 == 0, yp + m0 * N + n, N);
        continue;
      }
      for (int64_t m0 = 0; m0 < M; m0 += kernel.rows) {
        const int64_t tm = std::min(kernel.rows, M - m0);
        for (int64_t n = n0; n < n1; ++n) {
          if (m0 == 0 && !(kernel.prefetches && tm == 1) && n + ahead < N)
            prefetch_row(wp + (n + ahead) * stride, row_bytes);
          kernel.fn(wp + n * stride, a, m0, tm, yp + m0 * N + n, N);
        }
      }
    }
  });
  return y;
}

std::string ggml_kernel_path() {
#ifdef LOCALPAGED_GGML_AVX2
  std::string path = "avx2";
#ifdef LOCALPAGED_GGML_VNNI
  path += "+vnni";
#endif
#ifdef LOCALPAGED_GGML_AVX512
  path += "+avx512";
#endif
#ifdef LOCALPAGED_GGML_AMX
  if (amx_ready()) path += "+amx";
#endif
  return path;
#else
  return "scalar";
#endif
}

bool ggml_supported(int64_t type_id) { return find_type(type_id) != nullptr; }

void ggml_interleave(const Tensor& w, int64_t type_id, const Tensor& out) {
  const TypeInfo* t = find_type(type_id);
  TORCH_CHECK(t != nullptr && x8_kernel(t->id) != nullptr, "ggml_interleave: GGML type ", type_id,
              " has no interleaved kernel in this build (", ggml_kernel_path(), ")");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(0) % kX8 == 0 &&
                  w.size(1) % t->bytes == 0,
              "ggml_interleave: w must be a contiguous uint8 [N, row_bytes] of ", t->name,
              " blocks with N a multiple of 8 (got ", w.scalar_type(), " ", w.sizes(), ")");
  TORCH_CHECK(out.scalar_type() == at::kByte && out.is_contiguous() && out.numel() == w.numel() &&
                  out.data_ptr() != w.data_ptr(),
              "ggml_interleave: out must be another contiguous uint8 tensor of w's ", w.numel(), " bytes");
  const int64_t row_bytes = w.size(1), nb = row_bytes / t->bytes;
  uint8_t* src = const_cast<uint8_t*>(w.data_ptr<uint8_t>());   // read only
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, w.size(0) / kX8, 16, [&](int64_t g0, int64_t g1) {
    x8_move(src + g0 * kX8 * row_bytes, dst + g0 * kX8 * row_bytes, g1 - g0, nb, t->bytes, true);
  });
}

std::vector<int64_t> ggml_interleaved_types() {
  std::vector<int64_t> ids;
  for (const TypeInfo& t : kTypes)
    if (x8_kernel(t.id) != nullptr) ids.push_back(t.id);
  return ids;
}

int64_t ggml_interleaved_flag() { return kInterleaved; }

std::vector<int64_t> ggml_type_table() {
  std::vector<int64_t> table;
  for (const TypeInfo& t : kTypes) table.insert(table.end(), {t.id, t.elems, t.bytes});
  return table;
}
