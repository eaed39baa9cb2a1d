// 16-float vectors for the CPU kernels (cpu_decode.cpp, cpu_norm.cpp): the GCC/Clang vector
// extension, AVX-512 where the build machine has it (-march=native), else split into narrower
// registers by the compiler. Lane-wise arithmetic only, so no reassociation.
#pragma once

#include <cstdint>
#include <cstring>

namespace localpaged {

constexpr int64_t kLanes = 16;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* p) { Vec v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// The 16 lanes summed in a fixed tree order: lane j + 8 into j, then + 4, + 2, + 1.
inline float lane_sum(Vec a) {
  Vec b = a + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  Vec c = b + __builtin_shufflevector(b, b, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  Vec d = c + __builtin_shufflevector(c, c, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  return d[0] + d[1];
}

}  // namespace localpaged
