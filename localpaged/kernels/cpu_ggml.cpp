// GGUF quantized-block matmul on CPU: y = x @ dequantize(w).T, with w kept as its file bytes.
//
// Layout: w is uint8 [N, row_bytes], row n holding the K / E blocks of output row n in GGUF's
// byte layout (E elements per block; the spec is gguf-py's numpy dequantizer, gguf/quants.py).
// Rows may lie further apart than row_bytes (w.stride(0)). Formats, E and bytes per block:
//   32-element blocks, w = d * (q - o) or d * q + m:   Q4_0 (18 B), Q4_1 (20), Q5_0 (22),
//     Q5_1 (24), Q8_0 (34), IQ4_NL (18, q through a 16-entry int8 table)
//   256-element "K" blocks of 8 or 16 sub-blocks with 4-8 bit integer sub-scales:
//     Q2_K (84 B), Q3_K (110), Q4_K (144), Q5_K (176), Q6_K (210), IQ4_XS (136)
//
// The arithmetic (as llama.cpp's CPU backend does it):
// 1. Each row of x is quantized once per call to int8 per block, a = round(x / s) with
//    s = max|x| / 127 over the block: blocks of 256 for the K formats (with the sums of every 16
//    values, int16, and s times them, for the sub-block mins and offsets), blocks of 32 for the
//    32-element formats (with s times the block's sum).
// 2. Per weight block, the integer dot products of the weights' codes with a, exact in int32:
//    AVX2 `_mm256_maddubs_epi16` (u8 code x s8 a, adjacent pairs summed -> int16: at most
//    2 * 128 * 127 < 2^15), then `_mm256_madd_epi16` by the sub-block scales (K formats) or by 1
//    (pairs summed -> int32). Unsigned codes (<= 63: all but Q8_0, IQ4_NL, IQ4_XS) leave room
//    for one more pairwise add, so `_mm256_hadd_epi16` joins the products of two 32-element
//    chunks (or blocks) and one madd serves both. With VNNI (AVX-VNNI or AVX512-VNNI, 256-bit)
//    `dpbusd` makes the 4-element sums in one instruction, `packs_epi32` joins two chunks' and
//    `dpwssd` multiplies by the scales and adds: the same integers in fewer micro-ops
//    (bench/ggml_kernels.py measures the gain). Signed codes go through the sign trick,
//    maddubs(|w|, a * sign(w)). Integer offsets stay integers: Q6_K's q - 32 and Q3_K's q - 4 as
//    -32 (-4) * sum_i sc_i * sum16_i in the block's int32 sum; Q4_0's q - 8, Q5_0's q - 16 and
//    the mins of Q4_1 / Q5_1 as coefficient * (s * sum) in float.
// 3. K formats: per block the exact int32 sums sumi = sum_j sc_j * (codes_j . a_j) (offsets
//    included) and, for Q2_K, Q4_K, Q5_K, summ = sum_j m_j * (sum of a over j), then one float
//    per row: acc = fma(d * s, sumi, acc); acc = fma(-dmin * s, summ, acc), blocks in order.
//    Every path (plain C++, AVX2, AMX) computes these same integers and float operations, so a
//    K format's y is bitwise the same on every path and build. 32-element formats: block b's
//    exact int32 sum into float lane b % 8: lane = fma(d * s, sum, lane); lane = fma(coefficient,
//    s * (sum of a), lane); then the 8 lanes summed in one order (hsum). The AVX2 tiles gather 8
//    blocks' sums into the 8 lanes of one vector (hadd), the AMX tiles keep the lanes in memory:
//    the same y, bitwise (the plain C++ path keeps one accumulator: within the bound only).
//
// Invariants: each y[m, n] is computed by one thread, from row m of x alone, in a fixed order
// (blocks in order into 8 float lanes, then one fixed lane sum), so it is bitwise the same
// whatever M is, whatever the other rows are, however rows are tiled and on any thread count.
// The work is split over output rows n: groups of rows (~64 KB of weights), each thread of one
// at::parallel_for region taking its own contiguous share of them first (Items). Within a group,
// tiles of up to kTileRows rows of x: each weight block is unpacked once per tile (nibbles ->
// bytes, scales -> int16 lanes) and multiplied with every row of the tile, so each weight byte
// is read once from memory and, for M > 4, again from the L2 cache.
//
// Tolerance against float32 math on the dequantized weights: the quantization of x moves each
// x_k by at most s_k / 2 = max|x over k's block| / 254 (a value below that rounds to 0: by at
// most |x_k|), so |y - x @ W.T| <= sum_k |W[n, k]| * max|x over k's block| / 254, plus float32
// rounding (~1e-6 relative to sum_k |x_k W[n, k]|). Random data stays within 0.1-0.3 of that
// bound (the errors add up like a random walk); tests/kernels/test_cpu_ggml.py checks the bound itself.
// The rounding of x is llama.cpp's: on the same bytes its outputs and these agree to ~3e-8 of
// sum_k |x_k W[n, k]| for the K formats, ~3e-5 for the others (llama.cpp keeps s in float16).
//
// Paths: AVX2 + FMA + F16C (every format; -march=native on x86-64 since Haswell / Zen), else
// plain C++ (any CPU; the compiler vectorizes what it can). On Intel CPUs with AMX (Sapphire
// Rapids on; built with -march=native there), batches of 10 rows and more go through the int8
// tile unit instead, bitwise the AVX2 tiles' y (see the AMX section; LOCALPAGED_GGML_AMX=0 turns it off).
// ggml_kernel_path() says which ("avx2+amx" where the tiles are in use). On the vector paths
// Q4_K, Q5_K and Q6_K matrices with N a multiple of 8 are kept interleaved by groups of 8 rows (x8,
// made once at load: ggml_interleave; type_id | kInterleaved): their own loops for 1-4 rows of
// x at a time, lane r of each product row r's, bitwise the same y (see the x8 section): batch 1
// reads one linear stream with no horizontal sums, and the same loops serve larger batches below
// the AMX tiles (every batch without AMX on AVX2 builds; bench/ggml_kernels.py measures both
// layouts). With AVX-512 VNNI and no AMX tiles in use, batches of 2 rows and more take the x8
// groups two at a time (16 weight rows in a zmm: the pairs), for larger batches each pair
// unpacked once into a panel its tiles read (see cpu_ggml_avx512.inc); with AVX2 alone, larger
// batches unpack each x8 group into a panel the same way (cpu_ggml_x8_panel.inc); with AVX-512
// VNNI and no AMX the 32-element formats' larger batches unpack each 16 rows into a panel
// (cpu_ggml_avx512_b.inc). The same integers and float order, so y is bitwise the same.
//
// Files: cpu_ggml_common.h holds what every path reads (the instruction-set macros, the types'
// table, constants, the activations' quantization, the x8 layout's moves); this file the
// per-format table of every path's kernels (kFormatKernels), the dispatch and the entry points.
// Each path's kernels are a fragment of this translation unit, included inside its anonymous
// namespace: cpu_ggml_scalar.inc (plain C++), cpu_ggml_avx2.inc (AVX2 / VNNI over GGUF's rows),
// cpu_ggml_x8.inc (the interleaved layout's loops), cpu_ggml_x8_panel.inc (its 256-bit panels),
// cpu_ggml_avx512.inc (512-bit tiles, 5-9 rows over GGUF's rows; the x8 layout's pairs and
// panels), cpu_ggml_avx512_b.inc (the 32-element formats' panels), cpu_ggml_amx.inc (AMX tiles).
//
// Speed: bench/ggml_kernels.py times this kernel at Qwen2.5-1.5B's shapes (M = 1 streamed from
// DRAM, M = 8, M = 512) beside torch float32 on the dequantized weights and llama.cpp's ggml on
// the same bytes; docs/benchmarks.md ('Real models') has the figures and their machines. On a CPU
// that issues maddubs and madd on one pipe (AMD Zen 1) batch 1 is bound by those multiplies, not
// by memory; the AMX tiles unpack each panel of weights once per call, a fixed cost that batches
// below kAmxMinRows rows do not pay back (see the AMX section).

