"""Plain-torch reference for llama.cpp's ("ggml") quantized block formats, as GGUF stores them:
the ground truth of the GGUF matmul kernels.

A weight matrix [N, K] is kept as its raw GGUF bytes, ``uint8 [N, row_bytes(kind, K)]``: row n
is K // block_elems consecutive blocks of ``block_bytes`` bytes, each block holding
``block_elems`` consecutive weights of that row. ``dequantize(data, kind)`` turns the bytes back
into float32 [N, K], bit for bit as gguf-py's ``gguf.quants.dequantize`` (the spec; it computes
in float32, and every formula below is evaluated in float32 in the order written, with no fused
multiply-add). All multi-byte fields are little-endian; ``fp16`` is IEEE half, converted exactly
to float32. "nibble" q of byte j: the low one is ``b & 15``, the high one ``b >> 4``.

Blocks of 32 weights (i = 0..31):

- Q4_0 (18 bytes): fp16 d | 16 bytes qs. q_i = low nibble of qs[i] for i < 16, high nibble of
  qs[i - 16] for i >= 16. w_i = d * (q_i - 8).
- Q4_1 (20 bytes): fp16 d | fp16 m | 16 bytes qs (as Q4_0). w_i = (d * q_i) + m.
- Q5_0 (22 bytes): fp16 d | 4 bytes qh (a uint32, bit i = bit 4 of q_i) | 16 bytes qs (low 4
  bits, as Q4_0). w_i = d * (q_i - 16).
- Q5_1 (24 bytes): fp16 d | fp16 m | 4 bytes qh | 16 bytes qs (as Q5_0). w_i = (d * q_i) + m.
- Q8_0 (34 bytes): fp16 d | 32 int8 qs. w_i = qs_i * d.
- IQ4_NL (18 bytes): fp16 d | 16 bytes qs (4-bit indices, placed as Q4_0). w_i = d * KV[q_i],
  KV = IQ4_NL_VALUES, a non-linear 16-entry table of int8 levels.

Super-blocks of 256 weights (QK_K), made of sub-blocks with their own scales (i = 0..255):

- Q2_K (84 bytes): 16 bytes scales | 64 bytes qs | fp16 d | fp16 dmin. Sub-block s = i // 16
  (16 of 16 weights) has scale sc = scales[s] & 15 and min mn = scales[s] >> 4; 2-bit q_i for
  i = 128 h + 32 j + l (h < 2, j < 4, l < 32) is (qs[32 h + l] >> 2 j) & 3.
  w_i = (d * sc) * q_i - (dmin * mn).
- Q3_K (110 bytes): 32 bytes hmask | 64 bytes qs | 12 bytes scales | fp16 d. 16 sub-blocks of
  16; 6-bit scale s: low 4 bits = nibble of scales[s % 8] (low for s < 8, high for s >= 8), high 2
  bits = (scales[8 + s % 4] >> 2 (s // 4)) & 3; sc = that - 32. Low 2 bits of q_i placed as in
  Q2_K; its high bit hb = (hmask[i % 32] >> (i // 32)) & 1, and q_i = low - 4 (1 - hb) (values
  -4..3). w_i = (d * sc) * q_i.
- Q4_K (144 bytes): fp16 d | fp16 dmin | 12 bytes scales | 128 bytes qs. 8 sub-blocks of 32 with
  6-bit scales sc_s and mins mn_s packed in the 12 bytes (bytes a = 0..3, b = 4..7, c = 8..11):
  for s < 4, sc = a[s] & 63, mn = b[s] & 63; for s >= 4, sc = (c[s-4] & 15) | ((a[s-4] >> 6) << 4)
  and mn = (c[s-4] >> 4) | ((b[s-4] >> 6) << 4). Sub-block s = 2 t + u takes nibble u (0 low,
  1 high) of qs[32 t + l], l < 32. w_i = (d * sc) * q_i - (dmin * mn).
- Q5_K (176 bytes): fp16 d | fp16 dmin | 12 bytes scales (as Q4_K) | 32 bytes qh | 128 bytes qs
  (low 4 bits, as Q4_K). Bit 4 of q_i for sub-block s, l = i % 32, is (qh[l] >> s) & 1.
  w_i = (d * sc) * q_i - (dmin * mn).
- Q6_K (210 bytes): 128 bytes ql | 64 bytes qh | 16 int8 scales | fp16 d. 16 sub-blocks of 16,
  scale scales[i // 16]. For i = 128 h + r: low 4 bits = nibble (r // 64) of ql[64 h + r % 64];
  high 2 bits = (qh[32 h + r % 32] >> 2 (r // 32)) & 3; q_i = that 6-bit value - 32.
  w_i = (d * sc) * q_i.
- IQ4_XS (136 bytes): fp16 d | uint16 scales_h | 4 bytes scales_l | 128 bytes qs. 8 sub-blocks
  of 32; 6-bit scale s = nibble (s % 2) of scales_l[s // 2] | ((scales_h >> 2 s) & 3) << 4, and
  sc = that - 32. Sub-block s: weight 16 u + l (u < 2, l < 16) is KV[nibble u of qs[16 s + l]].
  w_i = (d * sc) * KV[q_i].

Plain types F32, F16 and BF16 (one element per "block") are in PLAIN_FORMATS; ``dequantize``
reads them too. Eager torch on CPU and CUDA gives the same float32 results (separate multiply
and add kernels); a compiler that contracts them into FMA would not be bit-exact any more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

QK_K = 256
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@dataclass(frozen=True)
class BlockFormat:
    """One GGML tensor type: ``block_elems`` weights stored in ``block_bytes`` bytes."""
    name: str
    type_id: int          # gguf.GGMLQuantizationType value
    block_elems: int
    block_bytes: int


FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("Q4_0", 2, 32, 18),
    BlockFormat("Q4_1", 3, 32, 20),
    BlockFormat("Q5_0", 6, 32, 22),
    BlockFormat("Q5_1", 7, 32, 24),
    BlockFormat("Q8_0", 8, 32, 34),
    BlockFormat("Q2_K", 10, QK_K, 84),
    BlockFormat("Q3_K", 11, QK_K, 110),
    BlockFormat("Q4_K", 12, QK_K, 144),
    BlockFormat("Q5_K", 13, QK_K, 176),
    BlockFormat("Q6_K", 14, QK_K, 210),
    BlockFormat("IQ4_NL", 20, 32, 18),
    BlockFormat("IQ4_XS", 23, QK_K, 136),
)}

PLAIN_FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("F32", 0, 1, 4),
    BlockFormat("F16", 1, 1, 2),
    BlockFormat("BF16", 30, 1, 2),
)}

_ALL = {**FORMATS, **PLAIN_FORMATS}
_BY_ID = {f.type_id: f for f in _ALL.values()}


def block_format(kind: str) -> BlockFormat:
    """The BlockFormat of a type name (FORMATS or PLAIN_FORMATS); ValueError for others."""
    fmt = _ALL.get(kind)
    if fmt is None:
        raise ValueError(f"GGML type {kind!r} is not supported; supported: {sorted(_ALL)}")
    return fmt


def format_for_type_id(type_id: int) -> BlockFormat:
    """The BlockFormat of a GGML type id (gguf.GGMLQuantizationType value); ValueError for
    others."""
    fmt = _BY_ID.get(int(type_id))
    if fmt is None:
        raise ValueError(f"GGML type id {type_id!r} is not supported; supported: "
                         f"{ {f.type_id: f.name for f in _ALL.values()} }")
    return fmt


def row_bytes(kind: str, K: int) -> int:
    """Bytes of one row of K weights of type `kind`. ValueError when K is not a non-negative
    multiple of the block size."""
    fmt = block_format(kind)
    if K < 0 or K % fmt.block_elems:
        raise ValueError(f"{kind} rows hold whole blocks of {fmt.block_elems} weights: "
                         f"K={K} is not a multiple of {fmt.block_elems}")
    return K // fmt.block_elems * fmt.block_bytes


# ---- field helpers; every block function takes uint8 [B, block_bytes], returns float32 ----

def _fp16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte offset `at` of each block, as float32 [B, 1]."""
    return b[:, at:at + 2].contiguous().view(torch.float16).to(torch.float32)


