// Matmul over GGUF quantized-block weights kept as their file bytes (cpu_ggml.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

// x float32 [M, K] contiguous, w uint8 [N, row_bytes] (row n: the K / block_elems GGUF blocks of
// output row n; rows may lie further apart than row_bytes, w.stride(0)), type_id the GGML type
// number (gguf.GGMLQuantizationType) -> y float32 [M, N] = x @ dequantize(w).T up to the int8
// quantization of x (see cpu_ggml.cpp for the arithmetic and the tolerance).
at::Tensor ggml_matmul(const at::Tensor& x, const at::Tensor& w, int64_t type_id);

// Which kernels this build runs: "avx2" (AVX2 + FMA + F16C), else "scalar" (plain C++).
std::string ggml_kernel_path();

// Whether ggml_matmul takes this GGML type number.
bool ggml_supported(int64_t type_id);