#include "cpu_ggml_common.h"

namespace {

#include "cpu_ggml_scalar.inc"

#ifdef LOCALPAGED_GGML_AVX2
#include "cpu_ggml_avx2.inc"
#include "cpu_ggml_x8.inc"
#include "cpu_ggml_x8_panel.inc"
#ifdef LOCALPAGED_GGML_AVX512
#include "cpu_ggml_avx512.inc"
#include "cpu_ggml_avx512_b.inc"
#endif
#ifdef LOCALPAGED_GGML_AMX
#include "cpu_ggml_amx.inc"
#endif
#endif  // LOCALPAGED_GGML_AVX2

// Asks for a weight row's cache lines ahead of its use: a row streamed from DRAM at batch 1 is
// otherwise read far below the machine's bandwidth (the hardware prefetchers do not run far enough
// ahead of one core's loads). The AVX2 batch-1 loops ask block by block instead, spread over
// their work, which streams faster than whole rows ahead (bench/ggml_kernels.py measures it).
inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 3);
}

// Every path's kernels, one row per GGML format: the table the dispatch reads (nullptr: this
// build, or this format, has no kernel on that path). The instruction-set macros of
// cpu_ggml_common.h decide which columns a build fills.
#ifdef LOCALPAGED_GGML_AVX2
#define LP_AVX2(...) __VA_ARGS__
#else
#define LP_AVX2(...) nullptr
#endif
#ifdef LOCALPAGED_GGML_AVX512
#define LP_AVX512(...) __VA_ARGS__
#else
#define LP_AVX512(...) nullptr
#endif
// prefill panels: the x8 K formats' (pairs with AVX-512 VNNI, else single groups with AVX2), the
// 32-element formats' (AVX-512 VNNI)
#if defined(LOCALPAGED_GGML_AVX512)
#define LP_PANEL(F) panel_kernels<F>()
#define LP_B_PANEL(F) b_panel_kernels<F>()
#elif defined(LOCALPAGED_GGML_AVX2)
#define LP_PANEL(F) x8_panel_kernels<F>()
#define LP_B_PANEL(F) PanelKernels{}
#else
#define LP_PANEL(F) PanelKernels{}
#define LP_B_PANEL(F) PanelKernels{}
#endif
#ifdef LOCALPAGED_GGML_AMX
#define LP_AMX(...) __VA_ARGS__
#else
#define LP_AMX(...) nullptr
#endif

