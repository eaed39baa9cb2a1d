// A memory read kernel for bench/machine.py's bandwidth measure (cpu_read.cpp).
#pragma once

#include <ATen/core/Tensor.h>

// The bytes of a contiguous CPU tensor summed as 64-bit integers (wrapping; a trailing part of
// under 8 bytes is left out), split over torch's threads: a result the compiler cannot drop, for
// a read of every byte at the speed of memory, not of arithmetic.
int64_t read_sum(const at::Tensor& x);
