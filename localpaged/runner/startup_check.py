"""Start-up self-check of the GPU path, with fallback: the app keeps working if a kernel fails.

Until a GPU has run a given build, its Triton kernels and captured graphs are untested there. At
start-up on CUDA the engine runs each Triton kernel once on a small input against the torch
reference (`check_kernels`; the GGML block matmul: `ggml_kernel_mismatch`, before a GGUF file's
weights are kept in their block formats) and, when decode graphs are on, one captured replay against the same
step run eagerly (`build_decode_graphs`). On an error or a mismatch it logs one line naming what
failed and falls back: the torch attention backend (and eager decode), or eager decode alone.
"""

from __future__ import annotations

import logging

import torch

from localpaged.kernels import ggml_reference, kv_quant
from localpaged.models.attention import (
    AttentionBackend,
    AttentionMetadata,
    PagedAttention,
    get_backend,
)
from localpaged.quant.ggml import NativeKernel
from localpaged.runner.cuda_graphs import DecodeGraphRunner, capture_sizes

logger = logging.getLogger(__name__)


def ggml_kernel_mismatch(kernel, device: torch.device, dtype: torch.dtype = torch.float32
                         ) -> str | None:
    """Run a GGML block matmul (quant/ggml.py: NativeKernel.kernel) once per block format and
    row count (1: GEMV, 20: tiles) against x @ dequantize(w).T; None, or what failed and how."""
    g = torch.Generator(device="cpu").manual_seed(0)
    tol = _tolerance(dtype)
    for kind, fmt in ggml_reference.FORMATS.items():
        data = ggml_reference.random_blocks(kind, 48, 512, g)
        w = ggml_reference.dequantize(data, kind).to(device)
        data = data.to(device)
        for m in (1, 20):
            x = torch.randn(m, 512, generator=g).to(device=device, dtype=dtype)
            want = x.float() @ w.T
            try:
                got = kernel(x, data, fmt.type_id).float()
                err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
            except Exception as exc:  # noqa: BLE001 - any failure means "do not use this kernel"
                return f"{kind} (M={m}) raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            if not err <= tol:                # also catches NaN
                return f"{kind} (M={m}) differs from the torch reference by {err:.3g} (tolerance {tol})"
    return None


def triton_ggml_native(device: torch.device) -> NativeKernel | None:
    """The Triton GGML kernel (kernels/triton_ggml.py) for a CUDA device once its check passed;
    None elsewhere or when it fails (the loader then requantizes a GGUF file's K-quants)."""
    if device.type != "cuda":
        return None
    from localpaged.kernels import triton_ggml
    problem = ggml_kernel_mismatch(triton_ggml.ggml_matmul, device)
    if problem is not None:
        logger.warning("start-up self-check: Triton GGML kernel %s; GGUF weights are requantized",
                       problem)
        return None
    return NativeKernel(triton_ggml.ggml_matmul, frozenset(ggml_reference.FORMATS), "cuda",
                        name="triton")


KERNELS = ("write_kv", "paged_decode_attention", "paged_prefill_attention", "copy_blocks")


WINDOWS = (0, 5)   # the attention kernels' checks: full attention, a sliding window


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if dtype == torch.float32 else 3e-2