def _shifts(values, shape, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=device).view(shape)


def _halves(qs: torch.Tensor) -> torch.Tensor:
    """[B, n] bytes -> [B, 2n]: the n low nibbles, then the n high nibbles."""
    return torch.cat([qs & 15, qs >> 4], dim=1)


def _kvalues(device) -> torch.Tensor:
    return torch.tensor(IQ4_NL_VALUES, dtype=torch.float32, device=device)


def _q4_0(b):
    q = _halves(b[:, 2:18]).to(torch.int8) - 8
    return _fp16(b, 0) * q.to(torch.float32)


def _q4_1(b):
    q = _halves(b[:, 4:20]).to(torch.float32)
    return (_fp16(b, 0) * q) + _fp16(b, 2)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """[B, 4] bytes of a little-endian uint32 -> [B, 32] of its bits 0..31 (uint8 0/1)."""
    bits = (qh.unsqueeze(-1) >> _shifts(range(8), (1, 1, 8), qh.device)) & 1
    return bits.reshape(qh.shape[0], 32)


def _q5_0(b):
    q = (_halves(b[:, 6:22]) | (_bits32(b[:, 2:6]) << 4)).to(torch.int8) - 16
    return _fp16(b, 0) * q.to(torch.float32)


def _q5_1(b):
    q = (_halves(b[:, 8:24]) | (_bits32(b[:, 4:8]) << 4)).to(torch.float32)
    return (_fp16(b, 0) * q) + _fp16(b, 2)


