// The decoder layers of one decode step at batch 1 on CPU (batch1_cpu.cpp, batch1_cpu.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

// x [1, hidden] float32 after the embedding; cos/sin [1, 1, D] (split_rope). Per layer, in
// `weights`: input norm, qkv, o, post-attention norm, gate_up, down, each linear's tensors as its
// kind in `kinds` (a (code, parameter) pair per linear, four per layer) says. Writes the new
// token's K/V at `slot` in every layer's cache, attends over the sequence's block table row
// [1, max_blocks] and length [1], and returns x before the final norm. `norm_kernel`: the
// model's RMSNorms run kernels/cpu_norm.cpp (else F.rms_norm).
at::Tensor decode_layers(at::Tensor x, const std::vector<at::Tensor>& weights,
                         const std::vector<int64_t>& kinds, const at::Tensor& cos,
                         const at::Tensor& sin, const std::vector<at::Tensor>& k_caches,
                         const std::vector<at::Tensor>& v_caches, const at::Tensor& slot,
                         const at::Tensor& block_table, const at::Tensor& seq_len, int64_t heads,
                         int64_t kv_heads, int64_t dim, double eps, double scale,
                         bool norm_kernel);
