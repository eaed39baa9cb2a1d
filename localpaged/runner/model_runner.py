"""ModelRunner: turns a scheduled batch into flat tensors, runs the model, samples.

Per step it builds, from the scheduler's output: token ids and positions of every new token
(decodes first, then prefill chunks), the slot mapping, block tables and sequence lengths. It
carries out the block moves the scheduler decided (swap out, copy-on-write, swap in) before the
forward pass, in the order the KV cache manager decided them (a copy-on-write of a block that was
just swapped in must follow the swap-in; a swap-out must follow the copies into its blocks).
See docs/architecture.md §5 steps 3-4 (prepare: slot mapping, block tables; forward).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from localpaged.core.block_manager import BlockManager
from localpaged.core.request import Sequence
from localpaged.core.scheduler import ScheduledSeq, SchedulerOutput
from localpaged.kernels.reference import decode_runs, window_start
from localpaged.models import LlamaForCausalLM
from localpaged.models.attention import AttentionMetadata, PagedAttention
from localpaged.runner import image_batch, prompt_logprobs
from localpaged.runner.batch1_cpu import Batch1Decoder
from localpaged.runner.cuda_graphs import DecodeGraphRunner
from localpaged.runner.encoder_cache import EncoderCache
from localpaged.runner.kv_cache import KVCache


@dataclass
class StepTimings:
    """Seconds spent per phase of engine steps (scheduler, prepare, forward, sample, finish).

    Optional and passed explicitly to `LLMEngine.step`; on CUDA each phase synchronizes first so
    a phase's kernels are charged to it (only when timings are asked for).
    """
    seconds: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    sync_cuda: bool = False

    @contextmanager
    def phase(self, name: str):
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def _sync(self) -> None:
        if self.sync_cuda:
            torch.cuda.synchronize()

    def per_step_ms(self) -> dict[str, float]:
        return {k: 1000 * v / max(1, self.steps) for k, v in self.seconds.items()}


@contextmanager
def _no_phase(name: str):
    yield


def phase_of(timings: StepTimings | None):
    """timings.phase, or a no-op context manager when no timings are asked for."""
    return timings.phase if timings is not None else _no_phase


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache,
                 block_manager: BlockManager,
                 backend: PagedAttention, graphs: DecodeGraphRunner | None = None,
                 batch1: Batch1Decoder | None = None, encoder: EncoderCache | None = None) -> None:
        self.model = model
        self.encoder = encoder        # a vision-language model's tower and its cache, else None
        self.graphs = graphs          # decode-only batches replay a CUDA graph when set
        self.batch1 = batch1          # CPU batch-1 decode: the layer loop in C++ when set
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.backend = backend
        self.device = kv_cache.device
        # None: one full-attention group (one AttentionMetadata a step); else each KV-cache
        # group's window, one AttentionMetadata per group (core.hybrid_kv_cache_manager)
        self.windows = None if block_manager.windows == (0,) else block_manager.windows

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, timings: StepTimings | None = None
                ) -> tuple[torch.Tensor | None, dict[int, int], dict]:
        """Run one step; returns float32 CPU logits [S, V], per sampling seq_id its row (a
        sequence with d draft tokens has d + 1 rows from there: the positions of its input
        token and of each draft), and the prompt logprobs computed this step per seq_id
        (prompt_logprobs.compute)."""
        phase = phase_of(timings)
        for op in out.block_ops:
            self.kv_cache.apply(op, self.backend)
        items = order_batch(out.scheduled)
        if not items:
            return None, {}, {}
        with phase("prepare"):
            input_ids, positions, meta = self.prepare(items)
        images = None
        if self.encoder is not None:
            with phase("encode"):
                images = image_batch.gather(items, self.encoder, self.encoder.tower.image_token_id,
                                            self.device)
        with phase("forward"):
            max_position = max(it.seq.num_computed_tokens + it.num_tokens for it in items) - 1
            one = isinstance(meta, AttentionMetadata)       # one KV-cache group
            if images is not None:        # image rows: the eager model (graphs and batch-1 take ids)
                hidden = self.model(input_ids, positions, self.kv_cache.layers, meta,
                                    self.backend, max_position, images=images)
            elif one and self.graphs is not None and self.graphs.can_run(meta, input_ids.shape[0]):
                hidden = self.graphs.run(input_ids, positions, meta)
            elif one and self.batch1 is not None and self.batch1.can_run(meta):
                hidden = self.batch1.run(input_ids, positions, meta, max_position)
            else:
                hidden = self.model(input_ids, positions, self.kv_cache.layers, meta,
                                    self.backend, max_position)
        prompt_lps = prompt_logprobs.compute(self.model, hidden, items)
        sampling = [it for it in items if it.samples]
        if not sampling:
            return None, {}, prompt_lps
        with phase("logits"):
            picked = _sampled_positions(items)
            if len(picked) != hidden.shape[0]:
                hidden = hidden.index_select(0, torch.tensor(picked, dtype=torch.long,
                                                             device=self.device))
            logits = self.model.compute_logits(hidden).float().cpu()
        return logits, _first_rows(sampling), prompt_lps

    def prepare(self, items: list[ScheduledSeq]
                ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata | list[AttentionMetadata]]:
        """Token ids, positions and the attention metadata: one AttentionMetadata for a model of
        one full-attention group, else one per KV-cache group (its own block tables and slots)."""
        tokens, positions = [], []
        for it in items:
            start = it.seq.num_computed_tokens
            tokens.extend(it.seq.token_ids[start:start + it.num_tokens])
            positions.extend(range(start, start + it.num_tokens))
        bm = self.block_manager
        if self.windows is None:
            meta = self._metadata(items, positions, bm.block_ids, 0)
        else:
            meta = [self._metadata(items, positions, functools.partial(bm.group_block_ids, g), w)
                    for g, w in enumerate(self.windows)]
        if self.encoder is not None and self.encoder.tower.bidirectional:
            runs = image_batch.open_runs([it for it in items if not is_decode(it)],
                                         self.encoder.tower.image_token_id)
            for m in [meta] if isinstance(meta, AttentionMetadata) else meta:
                m.open_runs = runs
        dev = self.device
        return (torch.tensor(tokens, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev), meta)

    def _metadata(self, items: list[ScheduledSeq], positions: list[int],
                  block_ids: Callable[[Sequence], list[int]], window: int) -> AttentionMetadata:
        """One group's metadata from its block tables (`block_ids`; 0 in NULL entries, which
        lie wholly before the window: never written, never read)."""
        B = self.block_manager.block_size
        tables = [block_ids(it.seq) for it in items]
        slots = []
        for it, table in zip(items, tables):
            start = it.seq.num_computed_tokens
            slots.extend(table[p // B] * B + p % B for p in range(start, start + it.num_tokens))
        num_decodes = sum(1 for it in items if is_decode(it))   # items are ordered: decodes first
        decodes, prefills = items[:num_decodes], items[num_decodes:]
        dev = self.device
        # One decode row per new token of a decode: a verified draft of d tokens is d + 1 rows
        # of its sequence, row j seeing the first computed + j + 1 tokens, so each position is
        # computed exactly as decoding it alone would (same kernels, same numbers).
        rows = [(i, it.seq.num_computed_tokens + j + 1) for i, it in enumerate(decodes)
                for j in range(it.num_tokens)]
        runs = None
        if self.backend.decode_one and len(items) == len(rows) == 1:
            seq_len = positions[0] + 1
            runs = decode_runs(tables[0], seq_len, B, window_start(seq_len, window))
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode_tokens=len(rows),
            decode_block_tables=self._block_tables([tables[i] for i, _ in rows]),
            decode_seq_lens=torch.tensor([n for _, n in rows], dtype=torch.int32, device=dev),
            prefill_block_tables=self._block_tables(tables[num_decodes:]),
            prefill_query_start_loc=torch.tensor(
                [0] + _cumsum([it.num_tokens for it in prefills]), dtype=torch.int32, device=dev),
            prefill_seq_lens=_seq_lens(prefills, dev),
            decode_runs=runs,
            window=window,
        )

    def _block_tables(self, tables: list[list[int]]) -> torch.Tensor:
        width = max((len(t) for t in tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device).view(len(tables), width)


def is_decode(it: ScheduledSeq) -> bool:
    """One new token after a computed context, with the draft tokens it verifies if any (as
    opposed to a prefill chunk)."""
    return it.num_tokens == 1 + it.seq.num_draft_tokens and it.seq.num_computed_tokens > 0


def order_batch(items: list[ScheduledSeq]) -> list[ScheduledSeq]:
    """Decodes first, then prefill chunks."""
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


def _sampled_positions(items: list[ScheduledSeq]) -> list[int]:
    """Rows of the step's hidden states that get logits: each sampling item's last token, or
    its last 1 + d tokens when it verifies a draft of d."""
    ends = _cumsum([it.num_tokens for it in items])
    return [p for end, it in zip(ends, items) if it.samples
            for p in range(end - 1 - it.seq.num_draft_tokens, end)]


def _first_rows(sampling: list[ScheduledSeq]) -> dict[int, int]:
    rows, row = {}, 0
    for it in sampling:
        rows[it.seq.seq_id] = row
        row += 1 + it.seq.num_draft_tokens
    return rows
