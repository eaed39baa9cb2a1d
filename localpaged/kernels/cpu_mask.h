// Grammar token masks applied to logits on CPU (cpu_mask.cpp).
#pragma once

#include <ATen/core/Tensor.h>

// logits [S, V] float32 (rows contiguous), bitmask [S, ceil(V / 32)] int32 packed as xgrammar
// packs it (bit j of word w allows token 32 w + j): refused tokens' logits become -inf, in place.
void mask_logits_(at::Tensor& logits, const at::Tensor& bitmask);
