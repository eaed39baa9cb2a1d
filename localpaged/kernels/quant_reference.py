"""Plain-torch reference for weight-only quantized matmul: the ground truth of
``triton_quant_matmul`` and the shared argument checks of both.

Canonical packed layouts (shared with localpaged.quant):
- int8: ``qweight`` int8 [N, K]; ``scales`` [N] float32; w[n, k] = qweight[n, k] * scales[n].
- int4: ``qweight`` uint8 [N, K // 2]; byte j of row n holds k = 2j in its LOW nibble and
  k = 2j + 1 in its HIGH nibble (values 0..15); ``scales`` and ``mins`` [N, K // G] (float32 or
  float16), G in GROUP_SIZES; w[n, k] = q[n, k] * scales[n, k // G] + mins[n, k // G].
Dequantization always runs in fp32; the matmul accumulates in fp32 and returns x.dtype.
"""

from __future__ import annotations

import torch

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
ACT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCALE_DTYPES = (torch.float32, torch.float16)


def check_quant_args(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     mins: torch.Tensor | None, group_size: int | None,
                     bits: int) -> tuple[int, int, int]:
    """Validate a quantized matmul's arguments; return (M, N, K). Raises ValueError naming the
    offending argument and what is supported."""
    if bits not in BITS:
        raise ValueError(f"bits={bits!r} is not supported; supported: {BITS}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in ACT_DTYPES:
        raise ValueError(f"x dtype {x.dtype} is not supported; supported: {ACT_DTYPES}")
    if scales.dtype not in SCALE_DTYPES:
        raise ValueError(f"scales dtype {scales.dtype} is not supported; supported: "
                         f"{SCALE_DTYPES}")
    others = {"qweight": qweight, "scales": scales, "mins": mins}
    for name, t in others.items():
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}: all on one device")
    M, K = x.shape
    N = qweight.shape[0]
    if bits == 8:
        if qweight.dtype != torch.int8 or qweight.dim() != 2 or qweight.shape[1] != K:
            raise ValueError(f"int8 qweight must be int8 [N, K={K}], got {qweight.dtype} "
                             f"{tuple(qweight.shape)}")
        if tuple(scales.shape) != (N,):
            raise ValueError(f"int8 scales must be [N={N}], got {tuple(scales.shape)}")
        if mins is not None:
            raise ValueError("int8 weights are symmetric: mins must be None")
        return M, N, K
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size={group_size!r} is not supported for int4; supported: "
                         f"{GROUP_SIZES}")
    if K % group_size:
        raise ValueError(f"int4 needs K ({K}) divisible by group_size ({group_size})")
    if qweight.dtype != torch.uint8 or qweight.dim() != 2 or qweight.shape[1] * 2 != K:
        raise ValueError(f"int4 qweight must be uint8 [N, K // 2 = {K // 2}], got "
                         f"{qweight.dtype} {tuple(qweight.shape)}")
    groups = (N, K // group_size)
    if mins is None:
        raise ValueError("int4 needs mins [N, K // group_size]")
    for name, t in (("scales", scales), ("mins", mins)):
        if tuple(t.shape) != groups:
            raise ValueError(f"int4 {name} must be [N, K // group_size] = {groups}, got "
                             f"{tuple(t.shape)}")
    if mins.dtype not in SCALE_DTYPES:
        raise ValueError(f"mins dtype {mins.dtype} is not supported; supported: {SCALE_DTYPES}")
    return M, N, K


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] -> uint8 [N, K] of nibbles: column 2j is byte j's low nibble, 2j + 1
    its high one."""
    low = qweight & 0x0F
    high = qweight >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 [N, K] and scales [N] -> w [N, K] in ``dtype`` (computed in fp32)."""
    return (qweight.float() * scales.float()[:, None]).to(dtype)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                    group_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed uint8 [N, K // 2], scales/mins [N, K // G] -> w [N, K] in ``dtype`` (fp32 math)."""
    q = unpack_int4(qweight).float()
    s = scales.float().repeat_interleave(group_size, dim=1)
    m = mins.float().repeat_interleave(group_size, dim=1)
    return (q * s + m).to(dtype)


def quant_matmul_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                           mins: torch.Tensor | None, group_size: int | None,
                           bits: int) -> torch.Tensor:
    """y = x @ w.T for x [M, K] and packed w [N, K]: dequantize in fp32, fp32 matmul, x.dtype."""
    check_quant_args(x, qweight, scales, mins, group_size, bits)
    if bits == 8:
        w = dequantize_int8(qweight, scales)
    else:
        w = dequantize_int4(qweight, scales, mins, group_size)
    return (x.float() @ w.T).to(x.dtype)
