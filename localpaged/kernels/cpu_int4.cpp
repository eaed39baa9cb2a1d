// Int4 weight-only matmul on CPU: one output row at a time, bf16 activations, float32 sums.
//
// Layout ("tiles", packed by kernels/cpu_int4_layout.py for quant/cpu_tiles.py: CpuInt4Tiles):
// packed int32 [N / 32, K / 8, 2, 16].
// Block b holds output rows [32 b, 32 b + 32) as two tiles of 16; for each chunk c of 8 inputs
// and tile i, one 64-byte line of 16 words, word l (row n = 32 b + 16 i + l) holding q[n, 8c + j]
// for j = 2p (bits 4p..4p+3) and j = 2p + 1 (bits 16+4p..) for p = 0..3. A block's lines are in
// the order the kernel reads them: one sequential stream per block.
//
// The arithmetic, per output row m and group g of G inputs:
//   D = sum_k bf16(x[m, k]) * (128 + q[n, k])       AVX-512 BF16 dot products: 128 + q is a bf16
//                                                    whose bits are 0x4300 | q, so unpacking is a
//                                                    mask and an OR (one vpternlogd)
//   y[m, n] += scale * D + (min - 128 * scale) * A   A = sum_k bf16(x[m, k]) over the group
// so y = sum_k x[m, k] * (q * scale + min) with float32 sums (in a fixed order per row: the
// result for a row does not depend on the other rows, the block split or the thread count).
// Against torch's int4 kernel (`_weight_int4pack_mm_for_cpu`): half the instructions per weight,
// scales and mins in float16 as the GGUF stores them (torch's are bf16), a float32 result
// (torch's is rounded to bf16). docs/benchmarks.md ('The CPU paths, piece by piece') has the two
// kernels' times on SmolLM2-135M's decoder linears.

#include "cpu_int4.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>

#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define LOCALPAGED_INT4_AVX512 1
#endif

using at::Tensor;

