// The decoder layers of one decode step of one sequence on CPU (batch1_cpu.cpp, runner/batch1_cpu.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

// x [R, hidden] float32 after the embedding: R = 1 decoding token, or 1 + d rows of one sequence
// verifying a draft of d tokens (row j at the next position after row j - 1); cos/sin [R, 1, D]
// (split_rope). Per layer, in `weights`: input norm, qkv, o, post-attention norm, gate_up, down,
// each linear's tensors as its kind in `kinds` (a (code, parameter) pair per linear, four per
// layer) says. Writes the rows' K/V at `slot` [R] in every layer's cache, row j attends over its
// block table row [R, max_blocks] and length seq_len[j], and returns x before the final norm.
// `norm_kernel`: the model's RMSNorms run kernels/cpu_norm.cpp (else F.rms_norm).
at::Tensor decode_layers(at::Tensor x, const std::vector<at::Tensor>& weights,
                         const std::vector<int64_t>& kinds, const at::Tensor& cos,
                         const at::Tensor& sin, const std::vector<at::Tensor>& k_caches,
                         const std::vector<at::Tensor>& v_caches, const at::Tensor& slot,
                         const at::Tensor& block_table, const at::Tensor& seq_len, int64_t heads,
                         int64_t kv_heads, int64_t dim, double eps, double scale,
                         bool norm_kernel);
