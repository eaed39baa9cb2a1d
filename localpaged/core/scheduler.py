"""Scheduler: continuous batching of sequence groups under one token budget per step, in two
priority classes (interactive, background).

A background group never delays an interactive group by a step: interactive groups are
scheduled as if no background work existed (its blocks and batch slots are taken back when
needed; only what the prefix cache holds can differ), and background work only adds its share
to a batch: the leftover budget, at most one token per sequence while interactive work prefills
(tests/engine/test_priority.py checks this step by step; bench/background.py measures the time). With
`background_shares_batch=False` (EngineConfig.background_batch "idle", the default on CPUs, where
each batch row costs about as much as a lone request), background work only runs in steps that
schedule no interactive work: on idle capacity. A background request with the prompt of an
interactive one (an alternative reply) is admitted after that prompt's blocks are computed, so it
shares them through the prefix cache. Preempted background groups resume later with identical
outputs (recompute or swap; each sequence keeps its own RNG).

Every step (an iteration of the model):
1. Running interactive groups, oldest first, get their next tokens: one per decoding sequence, or
   the next chunk of a prompt (chunked prefill; a chunk never ends inside an image whose
   tokens attend both ways: core.multimodal.chunk_tokens). When blocks run out a running group is
   preempted whole: the most recently admitted background group, or, when none runs, the most
   recently admitted interactive group; by recompute (its blocks are freed, it goes back to the
   front of the waiting queue) or by swap (its blocks move to the CPU pool).
2. Unless an interactive group was preempted in 1, swapped-out interactive groups come back,
   then waiting interactive groups are admitted first-come-first-served while the token budget,
   `max_num_seqs` and blocks allow. When an interactive group does not fit (blocks or
   `max_num_seqs`), running background groups are preempted, most recently admitted first,
   until it does. A waiting group's prompt first looks up the prefix cache: cached blocks are
   not recomputed; a group whose first blocks a running prompt is still computing waits for
   them (core.shared_prefill) while later groups are admitted.
   Then background work (every step, or with "idle" only steps without interactive work):
   running background groups get the token budget left, at most one token per sequence in a
   step that prefills interactive work; and only when nothing was preempted this step, no
   interactive group is waiting or swapped out and no interactive work is prefilled,
   swapped-out and then waiting background groups come in.
Prefills and decodes share a step; the model runner receives one flat batch.
3. After the forward pass and sampling, `update_from_output` is the one post-step update: it
   advances the computed tokens of what ran, registers blocks that became full in the prefix
   cache, applies forks and frees (parallel samples, beam search) and frees every group that
   finished. Every way a request ends (stop, length, abort, out of memory, beam search done)
   goes through it.
See docs/architecture.md §5 (the life of a request, steps 2 and 6).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from localpaged.core.block_pool import BlockOp
from localpaged.core.config import PREEMPTION_MODES, check_choice
from localpaged.core.block_manager import BlockManager
from localpaged.core.multimodal import chunk_tokens
from localpaged.core.request import GroupStatus, Sequence, SequenceGroup
from localpaged.core.sampling_params import BACKGROUND, INTERACTIVE
from localpaged.core.shared_prefill import SharedPrefill

logger = logging.getLogger(__name__)


@dataclass
class ScheduledSeq:
    group: SequenceGroup
    seq: Sequence
    num_tokens: int          # tokens computed this step, starting at seq.num_computed_tokens
    # Whether this step reaches the end of the sequence's tokens (so it samples the next one);
    # fixed when scheduled, so it stays right after the engine advances the sequence.
    samples: bool = field(init=False)

    def __post_init__(self) -> None:
        self.samples = self.seq.num_computed_tokens + self.num_tokens == len(self.seq.token_ids)


@dataclass
class Fork:
    """child now shares every block of parent (n > 1 after the prompt, or a beam)."""
    parent: Sequence
    child: Sequence


@dataclass
class StepResult:
    """What sampling decided, for `Scheduler.update_from_output` to apply (in this order)."""
    forks: list[Fork] = field(default_factory=list)
    frees: list[Sequence] = field(default_factory=list)          # seqs dropped from a running group
    finished: list[SequenceGroup] = field(default_factory=list)  # every seq has a finish_reason
    # Verified drafts, by seq_id: the tokens of the step whose K/V stay (the input token and the
    # accepted drafts; the rejected positions' slots are given back), and (drafted, accepted).
    kept: dict[int, int] = field(default_factory=dict)
    drafts: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    block_ops: list[BlockOp] = field(default_factory=list)       # carry out in this order
    preempted: list[SequenceGroup] = field(default_factory=list)
    out_of_memory: list[SequenceGroup] = field(default_factory=list)  # cannot fit even alone

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption_mode: str = "recompute", background_shares_batch: bool = True) -> None:
        check_choice("preemption_mode", preemption_mode, PREEMPTION_MODES)
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.preemption_mode = preemption_mode
        # False: background work runs only in steps with no interactive work (3 and 4 skipped)
        self.background_shares_batch = background_shares_batch
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []        # admission order: the last is preempted first
        self.swapped: deque[SequenceGroup] = deque()
        self.num_preemptions = 0
        self.num_swapped_out = 0
        self.num_shared_prefill_waits = 0    # steps a waiting group left to a sharing prompt

    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens, INTERACTIVE)
        # After an interactive group was preempted nothing else fits; from here on, victims are
        # background groups only.
        if not any(g.priority == INTERACTIVE for g in out.preempted):
            budget = self._schedule_swapped(out, budget, INTERACTIVE)
            budget = self._schedule_waiting(out, budget, INTERACTIVE)
        if self.background_shares_batch or not out.scheduled:
            self._schedule_background(out, budget)
        self._drop_unscheduled_drafts(out)
        out.block_ops = self.block_manager.take_block_ops()
        return out

    def _drop_unscheduled_drafts(self, out: SchedulerOutput) -> None:
        """A draft of a sequence that does not run this step is gone (it is only a guess)."""
        scheduled = {item.seq.seq_id for item in out.scheduled}
        for group in self.running:
            for seq in group.unfinished_seqs():
                if seq.num_draft_tokens and seq.seq_id not in scheduled:
                    seq.drop_drafts()

    def _schedule_background(self, out: SchedulerOutput, budget: int) -> None:
        """Steps 3 and 4: background work within what interactive work left of the step."""
        prefilling = any(item.num_tokens > 1 for item in out.scheduled)   # all interactive here
        budget = self._schedule_running(out, budget, BACKGROUND, max_per_seq=1 if prefilling else None)
        if not (out.preempted or prefilling or self._queued(INTERACTIVE)):
            budget = self._schedule_swapped(out, budget, BACKGROUND)
            self._schedule_waiting(out, budget, BACKGROUND)

    def _queued(self, priority: str) -> bool:
        return any(g.priority == priority for q in (self.waiting, self.swapped) for g in q)

    def _running_background(self) -> list[SequenceGroup]:
        return [g for g in self.running if g.priority == BACKGROUND]

    # ---- running ------------------------------------------------------------------------------
    def _schedule_running(self, out: SchedulerOutput, budget: int, priority: str,
                          max_per_seq: int | None = None) -> int:
        """Schedule running groups of one priority, in admission order, within budget."""
        for group in [g for g in self.running if g.priority == priority]:
            if budget <= 0:
                break
            if group not in self.running:     # preempted as a victim meanwhile
                continue
            items = self._allocate_group(group, budget, out, max_per_seq)
            if items is None:                 # preempted itself
                continue
            out.scheduled.extend(items)
            budget -= sum(it.num_tokens for it in items)
        return budget

    def _victim(self) -> SequenceGroup:
        """The group to preempt next: the most recently admitted background group, if any."""
        background = self._running_background()
        return background[-1] if background else self.running[-1]

    def _allocate_group(self, group: SequenceGroup, budget: int, out: SchedulerOutput,
                        max_per_seq: int | None = None) -> list[ScheduledSeq] | None:
        """Blocks for every unfinished seq of group, preempting younger groups as needed.

        Victims come from `_victim`: a background group only ever preempts background groups
        (itself last), since every background group is younger in priority than any interactive.
        """
        items: list[ScheduledSeq] = []
        for seq in group.unfinished_seqs():
            n = chunk_tokens(seq.images, seq.num_computed_tokens,
                             min(seq.num_uncomputed_tokens, budget - sum(it.num_tokens for it in items),
                                 max_per_seq or budget), grow=max_per_seq is None)
            if n <= 0:
                continue
            seq.drop_drafts(keep=n - 1)        # a draft runs whole or in part, never past n
            while not self.block_manager.allocate_slots(seq, n):
                if seq.num_draft_tokens:       # a draft never preempts anyone: it goes first
                    seq.drop_drafts()
                    n = seq.num_uncomputed_tokens
                    continue
                victim = self._victim()
                if victim is group and len(self.running) == 1:   # alone, and still no room
                    self.running.remove(group)
                    out.scheduled = [s for s in out.scheduled if s.group is not group]
                    out.out_of_memory.append(group)
                    return None
                self._preempt(victim, out)
                if victim is group:
                    return None
            items.append(ScheduledSeq(group, seq, n))
        return items

    def _preempt(self, group: SequenceGroup, out: SchedulerOutput) -> None:
        self.running.remove(group)
        out.scheduled = [s for s in out.scheduled if s.group is not group]
        out.preempted.append(group)
        self.num_preemptions += 1
        seqs = group.unfinished_seqs()
        for seq in seqs:
            seq.drop_drafts()
        if self.preemption_mode == "swap" and self.block_manager.can_swap_out(seqs):
            self.block_manager.swap_out(seqs)
            group.status = GroupStatus.SWAPPED
            self.swapped.appendleft(group)
            self.num_swapped_out += 1
        else:
            for seq in seqs:
                self.block_manager.reset_computed(seq)
            group.status = GroupStatus.WAITING
            self.waiting.appendleft(group)
        logger.debug("preempted %s (%s)", group.request_id, group.status.value)

    # ---- swapped and waiting ------------------------------------------------------------------
    def _num_running_seqs(self) -> int:
        return sum(_width(g) for g in self.running)

    def _schedule_swapped(self, out: SchedulerOutput, budget: int, priority: str) -> int:
        while budget > 0:
            group = next((g for g in self.swapped if g.priority == priority), None)
            if group is None:
                break
            seqs = group.unfinished_seqs()
            if not self._make_room(group, out, lambda: self._fits_seqs(group)
                                   and self.block_manager.can_swap_in(seqs)):
                break
            self.swapped.remove(group)
            self.block_manager.swap_in(seqs)
            budget = self._start(group, budget, out)
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, priority: str) -> int:
        """Admit waiting groups first-come-first-served until one does not fit; a group whose
        prompt's blocks a running prompt is computing waits for them (core.shared_prefill)."""
        sharing = SharedPrefill(self.block_manager)
        for group in [g for g in self.waiting if g.priority == priority]:
            if budget <= 0:
                break
            if sharing.waits(group, self.running):
                self.num_shared_prefill_waits += 1
                continue
            if not self._make_room(group, out, lambda: self._fits_seqs(group)
                                   and self._admit(group, budget)):
                break
            self.waiting.remove(group)
            budget = self._start(group, budget, out, allocated=True)
            sharing.add(group)
        return budget

    def _fits_seqs(self, group: SequenceGroup) -> bool:
        return self._num_running_seqs() + _width(group) <= self.max_num_seqs

    def _make_room(self, group: SequenceGroup, out: SchedulerOutput, fits) -> bool:
        """Whether `fits()` (which may allocate, all or nothing) succeeds; for an interactive
        group, running background groups are preempted, most recently admitted first, until it does."""
        while not fits():
            background = self._running_background()
            if group.priority == BACKGROUND or not background:
                return False
            self._preempt(background[-1], out)
        return True

    def _admit(self, group: SequenceGroup, budget: int) -> bool:
        """Prefix-cache lookup and block allocation for a waiting group; all or nothing."""
        # prompt logprobs need every prompt position's logits: no prefix-cache hits then
        cached = self.block_manager.admit(group.unfinished_seqs(), budget,
                                          use_prefix_cache=not group.needs_prompt_logprobs)
        if cached is None:
            return False
        if group.num_cached_tokens is None:          # first admission only
            group.num_cached_tokens = cached[0]
            group.num_disk_tokens = self.block_manager.admitted_disk_tokens[0]
        return True

    def _start(self, group: SequenceGroup, budget: int, out: SchedulerOutput,
               allocated: bool = False) -> int:
        """Append group to running and schedule its tokens for this step."""
        group.status = GroupStatus.RUNNING
        self.running.append(group)
        for seq in group.unfinished_seqs():
            n = chunk_tokens(seq.images, seq.num_computed_tokens, min(seq.num_uncomputed_tokens, budget))
            if n <= 0:
                continue
            if not allocated and not self.block_manager.allocate_slots(seq, n):
                break                          # no room this step; it runs next step
            out.scheduled.append(ScheduledSeq(group, seq, n))
            budget -= n
        return budget

    # ---- the post-step update -----------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, result: StepResult) -> None:
        """Apply one step: what ran is computed, full blocks are cached, forks share blocks,
        dropped sequences and finished groups free theirs. The only place a group finishes."""
        for item in out.scheduled:
            kept = result.kept.get(item.seq.seq_id)
            item.seq.num_computed_tokens += item.num_tokens if kept is None else kept
            if kept is not None:               # blocks only rejected draft positions needed
                self.block_manager.trim(item.seq, item.seq.num_computed_tokens)
            self.block_manager.cache_full_blocks(item.seq)
        for fork in result.forks:
            self.block_manager.fork(fork.parent, fork.child)
        for seq in result.frees:          # siblings go on: what it gave back is reported
            seq.released_blocks = self.block_manager.free(seq)
        for group in result.finished:
            self._finish(group)

    def _finish(self, group: SequenceGroup) -> None:
        """Remove a finished or aborted group from every queue and free all it holds."""
        for queue in (self.waiting, self.swapped):
            if group in queue:
                queue.remove(group)
        if group in self.running:
            self.running.remove(group)
        for seq in group.seqs:
            self.block_manager.free(seq)
        group.status = GroupStatus.FINISHED


def _width(group: SequenceGroup) -> int:
    """Sequences the group runs now, or once forked if it is still in its prompt."""
    return max(len(group.unfinished_seqs()), group.width if group.in_prompt_stage else 1)
