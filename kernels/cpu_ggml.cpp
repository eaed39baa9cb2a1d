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
//    `dpwssd` multiplies by the scales and adds: the same integers in fewer micro-ops (batch 8
//    ~15% faster, batch 1 3-5%, on the SPR VM). Signed codes go through the sign trick,
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
// The work is split over output rows n: groups of rows (~64 KB of weights) that the threads of
// one at::parallel_for region take in order from a shared counter. Within a group, tiles of up
// to kTileRows rows of x: each weight block is unpacked once per tile (nibbles -> bytes, scales
// -> int16 lanes) and multiplied with every row of the tile, so each weight byte is read once
// from memory and, for M > 4, again from the L2 cache.
//
// Tolerance against float32 math on the dequantized weights: the quantization of x moves each
// x_k by at most s_k / 2 = max|x over k's block| / 254 (a value below that rounds to 0: by at
// most |x_k|), so |y - x @ W.T| <= sum_k |W[n, k]| * max|x over k's block| / 254, plus float32
// rounding (~1e-6 relative to sum_k |x_k W[n, k]|). Random data stays within 0.1-0.3 of that
// bound (the errors add up like a random walk); tests/test_cpu_ggml.py checks the bound itself.
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
// x at a time, lane r of each product row r's, bitwise the same y (see the x8 section). On the
// SPR VM, 2 threads streaming from DRAM at batch 1: Q4_K 8960x1536 21.6-24.4 GB/s against
// 19.2-21.8 in GGUF's rows (~85% of the machine's read bandwidth), 8 rows 11.4 vs 7.1; without
// AMX, 512 rows 216 vs 129 GMAC/s.
//
// Speed (bench/ggml_kernels.py; 2 cores of an AMD EPYC Zen 1 VM, ~19 GB/s read bandwidth, idle):
// Qwen2.5-1.5B's linears (28 layers of Q4_K + a Q6_K lm_head, 928 MB) at M = 1 in 101 ms,
// ~9-10 GB/s on the large matrices: compute-bound here (Zen 1 runs maddubs / madd at half
// rate; one core streams ~6 GB/s), on par with llama.cpp's ggml (100 ms), 5x torch float32 on
// the dequantized weights. M = 8: 401 ms (llama.cpp 1044, torch 2321); M = 512: 25.0 s,
// ~30 GMAC/s (llama.cpp without its repacked layouts 27.2 s, torch float32 27.7 s).
// On 2 cores of a Sapphire Rapids VM (AVX2 path ~80 GMAC/s at any M > 4), the AMX path at M =
// 512: Q4_K 290-355 GMAC/s, Q6_K ~460 (3.6-5.2x); below ~10 rows the unpacking of the weights
// (~1.3 ms per 13.7M weights) costs more than the AVX2 tiles.

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
// (prefetcht0). Against one prefetcht0 8 KB ahead, 2 threads on the SPR VM streamed Q4_K
// 8960x1536 at 19.8-20.3 GB/s instead of 18.2-18.5, Q6_K 21.6-22.5 instead of 20.1-20.7.
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
// (x8_tile); the AMX tiles move each panel back to GGUF's rows (x8_rows) and run as before. The
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

// ---------------------------------------------------------------------------------------------
// Plain C++: each block unpacked to integers, then one integer dot per row.

// A K block: w[k] = d * sc[k / 16] * q[k] - dmin * mn[k / 16].
struct KInts {
  int8_t q[kSuper];
  int32_t sc[16], mn[16];
  float d, dmin;
};

// A 32-element block: w[k] = d * q[k] + m.
struct BInts {
  int8_t q[32];
  float d, m;
};

// Q4_K / Q5_K: 8 six-bit scales and mins in 12 bytes.
void k4_scale_min(const uint8_t* s, int j, int32_t& sc, int32_t& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void unpack_q4_k(const uint8_t* p, KInts& u) {
  u.d = half(p);
  u.dmin = half(p + 2);
  for (int j = 0; j < 8; ++j) {
    k4_scale_min(p + 4, j, u.sc[2 * j], u.mn[2 * j]);
    u.sc[2 * j + 1] = u.sc[2 * j];
    u.mn[2 * j + 1] = u.mn[2 * j];
  }
  const uint8_t* qs = p + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      u.q[64 * c + l] = qs[32 * c + l] & 0xF;
      u.q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
    }
}