struct FormatKernels {
  int id;
  TileFn scalar;   // plain C++, kScalarTileRows rows of x a tile (every CPU)
  TileFn avx2;     // AVX2 / VNNI over GGUF's rows, kTileRows rows a tile
  TileFn wide;     // AVX-512 tiles of the K formats, kWideRows rows, for batches above kTileRows
  X8Fn x8;         // the interleaved (x8) layout's loops; nullptr: the format is not interleaved
  PairFn pair;     // the x8 layout's 512-bit loops over two groups, for batches from kPairMinRows
  PanelKernels panel;   // prefill on panels (from panel.min_rows rows), unpack nullptr: none
  AmxFn amx;       // AMX tiles, from amx_min_rows rows
};

const FormatKernels kFormatKernels[] = {
    {kQ4_0, scalar_b_tile<unpack_q4_0, 18>, LP_AVX2(avx_tile<AvxQ4_0, false>), nullptr, nullptr, nullptr, LP_B_PANEL(AvxQ4_0),
     LP_AMX(amx_b_matmul<AvxQ4_0>)},
    {kQ4_1, scalar_b_tile<unpack_q4_1, 20>, LP_AVX2(avx_tile<AvxQ4_1, false>), nullptr, nullptr, nullptr, LP_B_PANEL(AvxQ4_1),
     LP_AMX(amx_b_matmul<AvxQ4_1>)},
    {kQ5_0, scalar_b_tile<unpack_q5_0, 22>, LP_AVX2(avx_tile<AvxQ5_0, false>), nullptr, nullptr, nullptr, LP_B_PANEL(AvxQ5_0),
     LP_AMX(amx_b_matmul<AvxQ5_0>)},
    {kQ5_1, scalar_b_tile<unpack_q5_1, 24>, LP_AVX2(avx_tile<AvxQ5_1, false>), nullptr, nullptr, nullptr, LP_B_PANEL(AvxQ5_1),
     LP_AMX(amx_b_matmul<AvxQ5_1>)},
    {kQ8_0, scalar_b_tile<unpack_q8_0, 34>, LP_AVX2(avx_tile<AvxQ8_0, false>), nullptr, nullptr, nullptr, LP_B_PANEL(AvxQ8_0),
     LP_AMX(amx_b_matmul<AvxQ8_0>)},
    {kIQ4_NL, scalar_b_tile<unpack_iq4_nl, 18>, LP_AVX2(avx_tile<AvxIQ4NL, false>), nullptr, nullptr, nullptr, LP_B_PANEL(AvxIQ4NL),
     LP_AMX(amx_b_matmul<AvxIQ4NL>)},
    {kQ2_K, scalar_k_tile<unpack_q2_k, 84>, LP_AVX2(avx_tile<AvxQ2K, true>),
     LP_AVX512(wide_k_tile<AvxQ2K>), nullptr, nullptr, {}, LP_AMX(amx_matmul<AvxQ2K>)},
    {kQ3_K, scalar_k_tile<unpack_q3_k, 110>, LP_AVX2(avx_tile<AvxQ3K, true>),
     LP_AVX512(wide_k_tile<AvxQ3K>), nullptr, nullptr, {}, LP_AMX(amx_matmul<AvxQ3K>)},
    {kQ4_K, scalar_k_tile<unpack_q4_k, 144>, LP_AVX2(avx_tile<AvxQ4K, true>),
     LP_AVX512(wide_k_tile<AvxQ4K>), LP_AVX2(x8_tile<X8Q4K>), LP_AVX512(pair_tile<X8Q4K>), LP_PANEL(X8Q4K),
     LP_AMX(amx_matmul<AvxQ4K>)},
    {kQ5_K, scalar_k_tile<unpack_q5_k, 176>, LP_AVX2(avx_tile<AvxQ5K, true>),
     LP_AVX512(wide_k_tile<AvxQ5K>), LP_AVX2(x8_tile<X8Q5K>), LP_AVX512(pair_tile<X8Q5K>), LP_PANEL(X8Q5K),
     LP_AMX(amx_matmul<AvxQ5K>)},
    {kQ6_K, scalar_k_tile<unpack_q6_k, 210>, LP_AVX2(avx_tile<AvxQ6K, true>),
     LP_AVX512(wide_k_tile<AvxQ6K>), LP_AVX2(x8_tile<X8Q6K>), LP_AVX512(pair_tile<X8Q6K>), LP_PANEL(X8Q6K),
     LP_AMX(amx_matmul<AvxQ6K>)},
    {kIQ4_XS, scalar_k_tile<unpack_iq4_xs, 136>, LP_AVX2(avx_tile<AvxIQ4XS, true>), nullptr, nullptr, nullptr, {},
     LP_AMX(amx_matmul<AvxIQ4XS>)},
};
static_assert(sizeof(kFormatKernels) / sizeof(kFormatKernels[0]) == sizeof(kTypes) / sizeof(kTypes[0]),
              "one row of kernels for each of kTypes");

