"""Speculative decoding's drafts: tokens guessed for a decoding sequence from what it already
holds (prompt lookup: its last n tokens found earlier in its prompt or output, and the tokens
that followed there), for the model to verify in one forward over every draft position.

Owns `propose` / `propose_from` (the n-gram lookup; a copy in progress continues where it
was), `DraftState` (per sequence: how likely a draft token is to be accepted, and so how many
to draft, if any), `StepCost` (what a step with d draft rows costs here in plain steps) and
`Drafter` (which sequences get drafts in a step, and how many: `attach`; with a draft model,
engine/draft_model.py, the sequences whose n-grams find nothing are drafted by it). Verification is the
sampler's (engine/sampler.py: verify), the bookkeeping the scheduler's and the KV cache
manager's; this module only guesses.

Invariants:
- A draft is never trusted: a sequence keeps exactly the tokens decoding without speculation
  keeps, greedy or sampled (a verification draws each position with the random number plain
  decoding would use: the rejection rule for a point-mass draft).
- Draft tokens sit at the end of `seq.token_ids` only between `attach` and the verification of
  the same step, counted by `seq.num_draft_tokens`; the scheduler drops those it does not run
  (`Sequence.drop_drafts`), so a draft is never a computed token, never hashed into the prefix
  cache, never shown.
- A draft never costs another request anything: when its blocks do not fit, it is dropped
  before anyone is preempted (scheduler).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from localpaged.core.request import Sequence, SequenceGroup
from localpaged.core.sampling_params import INTERACTIVE

NGRAM_MAX, NGRAM_MIN = 4, 2           # the longest and shortest suffix looked up
SEARCH_WINDOW = 4096                  # tokens back from the end that a lookup searches
OFF_BELOW = 0.2                       # acceptance rate under which a sequence stops drafting
DECAY = 0.8                           # weight of the past in DraftState's and StepCost's figures
PRIOR_ROW_COST = 0.25                 # a draft row's cost in plain steps until one is measured
PRIOR_MODEL_COST = 0.2                # a draft model's token in plain steps until one is measured
ROW_DECAY = 0.9                       # weight of the past in StepCost's row cost
PROBE_EVERY = 16                      # steps between drafts of a sequence that stopped
CONTROL_EVERY = 8                     # every 8th step drafts nothing (StepCost's plain figure)
NGRAM_SLACK = 0.3                     # n-grams draft unless their rate is this far below the model's
RETRY_NGRAM = 4                       # ... or they were passed over this many times in a row
MODEL_AFTER = 3                       # steps in a row without an n-gram match before a sequence's
                                      # first draft-model draft (which reads its whole prompt)


def propose(token_ids: list[int], k: int, sources: tuple[tuple[int, ...], ...] = (),
            near: int = 0, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN) -> list[int]:
    """Up to k tokens that followed an earlier occurrence of the longest suffix of token_ids
    (ngram_max down to ngram_min tokens long): in the draft sources first (earlier replies to
    the same prompt; the occurrence nearest to position `near`, the sequence's own output
    length, so a reply lines up with its sibling), then in token_ids' own last SEARCH_WINDOW
    tokens (the latest occurrence); [] when the suffix occurs nowhere."""
    return propose_from(token_ids, k, sources, near, None, ngram_max, ngram_min)[0]


def propose_from(token_ids: list[int], k: int, sources: tuple[tuple[int, ...], ...] = (),
                 near: int = 0, after: int | None = None, ngram_max: int = NGRAM_MAX,
                 ngram_min: int = NGRAM_MIN) -> tuple[list[int], int | None]:
    """`propose`, and where in token_ids the draft was copied from (None: from a source). With
    `after`, an occurrence in token_ids whose continuation starts at or after that position is
    taken before the latest one: a reply that copies its prompt in order (a pasted function
    written out again) keeps copying from where it was, even where the same few tokens occur
    on many of its lines."""
    if k <= 0 or len(token_ids) <= ngram_min:
        return [], None
    offset = max(0, len(token_ids) - SEARCH_WINDOW)
    own = np.asarray(token_ids[offset:], dtype=np.int64)
    texts = [np.asarray(src, dtype=np.int64) for src in sources]
    for n in range(min(ngram_max, len(own) - 1), ngram_min - 1, -1):
        suffix = own[len(own) - n:]
        for text in texts:
            if (found := _follows(text, suffix, len(text), k, near=near))[0]:
                return found[0], None
        at = None if after is None else after - offset
        draft, start = _follows(own, suffix, len(own) - n, k, after=at)   # not the suffix itself
        if draft:
            return draft, offset + start
    return [], None


def _follows(text: np.ndarray, pattern: np.ndarray, end: int, k: int, near: int | None = None,
             after: int | None = None) -> tuple[list[int], int]:
    """Up to k tokens after an occurrence of pattern starting before `end` in text (with a
    token after it), and where they start: the occurrence ending nearest to `near`, else the
    first whose continuation starts at or after `after`, else the latest."""
    n = len(pattern)
    starts = [i for i in np.flatnonzero(text[:max(0, end)] == pattern[0])
              if i + n < len(text) and np.array_equal(text[i:i + n], pattern)]
    if not starts:
        return [], 0
    if near is not None:
        i = min(starts, key=lambda i: abs(i + n - near))
    else:
        i = next((i for i in starts if after is not None and i + n >= after), starts[-1])
    return text[i + n:i + n + k].tolist(), int(i + n)


@dataclass
class DraftState:
    """One sequence's drafting: how likely its next draft token is to be accepted, and so how
    many to draft (the counts shown are the Sequence's: `drafted`, `accepted`).

    A verification keeps a draft's tokens up to its first rejection, so each draft token is a
    trial that succeeds with probability `rate` until one fails: after a draft of d tokens with
    a accepted, a successes and (a < d) failures. `rate` is their ratio over exponentially
    decaying counts (the sequence's recent drafts weigh most). A draft of k tokens then yields
    1 + rate + ... + rate^k tokens on average (`expected`); `next_k` picks the k with the most
    tokens per unit of the step's cost (StepCost.ratio), and none where no k beats a plain step
    (one token, cost 1). A sequence that stopped tries one draft every PROBE_EVERY steps, so a
    reply that starts to repeat itself is noticed."""
    k_max: int
    copy_from: int | None = None      # where in its tokens its drafts copy from next (see propose_from)
    draft_at: int | None = None       # where the pending draft was copied from
    successes: float = 3.0            # a prior of 3 accepted in 3.5 trials (rate 0.86)
    trials: float = 3.5
    idle_steps: int = 0
    passed_over: int = 0              # n-gram drafts found but not used for the draft model's
    misses: int = 0                   # steps in a row in which n-grams found nothing

    @property
    def rate(self) -> float:
        return self.successes / self.trials

    def expected(self, k: int) -> float:
        """Tokens a verification of a k-token draft yields on average (its own one included)."""
        r = min(self.rate, 1 - 1e-9)
        return (1 - r ** (k + 1)) / (1 - r)

    def best(self, ratio: Callable[[int], float]) -> tuple[float, int]:
        """The most expected tokens per unit of cost over draft lengths 1 .. k_max, and that k."""
        return max((self.expected(k) / ratio(k), k) for k in range(1, self.k_max + 1))

    def next_k(self, cost: StepCost, ratio: Callable[[int], float] | None = None) -> int:
        """The draft length for this step (0: none), by `ratio` (default cost.ratio: a draft
        that costs only its verification rows)."""
        gain, k = self.best(ratio or cost.ratio)
        if gain > 1 and self.rate >= OFF_BELOW:
            return k
        self.idle_steps += 1
        return k if self.idle_steps % PROBE_EVERY == 0 else 0

    def update(self, drafted: int, accepted: int) -> None:
        """After verification: accepted of drafted tokens were kept."""
        if drafted == 0:
            return
        if self.draft_at is not None:
            self.copy_from = self.draft_at + accepted
        self.successes = DECAY * self.successes + accepted
        self.trials = DECAY * self.trials + accepted + (accepted < drafted)


@dataclass
class StepCost:
    """What a decode step with d draft rows costs in plain decode steps on this machine and model:
    `ratio(d)` = 1 + row x d, measured on decode-only steps. A verification runs 1 + d decode rows
    (on CPU one conversation's through the C++ batch-1 loop, as its plain steps): where reading
    the weights bounds a step a row costs little, where the arithmetic does (a small model, a
    long context's attention, a CPU's integer multiplies) more. `row` is an exponential average
    over drafted steps of (seconds / plain - 1) / d (PRIOR_ROW_COST until one is measured), and
    `plain` one of plain steps' seconds. (A least-squares fit of base + per-row seconds was
    tried: over a few recent steps of similar d it put a verification's base at 2.5 plain steps,
    where one row measures ~1.4, and drafts came out too long.) Every CONTROL_EVERY-th step
    drafts nothing, so the plain figure stays current whatever the sequences do."""
    plain: float | None = None
    row: float = PRIOR_ROW_COST
    model_token: float = PRIOR_MODEL_COST     # a draft model's step per drafted position
    step: int = 0

    def allows(self) -> bool:
        """Whether this step may draft (called once per step)."""
        self.step += 1
        return self.step % CONTROL_EVERY != 0

    def ratio(self, d: int) -> float:
        """Seconds of a step with d draft rows over a plain one's."""
        return 1.0 + self.row * d

    def model_ratio(self, d: int) -> float:
        """`ratio` of a draft that a draft model guessed: d of its steps on top."""
        return 1.0 + (self.row + self.model_token) * d

    def observe_model(self, seconds: float, positions: int) -> None:
        """A draft model's steps for `positions` draft positions took `seconds`."""
        if self.plain and positions:
            token = seconds / self.plain / positions
            self.model_token = ROW_DECAY * self.model_token + (1 - ROW_DECAY) * token

    def observe(self, seconds: float, drafted_rows: int) -> None:
        """A decode step (no prompt work in it) with this many draft rows took `seconds`."""
        if drafted_rows == 0:
            self.plain = seconds if self.plain is None else 0.8 * self.plain + 0.2 * seconds
        elif self.plain:
            row = max(0.0, (seconds / self.plain - 1.0) / drafted_rows)
            self.row = ROW_DECAY * self.row + (1 - ROW_DECAY) * row


class DraftProposer(Protocol):
    """A draft model (engine/draft_model.py: DraftModel)."""
    caught_up: int            # tokens its last `propose` computed to catch up (prompts)

    def propose(self, wanted: list[tuple[Sequence, int]]) -> dict[int, list[int]]: ...

    def forget(self, seq_ids: list[int]) -> None: ...


@dataclass
class Drafter:
    """Drafts for the running sequences of a step (EngineConfig.speculation "ngram", or "draft":
    n-grams first, the draft `model` where they find nothing)."""
    k_max: int
    model: DraftProposer | None = None
    # background work runs only in steps without interactive work (Scheduler's "idle"
    # batching): while interactive groups run, background ones get no draft (it would be dropped)
    background_idle: bool = False
    states: dict[int, DraftState] = field(default_factory=dict)     # by seq_id: n-gram drafts
    model_states: dict[int, DraftState] = field(default_factory=dict)   # the draft model's
    drafting: dict[int, DraftState] = field(default_factory=dict)   # this step's draft's source
    cost: StepCost = field(default_factory=StepCost)
    drafted: int = 0                  # totals over the engine's life (stats, /metrics)
    accepted: int = 0
    model_seconds: float = 0.0        # the draft model's share of this step

    def attach(self, groups: list[SequenceGroup]) -> None:
        """Append a draft to each decoding sequence that can take one, where drafts pay."""
        self.model_seconds = 0.0
        if not self.cost.allows():
            return
        wanted: list[tuple[Sequence, int]] = []      # for the draft model, interactive first
        busy = self.background_idle and any(g.priority == INTERACTIVE for g in groups)
        for group in sorted(groups, key=lambda g: g.priority != INTERACTIVE):
            if not eligible(group) or busy and group.priority != INTERACTIVE:
                continue
            for seq in group.unfinished_seqs():
                if seq.num_uncomputed_tokens == 1 and not seq.num_draft_tokens:
                    self._draft(group, seq, wanted)
        if wanted:
            self._draft_by_model(wanted)

    def _draft(self, group: SequenceGroup, seq: Sequence, wanted: list[tuple[Sequence, int]]) -> None:
        state = self.states.setdefault(seq.seq_id, DraftState(self.k_max))
        room, sources = draft_room(group, seq), group.params_for(seq).draft_sources
        self.drafting[seq.seq_id] = state
        if self.model is None:
            k = min(state.next_k(self.cost), room)
            draft, state.draft_at = propose_from(seq.token_ids, k, sources, near=seq.num_output_tokens,
                                                 after=state.copy_from)
            _append(seq, draft)
            return
        # n-grams first (they cost nothing to find) unless their own acceptance is clearly
        # below the draft model's: each source keeps its own DraftState, so a story's chance
        # 2-gram matches do not silence the model, nor the model's guesses a copy in progress
        draft, at = propose_from(seq.token_ids, min(self.k_max, room), sources,
                                 near=seq.num_output_tokens, after=state.copy_from)
        state.misses = 0 if draft else state.misses + 1
        by_model = self.model_states.get(seq.seq_id)
        if by_model is None and state.misses >= MODEL_AFTER:   # the model reads the prompt once
            by_model = self.model_states[seq.seq_id] = DraftState(self.k_max)
        if by_model is None or draft and (state.rate >= by_model.rate - NGRAM_SLACK
                                          or state.passed_over >= RETRY_NGRAM):
            state.passed_over = 0
            draft = draft[:min(state.next_k(self.cost), room)]
            state.draft_at = at if draft else None
            _append(seq, draft)
            return
        state.passed_over += bool(draft)
        self.drafting[seq.seq_id] = by_model
        if k := min(by_model.next_k(self.cost, self.cost.model_ratio), room):
            wanted.append((seq, k))

    def _draft_by_model(self, wanted: list[tuple[Sequence, int]]) -> None:
        start = time.perf_counter()
        drafts = self.model.propose(wanted)
        self.model_seconds = time.perf_counter() - start
        if not self.model.caught_up:       # a prompt read for a new shadow is not a draft's cost
            self.cost.observe_model(self.model_seconds, max(k for _, k in wanted))
        for seq, _ in wanted:
            _append(seq, drafts.get(seq.seq_id, []))

    def verified(self, seq: Sequence, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        ngram = self.states.setdefault(seq.seq_id, DraftState(self.k_max))
        state = self.drafting.pop(seq.seq_id, None) or ngram
        state.update(drafted, accepted)
        if state is not ngram and ngram.copy_from is not None:   # a copy moves on under a model's draft
            ngram.copy_from += accepted + 1

    def forget(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            for states in (self.states, self.model_states, self.drafting):
                states.pop(seq.seq_id, None)
        if self.model is not None:
            self.model.forget([seq.seq_id for seq in seqs])


def _append(seq: Sequence, draft: list[int]) -> None:
    seq.token_ids.extend(draft)
    seq.num_draft_tokens = len(draft)


def eligible(group: SequenceGroup) -> bool:
    """Groups whose tokens a draft may speed up: decoding (past the prompt), not beam search,
    not opted out (SamplingParams.speculative), and no sampling setting that reads the tokens
    before each position (penalties)."""
    if group.beam is not None or group.in_prompt_stage:
        return False
    params = [group.params_for(s) for s in group.unfinished_seqs()]
    return all(p.speculative and not p.has_penalties for p in params)


def draft_room(group: SequenceGroup, seq: Sequence) -> int:
    """Draft tokens that could still be kept: within max_tokens and the model's context (the
    verification also yields one token of its own)."""
    p = group.params_for(seq)
    left = group.max_model_len - len(seq.token_ids) - 1
    if p.max_tokens is not None:
        left = min(left, p.max_tokens - seq.num_output_tokens - 1)
    return max(0, left)