def _q8_0(b):
    return b[:, 2:34].view(torch.int8).to(torch.float32) * _fp16(b, 0)


def _iq4_nl(b):
    return _fp16(b, 0) * _kvalues(b.device)[_halves(b[:, 2:18]).long()]


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    """K-quant 2-bit fields: [B, 32 H] bytes -> [B, 128 H], element 128 h + 32 j + l being
    (qs[32 h + l] >> 2 j) & 3."""
    B = qs.shape[0]
    return ((qs.view(B, -1, 1, 32) >> _shifts((0, 2, 4, 6), (1, 1, 4, 1), qs.device)) & 3
            ).reshape(B, -1)


def _q2_k(b):
    B = b.shape[0]
    scales = b[:, 0:16]
    dl = (_fp16(b, 80) * (scales & 15).to(torch.float32)).view(B, 16, 1)
    ml = (_fp16(b, 82) * (scales >> 4).to(torch.float32)).view(B, 16, 1)
    q = _crumbs(b[:, 16:80]).view(B, 16, 16).to(torch.float32)
    return (dl * q - ml).view(B, QK_K)


def _q3_k(b):
    B = b.shape[0]
    dev = b.device
    packed = b[:, 96:108]
    low = _halves(packed[:, 0:8])                                           # [B, 16]
    high = ((packed[:, 8:12].view(B, 1, 4) >> _shifts((0, 2, 4, 6), (1, 4, 1), dev)) & 3
            ).reshape(B, 16)
    sc = ((low | (high << 4)).to(torch.int8) - 32).to(torch.float32)
    dl = (_fp16(b, 108) * sc).view(B, 16, 1)
    ql = _crumbs(b[:, 32:96])
    hb = ((b[:, 0:32].view(B, 1, 32) >> _shifts(range(8), (1, 8, 1), dev)) & 1).reshape(B, QK_K)
    q = (ql.to(torch.int8) - ((hb ^ 1) << 2).to(torch.int8)).to(torch.float32)
    return (dl * q.view(B, 16, 16)).view(B, QK_K)


def _scale_min_k4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 scale bytes -> the 8 six-bit scales and the 8 six-bit mins, [B, 8] each."""
    a, m, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat([a & 63, (c & 15) | ((a >> 2) & 48)], dim=1)
    mn = torch.cat([m & 63, (c >> 4) | ((m >> 2) & 48)], dim=1)
    return sc, mn


def _nibbles_k(qs: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K's 128 qs bytes -> [B, 8, 32]: sub-block 2 t + u is nibble u of qs[32 t + l]."""
    B = qs.shape[0]
    return ((qs.view(B, 4, 1, 32) >> _shifts((0, 4), (1, 1, 2, 1), qs.device)) & 15
            ).view(B, 8, 32)


