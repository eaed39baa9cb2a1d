"""Plain-torch reference implementations of the paged-attention kernels.

These are the CPU path of the engine and the ground truth the Triton kernels in this package are
tested against. Every function here has the same signature as its Triton twin.

Cache layout (one tensor per layer for K and one for V):
    cache[num_blocks, block_size, num_kv_heads, head_dim]
A token's slot is ``block_id * block_size + offset``; a block table row lists the physical block
ids of a sequence's logical blocks in order (padding entries are never read past ``seq_len``).

Sliding windows: the attention functions take ``window`` (0: full attention). With a window W a
query at position p attends to positions p - W < k <= p, as transformers' sliding-window mask;
table entries of blocks wholly before the window may hold any block id (a sliding-window layer's
KV cache gives those blocks back) and are never read.

KV cache dtypes (kernels/kv_quant.py): a float32, bfloat16 or float16 cache is read converted to
q's dtype; an int8 cache ([..., D + 4], a float32 scale per token and head) is quantized on write
and dequantized on read, only the rows a kernel reads. copy_blocks moves rows as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localpaged.kernels.kv_quant import load, store, store_pair


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store key/value [T, Hkv, D] into their slots; a negative slot means "skip this token"."""
    num_blocks, block_size = k_cache.shape[:2]
    slots = slot_mapping.long()
    if bool((slots < 0).any()):
        keep = slots >= 0
        key, value, slots = key[keep], value[keep], slots[keep]
    key, value = store_pair(key, value, k_cache.dtype)
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:]).index_copy_(0, slots, key)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:]).index_copy_(0, slots, value)


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int,
            start: int = 0) -> torch.Tensor:
    """Cached tokens [start, length) of one sequence, [length - start, Hkv, D]; blocks before
    start's are not read."""
    B = cache.shape[1]
    first, num_blocks = start // B, -(-length // B)
    return cache[block_table[first:num_blocks].long()].flatten(0, 1)[start - first * B:length - first * B]


def window_start(seq_len: int, window: int) -> int:
    """The first position a query at position seq_len - 1 attends to (0 without a window)."""
    return max(0, seq_len - window) if window else 0


DECODE_CHUNK = 16     # sequences per gather: sorted by length, so padding stays small


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float, window: int = 0) -> torch.Tensor:
    """One query token per sequence: q [B, H, D] attends to its seq_len cached tokens (the
    last `window` of them with a window).

    One sequence (a single conversation) reads its K/V in place, without a gather; several are
    gathered in chunks of similar length, each padded to its own longest.
    """
    if q.shape[0] == 1 and back_to_back(k_cache) and back_to_back(v_cache):
        return _decode_in_place(q, k_cache, v_cache, block_tables[0], int(seq_lens[0]), scale, window)
    if q.shape[0] <= DECODE_CHUNK:
        return _decode_padded(q, k_cache, v_cache, block_tables, seq_lens, scale, window)
    out = torch.empty_like(q)
    for chunk in seq_lens.argsort().split(DECODE_CHUNK):
        out[chunk] = _decode_padded(q[chunk], k_cache, v_cache, block_tables[chunk],
                                    seq_lens[chunk], scale, window)
    return out


def contiguous_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """(first block, number of blocks) of each maximal run of consecutive block ids, in order."""
    runs: list[tuple[int, int]] = []
    for b in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