// The kernels of a type; nullptr: not a type of kTypes.
const FormatKernels* find_kernels(int id) {
  for (const FormatKernels& k : kFormatKernels)
    if (k.id == id) return &k;
  return nullptr;
}

const FormatKernels& kernels_of(int id) {
  const FormatKernels* k = find_kernels(id);
  TORCH_CHECK(k != nullptr, "ggml_matmul: no kernel for GGML type ", id);
  return *k;
}

// The tile function of a type, the rows it takes at once, and whether it asks for its weights'
// lines itself at batch 1 (tm == 1).
struct Kernel {
  TileFn fn;
  int64_t rows;
  bool prefetches = false;
};

Kernel kernel_for(int id, int64_t M) {
  const FormatKernels& k = kernels_of(id);
#ifdef LOCALPAGED_GGML_AVX512
  // up to kTileRows rows of x the 256-bit tiles are faster (bench/ggml_kernels.py measures both)
  if (M > kTileRows && k.wide) return {k.wide, kWideRows, true};
#endif
  (void)M;
  if (k.avx2) return {k.avx2, kTileRows, true};   // every format has one where AVX2 is built
  return {k.scalar, kScalarTileRows};             // other CPUs
}

// Items [0, n) in one contiguous share per thread: take(t) gives thread t its share's items
// from the front, in order, then the other shares' from their backs; -1 when none is left.
// A share is one linear range of the weights, so each thread's prefetch runs on into its own
// next item; one shared counter (items in turn to whichever thread asks) would interleave the
// threads' reads and streams slower at batch 1 (bench/ggml_kernels.py measures it).
class Items {
 public:
  Items(int64_t n, int64_t shares) : shares_(shares), range_(new Range[shares]) {
    for (int64_t t = 0; t < shares; ++t)
      range_[t].v.store(pack(t * n / shares, (t + 1) * n / shares), std::memory_order_relaxed);
  }
  int64_t take(int64_t t) {
    for (int64_t i = 0; i < shares_; ++i) {
      const int64_t item = i == 0 ? claim(range_[t], true) : claim(range_[(t + i) % shares_], false);
      if (item >= 0) return item;
    }
    return -1;
  }