namespace {

constexpr int64_t kTile = 16, kTiles = 2, kBlock = kTile * kTiles, kChunk = 8;
constexpr int64_t kRowsPerItem = 16;    // prefill rows per work item

inline float bf16_value(uint16_t bits) {
  const uint32_t word = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}

struct Operands {
  const uint16_t* x;        // bf16 [M, K]
  const float* group_sums;  // [M, K / G]: A per row and group
  const int32_t* packed;
  const at::Half* scales;   // [K / G, N]
  const at::Half* mins;
  float* y;                 // [M, N]
  int64_t K, N, G;
};

#ifdef LOCALPAGED_INT4_AVX512
inline __m512 load_half(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Output rows of block b for input row m.
void block_row(const Operands& o, int64_t b, int64_t m) {
  const int64_t chunks = o.K / kChunk, per_group = o.G / kChunk;
  const __m512i mask = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
  const __m512 offset = _mm512_set1_ps(128.0f);
  const uint32_t* x = reinterpret_cast<const uint32_t*>(o.x + m * o.K);   // bf16 pairs
  const int32_t* w = o.packed + b * chunks * kTiles * kTile;
  __m512 acc[kTiles];
  for (int i = 0; i < kTiles; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < o.K / o.G; ++g) {
    __m512 d[kTiles][4];
    for (int i = 0; i < kTiles; ++i)
      for (int p = 0; p < 4; ++p) d[i][p] = _mm512_setzero_ps();
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      __m512bh a[4];
      for (int p = 0; p < 4; ++p) a[p] = (__m512bh)_mm512_set1_epi32(x[c * 4 + p]);
      for (int i = 0; i < kTiles; ++i) {
        const __m512i line = _mm512_loadu_si512(w + (c * kTiles + i) * kTile);
        for (int p = 0; p < 4; ++p) {
          const __m512i q = _mm512_ternarylogic_epi32(_mm512_srli_epi32(line, 4 * p), mask, bias, 0xEA);
          d[i][p] = _mm512_dpbf16_ps(d[i][p], (__m512bh)q, a[p]);
        }
      }
    }
    const __m512 sum = _mm512_set1_ps(o.group_sums[m * (o.K / o.G) + g]);
    for (int i = 0; i < kTiles; ++i) {
      const int64_t n = b * kBlock + i * kTile;
      const __m512 scale = load_half(o.scales + g * o.N + n);
      const __m512 shift = _mm512_fnmadd_ps(offset, scale, load_half(o.mins + g * o.N + n));
      const __m512 dot = _mm512_add_ps(_mm512_add_ps(d[i][0], d[i][1]), _mm512_add_ps(d[i][2], d[i][3]));
      acc[i] = _mm512_fmadd_ps(shift, sum, _mm512_fmadd_ps(scale, dot, acc[i]));
    }
  }
  for (int i = 0; i < kTiles; ++i) _mm512_storeu_ps(o.y + m * o.N + b * kBlock + i * kTile, acc[i]);
}
#else
// Portable: the same sums without the BF16 dot products (any CPU, much slower).
void block_row(const Operands& o, int64_t b, int64_t m) {
  const int64_t chunks = o.K / kChunk;
  const uint16_t* x = o.x + m * o.K;
  for (int64_t t = 0; t < kBlock; ++t) {
    const int64_t i = t / kTile, l = t % kTile, n = b * kBlock + t;
    float acc = 0.0f;
    for (int64_t g = 0; g < o.K / o.G; ++g) {
      float dot = 0.0f;
      for (int64_t k = g * o.G; k < (g + 1) * o.G; ++k) {
        const int64_t c = k / kChunk, j = k % kChunk;
        const uint32_t word = o.packed[((b * chunks + c) * kTiles + i) * kTile + l];
        const uint32_t q = (word >> (4 * (j / 2) + 16 * (j % 2))) & 0xF;
        dot += bf16_value(x[k]) * float(128 + q);
      }
      const float scale = float(o.scales[g * o.N + n]), min = float(o.mins[g * o.N + n]);
      acc += scale * dot + (min - 128.0f * scale) * o.group_sums[m * (o.K / o.G) + g];
    }
    o.y[m * o.N + n] = acc;
  }
}
#endif

void check_inputs(const Tensor& x, const Tensor& packed, const Tensor& scales, const Tensor& mins,
                  int64_t G) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "x: float32 [M, K] on CPU");
  const int64_t K = x.size(1);
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kInt && packed.is_contiguous() &&
              packed.size(1) * kChunk == K && packed.size(2) == kTiles && packed.size(3) == kTile,
              "packed: int32 [N / 32, K / 8, 2, 16]");
  TORCH_CHECK(G > 0 && G % kChunk == 0 && K % G == 0, "group size a multiple of 8 dividing K");
  const int64_t N = packed.size(0) * kBlock;
  for (const Tensor* t : {&scales, &mins})
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->is_contiguous() && t->size(0) == K / G &&
                t->size(1) == N, "scales and mins: float16 [K / G, N]");
}

}  // namespace

Tensor int4_matmul(const Tensor& x_in, const Tensor& packed, const Tensor& scales,
                   const Tensor& mins, int64_t G) {
  RECORD_FUNCTION("localpaged::int4_matmul", std::vector<c10::IValue>());   // named in profiles
  check_inputs(x_in, packed, scales, mins, G);
  const Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * kBlock, groups = K / G;
  Tensor y = at::empty({M, N}, x_in.options());
  // bf16(x), rounded to nearest even as torch's x.to(bfloat16) rounds (c10::BFloat16, here
  // without an extra op), and A per row and group, in input order
  std::vector<uint16_t> xb(M * K);
  std::vector<float> sums(M * groups);
  const float* xf = x.data_ptr<float>();
  at::parallel_for(0, M * groups, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float s = 0.0f;
      for (int64_t k = r * G; k < (r + 1) * G; ++k) {
        xb[k] = c10::BFloat16(xf[k]).x;
        s += bf16_value(xb[k]);
      }
      sums[r] = s;
    }
  });
  const Operands o{xb.data(), sums.data(), packed.data_ptr<int32_t>(), scales.data_ptr<at::Half>(),
                   mins.data_ptr<at::Half>(), y.data_ptr<float>(), K, N, G};
  const int64_t blocks = N / kBlock, row_items = (M + kRowsPerItem - 1) / kRowsPerItem;
  at::parallel_for(0, blocks * row_items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item % blocks, first = (item / blocks) * kRowsPerItem;
      for (int64_t m = first; m < std::min(M, first + kRowsPerItem); ++m) block_row(o, b, m);
    }
  });
  return y;
}

bool int4_vectorized() {
#ifdef LOCALPAGED_INT4_AVX512
  return true;
#else
  return false;
#endif
}
