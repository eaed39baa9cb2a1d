"""Scheduler: continuous batching of sequence groups under one token budget per step.

Every step (an iteration of the model):
1. Running groups, oldest first, get their next tokens: one per decoding sequence, or the next
   chunk of a prompt (chunked prefill). When blocks run out, the most recently admitted running
   group is preempted whole: by recompute (its blocks are freed, it goes back to the front of the
   waiting queue) or by swap (its blocks move to the CPU pool).
2. If nothing was preempted, swapped-out groups come back first, then waiting groups are
   admitted first-come-first-served while the token budget, `max_num_seqs` and blocks allow.
   A waiting group's prompt first looks up the prefix cache: cached blocks are not recomputed.
Prefills and decodes share a step; the model runner receives one flat batch.
3. After the forward pass and sampling, `update_from_output` is the one post-step update: it
   advances the computed tokens of what ran, registers blocks that became full in the prefix
   cache, applies forks and frees (parallel samples, beam search) and frees every group that
   finished. Every way a request ends (stop, length, abort, out of memory, beam search done)
   goes through it.
See docs/architecture.md §4 (the life of a request, steps 2 and 6).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from localpaged.block_pool import BlockOp
from localpaged.kv_cache_manager import KVCacheManager
from localpaged.request import GroupStatus, Sequence, SequenceGroup

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
    def __init__(self, block_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption_mode: str = "recompute") -> None:
        if preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {preemption_mode!r}")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.preemption_mode = preemption_mode
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []        # admission order: the last is preempted first
        self.swapped: deque[SequenceGroup] = deque()
        self.num_preemptions = 0
        self.num_swapped_out = 0

    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
            self._schedule_waiting(out, budget)
        out.block_ops = self.block_manager.take_block_ops()
        return out

    # ---- running ------------------------------------------------------------------------------
    def _schedule_running(self, out: SchedulerOutput) -> int:
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            group = self.running[i]
            items = self._allocate_group(group, budget, out)
            if items is None:                 # preempted itself
                continue
            out.scheduled.extend(items)
            budget -= sum(it.num_tokens for it in items)
            i += 1
        return budget

    def _allocate_group(self, group: SequenceGroup, budget: int,
                        out: SchedulerOutput) -> list[ScheduledSeq] | None:
        """Blocks for every unfinished seq of group, preempting younger groups as needed."""
        items: list[ScheduledSeq] = []
        for seq in group.unfinished_seqs():
            n = min(seq.num_uncomputed_tokens, budget - sum(it.num_tokens for it in items))
            if n <= 0:
                continue
            while not self.block_manager.allocate_slots(seq, n):
                victim = self.running[-1]
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

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        while self.swapped and budget > 0:
            group = self.swapped[0]
            seqs = group.unfinished_seqs()
            if (self._num_running_seqs() + _width(group) > self.max_num_seqs
                    or not self.block_manager.can_swap_in(seqs)):
                break
            self.swapped.popleft()
            self.block_manager.swap_in(seqs)
            budget = self._start(group, budget, out)
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0:
            group = self.waiting[0]
            if self._num_running_seqs() + _width(group) > self.max_num_seqs:
                break
            if not self._admit(group, budget):
                break
            self.waiting.popleft()
            budget = self._start(group, budget, out, allocated=True)

    def _admit(self, group: SequenceGroup, budget: int) -> bool:
        """Prefix-cache lookup and block allocation for a waiting group; all or nothing."""
        # prompt logprobs need every prompt position's logits: no prefix-cache hits then
        cached = self.block_manager.admit(group.unfinished_seqs(), budget,
                                          use_prefix_cache=not group.needs_prompt_logprobs)
        if cached is None:
            return False
        if group.num_cached_tokens is None:          # first admission only
            group.num_cached_tokens = cached[0]
        return True

    def _start(self, group: SequenceGroup, budget: int, out: SchedulerOutput,
               allocated: bool = False) -> int:
        """Append group to running and schedule its tokens for this step."""
        group.status = GroupStatus.RUNNING
        self.running.append(group)
        for seq in group.unfinished_seqs():
            n = min(seq.num_uncomputed_tokens, budget)
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
            item.seq.num_computed_tokens += item.num_tokens
            self.block_manager.cache_full_blocks(item.seq)
        for fork in result.forks:
            self.block_manager.fork(fork.parent, fork.child)
        for seq in result.frees:
            self.block_manager.free(seq)
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
