// RMSNorm over float32 rows on CPU (cpu_norm.cpp).
#pragma once

#include <ATen/core/Tensor.h>

// x [..., H] float32, weight [H] float32 -> (x * rsqrt(mean(x^2) + eps)) * weight, per row.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