def decode_runs(block_ids: list[int], seq_len: int, block_size: int,
                start: int = 0) -> list[tuple[int, int]]:
    """(first slot, number of tokens) of each run of consecutive blocks that hold a sequence's
    tokens [start, seq_len), in order; the lengths sum to seq_len - start. Blocks before
    start's are not looked at (a sliding window's: `window_start`)."""
    first_block = start // block_size
    runs, left, skip = [], seq_len - start, start - first_block * block_size
    for first, count in contiguous_runs(block_ids[first_block:-(-seq_len // block_size)]):
        length = min(count * block_size - skip, left)
        left -= length
        runs.append((first * block_size + skip, length))
        skip = 0
    return runs


def decode_one(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, slot_mapping: torch.Tensor, runs: list[tuple[int, int]],
               scale: float) -> torch.Tensor:
    """A batch of one decoding sequence (one conversation): write its new key/value [1, Hkv, D]
    at slot_mapping[0] (a real slot, never negative), then q [1, H, D] attends to the runs
    (decode_runs, computed once per step by the model runner instead of once per layer)."""
    key, value = store_pair(key, value, k_cache.dtype)
    num_blocks, block_size = k_cache.shape[:2]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value)
    return _attend_runs(q, k_cache, v_cache, runs, scale)


def back_to_back(cache: torch.Tensor) -> bool:
    """Whether block b + 1 starts where block b ends, so a run of blocks is one strided view."""
    return cache.stride(0) == cache.shape[1] * cache.stride(1)


def _run_view(cache: torch.Tensor, first_slot: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Tokens [first_slot, first_slot + length) of a cache as [1, Hkv, length, D], one strided
    view (no copy). Needs blocks laid out back to back (KVCache's caches are contiguous)."""
    token, head, dim = cache.stride(1), cache.stride(2), cache.stride(3)
    view = cache.as_strided((1, cache.shape[2], length, cache.shape[3]), (0, head, token, dim),
                            cache.storage_offset() + first_slot * token)
    return load(view, dtype)


def _decode_in_place(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     table: torch.Tensor, seq_len: int, scale: float, window: int = 0) -> torch.Tensor:
    """q [1, H, D] over one sequence's seq_len tokens (its window's), read in place (see
    _attend_runs)."""
    runs = decode_runs(table.tolist(), seq_len, k_cache.shape[1], window_start(seq_len, window))
    return _attend_runs(q, k_cache, v_cache, runs, scale)


def _attend_runs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 runs: list[tuple[int, int]], scale: float) -> torch.Tensor:
    """q [1, H, D] over the cached tokens of `runs`, read as views of the cache: one run (blocks
    back to back) with no copy, several runs joined into one copy. Either way one 4-D SDPA call
    (torch's fused CPU kernel) over the same values, so the result is bitwise the same however
    the sequence's blocks happen to lie (which depends on what else ran: checked in
    tests/engine/test_latency_paths.py)."""
    num_kv_heads = k_cache.shape[2]
    num_heads, head_dim = q.shape[1], q.shape[2]
    if not (back_to_back(k_cache) and back_to_back(v_cache)):
        raise ValueError("decode in place needs caches whose blocks are laid out back to back")
    qg = q.view(1, num_kv_heads, num_heads // num_kv_heads, head_dim)
    views = [(_run_view(k_cache, first, length, q.dtype), _run_view(v_cache, first, length, q.dtype))
             for first, length in runs]
    if len(views) == 1:
        keys, values = views[0]
    else:
        keys = torch.cat([k for k, _ in views], dim=2)
        values = torch.cat([v for _, v in views], dim=2)
    return F.scaled_dot_product_attention(qg, keys, values, scale=scale).view(1, num_heads, head_dim)


def _decode_padded(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                   window: int = 0) -> torch.Tensor:
    batch, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    max_len = int(seq_lens.max())
    if window:
        table, pos = _window_columns(block_tables, seq_lens.to(q.device), block_size, window)
        length = pos.shape[1]
    else:
        table, length = block_tables[:, :-(-max_len // block_size)].long(), max_len
        pos = torch.arange(max_len, device=q.device)[None, :]
    # [B, blocks, B_size, Hkv, D] -> [B, Hkv, L, D]; padding entries are masked below.
    keys = load(k_cache[table].flatten(1, 2)[:, :length].transpose(1, 2), q.dtype)
    values = load(v_cache[table].flatten(1, 2)[:, :length].transpose(1, 2), q.dtype)
    group = num_heads // num_kv_heads
    qg = q.view(batch, num_kv_heads, group, head_dim)
    lens = seq_lens[:, None].to(q.device)
    valid = (pos < lens) & (pos >= lens - window) if window else pos < lens
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=valid[:, None, None, :],
                                         scale=scale)
    return out.reshape(batch, num_heads, head_dim)


def _window_columns(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                    window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For decode with a window: each row's block ids from its window's first block on
    ([B, n], as many columns as the widest row needs; a shorter row's extra columns repeat
    table entries at or after its window, clamped to the table, and are masked) and the
    position of each gathered token ([B, n * block_size]). Entries before a row's window are
    not gathered: they may hold any block id."""
    device = seq_lens.device
    first = (seq_lens - window).clamp(min=0) // block_size
    width = int((-(-seq_lens // block_size) - first).max())
    cols = first[:, None] + torch.arange(width, device=device)[None, :]
    table = block_tables.to(device).long().gather(1, cols.clamp(max=block_tables.shape[1] - 1))
    pos = first[:, None] * block_size + torch.arange(width * block_size, device=device)[None, :]
    return table, pos


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float, window: int = 0,
                            open_runs: list[list[tuple[int, int]]] | None = None) -> torch.Tensor:
    """New tokens attend causally to their sequence's cached prefix and to themselves (to the
    last `window` positions up to their own, with a window).

    Sequence i owns queries q[query_start_loc[i]:query_start_loc[i+1]] ([T, H, D] overall); they
    are its last tokens, so the cache already holds all seq_lens[i] tokens (written by write_kv).
    `open_runs[i]`: runs of positions [lo, hi) inside sequence i's new tokens whose queries also
    see the run's later keys (Gemma 3's image tokens: transformers' OR of causal and blockwise,
    then AND with the window).
    """
    out = torch.empty_like(q)
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        lo, hi = starts[i], starts[i + 1]
        q_len = hi - lo
        if q_len == 0:
            continue
        group = num_heads // num_kv_heads        # expanded K/V: much faster than enable_gqa on CPU
        start = window_start(seq_len - q_len + 1, window)     # the first query's window
        keys = load(_gather(k_cache, block_tables[i], seq_len, start), q.dtype).repeat_interleave(group, 1)
        values = load(_gather(v_cache, block_tables[i], seq_len, start), q.dtype).repeat_interleave(group, 1)
        runs = open_runs[i] if open_runs else ()
        # [1, H, T, D]: with a batch dimension torch's CPU flash kernel serves (masks included);
        # without, its slower math path (docs/benchmarks.md, 'Real models', has the figures)
        args = (q[lo:hi].transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None])
        if q_len == seq_len and not window and not runs:
            # plain causal over the whole sequence: the flash kernel skips the blocks above the
            # diagonal (`is_causal` aligns the diagonal top-left: right only without a prefix)
            attn = F.scaled_dot_product_attention(*args, is_causal=True, scale=scale)
        else:
            attn = F.scaled_dot_product_attention(*args, attn_mask=prefill_mask(
                seq_len, q_len, start, window, runs, q.device), scale=scale)
        out[lo:hi] = attn[0].transpose(0, 1)
    return out


def prefill_mask(seq_len: int, q_len: int, start: int, window: int,
                 runs: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """[q_len, seq_len - start]: which keys (positions start..seq_len-1) each of a sequence's
    last q_len positions sees: causal, OR each open run both ways, AND the window."""
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(start, seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    for first, end in runs:
        mask = mask | ((q_pos >= first) & (q_pos < end) & (k_pos >= first) & (k_pos < end))
    if window:
        mask = mask & (k_pos > q_pos - window)
    return mask


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """dst[block_mapping[p, 1]] = src[block_mapping[p, 0]] for every pair p.

    src and dst share a device and a block shape; they may be the same tensor (copy-on-write).
    Swapping between devices stages through a contiguous buffer (see localpaged.runner.kv_cache).
    """
    if block_mapping.numel() == 0:
        return
    mapping = block_mapping.to(src.device).long()
    dst[mapping[:, 1]] = src[mapping[:, 0]]
