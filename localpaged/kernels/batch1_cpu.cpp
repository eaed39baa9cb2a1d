// The decoder layers of one decode step at batch 1 on CPU (see runner/batch1_cpu.py).
//
// The same ATen calls, in the same order and with the same arguments, as the Python path:
// models/llama.py (RMSNorm in float32: F.rms_norm or kernels/cpu_norm.cpp; rotate, Attention,
// MLP, DecoderLayer), models/linear.py (Linear), quant/cpu.py (CpuInt4Weight.matmul),
// quant/cpu_tiles.py (CpuInt4Tiles.matmul, the kernel of kernels/cpu_int4.cpp), quant/ggml.py
// (GgmlWeight.matmul, the kernel of kernels/cpu_ggml.cpp; PartsWeight via quant/linear.py) and
// kernels/cpu_ops.py (write_kv, then the decode kernel of kernels/cpu_decode.cpp). So the result is bitwise the Python path's with the
// `cpu` attention backend; only the interpreter between the calls is gone. A change to any of
// those functions must be made here too (tests/kernels/test_batch1_cpu.py compares the two).

#include "batch1_cpu.h"

#include "cpu_decode.h"
#include "cpu_ggml.h"
#include "cpu_int4.h"
#include "cpu_norm.h"

#include <ATen/TensorOperators.h>   // x * y, x + y on tensors
#include <ATen/ops/_weight_int4pack_mm_for_cpu.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/silu.h>

using at::Tensor;

namespace {

// One decoder linear, as the Python module computes x [R, K] (R = 1, or a draft's rows). `kind`
// is (code, parameter), the code saying which module (runner/batch1_cpu.py: _layout) and which tensors
// `w` points at; `w` is advanced past them. code | kBias: a QuantLinear's bias follows, added as QuantLinear.forward
// adds it.
enum Code : int64_t {
  kLinear = 0,     // F.linear: (weight)
  kSplit = 1,      // models/linear.py times_blocks over `parameter` row blocks, one bmm:
                   // (the weight's row_blocks, [parameter, K, N / parameter]; the weight,
                   // for several rows: F.linear on the very tensor Linear uses)
  kInt4Torch = 2,  // CpuInt4Weight.matmul, group size `parameter`: (packed, scales_zeros), bf16
                   // activations into torch's packed int4 op, the result back in x's dtype
  kInt4Tiles = 3,  // CpuInt4Tiles.matmul, group size `parameter`: (packed, scales, mins)
  kGgml = 4,       // GgmlWeight.matmul, GGML type number `parameter`: (data)
  kGgmlParts = 5,  // PartsWeight of `parameter` GgmlWeights: (type numbers int64 [parameter],
                   // then each part's data), the outputs concatenated
};
constexpr int64_t kBias = 16;

Tensor unbiased(const Tensor& x, int64_t code, int64_t parameter, const Tensor*& w) {
  switch (code) {
    case kGgml:
      return ggml_matmul(x.contiguous(), *w++, parameter);
    case kGgmlParts: {
      const Tensor& types = *w++;
      std::vector<Tensor> parts;
      for (int64_t i = 0; i < parameter; ++i) parts.push_back(ggml_matmul(x.contiguous(), *w++, types[i].item<int64_t>()));
      return at::cat(parts, -1);
    }
    case kInt4Torch: {
      Tensor y = at::_weight_int4pack_mm_for_cpu(x.to(at::kBFloat16).contiguous(), w[0], parameter, w[1]);
      w += 2;
      return y.to(x.scalar_type());
    }
    case kInt4Tiles: {
      Tensor y = int4_matmul(x, w[0], w[1], w[2], parameter);
      w += 3;
      return y;
    }
    case kSplit: {   // one row: the threaded bmm; several (a draft's rows): F.linear, as Linear
      const Tensor& blocks = w[0];
      const Tensor& weight = w[1];
      w += 2;
      if (x.size(0) > 1) return at::linear(x, weight);
      return at::bmm(x.expand({parameter, 1, blocks.size(1)}), blocks).view({1, parameter * blocks.size(2)});
    }
    default:
      return at::linear(x, *w++);
  }
}

Tensor linear(const Tensor& x, const int64_t* kind, const Tensor*& w) {
  Tensor y = unbiased(x, kind[0] & ~kBias, kind[1], w);
  if (kind[0] & kBias) y = y + *w++;
  return y;
}

}  // namespace

// See batch1_cpu.h.
Tensor decode_layers(Tensor x, const std::vector<Tensor>& weights, const std::vector<int64_t>& kinds,
                     const Tensor& cos, const Tensor& sin, const std::vector<Tensor>& k_caches,
                     const std::vector<Tensor>& v_caches, const Tensor& slot,
                     const Tensor& block_table, const Tensor& seq_len,
                     int64_t heads, int64_t kv_heads, int64_t dim, double eps, double scale,
                     bool norm_kernel) {
  const int64_t rows = x.size(0), hidden = x.size(1), qk_width = (heads + kv_heads) * dim;
  // RMSNorm: the extension's kernel where the model's norms use it, else F.rms_norm's op
  auto norm = [&](const Tensor& t, const Tensor& weight) {
    return norm_kernel ? rms_norm(t, weight, eps) : at::rms_norm(t, {hidden}, weight, eps);
  };
  const Tensor* w = weights.data();
  for (size_t l = 0; l < k_caches.size(); ++l) {
    const int64_t* kind = &kinds[8 * l];
    const Tensor& k_cache = k_caches[l];
    const Tensor& v_cache = v_caches[l];
    const int64_t slots = k_cache.size(0) * k_cache.size(1);
    // attention
    Tensor h = norm(x, *w++);
    Tensor qkv = linear(h, kind, w);
    Tensor v = qkv.slice(1, qk_width).view({rows, kv_heads, dim});
    Tensor qk = qkv.slice(1, 0, qk_width).view({rows, heads + kv_heads, dim});
    qk = qk * cos + qk.roll({dim / 2}, {-1}) * sin;
    // write_kv: rows as the cache stores them (kv_rows: as is for float32, int8 quantized)
    const int64_t width = k_cache.size(3);   // dim, or dim + 4 for int8 (kernels/kv_quant.py)
    k_cache.view({slots, kv_heads, width}).index_copy_(0, slot, kv_rows(qk.slice(1, heads), k_cache.scalar_type()));
    v_cache.view({slots, kv_heads, width}).index_copy_(0, slot, kv_rows(v, v_cache.scalar_type()));
    Tensor out = paged_decode_attention(qk.slice(1, 0, heads), k_cache, v_cache, block_table,
                                        seq_len, scale);
    x = x + linear(out.reshape({rows, heads * dim}), kind + 2, w);
    // MLP
    h = norm(x, *w++);
    Tensor gate_up = linear(h, kind + 4, w);
    const int64_t half = gate_up.size(-1) / 2;
    x = x + linear(at::silu(gate_up.slice(-1, 0, half)) * gate_up.slice(-1, half), kind + 6, w);
  }
  return x;
}
