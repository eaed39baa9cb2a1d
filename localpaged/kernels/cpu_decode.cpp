// Paged decode attention on CPU: the PagedAttention decode kernel of the paper, for x86/ARM cores.
//
// Work is split as flash-decoding splits it: each sequence's context in chunks of kChunk tokens,
// every (sequence, chunk) one work item over all heads, run in parallel on torch's intra-op
// threads; each item leaves per head a partial (sum of p * v, max score, sum of p) and the
// partials of a sequence are combined in chunk order. The chunking depends only on the sequence's
// length, so a sequence's result is bitwise the same alone or in any batch, and on any number of
// threads. An item reads each token's K row (all KV heads, contiguous) once, then per query head
// its KV head's part of the V rows (from the caches: a chunk's rows stay there), the head's sum
// in registers, following the block table one block at a time.
//
// Sliding window W (0: full attention): the query at position len - 1 attends to positions
// [window_start, len) with window_start = max(0, len - W), and the chunks tile that range from
// window_start (the same chunking as a sequence of len - window_start tokens). Rows before
// window_start are never read, nor are table entries of blocks wholly before it: they may hold
// any block id (a sliding-window layer's KV cache gives those blocks back).
//
// Cache dtypes (kernels/kv_quant.py): float32, bfloat16 and float16 rows are converted to float
// 16 lanes at a time as they are loaded; an int8 row (D int8 values, then its float32 scale s)
// is loaded as float(q) and its scale s applied once per row (the score q . k times s; p times s
// before the V accumulation), so the result differs from the reference over dequantized rows
// only by rounding (~1e-7). The same loop serves every dtype (a template over the element type);
// float32 rows are loaded as they lie.
//
// Against the torch reference (kernels/reference.py, SDPA): the same softmax in float32, summed
// in another order, so equal to ~1e-7 (tests/kernels/test_cpu_decode.py). bench/kv_dtype.py times
// this kernel alone over a model's layers; docs/benchmarks.md ('The CPU paths, piece by piece') has
// its figures against SDPA over the same cache.

#include "cpu_decode.h"
#include "cpu_vec.h"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

using at::Tensor;

namespace {

using localpaged::kLanes;
using localpaged::lane_sum;
using localpaged::load;
using localpaged::store;
using localpaged::Vec;

constexpr int64_t kChunk = 64;      // tokens per work item: 16 items at 1,000 tokens
constexpr int64_t kMaxVecs = 16;    // head_dim <= 256
constexpr int64_t kScaleBytes = 4;  // an int8 row's float32 scale, after its head_dim values

// 16 lanes of a cached row as floats: float32 as is; bfloat16 its bits shifted into a float's
// upper half (exact); float16 converted (exact); int8 converted (exact), the caller multiplying
// by the row's scale. AVX2/F16C where the build machine has them (two 8-lane halves: GCC lowers
// a 16-lane __builtin_convertvector poorly there), else the vector extension's conversions.
typedef uint16_t U16x16 __attribute__((vector_size(kLanes * 2)));
typedef uint32_t U32x16 __attribute__((vector_size(kLanes * 4)));
typedef int8_t I8x16 __attribute__((vector_size(kLanes)));

inline Vec lanes(const float* p) { return load(p); }
#if defined(__AVX2__) && defined(__F16C__)
inline Vec join(__m256 lo, __m256 hi) {
  Vec v;
  std::memcpy(&v, &lo, sizeof lo);
  std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
  return v;
}
inline Vec lanes(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(bits)), 16);
  const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(bits, 1)), 16);
  return join(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi));
}
inline Vec lanes(const c10::Half* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return join(_mm256_cvtph_ps(_mm256_castsi256_si128(bits)),
              _mm256_cvtph_ps(_mm256_extracti128_si256(bits, 1)));
}
inline Vec lanes(const int8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return join(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)),
              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8))));
}
#else
typedef _Float16 H16x16 __attribute__((vector_size(kLanes * 2)));
inline Vec lanes(const c10::BFloat16* p) {
  U16x16 bits;
  std::memcpy(&bits, p, sizeof bits);
  const U32x16 wide = __builtin_convertvector(bits, U32x16) << 16;
  Vec v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}
inline Vec lanes(const c10::Half* p) {
  H16x16 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, Vec);
}
inline Vec lanes(const int8_t* p) {
  I8x16 q;
  std::memcpy(&q, p, sizeof q);
  return __builtin_convertvector(q, Vec);
}
#endif