def check_kernels(ops: AttentionBackend, reference: AttentionBackend, device: torch.device,
                  dtype: torch.dtype, block_size: int = 16, head_dim: int = 64,
                  kv_dtype: torch.dtype | None = None) -> str | None:
    """Run each kernel of `ops` once against `reference`; None, or what failed and how. The
    attention kernels run with full attention and with a sliding window of 5 (it starts inside
    the first sequence's second block, so its table entry 0 is not attended to). The caches are
    of kv_dtype (None: dtype; int8: kernels/kv_quant.py rows, compared dequantized)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    num_blocks, kv_heads, heads = 8, 2, 4

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    kv_dtype = kv_dtype or dtype
    k_cache, v_cache = (kv_quant.store(rand(num_blocks, block_size, kv_heads, head_dim), kv_dtype)
                        for _ in range(2))
    caches = [(k_cache, v_cache), (k_cache.clone(), v_cache.clone())]   # ops', reference's
    values = lambda c: torch.cat([kv_quant.load(x, dtype) for x in c])   # noqa: E731
    tables = torch.tensor([[3, 1, 6], [5, 0, 2]], dtype=torch.int32, device=device)
    lens = torch.tensor([2 * block_size + 3, block_size + 1], dtype=torch.int32, device=device)
    scale = head_dim ** -0.5
    tol = max(_tolerance(dtype), _tolerance(kv_dtype))     # a smaller cache rounds K/V
    cases = {
        "write_kv": lambda m, c: (m.write_kv(k_new, v_new, c[0], c[1], slots), values(c))[1],
        "paged_decode_attention": lambda m, c: torch.cat([m.paged_decode_attention(
            q_dec, c[0], c[1], tables, lens, scale, window) for window in WINDOWS]),
        "paged_prefill_attention": lambda m, c: torch.cat([m.paged_prefill_attention(
            q_pre, c[0], c[1], tables, starts, lens, scale, window) for window in WINDOWS]),
        "copy_blocks": lambda m, c: (m.copy_blocks(c[0], c[0], pairs), values(c[:1]))[1],
    }
    k_new, v_new = rand(3, kv_heads, head_dim), rand(3, kv_heads, head_dim)
    slots = torch.tensor([3 * block_size, -1, 5 * block_size + 2], dtype=torch.long, device=device)
    q_dec, q_pre = rand(2, heads, head_dim), rand(5, heads, head_dim)
    starts = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    pairs = torch.tensor([[1, 4], [6, 7]], dtype=torch.long, device=device)
    for name in KERNELS:
        try:
            got = cases[name](ops, caches[0]).float()
            want = cases[name](reference, caches[1]).float()
            err = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
        except Exception as exc:  # noqa: BLE001 - any failure means "do not use this kernel"
            return f"{name} raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        if not err <= tol:                    # also catches NaN
            return f"{name} differs from the torch reference by {err:.3g} (tolerance {tol})"
    return None


def select_backend(name: str, device: torch.device, dtype: torch.dtype, block_size: int,
                   head_dim: int, force_check: bool = False,
                   kv_dtype: torch.dtype | None = None) -> tuple[PagedAttention, bool]:
    """The attention backend to use and whether decode graphs may be captured with it.

    The Triton backend is checked on CUDA (or when force_check); on failure: torch backend, no
    graphs. Graphs need the Triton kernels (the torch reference reads lengths on the host).
    """
    backend = get_backend(name, device)
    if backend.name != "triton" or not (device.type == "cuda" or force_check):
        return backend, False
    failure = check_kernels(backend, get_backend("torch", device), device, dtype, block_size,
                            head_dim, kv_dtype)
    if failure is not None:
        logger.warning("start-up self-check: Triton kernel %s; using the torch attention backend "
                       "and eager decode", failure)
        return get_backend("torch", device), False
    return backend, device.type == "cuda"


def build_decode_graphs(model, kv_layers: list, backend: PagedAttention, max_num_seqs: int,
                        max_model_len: int, block_size: int, device: torch.device,
                        dtype: torch.dtype, capture: bool = True) -> DecodeGraphRunner | None:
    """Capture the decode graphs and check one replay against eager; None (eager) on failure."""
    try:
        runner = DecodeGraphRunner(model, kv_layers, backend, capture_sizes(max_num_seqs),
                                   max_model_len, block_size, device, dtype, capture)
        failure = graph_mismatch(runner, dtype)
    except Exception as exc:  # noqa: BLE001 - eager decode still works
        failure = f"capture raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    if failure is not None:
        logger.warning("start-up self-check: CUDA graph %s; decoding eagerly", failure)
        return None
    return runner


@torch.inference_mode()
def graph_mismatch(runner: DecodeGraphRunner, dtype: torch.dtype) -> str | None:
    """Replay size 1 on a dummy step (writes no KV) and compare with the eager model."""
    device = runner.buffers.input_ids.device
    ids = torch.tensor([1], dtype=torch.long, device=device)
    positions = torch.zeros(1, dtype=torch.long, device=device)
    ints = dict(dtype=torch.int32, device=device)
    meta = AttentionMetadata(
        slot_mapping=torch.full((1,), -1, dtype=torch.long, device=device), num_decode_tokens=1,
        decode_block_tables=torch.zeros(1, 1, **ints), decode_seq_lens=torch.ones(1, **ints),
        prefill_block_tables=torch.zeros(0, 1, **ints),
        prefill_query_start_loc=torch.zeros(1, **ints), prefill_seq_lens=torch.zeros(0, **ints))
    got = runner.run(ids, positions, meta).float().clone()
    want = runner.model(ids, positions, runner.kv_layers, meta, runner.backend).float()
    err = (got - want).abs().max().item()
    tol = _tolerance(dtype) * max(1.0, want.abs().max().item())
    return None if err <= tol else f"replay differs from eager by {err:.3g} (tolerance {tol:.3g})"