void unpack_q5_k(const uint8_t* p, KInts& u) {
  unpack_q4_k(p, u);   // same header, scales and nibble order; the qs lie 32 bytes later
  const uint8_t *qh = p + 16, *qs = p + 48;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      u.q[64 * c + l] = (qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
      u.q[64 * c + 32 + l] = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
    }
}

void unpack_q6_k(const uint8_t* p, KInts& u) {
  const uint8_t *ql = p, *qh = p + 128;
  for (int i = 0; i < 16; ++i) {
    u.sc[i] = static_cast<int8_t>(p[192 + i]);
    u.mn[i] = 0;
  }
  u.d = half(p + 208);
  u.dmin = 0.0f;
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const int hb = qh[32 * h + l];
      int8_t* q = u.q + 128 * h;
      q[l] = static_cast<int8_t>(((ql[64 * h + l] & 0xF) | ((hb & 3) << 4)) - 32);
      q[l + 32] = static_cast<int8_t>(((ql[64 * h + l + 32] & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
      q[l + 64] = static_cast<int8_t>(((ql[64 * h + l] >> 4) | (((hb >> 4) & 3) << 4)) - 32);
      q[l + 96] = static_cast<int8_t>(((ql[64 * h + l + 32] >> 4) | (((hb >> 6) & 3) << 4)) - 32);
    }
}

void unpack_q2_k(const uint8_t* p, KInts& u) {
  for (int i = 0; i < 16; ++i) {
    u.sc[i] = p[i] & 0xF;
    u.mn[i] = p[i] >> 4;
  }
  const uint8_t* qs = p + 16;
  u.d = half(p + 80);
  u.dmin = half(p + 82);
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) u.q[128 * h + 32 * s + l] = (qs[32 * h + l] >> (2 * s)) & 3;
}

// Q3_K: 16 six-bit signed scales in 12 bytes (low 4 bits in bytes 0-7, high 2 in bytes 8-11).
int32_t q3_scale(const uint8_t* s, int i) {
  const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

void unpack_q3_k(const uint8_t* p, KInts& u) {
  const uint8_t *hmask = p, *qs = p + 32;
  for (int i = 0; i < 16; ++i) {
    u.sc[i] = q3_scale(p + 96, i);
    u.mn[i] = 0;
  }
  u.d = half(p + 108);
  u.dmin = 0.0f;
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int low = (qs[32 * h + l] >> (2 * s)) & 3, high = (hmask[l] >> (4 * h + s)) & 1;
        u.q[128 * h + 32 * s + l] = static_cast<int8_t>(low - (high ? 0 : 4));
      }
}

void unpack_iq4_xs(const uint8_t* p, KInts& u) {
  u.d = half(p);
  u.dmin = 0.0f;
  const uint16_t sh = u16(p + 2);
  const uint8_t *sl = p + 4, *qs = p + 8;
  for (int j = 0; j < 8; ++j) {
    const int ls = ((sl[j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
    u.sc[2 * j] = u.sc[2 * j + 1] = ls - 32;
    u.mn[2 * j] = u.mn[2 * j + 1] = 0;
    for (int l = 0; l < 16; ++l) {
      u.q[32 * j + l] = kIQ4Values[qs[16 * j + l] & 0xF];
      u.q[32 * j + 16 + l] = kIQ4Values[qs[16 * j + l] >> 4];
    }
  }
}

// 32-element blocks: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.
void nibbles(const uint8_t* qs, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0xF;
    q[j + 16] = qs[j] >> 4;
  }
}

void unpack_q4_0(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = 0.0f;
  nibbles(p + 2, u.q);
  for (int j = 0; j < 32; ++j) u.q[j] -= 8;
}

void unpack_q4_1(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = half(p + 2);
  nibbles(p + 4, u.q);
}

void fifth_bits(uint32_t qh, int8_t* q) {
  for (int j = 0; j < 32; ++j) q[j] |= ((qh >> j) & 1) << 4;
}

void unpack_q5_0(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = 0.0f;
  nibbles(p + 6, u.q);
  fifth_bits(u32(p + 2), u.q);
  for (int j = 0; j < 32; ++j) u.q[j] -= 16;
}

void unpack_q5_1(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = half(p + 2);
  nibbles(p + 8, u.q);
  fifth_bits(u32(p + 4), u.q);
}

void unpack_q8_0(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = 0.0f;
  std::memcpy(u.q, p + 2, 32);
}

void unpack_iq4_nl(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = 0.0f;
  nibbles(p + 2, u.q);
  for (int j = 0; j < 32; ++j) u.q[j] = kIQ4Values[static_cast<uint8_t>(u.q[j])];
}

template <void (*Unpack)(const uint8_t*, KInts&), int64_t Bytes>
void scalar_k_tile(const uint8_t* row, const Acts& a, int64_t m0, int64_t tm, float* y, int64_t ldy) {
  float acc[kScalarTileRows] = {};
  KInts u;
  const int64_t K = a.K;
  for (int64_t b = 0; b < a.blocks; ++b) {
    Unpack(row + b * Bytes, u);
    for (int64_t m = 0; m < tm; ++m) {
      const int64_t r = m0 + m;
      const int8_t* x = a.q.data() + r * K + b * kSuper;
      const int16_t* s16 = a.sum16.data() + r * K / 16 + b * 16;
      int32_t sumi = 0, summ = 0;
      for (int i = 0; i < 16; ++i) {
        int32_t s = 0;
        for (int k = 0; k < 16; ++k) s += int32_t(u.q[16 * i + k]) * x[16 * i + k];
        sumi += u.sc[i] * s;
        summ += u.mn[i] * s16[i];
      }
      const float da = a.d[r * a.blocks + b];
      acc[m] = std::fma(u.d * da, static_cast<float>(sumi), acc[m]);
      acc[m] = std::fma(-u.dmin * da, static_cast<float>(summ), acc[m]);
    }
  }
  for (int64_t m = 0; m < tm; ++m) y[m * ldy] = acc[m];
}

template <void (*Unpack)(const uint8_t*, BInts&), int64_t Bytes>
void scalar_b_tile(const uint8_t* row, const Acts& a, int64_t m0, int64_t tm, float* y, int64_t ldy) {
  float acc[kScalarTileRows] = {};
  BInts u;
  const int64_t K = a.K;
  for (int64_t b = 0; b < a.blocks; ++b) {
    Unpack(row + b * Bytes, u);
    for (int64_t m = 0; m < tm; ++m) {
      const int64_t r = m0 + m;
      const int8_t* x = a.q.data() + r * K + b * 32;
      int32_t sumi = 0;
      for (int k = 0; k < 32; ++k) sumi += int32_t(u.q[k]) * x[k];
      acc[m] = std::fma(u.d * a.d[r * a.blocks + b], static_cast<float>(sumi), acc[m]);
      acc[m] = std::fma(u.m, a.dsum32[r * a.blocks + b], acc[m]);
    }
  }
  for (int64_t m = 0; m < tm; ++m) y[m * ldy] = acc[m];
}

#ifdef LOCALPAGED_GGML_AVX2
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


// The x8 batch-1 loops' prefetch, as prefetch_ahead with nearer distances: into L1 1 KB ahead,
// into L2 4 KB ahead. On the SPR VM (2 threads, Q4_K 8960x1536 streamed, interleaved A/B runs)
// 22.7-22.8 GB/s against 19.7-21.3 for prefetch_ahead's 2 KB / 8 KB, 20.7-21.3 for none.
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

// Rows [m0, m0 + tm) of x against one group, y[m * ldy + r]; `prefetch`: the first pass over
// the group (its weights come from DRAM).
template <class F>
void x8_tile(const uint8_t* g, const Acts& a, int64_t m0, int64_t tm, bool prefetch, float* y, int64_t ldy) {
  if constexpr (std::is_same_v<F, X8Q6K>) {
    switch (tm) {
      case 1: return x8_q6k_rows<1>(g, a, m0, prefetch, y, ldy);
      case 2: return x8_q6k_rows<2>(g, a, m0, prefetch, y, ldy);
      case 3: return x8_q6k_rows<3>(g, a, m0, prefetch, y, ldy);
      default: return x8_q6k_rows<4>(g, a, m0, prefetch, y, ldy);
    }
  } else {
    switch (tm) {
      case 1: return x8_k4_one<F>(g, a, m0, y);
      case 2: return x8_k4_rows<F, 2>(g, a, m0, prefetch, y, ldy);
      case 3: return x8_k4_rows<F, 3>(g, a, m0, prefetch, y, ldy);
      default: return x8_k4_rows<F, 4>(g, a, m0, prefetch, y, ldy);
    }
  }
}

#ifdef LOCALPAGED_GGML_AVX512
// ---------------------------------------------------------------------------------------------
// AVX-512 VNNI, K formats with unsigned codes (<= 63), tiles of up to kWideRows rows (batched
// decode below the AMX tiles' kAmxMinRows): the same integers and float order as avx_k_rows,
// so bitwise the same y. 64 codes per zmm: W[j] = the codes of chunks 2j and 2j + 1, so a row's
// 64 bytes of x load as they lie; dpbusd makes the 4-element sums, packs_epi32 joins W[j]'s and
// W[j + 1]'s per 128-bit lane (128-bit lane i of the sums: chunk 2j + i / 2, sub-block half
// i % 2), and dpwssd multiplies by the matching scales. 32 registers hold 8 rows' sums. Measured
// on the SPR VM: 512-bit dpbusd moves ~1.4x the products of two 256-bit ones.
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

// For batches of 5-9 rows (kernel_for): 2 threads streaming Q4_K 8960x1536 at M = 8, 9.5 GB/s
// against 8.5 on the 256-bit tiles, Q6_K 12.9 against 10.7; at M = 4 the 256-bit tiles were
// ~6% faster, and batch 1 stays on the 256-bit row loop (a 512-bit version measured slower).
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
#endif  // LOCALPAGED_GGML_AVX512

#ifdef LOCALPAGED_GGML_AMX
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
// Batches from kAmxMinRows rows on (below: the AVX2 tiles). A K format's panel costs ~1.3 ms per
// 13.7M weights to unpack; a 32-element format's matmul alone is faster on the tiles from ~5
// rows, but in the engine's steps not before ~10: steps that use the tiles run the element-wise
// ops around them slower (silu and mul ~1.5x, measured on the SPR VM).
constexpr int64_t kAmxMinRows = 10;
// Weights in the x8 layout: each panel is moved back to GGUF's rows first, and the x8 tiles are
// faster than the AVX2 tiles, so the AMX tiles pay later (SPR VM, 2 threads, GMAC/s x8 tiles vs
// AMX: Q4_K 8960x1536 at 24 rows 221 vs 165, at 32 227 vs 236; Q6_K 1536x8960 at 16 rows 139 vs
// 119, at 24 142 vs 163; Q5_K 8960x1536 at 16 rows 166 (tiles), at 24 169 (AMX)).
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
// AVX2 tiles' (tests/test_cpu_ggml.py: a row alone and in a batch, the builds side by side).

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
#endif  // LOCALPAGED_GGML_AMX
#endif  // LOCALPAGED_GGML_AVX2

// Asks for a weight row's cache lines ahead of its use: a row streamed from DRAM at batch 1 is
// otherwise read at about a third of the bandwidth (the hardware prefetchers do not run far enough
// ahead of one core's loads). The AVX2 batch-1 loops ask block by block instead, spread over
// their work (17.2-17.8 GB/s against 15.5 for whole rows ahead, on the SPR VM reading ~26 GB/s).
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
// Against one shared counter (items in turn to whichever thread asks), 2 threads streaming
// Q4_K / Q6_K at batch 1 on the SPR VM: ~+3-10% (interleaved A/B runs; 1536x8960 x8 24.0-24.6
// against 21.4-22.3 GB/s): each thread's prefetch runs on into its own next item.
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
  const int64_t min_macs = int64_t(1) << 17;   // per thread (~10 us), else fewer threads
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