// Lanes j of a KV head's row as floats (int8: its values q, unscaled; `scale` is the row's s).
template <typename T>
struct RowReader {
  static constexpr bool kScaled = std::is_same_v<T, int8_t>;
  const T* row;
  float scale = 1.0f;
  RowReader(const T* r, int64_t dim) : row(r) {
    if constexpr (kScaled) std::memcpy(&scale, r + dim, sizeof scale);
  }
  Vec operator()(int64_t j) const { return lanes(row + j * kLanes); }
};

// x[i] = exp(x[i]) for x <= 0 (scores minus their max): Cephes' expf (range reduction by ln 2,
// degree-6 polynomial, ~1 ulp), written elementwise so the loop vectorizes. Below -87 the result
// is held at exp(-87) ~ 1.6e-38, nothing next to the max's exp(0) = 1.
inline void exp_in_place(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] < -87.0f ? -87.0f : x[i];
    const float k = std::nearbyint(v * 1.44269504088896341f);
    const float r = v - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
    float two_k;
    std::memcpy(&two_k, &bits, sizeof two_k);
    x[i] = p * two_k;
  }
}

// Where one sequence's K and V rows are: a row's offset in its cache is
// table[pos / block_size] * block + (pos % block_size) * token; a KV head's part is `head` further.
template <typename T>
struct Paged {
  const T* k;
  const T* v;
  const int32_t* table;
  int64_t block_size, block, token, head;   // strides in elements of T
};

// f(row, i) for the rows of tokens lo + i in [lo, hi) of `cache`, one block at a time.
template <typename T, typename F>
inline void for_each_row(const Paged<T>& s, const T* cache, int64_t lo, int64_t hi, F&& f) {
  for (int64_t pos = lo; pos < hi;) {
    const int64_t blk = pos / s.block_size, end = std::min(hi, (blk + 1) * s.block_size);
    const T* row = cache + s.table[blk] * s.block + (pos - blk * s.block_size) * s.token;
    for (; pos < end; ++pos, row += s.token) f(row, pos - lo);
  }
}

// One work item: tokens [lo, hi) of one sequence, every head. q [H, D]; part [H, D + 2] gets per
// head (sum_i p_i * v_i, max, sum_i p_i) with p_i = exp(score_i - max); scores [H, kChunk] is
// scratch. VECS = D / kLanes when known at compile time (the common head sizes), else 0.
template <typename T, int64_t VECS>
void attend_chunk(const float* q, int64_t heads, int64_t kv_heads, int64_t vecs, const Paged<T>& s,
                  int64_t lo, int64_t hi, float scale, float* part, float* scores) {
  const int64_t V = VECS ? VECS : vecs, dim = V * kLanes, group = heads / kv_heads, n = hi - lo;
  for_each_row(s, s.k, lo, hi, [&](const T* row, int64_t i) {
    for (int64_t kh = 0; kh < kv_heads; ++kh) {
      const RowReader<T> read(row + kh * s.head, dim);
      Vec key[VECS ? VECS : kMaxVecs];
      for (int64_t j = 0; j < V; ++j) key[j] = read(j);
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {   // the query heads of KV head kh
        Vec acc = load(q + h * dim) * key[0];
        for (int64_t j = 1; j < V; ++j) acc += load(q + h * dim + j * kLanes) * key[j];
        // int8: q . (s * k) as s * (q . k), one multiply per row rather than per element
        if constexpr (RowReader<T>::kScaled) scores[h * kChunk + i] = lane_sum(acc) * read.scale * scale;
        else scores[h * kChunk + i] = lane_sum(acc) * scale;
      }
    }
  });
  for (int64_t h = 0; h < heads; ++h) {
    float* p = scores + h * kChunk;
    float* out = part + h * (dim + 2);
    const float max = *std::max_element(p, p + n);
    for (int64_t i = 0; i < n; ++i) p[i] -= max;
    exp_in_place(p, n);
    out[dim] = max;
    out[dim + 1] = std::accumulate(p, p + n, 0.0f);
  }
  // Per head, its sum over the chunk's V rows in registers (a head's rows: its KV head's part),
  // each lane a chain of fused multiply-adds in token order, from zero.
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kh = h / group;
    const float* p = scores + h * kChunk;
    Vec acc[VECS ? VECS : kMaxVecs];
    for (int64_t j = 0; j < V; ++j) acc[j] = Vec{};
    for_each_row(s, s.v, lo, hi, [&](const T* row, int64_t i) {
      const RowReader<T> read(row + kh * s.head, dim);
      // int8: p * (s * v) as (p * s) * v
      const float w = RowReader<T>::kScaled ? p[i] * read.scale : p[i];
      for (int64_t j = 0; j < V; ++j) acc[j] = acc[j] + w * read(j);
    });
    for (int64_t j = 0; j < V; ++j) store(part + h * (dim + 2) + j * kLanes, acc[j]);
  }
}

