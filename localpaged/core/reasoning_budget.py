"""The thinking budget: per sequence, how many tokens it has spent inside its reasoning, and the
tokens the engine forces once that budget is spent.

A reasoning model writes its reasoning between an opening and a closing marker (`<think>` ...
`</think>`, or harmony's `<|channel|>analysis<|message|>` ... `<|end|><|start|>assistant<|channel|>
final<|message|>`) and its answer after. `ReasoningMarkers` (in SamplingParams) are those
markers' token ids, a short transition the answer starts with ("\\n\\n"; none for harmony) and
the markers' special tokens, which the detokenizer keeps in the reply's text where it drops
every other special token (engine/detokenizer.py `decode`), so the text can be split;
chat/reasoning.py finds them for a chat template. `ReasoningState` belongs to one sequence like its block table and its grammar:
forked with it (n samples, beams), advanced by every token it keeps (`Sequence.keep`), never by a
draft, and kept as it is across preemption (a recomputed or swapped-in sequence has the same
tokens, so the same state).

Invariant: `count` is the number of the sequence's kept output tokens that lie inside a
reasoning span, markers excluded. While `count < budget` the state forces nothing; once a
sequence is inside its reasoning with `count >= budget`, `forced()` names the next token of
closing marker + transition, one per step (the sampler allows only that token: engine/grammar.py
`force_token`), until all are written; then the answer follows freely. A draft is cut where the
state would force a token (`check_draft`), so speculation never carries a sequence past its
budget and a budgeted reply is the same with speculation as without. Requests without a budget
only count (the usage's reasoning tokens): their tokens are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ReasoningMarkers:
    start: tuple[int, ...]          # the opening marker's token ids
    end: tuple[int, ...]            # the closing marker's token ids
    transition: tuple[int, ...] = ()    # forced after a closing marker the budget forced
    special: tuple[int, ...] = ()       # the markers' special tokens: kept in the reply's text

    def __post_init__(self) -> None:
        for name in ("start", "end", "transition", "special"):
            ids = getattr(self, name)
            if not isinstance(ids, tuple) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise ValueError(f"ReasoningMarkers.{name} must be a tuple of token ids, "
                                 f"got {ids!r}")
        if not self.start or not self.end:
            raise ValueError("ReasoningMarkers.start and .end must not be empty")
        if not set(self.special) <= set(self.start + self.end + self.transition):
            raise ValueError("ReasoningMarkers.special must be tokens of the markers, "
                             f"got {self.special!r}")


@dataclass
class ReasoningState:
    markers: ReasoningMarkers
    budget: int | None              # None: count only
    inside: bool = False
    count: int = 0                  # output tokens inside the reasoning, markers excluded
    forcing: int = -1               # index into end + transition of the next forced token
    tail: tuple[int, ...] = ()      # the last tokens, as long as the longest marker

    @classmethod
    def start(cls, markers: ReasoningMarkers | None, budget: int | None,
              prompt_ids: list[int]) -> "ReasoningState | None":
        """The state of a sequence right after its prompt (None without markers): inside when the
        prompt opened a reasoning span it did not close (a template that starts the reasoning)."""
        if markers is None:
            return None
        state = cls(markers, budget)
        state.inside = _last_at(prompt_ids, markers.start) > _last_at(prompt_ids, markers.end)
        state.tail = tuple(prompt_ids[-state._keep:])
        return state

    @property
    def _keep(self) -> int:
        return max(len(self.markers.start), len(self.markers.end))

    def copy(self) -> "ReasoningState":
        return replace(self)

    @property
    def _forced_ids(self) -> tuple[int, ...]:
        return self.markers.end + self.markers.transition

    def forced(self) -> int | None:
        """The token the next position must take, or None where the sequence chooses."""
        if self.forcing >= 0:
            return self._forced_ids[self.forcing]
        if self.inside and self.budget is not None and self.count >= self.budget:
            return self._forced_ids[0]
        return None

    def advance(self, token: int) -> None:
        """Take a kept token (the one forced(), where it named one)."""
        want = self.forced()
        if want is not None and token == want:
            self.forcing = max(self.forcing, 0) + 1
            if self.forcing == len(self._forced_ids):
                self.forcing = -1
        else:               # free, or a grammar refused the forced token: it decides
            self.forcing = -1
        self.tail = (self.tail + (token,))[-self._keep:]
        m = self.markers
        if self.inside:
            if self.tail[-len(m.end):] == m.end:
                self.inside = False
                self.count -= len(m.end) - 1       # the marker's earlier tokens were counted
            else:
                self.count += 1
        elif self.tail[-len(m.start):] == m.start:
            self.inside = True

    def check_draft(self, draft: list[int]) -> int:
        """How many leading draft tokens keep every position they span free: the verification
        samples the draft's positions and the one after without forcing, so a draft ends before
        the first position where this state would force a token (the state is unchanged)."""
        if self.budget is None:
            return len(draft)
        probe = self.copy()
        for n, token in enumerate(draft):
            if probe.forced() is not None:
                return max(0, n - 1)
            probe.advance(token)
        return len(draft) if probe.forced() is None else max(0, len(draft) - 1)


def _last_at(ids: list[int], marker: tuple[int, ...]) -> int:
    """Where marker last ends in ids (its end index), -1 if it does not occur."""
    k = len(marker)
    for i in range(len(ids) - k, -1, -1):
        if tuple(ids[i:i + k]) == marker:
            return i + k
    return -1