 private:
  struct alignas(64) Range {
    std::atomic<uint64_t> v;   // front << 32 | back: items [front, back) are left
  };
  static uint64_t pack(int64_t front, int64_t back) { return uint64_t(front) << 32 | uint64_t(back); }
  static int64_t claim(Range& r, bool front) {
    uint64_t v = r.v.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = int64_t(v >> 32), b = int64_t(v & 0xFFFFFFFFu);
      if (f >= b) return -1;
      if (r.v.compare_exchange_weak(v, front ? pack(f + 1, b) : pack(f, b - 1), std::memory_order_relaxed))
        return front ? f : b - 1;
    }
  }
  int64_t shares_;
  std::unique_ptr<Range[]> range_;
};

// The batch-1 kernel of a type in the x8 layout; nullptr: none (the type is not interleaved).
X8Fn x8_kernel(int id) {
  const FormatKernels* k = find_kernels(id);
  return k != nullptr ? k->x8 : nullptr;
}

}  // namespace

Tensor ggml_matmul(const Tensor& x, const Tensor& w, int64_t type_id) {
  RECORD_FUNCTION("localpaged::ggml_matmul", std::vector<c10::IValue>());   // named in profiles
  const bool x8 = type_id & kInterleaved;   // w in the x8 layout (ggml_interleave)
  const TypeInfo* t = find_type(type_id & ~kInterleaved);
  TORCH_CHECK(t != nullptr, "ggml_matmul: GGML type ", type_id, " (", other_type_name(type_id),
              ") is not supported; supported: ", supported_list());
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "ggml_matmul: x must be a float32 [M, K] CPU tensor (got ", x.scalar_type(), " ",
              x.sizes(), " on ", x.device(), ")");
  TORCH_CHECK(x.is_contiguous(), "ggml_matmul: x must be contiguous (got strides ", x.strides(), ")");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.device().is_cpu(),
              "ggml_matmul: w must be a uint8 [N, row_bytes] CPU tensor of ", t->name,
              " blocks (got ", w.scalar_type(), " ", w.sizes(), " on ", w.device(), ")");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K > 0 && K % t->elems == 0, "ggml_matmul: K = ", K, " is not a positive multiple of ",
              t->name, "'s block of ", t->elems, " elements");
  const int64_t row_bytes = K / t->elems * t->bytes;
  TORCH_CHECK(w.size(1) == row_bytes, "ggml_matmul: w rows must hold K / ", t->elems, " * ",
              t->bytes, " = ", row_bytes, " bytes of ", t->name, " blocks for K = ", K, " (got ",
              w.size(1), ")");
  TORCH_CHECK(w.stride(1) == 1 && (N <= 1 || w.stride(0) >= row_bytes),
              "ggml_matmul: w rows must be contiguous bytes, one row after another (got strides ",
              w.strides(), ")");
  TORCH_CHECK(!x8 || (x8_kernel(t->id) != nullptr && N % kX8 == 0 && w.is_contiguous()),
              "ggml_matmul: ", t->name, " ", w.sizes(), " is not in a layout this build interleaves "
              "(see ggml_interleaved_types)");
  Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;

  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t stride = w.stride(0);
  float* yp = y.data_ptr<float>();