// out [H, D] from a sequence's `chunks` partials (attend_chunk's, `stride` floats apart), rescaled
// to the largest max and summed in chunk order.
void combine(const float* part, int64_t chunks, int64_t stride, int64_t heads, int64_t dim,
             float* out) {
  for (int64_t h = 0; h < heads; ++h) {
    const float* first = part + h * (dim + 2);
    float max = first[dim];
    for (int64_t c = 1; c < chunks; ++c) max = std::max(max, first[c * stride + dim]);
    float* o = out + h * dim;
    std::fill(o, o + dim, 0.0f);
    float total = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* p = first + c * stride;
      const float w = std::exp(p[dim] - max);
      total += p[dim + 1] * w;
      for (int64_t d = 0; d < dim; ++d) o[d] += p[d] * w;
    }
    for (int64_t d = 0; d < dim; ++d) o[d] /= total;
  }
}

// The first position a sequence of `len` tokens attends to under window `window` (0: none).
inline int64_t window_start(int64_t len, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, len - window) : 0;
}

// Shapes, dtypes and every block id a sequence will read (its window's): a bad table must not
// read outside the cache.
void check_inputs(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                  const Tensor& tables, const Tensor& lens, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, "q [B, H, D] and caches [N, bs, Hkv, D]");
  const auto kv = k_cache.scalar_type();
  TORCH_CHECK(q.scalar_type() == at::kFloat && v_cache.scalar_type() == kv &&
              (kv == at::kFloat || kv == at::kBFloat16 || kv == at::kHalf || kv == at::kChar),
              "float32 q; float32, bfloat16, float16 or int8 caches of one dtype");
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "CPU tensors");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.strides() == v_cache.strides() &&
              k_cache.stride(3) == 1, "K and V caches of one layout, head_dim contiguous");
  const int64_t heads = q.size(1), kv_heads = k_cache.size(2), dim = q.size(2);
  TORCH_CHECK(k_cache.size(3) == dim + (kv == at::kChar ? kScaleBytes : 0),
              "cache rows of head_dim values (int8: and a float32 scale)");
  TORCH_CHECK(dim % kLanes == 0 && dim <= kLanes * kMaxVecs, "head_dim a multiple of 16, at most 256");
  TORCH_CHECK(heads % kv_heads == 0, "query heads a multiple of KV heads");
  TORCH_CHECK(window >= 0, "window ", window, " negative (0: full attention)");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == q.size(0) && lens.numel() == q.size(0),
              "one block table row and one length per sequence");
  const int64_t block_size = k_cache.size(1), num_blocks = k_cache.size(0);
  const int32_t* table = tables.data_ptr<int32_t>();
  const int32_t* len = lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < q.size(0); ++b) {
    TORCH_CHECK(len[b] >= 1 && len[b] <= tables.size(1) * block_size, "sequence length ", len[b],
                " outside [1, block table capacity]");
    for (int64_t i = window_start(len[b], window) / block_size;
         i < (len[b] + block_size - 1) / block_size; ++i) {
      const int32_t id = table[b * tables.size(1) + i];
      TORCH_CHECK(id >= 0 && id < num_blocks, "block id ", id, " outside the cache");
    }
  }
}