def _k_scaled(b, q):
    B = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_fp16(b, 0) * sc.to(torch.float32)).view(B, 8, 1)
    dm = (_fp16(b, 2) * mn.to(torch.float32)).view(B, 8, 1)
    return (d * q.to(torch.float32) - dm).view(B, QK_K)


def _q4_k(b):
    return _k_scaled(b, _nibbles_k(b[:, 16:144]))


def _q5_k(b):
    B = b.shape[0]
    hb = (b[:, 16:48].view(B, 1, 32) >> _shifts(range(8), (1, 8, 1), b.device)) & 1
    return _k_scaled(b, _nibbles_k(b[:, 48:176]) | (hb << 4))


def _q6_k(b):
    B = b.shape[0]
    d = (_fp16(b, 208) * b[:, 192:208].view(torch.int8).to(torch.float32)).view(B, 16, 1)
    low = ((b[:, 0:128].view(B, 2, 1, 64) >> _shifts((0, 4), (1, 1, 2, 1), b.device)) & 15
           ).reshape(B, QK_K)
    high = _crumbs(b[:, 128:192])
    q = ((low | (high << 4)).to(torch.int8) - 32).to(torch.float32)
    return (d * q.view(B, 16, 16)).view(B, QK_K)


def _iq4_xs(b):
    B = b.shape[0]
    dev = b.device
    sh = b[:, 2].to(torch.int32) | (b[:, 3].to(torch.int32) << 8)           # uint16 scales_h
    high = ((sh.view(B, 1) >> torch.arange(0, 16, 2, dtype=torch.int32, device=dev)) & 3
            ).to(torch.uint8)                                                # [B, 8]
    low = ((b[:, 4:8].view(B, 4, 1) >> _shifts((0, 4), (1, 1, 2), dev)) & 15).reshape(B, 8)
    sc = ((low | (high << 4)).to(torch.int8) - 32).to(torch.float32)
    dl = (_fp16(b, 0) * sc).view(B, 8, 1)
    idx = (b[:, 8:136].view(B, 8, 1, 16) >> _shifts((0, 4), (1, 1, 2, 1), dev)) & 15
    return (dl * _kvalues(dev)[idx.view(B, 8, 32).long()]).view(B, QK_K)


def _f32(b):
    return b.contiguous().view(torch.float32)


def _plain_f16(b):
    return b.contiguous().view(torch.float16).to(torch.float32)


def _bf16(b):
    return b.contiguous().view(torch.bfloat16).to(torch.float32)


_BLOCK_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs, "F32": _f32, "F16": _plain_f16, "BF16": _bf16,
}

# Byte offsets of each format's fp16 scale fields (d, dmin or m) inside a block.
SCALE_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                "IQ4_NL": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2),
                "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}


