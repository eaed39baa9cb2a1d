// Int4 weight-only matmul on CPU over the "tiles" layout (cpu_int4.cpp; quant/cpu_tiles.py: CpuInt4Tiles).
#pragma once

#include <ATen/core/Tensor.h>

// x [M, K] float32 -> [M, N] float32 with w[n, k] = q[n, k] * scales[k / G, n] + mins[k / G, n]:
// packed int32 [N / 32, K / 8, 2, 16] (see cpu_int4.cpp), scales and mins float16 [K / G, N].
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& mins, int64_t group_size);

// Whether this build multiplies with AVX-512 BF16 dot products (else a slow portable loop).
bool int4_vectorized();
