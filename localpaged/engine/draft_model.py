"""DraftModel: a small model with the target's tokenizer that drafts tokens for speculative
decoding (`EngineConfig.speculation == "draft"`, `--draft-model`), where the conversation holds
nothing to copy (core/speculation.py drafts from n-grams first).

Owns the draft model, its own KV cache and its own KVCacheManager (the paper's block tables,
ref counts and prefix cache, for the draft's K/V), and per target sequence a *shadow*: a
Sequence of the draft model holding the target's tokens followed by the draft's guesses, with
its own block table. `propose` brings each shadow up to its target's tokens (the tokens the last
verification kept replace the guesses it rejected: their slots and blocks are given back with
`KVCacheManager.trim`), computes what the draft model has not seen yet, then decodes greedily,
one batched step per draft position, through the same ModelRunner the engine uses (on CPU the
C++ batch-1 loop for the decode steps). `forget` frees a finished sequence's shadow.

Invariants:
- A shadow's tokens up to `verified[seq_id]` are its target's kept tokens; only those are
  hashed into the draft's prefix cache, so a cached draft block never holds a guess.
- ref_count of a draft block == number of shadow tables holding it (KVCacheManager.check).
- The draft model never touches the target's blocks, steps or random numbers: a draft is only
  ever a guess, verified by the target (engine/sampler.py: verify), so the target's output is
  what it is without speculation, greedy or sampled.
- Out of draft blocks, the shadows of sequences not drafting this step give theirs back (least
  recently drafting first); if that is not enough, a sequence gets a shorter draft (or none)
  and loses its shadow. Nothing else changes.
"""

from __future__ import annotations

import itertools
import logging

import torch

from localpaged.core.kv_cache_manager import KVCacheManager
from localpaged.core.request import Sequence, SequenceGroup
from localpaged.core.sampling_params import SamplingParams
from localpaged.core.scheduler import ScheduledSeq, SchedulerOutput
from localpaged.runner import loader, startup_check
from localpaged.runner.batch1_cpu import Batch1Decoder
from localpaged.runner.kv_cache import KVCache
from localpaged.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)

PROMPT_CHUNK = 1024          # tokens of one shadow computed in one forward when it catches up