// Every (sequence, chunk) work item's partials into `part` ([B, chunks, H, D + 2]), over caches
// of element type T; sequence b's chunks tile [first[b], len[b]).
template <typename T>
void attend_all(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                const Tensor& tables, const int32_t* len, const std::vector<int64_t>& first,
                const std::vector<int64_t>& count, int64_t chunks, float scale, Tensor& part) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const Paged<T> cache{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(),
                       tables.data_ptr<int32_t>(), k_cache.size(1), k_cache.stride(0),
                       k_cache.stride(1), k_cache.stride(2)};
  const int64_t stride = heads * (dim + 2), kv_heads = k_cache.size(2);
  auto attend = dim == 64 ? attend_chunk<T, 4> : dim == 128 ? attend_chunk<T, 8> : attend_chunk<T, 0>;
  at::parallel_for(0, batch * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(heads * kChunk);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / chunks, c = item % chunks;
      if (c >= count[b]) continue;
      const int64_t lo = first[b] + c * kChunk, hi = std::min<int64_t>(lo + kChunk, len[b]);
      Paged<T> seq = cache;
      seq.table += b * tables.size(1);
      attend(q.data_ptr<float>() + b * heads * dim, heads, kv_heads, dim / kLanes, seq, lo, hi,
             scale, part.data_ptr<float>() + item * stride, scores.data());
    }
  });
}

}  // namespace

Tensor paged_decode_attention(const Tensor& q_in, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor& block_tables, const Tensor& seq_lens, double scale,
                              int64_t window) {
  RECORD_FUNCTION("localpaged::paged_decode_attention", std::vector<c10::IValue>());
  const Tensor q = q_in.contiguous();
  const Tensor tables = block_tables.to(at::kInt).contiguous();
  const Tensor lens = seq_lens.to(at::kInt).contiguous();
  check_inputs(q, k_cache, v_cache, tables, lens, window);
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int32_t* len = lens.data_ptr<int32_t>();
  std::vector<int64_t> first(batch), count(batch);   // per sequence: window start, its chunks
  int64_t chunks = 0;                                // per sequence, at most
  for (int64_t b = 0; b < batch; ++b) {
    first[b] = window_start(len[b], window);
    count[b] = (len[b] - first[b] + kChunk - 1) / kChunk;
    chunks = std::max(chunks, count[b]);
  }
  Tensor part = at::empty({batch, chunks, heads, dim + 2}, q.options());
  Tensor out = at::empty_like(q);
  const float s = static_cast<float>(scale);
  switch (k_cache.scalar_type()) {
    case at::kBFloat16:
      attend_all<c10::BFloat16>(q, k_cache, v_cache, tables, len, first, count, chunks, s, part);
      break;
    case at::kHalf:
      attend_all<c10::Half>(q, k_cache, v_cache, tables, len, first, count, chunks, s, part);
      break;
    case at::kChar:
      attend_all<int8_t>(q, k_cache, v_cache, tables, len, first, count, chunks, s, part);
      break;
    default:
      attend_all<float>(q, k_cache, v_cache, tables, len, first, count, chunks, s, part);
  }
  const int64_t stride = heads * (dim + 2);
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      combine(part.data_ptr<float>() + b * chunks * stride, count[b], stride, heads, dim,
              out.data_ptr<float>() + b * heads * dim);
  });
  return out;
}

Tensor kv_rows(const Tensor& x, at::ScalarType cache_dtype) {
  if (cache_dtype != at::kChar) return x.scalar_type() == cache_dtype ? x : x.to(cache_dtype);
  // kernels/kv_quant.py quantize, one (token, head) row at a time in one pass: the same float32
  // arithmetic (scale = max|x| / 127, at least FLT_MIN; q = x / scale rounded half to even, in
  // [-127, 127] since scale >= max|x| / 127), so the same bytes, without the eight ATen ops
  // (and their temporaries) per K and per V of every layer that made the int8 write slow.
  const Tensor f = x.to(at::kFloat).contiguous();
  const int64_t d = f.size(-1), n = f.numel() / d;
  std::vector<int64_t> sizes = f.sizes().vec();
  sizes.back() = d + 4;
  Tensor out = at::empty(sizes, f.options().dtype(at::kChar));
  const float* src = f.data_ptr<float>();
  int8_t* dst = out.data_ptr<int8_t>();
  for (int64_t r = 0; r < n; ++r) {
    const float* row = src + r * d;
    int8_t* o = dst + r * (d + 4);
    float amax = 0.0f;
    for (int64_t k = 0; k < d; ++k) amax = std::max(amax, std::fabs(row[k]));
    const float s = std::max(amax / 127.0f, std::numeric_limits<float>::min());
    for (int64_t k = 0; k < d; ++k) o[k] = static_cast<int8_t>(std::nearbyint(row[k] / s));
    std::memcpy(o + d, &s, sizeof(float));
  }
  return out;
}
