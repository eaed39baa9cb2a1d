// The decoder layers of one decode step at batch 1 on CPU (see batch1_cpu.py).
//
// The same ATen calls, in the same order and with the same arguments, as the Python path:
// models/llama.py (RMSNorm in float32, rotate, Attention, MLP, DecoderLayer), models/linear.py
// (Linear), quant/cpu.py (CpuInt4Weight.matmul) and kernels/reference.py (decode_one,
// _attend_runs, _run_view). So the result is bitwise the Python path's; only the interpreter
// between the calls is gone. A change to any of those functions must be made here too
// (tests/test_batch1_cpu.py compares the two).

#include <torch/extension.h>

using at::Tensor;

namespace {

// One decoder linear, as the Python module computes a [1, K] row. `kind` says which module:
//   kind < 0: CpuInt4Weight.matmul, group size -kind, tensors (packed, scales_zeros): bf16
//             activations into torch's packed int4 op, the result back in x's dtype;
//   kind = 0: F.linear, tensor (weight);
//   kind > 1: models/linear.py times_blocks over `kind` row blocks (one bmm), tensor (the
//             weight's row_blocks, [kind, K, N / kind]).
// `w` points at the linear's tensors and is advanced past them.
Tensor linear(const Tensor& x, int64_t kind, const Tensor*& w) {
  if (kind < 0) {
    Tensor y = at::_weight_int4pack_mm_for_cpu(x.to(at::kBFloat16).contiguous(), w[0], -kind, w[1]);
    w += 2;
    return y.to(x.scalar_type());
  }
  const Tensor& weight = *w++;
  if (kind == 0) return at::linear(x, weight);
  return at::bmm(x.expand({kind, 1, weight.size(1)}), weight).view({1, kind * weight.size(2)});
}

// _run_view: tokens [first, first + length) of a cache as [1, Hkv, length, D], no copy.
Tensor run_view(const Tensor& cache, int64_t first, int64_t length) {
  return cache.as_strided({1, cache.size(2), length, cache.size(3)},
                          {0, cache.stride(2), cache.stride(1), cache.stride(3)},
                          cache.storage_offset() + first * cache.stride(1));
}

// _attend_runs: one SDPA call over the runs, joined by a copy when there are several.
Tensor attend_runs(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                   const std::vector<int64_t>& firsts, const std::vector<int64_t>& lengths,
                   double scale) {
  const int64_t heads = q.size(1), kv_heads = k_cache.size(2), dim = q.size(2);
  Tensor qg = q.view({1, kv_heads, heads / kv_heads, dim});
  Tensor keys, values;
  if (firsts.size() == 1) {
    keys = run_view(k_cache, firsts[0], lengths[0]);
    values = run_view(v_cache, firsts[0], lengths[0]);
  } else {
    std::vector<Tensor> ks, vs;
    for (size_t i = 0; i < firsts.size(); ++i) {
      ks.push_back(run_view(k_cache, firsts[i], lengths[i]));
      vs.push_back(run_view(v_cache, firsts[i], lengths[i]));
    }
    keys = at::cat(ks, 2);
    values = at::cat(vs, 2);
  }
  return at::scaled_dot_product_attention(qg, keys, values, {}, 0.0, false, scale)
      .view({1, heads, dim});
}

}  // namespace

// x [1, hidden] float32 after the embedding; cos/sin [1, 1, D] (split_rope). Per layer, in
// `weights`: input norm, qkv, o, post-attention norm, gate_up, down, each linear's tensors as its
// kind in `kinds` (four per layer) says. Writes the new token's K/V at `slot` in every layer's
// cache, returns x before the final norm.
Tensor decode_layers(Tensor x, const std::vector<Tensor>& weights, const std::vector<int64_t>& kinds,
                     const Tensor& cos, const Tensor& sin, const std::vector<Tensor>& k_caches,
                     const std::vector<Tensor>& v_caches, const Tensor& slot,
                     const std::vector<int64_t>& run_firsts, const std::vector<int64_t>& run_lengths,
                     int64_t heads, int64_t kv_heads, int64_t dim, double eps, double scale) {
  const int64_t hidden = x.size(1), qk_width = (heads + kv_heads) * dim;
  const Tensor* w = weights.data();
  for (size_t l = 0; l < k_caches.size(); ++l) {
    const int64_t* kind = &kinds[4 * l];
    const Tensor& k_cache = k_caches[l];
    const Tensor& v_cache = v_caches[l];
    const int64_t slots = k_cache.size(0) * k_cache.size(1);
    // attention
    Tensor h = at::rms_norm(x, {hidden}, *w++, eps);
    Tensor qkv = linear(h, kind[0], w);
    Tensor v = qkv.slice(1, qk_width).view({1, kv_heads, dim});
    Tensor qk = qkv.slice(1, 0, qk_width).view({1, heads + kv_heads, dim});
    qk = qk * cos + qk.roll({dim / 2}, {-1}) * sin;
    k_cache.view({slots, kv_heads, dim}).index_copy_(0, slot, qk.slice(1, heads));
    v_cache.view({slots, kv_heads, dim}).index_copy_(0, slot, v);
    Tensor out = attend_runs(qk.slice(1, 0, heads), k_cache, v_cache, run_firsts, run_lengths, scale);
    x = x + linear(out.reshape({1, heads * dim}), kind[1], w);
    // MLP
    h = at::rms_norm(x, {hidden}, *w++, eps);
    Tensor gate_up = linear(h, kind[2], w);
    const int64_t half = gate_up.size(-1) / 2;
    x = x + linear(at::silu(gate_up.slice(-1, 0, half)) * gate_up.slice(-1, half), kind[3], w);
  }
  return x;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // ATen needs no GIL: the server's threads (streaming, HTTP) run while a step computes
  m.def("decode_layers", &decode_layers, "decoder layers of a batch-1 CPU decode step",
        py::call_guard<py::gil_scoped_release>());
}
