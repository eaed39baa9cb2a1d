"""Speculative decoding's drafts: tokens guessed for a decoding sequence from what it already
holds (prompt lookup: its last n tokens found earlier in its prompt or output, and the tokens
that followed there), for the model to verify in one forward over every draft position.

Owns `propose` / `propose_from` (the n-gram lookup; a copy in progress continues where it
was), `DraftState` (per sequence: how likely a draft token is to be accepted, and so how many
to draft, if any), `StepCost` (what a step with d draft rows costs here in plain steps) and
`Drafter` (which sequences get drafts in a step, and how many: `attach`). Verification is the
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

from dataclasses import dataclass, field

import numpy as np

from localpaged.core.request import Sequence, SequenceGroup

NGRAM_MAX, NGRAM_MIN = 4, 2           # the longest and shortest suffix looked up
SEARCH_WINDOW = 4096                  # tokens back from the end that a lookup searches
OFF_BELOW = 0.2                       # acceptance rate under which a sequence stops drafting
DECAY = 0.8                           # weight of the past in DraftState's and StepCost's figures
PRIOR_ROW_COST = 0.25                 # a draft row's cost in plain steps until one is measured
ROW_DECAY = 0.9                       # weight of the past in StepCost's row cost
PROBE_EVERY = 16                      # steps between drafts of a sequence that stopped
CONTROL_EVERY = 8                     # every 8th step drafts nothing (StepCost's plain figure)


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

    @property
    def rate(self) -> float:
        return self.successes / self.trials

    def expected(self, k: int) -> float:
        """Tokens a verification of a k-token draft yields on average (its own one included)."""
        r = min(self.rate, 1 - 1e-9)
        return (1 - r ** (k + 1)) / (1 - r)

    def next_k(self, cost: StepCost) -> int:
        gain, k = max((self.expected(k) / cost.ratio(k), k) for k in range(1, self.k_max + 1))
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
    step: int = 0

    def allows(self) -> bool:
        """Whether this step may draft (called once per step)."""
        self.step += 1
        return self.step % CONTROL_EVERY != 0

    def ratio(self, d: int) -> float:
        """Seconds of a step with d draft rows over a plain one's."""
        return 1.0 + self.row * d

    def observe(self, seconds: float, drafted_rows: int) -> None:
        """A decode step (no prompt work in it) with this many draft rows took `seconds`."""
        if drafted_rows == 0:
            self.plain = seconds if self.plain is None else 0.8 * self.plain + 0.2 * seconds
        elif self.plain:
            row = max(0.0, (seconds / self.plain - 1.0) / drafted_rows)
            self.row = ROW_DECAY * self.row + (1 - ROW_DECAY) * row


@dataclass
class Drafter:
    """Drafts for the running sequences of a step (EngineConfig.speculation == "ngram")."""
    k_max: int
    states: dict[int, DraftState] = field(default_factory=dict)     # by seq_id
    cost: StepCost = field(default_factory=StepCost)
    drafted: int = 0                  # totals over the engine's life (stats, /metrics)
    accepted: int = 0

    def attach(self, groups: list[SequenceGroup]) -> None:
        """Append a draft to each decoding sequence that can take one, where drafts pay."""
        if not self.cost.allows():
            return
        for group in groups:
            if not eligible(group):
                continue
            for seq in group.unfinished_seqs():
                if seq.num_uncomputed_tokens != 1 or seq.num_draft_tokens:
                    continue
                state = self.states.setdefault(seq.seq_id, DraftState(self.k_max))
                k = min(state.next_k(self.cost), _room(group, seq))
                draft, state.draft_at = propose_from(seq.token_ids, k, group.params_for(seq).draft_sources,
                                                     near=seq.num_output_tokens, after=state.copy_from)
                seq.token_ids.extend(draft)
                seq.num_draft_tokens = len(draft)

    def verified(self, seq: Sequence, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.states.setdefault(seq.seq_id, DraftState(self.k_max)).update(drafted, accepted)

    def forget(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.states.pop(seq.seq_id, None)


def eligible(group: SequenceGroup) -> bool:
    """Groups whose tokens a draft may speed up: decoding (past the prompt), not beam search,
    not opted out (SamplingParams.speculative), and no sampling setting that reads the tokens
    before each position (penalties)."""
    if group.beam is not None or group.in_prompt_stage:
        return False
    params = [group.params_for(s) for s in group.unfinished_seqs()]
    return all(p.speculative and not p.has_penalties for p in params)


def _room(group: SequenceGroup, seq: Sequence) -> int:
    """Draft tokens that could still be kept: within max_tokens and the model's context (the
    verification also yields one token of its own)."""
    p = group.params_for(seq)
    left = group.max_model_len - len(seq.token_ids) - 1
    if p.max_tokens is not None:
        left = min(left, p.max_tokens - seq.num_output_tokens - 1)
    return max(0, left)
