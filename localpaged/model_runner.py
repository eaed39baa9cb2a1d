"""ModelRunner: turns a scheduled batch into flat tensors, runs the model, samples.

Per step it builds, from the scheduler's output: token ids and positions of every new token
(decodes first, then prefill chunks), the slot mapping, block tables and sequence lengths. It
carries out the block moves the scheduler decided (swap out, copy-on-write, swap in) before the
forward pass, in the order the KV cache manager decided them (a copy-on-write of a block that was
just swapped in must follow the swap-in; a swap-out must follow the copies into its blocks).
See docs/architecture.md §4 steps 3-4 (prepare: slot mapping, block tables; forward).
"""

from __future__ import annotations

import torch

from localpaged import prompt_logprobs
from localpaged.attention import AttentionBackend, AttentionMetadata
from localpaged.kv_cache import KVCache
from localpaged.kv_cache_manager import KVCacheManager
from localpaged.models import LlamaForCausalLM
from localpaged.scheduler import ScheduledSeq, SchedulerOutput


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, kv: KVCacheManager,
                 backend: AttentionBackend) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.kv = kv
        self.backend = backend
        self.device = kv_cache.device

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[torch.Tensor | None, dict[int, int], dict]:
        """Run one step; returns float32 CPU logits [S, V], per sampling seq_id its row, and
        the prompt logprobs computed this step per seq_id (prompt_logprobs.compute)."""
        for op in out.block_ops:
            self.kv_cache.apply(op, self.backend)
        items = order_batch(out.scheduled)
        if not items:
            return None, {}, {}
        input_ids, positions, meta = self.prepare(items)
        hidden = self.model(input_ids, positions, self.kv_cache.layers, meta, self.backend)
        prompt_lps = prompt_logprobs.compute(self.model, hidden, items)
        ends = torch.tensor(_last_token_indices(items), dtype=torch.long, device=self.device)
        sampling = [it for it in items if it.samples]
        if not sampling:
            return None, {}, prompt_lps
        logits = self.model.compute_logits(hidden.index_select(0, ends)).float().cpu()
        return logits, {it.seq.seq_id: i for i, it in enumerate(sampling)}, prompt_lps

    def prepare(self, items: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        B = self.kv.block_size
        tokens, positions, slots = [], [], []
        for it in items:
            start = it.seq.num_computed_tokens
            span = range(start, start + it.num_tokens)
            table = self.kv.block_ids(it.seq)
            tokens.extend(it.seq.token_ids[start:start + it.num_tokens])
            positions.extend(span)
            slots.extend(table[p // B] * B + p % B for p in span)
        decodes = [it for it in items if it.num_tokens == 1 and it.seq.num_computed_tokens > 0]
        prefills = items[len(decodes):]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode_tokens=len(decodes),
            decode_block_tables=self._block_tables(decodes),
            decode_seq_lens=_seq_lens(decodes, dev),
            prefill_block_tables=self._block_tables(prefills),
            prefill_query_start_loc=torch.tensor(
                [0] + _cumsum([it.num_tokens for it in prefills]), dtype=torch.int32, device=dev),
            prefill_seq_lens=_seq_lens(prefills, dev),
        )
        return (torch.tensor(tokens, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev), meta)

    def _block_tables(self, items: list[ScheduledSeq]) -> torch.Tensor:
        tables = [self.kv.block_ids(it.seq) for it in items]
        width = max((len(t) for t in tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device).view(len(items), width)


def order_batch(items: list[ScheduledSeq]) -> list[ScheduledSeq]:
    """Decodes (one new token after a computed context) first, then prefill chunks."""
    def is_decode(it: ScheduledSeq) -> bool:
        return it.num_tokens == 1 and it.seq.num_computed_tokens > 0
    return [it for it in items if is_decode(it)] + [it for it in items if not is_decode(it)]


def _seq_lens(items: list[ScheduledSeq], device: torch.device) -> torch.Tensor:
    return torch.tensor([it.seq.num_computed_tokens + it.num_tokens for it in items],
                        dtype=torch.int32, device=device)


def _cumsum(xs: list[int]) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out


def _last_token_indices(items: list[ScheduledSeq]) -> list[int]:
    ends = _cumsum([it.num_tokens for it in items])
    return [end - 1 for end, it in zip(ends, items) if it.samples]
