"""Shared prefill: a waiting prompt that begins like one being prefilled waits for its blocks.

The prefix cache holds a block once it is computed (`cache_full_blocks`, after the step). Two
prompts that begin alike and arrive together (tabs sent at once, API clients sharing a system
prompt and a document) would otherwise both compute their common blocks in the same step. The
scheduler instead leaves such a prompt waiting while a running group still in its prompt has
those blocks to compute; the step after they are computed it is admitted, finds them in the
prefix cache and computes only what differs. A prefix hit gives the same tokens as computing
the blocks (the engine's tests check it), so outputs do not change; the waiting prompt's first
token comes after the other's prefill step and its own (shorter) one instead of after one step
that computes both.

Invariants:
- a group waits only on blocks that a *running* group still in its prompt has yet to compute,
  so that group's progress (or its preemption, which takes it out of the running list) ends the
  wait: no group waits on a group that is waiting itself;
- an interactive group waits only on interactive groups (a background group may run only on
  capacity interactive work leaves, so waiting on one would delay interactive work: the
  scheduler's rule); a background group waits on either;
- a chain hash names a block's tokens and everything before them (prefix_cache.hash_block),
  so a shared hash means the whole prefix up to that block is shared: every earlier block is
  computed by then or computed by the same group.
Groups that skip the prefix cache (prompt logprobs) never wait.
"""

from __future__ import annotations

from localpaged.core.block_manager import BlockManager
from localpaged.core.request import SequenceGroup
from localpaged.core.sampling_params import BACKGROUND, INTERACTIVE

# A prompt waits only when at least this many of its full blocks are being computed by another
# group: below it, the step's wait costs more than the tokens it saves.
MIN_SHARED_BLOCKS = 2


class SharedPrefill:
    """One scheduling step's view: which blocks the running groups' prompts have yet to compute."""

    def __init__(self, block_manager: BlockManager) -> None:
        self.block_manager = block_manager
        self.enabled = block_manager.pool.enable_caching
        self._computing: set[bytes] | None = None     # built on the first question of a step

    def add(self, group: SequenceGroup) -> None:
        """`group` now runs (admitted this step, of the priority asked about): its prompt's
        blocks count from here on."""
        if self._computing is not None:
            self._computing |= self._to_compute(group)

    def waits(self, group: SequenceGroup, running: list[SequenceGroup]) -> bool:
        """Whether waiting `group` should stay waiting this step: MIN_SHARED_BLOCKS or more of
        its prompt's full blocks (before its last token) are being computed by a running group."""
        if not self.enabled or group.needs_prompt_logprobs or not group.in_prompt_stage:
            return False
        if self._computing is None:          # the groups of one call share their priority
            self._computing = set()
            for other in running:
                if other.priority == INTERACTIVE or group.priority == BACKGROUND:
                    self._computing |= self._to_compute(other)
        if not self._computing:
            return False
        seq, size = group.seqs[0], self.block_manager.block_size
        hashes = self.block_manager.block_hashes(seq, (len(seq.token_ids) - 1) // size)
        return sum(h in self._computing for h in hashes) >= MIN_SHARED_BLOCKS

    def _to_compute(self, group: SequenceGroup) -> set[bytes]:
        """Chain hashes of the full prompt blocks `group` has not computed yet (none once the
        prompt is done)."""
        if not group.in_prompt_stage:
            return set()
        seq, size = group.seqs[0], self.block_manager.block_size
        hashes = self.block_manager.block_hashes(seq, len(seq.token_ids) // size)
        return set(hashes[seq.num_computed_tokens // size:])
