// A read of memory as fast as the machine can stream it, for bench/machine.py's bandwidth
// measure (the way STREAM reads: arrays far past the last-level cache, every thread on its own
// contiguous part). Each thread adds its part as 64-bit integers in four independent AVX2
// accumulators, 128 bytes a step: one add per 32-byte load, so the loads, not the adds, bound
// it. torch's own reductions (sum over float32) do more work per byte and measured below what
// the decode loop itself reads.

#include "cpu_read.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kStep = 128;                 // bytes per iteration: 4 loads of 32 bytes
constexpr int64_t kGrain = int64_t{1} << 16;   // steps: threads split the array in large parts

int64_t sum_bytes(const char* p, int64_t steps) {
#if defined(__AVX2__)
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < steps; ++i, p += kStep) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 96)));
  }
  alignas(32) int64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
  int64_t acc[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < steps; ++i, p += kStep) {
    for (int j = 0; j < 16; ++j) {
      int64_t v;
      std::memcpy(&v, p + 8 * j, 8);
      acc[j % 4] += v;
    }
  }
  return acc[0] + acc[1] + acc[2] + acc[3];
#endif
}

}  // namespace

int64_t read_sum(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "read_sum: a contiguous CPU tensor");
  const char* base = static_cast<const char*>(x.data_ptr());
  const int64_t bytes = x.numel() * static_cast<int64_t>(x.element_size());
  const int64_t steps = bytes / kStep;
  std::atomic<uint64_t> total{0};
  at::parallel_for(0, steps, kGrain, [&](int64_t begin, int64_t end) {
    total += static_cast<uint64_t>(sum_bytes(base + begin * kStep, end - begin));
  });
  uint64_t tail = 0;
  for (int64_t i = steps * kStep; i + 8 <= bytes; i += 8) {
    uint64_t v;
    std::memcpy(&v, base + i, 8);
    tail += v;
  }
  return static_cast<int64_t>(total.load() + tail);
}
