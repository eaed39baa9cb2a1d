// Grammar token masks applied to logits on CPU (engine/grammar.py: apply_mask), in place.
// A mask is xgrammar's packed bitmask, one int32 word per 32 tokens. Most words of a grammar's
// mask are all refused (0) or all allowed (-1): those cost one compare (and one fill of 32
// floats), only mixed words are read bit by bit. xgrammar's own CPU kernel reads every bit;
// bench/grammar.py times the step. The reference is kernels/reference.py: mask_logits_.

#include "cpu_mask.h"

#include <ATen/record_function.h>

#include <cstdint>
#include <limits>

void mask_logits_(at::Tensor& logits, const at::Tensor& bitmask) {
  RECORD_FUNCTION("localpaged::mask_logits_", std::vector<c10::IValue>());
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.device().is_cpu() && logits.dim() == 2 &&
              logits.stride(1) == 1, "logits: float32 CPU [S, V] with contiguous rows");
  TORCH_CHECK(bitmask.scalar_type() == at::kInt && bitmask.device().is_cpu() && bitmask.dim() == 2 &&
              bitmask.is_contiguous(), "bitmask: contiguous int32 CPU [S, W]");
  const int64_t S = logits.size(0), V = logits.size(1), W = bitmask.size(1);
  TORCH_CHECK(bitmask.size(0) == S && W * 32 >= V, "bitmask [S, ceil(V / 32)] for logits [S, V]");
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < S; ++s) {
    float* row = logits.data_ptr<float>() + s * logits.stride(0);
    const uint32_t* words = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>()) + s * W;
    for (int64_t w = 0; w * 32 < V; ++w) {
      const uint32_t word = words[w];
      if (word == 0xFFFFFFFFu) continue;
      float* x = row + w * 32;
      const int64_t n = V - w * 32 < 32 ? V - w * 32 : 32;
      if (word == 0) {
        for (int64_t j = 0; j < n; ++j) x[j] = ninf;
      } else {
        for (int64_t j = 0; j < n; ++j)
          if (!((word >> j) & 1u)) x[j] = ninf;
      }
    }
  }
}