#ifdef LOCALPAGED_GGML_AMX
  if (const AmxFn amx = M >= amx_min_rows(t->id, x8) ? kernels_of(t->id).amx : nullptr; amx && amx_ready()) {
    const int64_t rows = (M + kAmxRows - 1) / kAmxRows * kAmxRows;
    amx(quantize_acts(x.data_ptr<float>(), M, K, t->elems == kSuper ? kSuper : 32, rows), M, wp, stride, x8, N, yp);
    return y;
  }
#endif
  const Acts a = quantize_acts(x.data_ptr<float>(), M, K, t->elems == kSuper ? kSuper : 32, M);
  const Kernel kernel = kernel_for(t->id, M);
  const X8Fn x8_fn = x8 ? x8_kernel(t->id) : nullptr;
  // two groups at a time (the 512-bit loops) where the build has them, the batch is large enough
  // and no AMX tiles are in use (on such CPUs the x8 tiles keep the batches below the tiles: a
  // 512-bit form of them measured no faster there, docs/benchmarks.md)
#ifdef LOCALPAGED_GGML_AMX
  const bool amx_cpu = amx_ready();
#else
  const bool amx_cpu = false;
#endif
  const FormatKernels& k = kernels_of(t->id);
  const PairFn pair_fn = x8 && M >= kPairMinRows && !amx_cpu ? k.pair : nullptr;
  // prefill: each panel of weight rows unpacked once, then read by every tile of x's rows
  const PanelKernels panel =
      k.panel.unpack && k.panel.x8 == x8 && M >= k.panel.min_rows && !amx_cpu ? k.panel : PanelKernels{};
  const int64_t nb = K / t->elems;
  // Work items: groups of output rows (~64 KB of weights), each thread of one parallel region
  // taking its own contiguous share from the front, then the others' from their backs (Items):
  // one linear stream through the weights per thread, and a thread that starts late (a busy
  // core) takes fewer instead of holding the others up. Which thread computes a row changes
  // nothing in its result.
  const int64_t unit = std::max(pair_fn ? 2 * kX8 : kX8, panel.rows);   // a pair or panel never straddles two items
  const int64_t group = (std::max<int64_t>(1, kGroupBytes / row_bytes) + unit - 1) / unit * unit;
  const int64_t ahead = std::max<int64_t>(1, kPrefetchBytes / row_bytes);   // rows
  const Prefetch ahead_x8 = M <= kStreamRows ? x8_stream_prefetch() : kX8NearFar;   // x8 first passes
  const int64_t items = (N + group - 1) / group;
  const int64_t min_macs = int64_t(1) << 17;   // per thread, else fewer threads: less is not worth a thread
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>({at::get_num_threads(), items, M * N * K / min_macs}));
  Items work(items, threads);
  at::parallel_for(0, threads, 1, [&](int64_t thread, int64_t) {
    std::unique_ptr<uint8_t, decltype(&std::free)> buf(
        panel.unpack ? static_cast<uint8_t*>(std::aligned_alloc(64, nb * panel.bytes)) : nullptr, &std::free);
    for (int64_t item; (item = work.take(thread)) >= 0;) {
      const int64_t n0 = item * group, n1 = std::min(N, n0 + group);
      int64_t n = n0;
      for (; buf && n + panel.rows <= n1; n += panel.rows) {   // the weights from DRAM once, then L1 / L2
        panel.unpack(wp + n * stride, stride, nb, buf.get());
        for (int64_t m0 = 0; m0 < M; m0 += kPanelTileRows)
          panel.tile(buf.get(), a, m0, std::min(kPanelTileRows, M - m0), yp + m0 * N + n, N);
      }
      if (x8_fn) {   // a group's passes over x's rows: the first from DRAM, the others from L1 / L2
        for (; pair_fn && n + 2 * kX8 <= n1; n += 2 * kX8)
          for (int64_t m0 = 0; m0 < M; m0 += kPairRows)
            pair_fn(wp + n * stride, wp + (n + kX8) * stride, a, m0, std::min(kPairRows, M - m0),
                    m0 == 0 ? ahead_x8 : Prefetch{}, yp + m0 * N + n, N);
        for (; n < n1; n += kX8)
          for (int64_t m0 = 0; m0 < M; m0 += kX8Rows)
            x8_fn(wp + n * stride, a, m0, std::min(kX8Rows, M - m0), m0 == 0 ? ahead_x8 : Prefetch{},
                  yp + m0 * N + n, N);
        continue;
      }
      for (int64_t m0 = 0; m0 < M; m0 += kernel.rows) {   // rows past the panels
        const int64_t tm = std::min(kernel.rows, M - m0);
        for (int64_t r = n; r < n1; ++r) {
          if (m0 == 0 && !(kernel.prefetches && tm == 1) && r + ahead < N)
            prefetch_row(wp + (r + ahead) * stride, row_bytes);
          kernel.fn(wp + r * stride, a, m0, tm, yp + m0 * N + r, N);
        }
      }
    }
  });
  return y;
}

