"""Packed weight-only quantized tensors: the canonical layout every kernel codes against.

int8: `qweight` int8 [N, K]; `scales` float32 [N]; w[n, k] = qweight[n, k] * scales[n]
      (symmetric, per output channel; `mins` is None, group_size == K). GGUF Q8_0 is kept exactly
      as the grouped variant: group_size 32, `scales` float16 [N, K // 32],
      w[n, k] = qweight[n, k] * scales[n, k // 32] (kernels other than the torch reference may
      support only the per-channel form: check `per_channel`).
int4: `qweight` uint8 [N, K // 2]; byte j of row n holds k = 2j in the LOW nibble and k = 2j + 1
      in the HIGH nibble (values 0..15); `scales`, `mins` [N, K // G] (float16 or float32);
      w[n, k] = q[n, k] * scales[n, k // G] + mins[n, k // G]. GGUF Q4_1 is exactly this with
      G = 32; Q4_0 is mins = -8 * scales.
`PackedWeight.dequantize(dtype)` is the torch reference all kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from localpaged.quant import cpu_tiles
from localpaged.quant.cpu import INT4_N_MULTIPLE, CpuInt4Weight
from localpaged.quant.cpu_tiles import CpuInt4Tiles
from localpaged.quant.memory import trim_heap
from localpaged.quant.weight import QuantWeight, WeightDefaults

INT4_GROUP_SIZES = (32, 64, 128)


def triton_linear(x: torch.Tensor, pw: PackedWeight) -> torch.Tensor:
    """The Triton weight-only kernel (kernels/triton_quant_matmul.py) on pw's canonical tensors;
    imported on first use, so a CPU-only start never imports triton for it."""
    from localpaged.kernels.triton_quant_matmul import quant_matmul
    return quant_matmul(x, pw.qweight, pw.scales, pw.mins, pw.group_size, pw.bits)


@dataclass
class PackedWeight(WeightDefaults):
    bits: int                      # 8 or 4
    group_size: int                # int8: K (per channel); int4: 32, 64 or 128
    qweight: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None      # int4 only
    shape: tuple[int, int]         # logical (N, K)

    def __post_init__(self) -> None:
        N, K = self.shape
        if self.bits == 8:
            assert self.qweight.dtype == torch.int8 and tuple(self.qweight.shape) == (N, K)
            want = (N,) if self.group_size == K else (N, K // self.group_size)
            assert tuple(self.scales.shape) == want and self.mins is None
        elif self.bits == 4:
            assert self.qweight.dtype == torch.uint8 and tuple(self.qweight.shape) == (N, K // 2)
            assert tuple(self.scales.shape) == (N, K // self.group_size) == tuple(self.mins.shape)
        else:
            raise ValueError(f"bits must be 4 or 8, got {self.bits}")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.mins)
                   if t is not None)

    @property
    def per_channel(self) -> bool:
        return self.bits == 8 and self.group_size == self.shape[1]

    @property
    def format(self) -> str:
        return f"int{self.bits}" if self.per_channel else f"int{self.bits} g{self.group_size}"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x.dtype: Triton on CUDA (int4, per-channel int8), torch's
        int8 op for per-channel int8 on CPU, else dequantize then F.linear."""
        if x.is_cuda and (self.bits == 4 or self.per_channel):
            return triton_linear(x, self)
        if self.per_channel:
            y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), self.qweight,
                                                    self.scales.to(torch.bfloat16))
            return y.to(x.dtype)
        return F.linear(x, self.dequantize(x.dtype))

    def kernels(self) -> set[str]:
        if self.qweight.is_cuda and (self.bits == 4 or self.per_channel):
            return {"triton"}
        return {"torch" if self.per_channel else "reference"}

    def linear_form(self) -> QuantWeight:
        """On CPU, the form its kernels read fastest (quant/cpu.py says which and why);
        elsewhere this one."""
        return self.cpu_form() if self.qweight.device.type == "cpu" else self

    def embedding_form(self) -> QuantWeight:
        """Row gathers need the canonical layout: only int8 takes its CPU form (shared with a
        tied lm_head)."""
        return self.cpu_form() if self.bits == 8 and self.qweight.device.type == "cpu" else self

    def cpu_form(self) -> QuantWeight:
        """The form of this weight the CPU kernels read fastest (quant/cpu.py)."""
        if self.bits == 4 and cpu_tiles.fits(self) and cpu_tiles.available():
            return CpuInt4Tiles.from_packed(self)
        if self.bits == 4 and self.shape[0] % INT4_N_MULTIPLE == 0:
            return CpuInt4Weight.from_packed(self)
        if self.bits == 8 and not (self.per_channel and self.scales.dtype == torch.bfloat16):
            pw = self if self.per_channel else per_channel_int8(self)      # idempotent
            # bf16-representable by construction (quantize_int8): the op's bf16 scales, cast once
            return PackedWeight(8, pw.group_size, pw.qweight, pw.scales.to(torch.bfloat16), None,
                                pw.shape)
        return self

    def permute_rows(self, index: torch.Tensor) -> PackedWeight:
        """Output rows reordered (e.g. undoing llama.cpp's q/k rotary permutation): exact."""
        pick = (lambda t: None if t is None else t.index_select(0, index))
        return PackedWeight(self.bits, self.group_size, pick(self.qweight), pick(self.scales),
                            pick(self.mins), self.shape)

    def load_layout(self) -> PackedWeight:
        """The layout a linear's weight is kept in from load on: this one."""
        return self

    def stack_key(self) -> tuple:
        """Weights with equal keys stack into one (cat_rows): the same quantization and K."""
        return ("packed", self.bits, self.group_size, self.shape[1], self.scales.dtype)

    @staticmethod
    def stack(parts: list[PackedWeight]) -> PackedWeight:
        return cat_rows(parts)

    def to(self, device: torch.device) -> PackedWeight:
        move = (lambda t: None if t is None else t.to(device))
        return PackedWeight(self.bits, self.group_size, move(self.qweight), move(self.scales),
                            move(self.mins), self.shape)

    def int_values(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The integer weights (int8 [N, K], or int4 as uint8 0..15 [N, K]), optionally some rows."""
        q = self.qweight if rows is None else self.qweight.index_select(0, rows)
        if self.bits == 8:
            return q
        return torch.stack((q & 15, q >> 4), dim=-1).flatten(-2)

    def dequantize(self, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
        """w [N, K] (or the selected rows) in `dtype`, computed in float32."""
        q = self.int_values(rows).float()
        pick = (lambda t: t if rows is None else t.index_select(0, rows))
        if self.per_channel:
            return (q * pick(self.scales).float()[:, None]).to(dtype)
        G = self.group_size
        q = q.view(q.shape[0], -1, G)
        w = q * pick(self.scales).float()[..., None]
        if self.mins is not None:
            w = w + pick(self.mins).float()[..., None]
        return w.flatten(1).to(dtype)


def cat_rows(parts: list[PackedWeight]) -> PackedWeight:
    """Stack weights along N (fused q/k/v and gate/up): each output row keeps its own scales."""
    first = parts[0]
    if any((p.bits, p.group_size, p.shape[1], p.scales.dtype) !=
           (first.bits, first.group_size, first.shape[1], first.scales.dtype) for p in parts):
        raise ValueError("cannot fuse weights quantized differently: " + ", ".join(p.format for p in parts))
    cat = (lambda ts: None if ts[0] is None else torch.cat(ts))
    return PackedWeight(first.bits, first.group_size, cat([p.qweight for p in parts]),
                        cat([p.scales for p in parts]), cat([p.mins for p in parts]),
                        (sum(p.shape[0] for p in parts), first.shape[1]))


def quantize_int8(w: torch.Tensor) -> PackedWeight:
    """Symmetric per-output-channel int8 (round to nearest; max |w| of a row maps to <= 127)."""
    w = w.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-30)
    # scales exactly representable in bf16 (torch's packed CPU op takes bf16 scales), rounded up
    # so no weight clips: without this the bf16 cast adds up to 0.4% error to every row
    up = scales.to(torch.bfloat16).float()
    scales = torch.where(up < scales, torch.nextafter(up.to(torch.bfloat16), torch.tensor(
        float("inf"), dtype=torch.bfloat16)).float(), up)
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return PackedWeight(8, w.shape[1], q, scales, None, tuple(w.shape))


def quantize_int4(w: torch.Tensor, group_size: int = 32, scale_dtype: torch.dtype = torch.float16) -> PackedWeight:
    """Asymmetric int4 per group of `group_size` along K (min/max, as llama.cpp's Q4_1 does)."""
    N, K = w.shape
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group_size must be one of {INT4_GROUP_SIZES}, got {group_size}")
    if K % group_size:
        raise ValueError(f"quantization='int4' needs in_features divisible by the group size "
                         f"{group_size}; got a weight of shape {N}x{K}. Use quantization='int8' "
                         f"or 'none' for this model")
    g = w.float().view(N, K // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scales = ((hi - lo) / 15.0).to(scale_dtype).float()
    mins = lo.to(scale_dtype).float()
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round((g - mins[..., None]) / safe[..., None]).clamp_(0, 15).to(torch.uint8).view(N, K)
    return PackedWeight(4, group_size, pack_int4(q), scales.to(scale_dtype), mins.to(scale_dtype), (N, K))


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 values 0..15 [N, K] -> canonical bytes [N, K // 2] (even k low nibble)."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)


def per_channel_int8(pw: PackedWeight, chunk_weights: int = 1 << 20) -> PackedWeight:
    """Group-wise int8 requantized per output channel, a chunk of rows at a time: a row's scale
    depends on that row alone, so the chunks give what the whole would, and loading peaks at one
    chunk in float32 (16 MB), not a whole embedding table and quantize_int8's temporaries."""
    N, K = pw.shape
    step = max(1, chunk_weights // K)
    parts = []
    for i in range(0, N, step):
        parts.append(quantize_int8(pw.dequantize(torch.float32, torch.arange(i, min(i + step, N)))))
        trim_heap()
    return parts[0] if len(parts) == 1 else cat_rows(parts)