def random_blocks(kind: str, N: int, K: int, generator: torch.Generator | None = None,
                  scale: float = 0.01) -> torch.Tensor:
    """uint8 [N, row_bytes] of `kind`: every code, sub-scale and bit field random, the fp16
    scales random in [0, scale) (finite, so the weights are too). For kernel tests."""
    fmt = block_format(kind)
    data = torch.randint(0, 256, (N, row_bytes(kind, K)), dtype=torch.uint8, generator=generator)
    blocks = data.view(N, K // fmt.block_elems, fmt.block_bytes)
    for at in SCALE_FIELDS[kind]:
        halves = (torch.rand(N, K // fmt.block_elems, generator=generator) * scale).half()
        blocks[:, :, at:at + 2] = halves.view(torch.uint8).view(N, -1, 2)
    return data


# Weights dequantized per step: bounds the temporaries (a few times this many bytes x 4) no
# matter how many rows come in; the output itself is the only full-size allocation.
CHUNK_ELEMS = 1 << 21


def dequantize(data: torch.Tensor, kind: str) -> torch.Tensor:
    """GGUF bytes of type `kind`, uint8 [..., row_bytes] (1-D: one row), -> float32 [..., K]
    on data's device, bitwise equal to gguf.quants.dequantize. ValueError for an unknown kind
    or a last dimension that is not whole blocks; TypeError for a non-uint8 tensor."""
    fmt = block_format(kind)
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
        raise TypeError(f"GGUF {kind} data must be a uint8 tensor, got "
                        f"{getattr(data, 'dtype', type(data))}")
    if data.dim() == 0:
        raise ValueError(f"GGUF {kind} data must have a last dimension of row bytes, got a "
                         f"0-d tensor")
    nbytes = data.shape[-1]
    if nbytes % fmt.block_bytes:
        raise ValueError(f"{kind} rows are whole blocks of {fmt.block_bytes} bytes: the last "
                         f"dimension ({nbytes}) is not a multiple of {fmt.block_bytes}")
    K = nbytes // fmt.block_bytes * fmt.block_elems
    lead = tuple(data.shape[:-1])
    blocks = data.reshape(-1, fmt.block_bytes)     # a view for any slice of whole rows
    out = torch.empty(blocks.shape[0], fmt.block_elems, dtype=torch.float32, device=data.device)
    fn = _BLOCK_FNS[fmt.name]
    step = max(1, CHUNK_ELEMS // fmt.block_elems)
    for start in range(0, blocks.shape[0], step):
        out[start:start + step] = fn(blocks[start:start + step]).view(-1, fmt.block_elems)
    return out.view(*lead, K)


# ---- The interleaved layout of the CPU's batch-1 kernels ("x8", kernels/cpu_ggml.cpp) --------
# The same bytes as GGUF's rows, moved: each group of 8 rows (rows 8g .. 8g + 7, which the group
# occupies in place, so the tensor keeps its [N, row_bytes] shape) holds its rows' block b side by
# side, blocks in order, and within a block the rows' 4-byte units interleaved: unit u of row r at
# byte 4 (8u + r); a trailing 2-byte unit (Q6_K's d, when the block size is not a multiple of 4)
# at 32 (block_bytes // 4) + 2r. So a 32-byte load holds 4 bytes of each of the 8 rows.
X8_ROWS = 8


def _x8_order(block_bytes: int) -> torch.Tensor:
    """int64 [8 * block_bytes]: byte i of an interleaved group-block is byte order[i] of the
    8 rows' blocks laid one after another ([8, block_bytes] flattened)."""
    units = block_bytes // 4
    r = torch.arange(X8_ROWS)
    body = (r.view(1, X8_ROWS, 1) * block_bytes + 4 * torch.arange(units).view(units, 1, 1)
            + torch.arange(4).view(1, 1, 4)).reshape(-1)
    tail = (r.view(X8_ROWS, 1) * block_bytes + 4 * units + torch.arange(block_bytes % 4)).reshape(-1)
    return torch.cat([body, tail])


def _x8_blocks(data: torch.Tensor, kind: str) -> tuple[torch.Tensor, int]:
    fmt = block_format(kind)
    N, nbytes = data.shape
    if N % X8_ROWS or nbytes % fmt.block_bytes:
        raise ValueError(f"the interleaved layout takes [N, row_bytes] of whole {kind} blocks with N "
                         f"a multiple of {X8_ROWS}, got {tuple(data.shape)}")
    return data.view(N // X8_ROWS, X8_ROWS, nbytes // fmt.block_bytes, fmt.block_bytes), fmt.block_bytes


def interleave(data: torch.Tensor, kind: str) -> torch.Tensor:
    """GGUF rows uint8 [N, row_bytes] -> the same bytes in the x8 layout (a new tensor)."""
    groups, size = _x8_blocks(data, kind)
    g, _, nb, _ = groups.shape
    rows_of_block = groups.permute(0, 2, 1, 3).reshape(g, nb, X8_ROWS * size)
    return rows_of_block[:, :, _x8_order(size).to(data.device)].reshape(data.shape)


def deinterleave(data: torch.Tensor, kind: str) -> torch.Tensor:
    """The inverse of interleave: x8 bytes -> GGUF rows (a new tensor)."""
    groups, size = _x8_blocks(data, kind)
    g, _, nb, _ = groups.shape
    order = _x8_order(size).to(data.device)
    rows_of_block = torch.empty(g, nb, X8_ROWS * size, dtype=torch.uint8, device=data.device)
    rows_of_block[:, :, order] = data.reshape(g, nb, X8_ROWS * size)
    return rows_of_block.view(g, nb, X8_ROWS, size).permute(0, 2, 1, 3).reshape(data.shape)
