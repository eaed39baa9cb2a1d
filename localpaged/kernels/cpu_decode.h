// Paged decode attention on CPU (cpu_decode.cpp): the `cpu` attention backend's decode kernel.
#pragma once

#include <ATen/core/Tensor.h>

// One query token per sequence: q [B, H, D] float32 attends to the seq_lens[b] tokens that
// block_tables[b] ([B, max_blocks] int32) points at in k_cache / v_cache
// ([num_blocks, block_size, Hkv, D] float32, bfloat16 or float16, or [..., D + 4] int8 rows with
// their float32 scale: kernels/kv_quant.py). Returns [B, H, D] float32. With a sliding window W > 0
// only its last W tokens are attended to, and table entries of blocks wholly before them are
// never read (they may hold any id).
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, double scale, int64_t window = 0);

// x [..., D] as rows of a cache of dtype cache_dtype (kernels/kv_quant.py `store`): x itself for
// a cache of x's dtype, converted for bfloat16/float16, quantized ([..., D + 4]) for int8.
at::Tensor kv_rows(const at::Tensor& x, at::ScalarType cache_dtype);
