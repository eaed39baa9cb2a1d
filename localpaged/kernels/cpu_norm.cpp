// RMSNorm over float32 rows on CPU, as transformers writes it: x * rsqrt(mean(x^2) + eps), then
// times the weight. One pass over a row instead of torch's composite (`F.rms_norm` on CPU is
// seven ATen ops, each dispatched on its own; a SmolLM2 step has 61 of them; docs/benchmarks.md,
// 'The CPU paths, piece by piece', has the times).
// The sum of squares runs in 16 float32 lanes summed in a fixed tree, so a row's result does not
// depend on the other rows or the thread count; against the composite it differs by float32
// rounding of the sum (tests/kernels/test_cpu_norm.py). Used where the CPU extension is built when the
// model loads (models/llama.py: RMSNorm.kernel), never switched while the model serves.

#include "cpu_norm.h"
#include "cpu_vec.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <ATen/record_function.h>

#include <cmath>
#include <cstring>

using at::Tensor;

namespace {

using localpaged::kLanes;
using localpaged::lane_sum;
using localpaged::load;
using localpaged::store;
using localpaged::Vec;

void norm_row(const float* x, const float* w, float* out, int64_t H, float eps) {
  Vec acc = {};
  int64_t i = 0;
  for (; i + kLanes <= H; i += kLanes) acc += load(x + i) * load(x + i);
  float lanes[kLanes];
  store(lanes, acc);
  for (; i < H; ++i) lanes[i % kLanes] += x[i] * x[i];
  const float r = 1.0f / std::sqrt(lane_sum(load(lanes)) / static_cast<float>(H) + eps);
  for (i = 0; i < H; ++i) out[i] = (x[i] * r) * w[i];
}

}  // namespace

Tensor rms_norm(const Tensor& x_in, const Tensor& weight, double eps) {
  RECORD_FUNCTION("localpaged::rms_norm", std::vector<c10::IValue>());
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
              x_in.device().is_cpu() && weight.device().is_cpu(), "float32 CPU tensors");
  const int64_t H = weight.numel();
  TORCH_CHECK(weight.dim() == 1 && x_in.dim() >= 1 && x_in.size(-1) == H,
              "x [..., H] and weight [H]");
  const Tensor x = x_in.contiguous();
  const Tensor w = weight.contiguous();
  Tensor out = at::empty_like(x);
  const int64_t rows = x.numel() / H;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) norm_row(xp + r * H, wp, op + r * H, H, e);
  });
  return out;
}
