// Matmul over GGUF quantized-block weights kept as their file bytes (cpu_ggml.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

// x float32 [M, K] contiguous, w uint8 [N, row_bytes] (row n: the K / block_elems GGUF blocks of
// output row n; rows may lie further apart than row_bytes, w.stride(0)), type_id the GGML type
// number (gguf.GGMLQuantizationType) -> y float32 [M, N] = x @ dequantize(w).T up to the int8
// quantization of x (see cpu_ggml.cpp for the arithmetic and the tolerance).
// type_id | ggml_interleaved_flag(): w in the interleaved layout (x8) that ggml_interleave makes.
at::Tensor ggml_matmul(const at::Tensor& x, const at::Tensor& w, int64_t type_id);

// The same bytes as w (contiguous, N a multiple of 8), each group of 8 rows interleaved, into
// out (as many bytes): the layout of the batch-1 kernels (cpu_ggml.cpp, "x8"). Only the types of
// ggml_interleaved_types().
void ggml_interleave(const at::Tensor& w, int64_t type_id, const at::Tensor& out);

// The GGML types this build keeps interleaved (it has their batch-1 x8 kernels); empty: none.
std::vector<int64_t> ggml_interleaved_types();

// The flag added to a type number for weights in the x8 layout.
int64_t ggml_interleaved_flag();

// This build's table of GGML types, (type number, elements, bytes) per block, flattened: the
// Python side's ggml_reference.FORMATS must agree (tests/kernels/test_ggml_types.py).
std::vector<int64_t> ggml_type_table();

// Which kernels this build runs: "avx2" (AVX2 + FMA + F16C), else "scalar" (plain C++).
std::string ggml_kernel_path();

// Whether ggml_matmul takes this GGML type number.
bool ggml_supported(int64_t type_id);