class DraftModel:
    def __init__(self, name: str, device: torch.device, dtype: torch.dtype, block_size: int,
                 num_blocks: int, tokenizer, vocab_size: int, enforce_eager: bool = False) -> None:
        loaded = loader.load(name, device, dtype, None, "auto")   # its file's format: small, fast
        check_same_tokenizer(name, loaded.tokenizer, tokenizer)
        self.model, mc = loaded.model, loaded.config
        if self.model.kv_groups.has_window:
            raise ValueError(f"draft model {name}: sliding-window layers are not supported for "
                             f"drafting; choose a model whose layers all attend fully")
        self.max_model_len = getattr(mc, "max_position_embeddings", 2048)
        self.vocab_size = vocab_size              # the target's: a guess is one of its ids
        backend, _ = startup_check.select_backend("auto", device, dtype, block_size,
                                                  self.model.head_dim)
        self.kv_cache = KVCache(mc.num_hidden_layers, [num_blocks], block_size,
                                mc.num_key_value_heads, self.model.head_dim, dtype, device, [0],
                                self.model.kv_groups.layer_group)
        self.blocks = KVCacheManager(num_blocks, block_size, True, keep_runs=device.type == "cpu")
        batch1 = None if enforce_eager else Batch1Decoder.create(self.model, self.kv_cache.layers,
                                                                  backend)
        self.runner = ModelRunner(self.model, self.kv_cache, self.blocks, backend, None, batch1)
        self.shadows: dict[int, SequenceGroup] = {}    # by the target's seq_id
        self.verified: dict[int, int] = {}             # shadow tokens that are its target's
        self.caught_up = 0            # prompt tokens the last propose computed (not a draft's cost)
        self.last_used: dict[int, int] = {}           # by the target's seq_id: when it last drafted
        self._clock = itertools.count()
        self._order: dict[int, int] = {}   # this call's sequences, in the order asked (first first)
        logger.info("draft model ready: %s, %d KV blocks of %d tokens", loaded.source.description,
                    num_blocks, block_size)

    # ---- the public interface ---------------------------------------------------------------
    def propose(self, wanted: list[tuple[Sequence, int]]) -> dict[int, list[int]]:
        """Up to k greedy tokens of the draft model after each target sequence's tokens, by the
        target's seq_id (fewer where the draft's blocks run out)."""
        self._order = {seq.seq_id: i for i, (seq, _) in enumerate(wanted)}
        for sid in self._order:
            self.last_used[sid] = next(self._clock)
        active = [(seq.seq_id, k) for seq, k in wanted if k > 0 and self._sync(seq)]
        drafts: dict[int, list[int]] = {sid: [] for sid, _ in active}
        self.caught_up = 0
        while active:
            items = self._schedule(active)
            self.caught_up += sum(it.num_tokens for it in items if it.num_tokens > 2)
            logits, rows, _ = self.runner.execute(SchedulerOutput(
                scheduled=items, block_ops=self.blocks.take_block_ops()))
            active = [(sid, k) for sid, k in active if sid in self.shadows]   # still holding blocks
            for item in items:
                item.seq.num_computed_tokens += item.num_tokens
                if item.samples:
                    token = int(logits[rows[item.seq.seq_id], :self.vocab_size].argmax())
                    item.seq.token_ids.append(token)
                    drafts[self._target_of(item.group)].append(token)
            active = [(sid, k) for sid, k in active if len(drafts[sid]) < k]
        return drafts

    def forget(self, seq_ids: list[int]) -> None:
        """The target sequences ended: free their shadows' blocks."""
        for sid in seq_ids:
            group = self.shadows.pop(sid, None)
            self.verified.pop(sid, None)
            self.last_used.pop(sid, None)
            if group is not None:
                self.blocks.free(group.seqs[0])

    def check(self) -> None:
        """The draft's block accounting (KVCacheManager.check) over the live shadows."""
        self.blocks.check(expect_empty=not self.shadows,
                          seqs=[g.seqs[0] for g in self.shadows.values()])

    # ---- bringing a shadow up to its target ---------------------------------------------------
    def _sync(self, seq: Sequence) -> bool:
        """The shadow of seq holds seq's tokens, its K/V computed as far as they agree; False
        when seq is past the draft model's context."""
        tokens = seq.token_ids
        if len(tokens) >= self.max_model_len:
            self.forget([seq.seq_id])
            return False
        group = self.shadows.get(seq.seq_id)
        if group is None:
            return self._start(seq)
        shadow, verified = group.seqs[0], self.verified[seq.seq_id]
        common = verified + _common_prefix(shadow.token_ids[verified:shadow.num_computed_tokens],
                                           tokens[verified:])
        # the last token is computed again even where the shadow's guesses already hold it (the
        # target kept them by n-gram drafts since): its logits are the next guess's
        common = min(common, len(tokens) - 1)
        shadow.num_computed_tokens = common
        self.blocks.trim(shadow, common)          # the rejected guesses' slots and blocks
        shadow.token_ids = list(tokens)
        self.verified[seq.seq_id] = len(tokens)
        self.blocks.cache_full_blocks(shadow)     # full blocks of kept tokens only
        return True

    def _start(self, seq: Sequence) -> bool:
        shadow = Sequence(seq.token_ids, len(seq.token_ids), 0, None)
        group = SequenceGroup(f"draft-{seq.seq_id}", None, shadow.token_ids,
                              SamplingParams(temperature=0.0), [shadow], set(), self.max_model_len)
        hits = self.blocks.find_cached_prefix(shadow)
        if not self._allocate(seq.seq_id, shadow, 0, hits):
            return False
        self.shadows[seq.seq_id] = group
        self.verified[seq.seq_id] = len(seq.token_ids)
        return True

    def _schedule(self, active: list[tuple[int, int]]) -> list[ScheduledSeq]:
        """This forward's work: each active shadow's next chunk of uncomputed tokens (one token
        once it has caught up); a shadow whose blocks do not fit is dropped."""
        items = []
        for sid, _ in active:
            if (group := self.shadows.get(sid)) is None:    # given back to an earlier one
                continue
            shadow = group.seqs[0]
            n = min(shadow.num_uncomputed_tokens, PROMPT_CHUNK)
            if len(shadow.token_ids) >= self.max_model_len or not self._allocate(sid, shadow, n):
                self.forget([sid])
                continue
            items.append(ScheduledSeq(group, shadow, n))
        return items

    def _allocate(self, sid: int, shadow: Sequence, n: int, hits: list | None = None) -> bool:
        """Slots for n more tokens of sid's shadow. When the draft's blocks run out, others give
        theirs back: first the shadows of sequences that did not ask for a draft this call
        (preempted, waiting, drafting from n-grams), least recently drafting first, then those
        asked for after this one (the Drafter asks for interactive requests first)."""
        mine = self._order.get(sid, len(self._order))
        while not self.blocks.allocate_slots(shadow, n, hits):
            others = [s for s in self.shadows if s != sid and self._order.get(s, len(self._order)) >= mine]
            if not others:
                return False
            self.forget([min(others, key=self._give_back_order)])
        return True

    def _give_back_order(self, sid: int) -> tuple[int, int]:
        """Sorts first the shadow that gives its blocks back first: not asked for this call,
        least recently drafting; then asked for, the last asked first."""
        if sid not in self._order:
            return 0, self.last_used.get(sid, -1)
        return 1, -self._order[sid]

    @staticmethod
    def _target_of(group: SequenceGroup) -> int:
        return int(group.request_id.removeprefix("draft-"))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class DraftTokenizerMismatch(ValueError):
    """The draft model's tokenizer is not the target's (the app then drafts from n-grams only)."""


def check_same_tokenizer(name: str, draft, target) -> None:
    """A draft model must map text to the same token ids as the target: its guesses are ids."""
    d, t = draft.get_vocab(), target.get_vocab()
    if d != t:
        raise DraftTokenizerMismatch(
            f"draft model {name}: its tokenizer differs from the target model's ({len(d):,} vs "
            f"{len(t):,} tokens, or the same count with other ids); a draft model must share the "
            f"target's tokenizer")