std::string ggml_kernel_path() {
#ifdef LOCALPAGED_GGML_AVX2
  std::string path = "avx2";
#ifdef LOCALPAGED_GGML_VNNI
  path += "+vnni";
#endif
#ifdef LOCALPAGED_GGML_AVX512
  path += "+avx512";
#endif
#ifdef LOCALPAGED_GGML_AMX
  if (amx_ready()) path += "+amx";
#endif
  return path;
#else
  return "scalar";
#endif
}

bool ggml_supported(int64_t type_id) { return find_type(type_id) != nullptr; }

void ggml_interleave(const Tensor& w, int64_t type_id, const Tensor& out) {
  const TypeInfo* t = find_type(type_id);
  TORCH_CHECK(t != nullptr && x8_kernel(t->id) != nullptr, "ggml_interleave: GGML type ", type_id,
              " has no interleaved kernel in this build (", ggml_kernel_path(), ")");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(0) % kX8 == 0 &&
                  w.size(1) % t->bytes == 0,
              "ggml_interleave: w must be a contiguous uint8 [N, row_bytes] of ", t->name,
              " blocks with N a multiple of 8 (got ", w.scalar_type(), " ", w.sizes(), ")");
  TORCH_CHECK(out.scalar_type() == at::kByte && out.is_contiguous() && out.numel() == w.numel() &&
                  out.data_ptr() != w.data_ptr(),
              "ggml_interleave: out must be another contiguous uint8 tensor of w's ", w.numel(), " bytes");
  const int64_t row_bytes = w.size(1), nb = row_bytes / t->bytes;
  uint8_t* src = const_cast<uint8_t*>(w.data_ptr<uint8_t>());   // read only
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, w.size(0) / kX8, 16, [&](int64_t g0, int64_t g1) {
    x8_move(src + g0 * kX8 * row_bytes, dst + g0 * kX8 * row_bytes, g1 - g0, nb, t->bytes, true);
  });
}

std::vector<int64_t> ggml_interleaved_types() {
  std::vector<int64_t> ids;
  for (const TypeInfo& t : kTypes)
    if (x8_kernel(t.id) != nullptr) ids.push_back(t.id);
  return ids;
}

int64_t ggml_interleaved_flag() { return kInterleaved; }

std::vector<int64_t> ggml_type_table() {
  std::vector<int64_t> table;
  for (const TypeInfo& t : kTypes) table.insert(table.end(), {t.id, t.elems, t.bytes});
  return table;
}
