"""Parallel thinking's pruning: which branches of one request (n samples, or compare columns)
stop early because they fall behind the others, so that their blocks go back to the pool.

    params = SamplingParams(n=4, temperature=0.8, seed=1, prune=PruneRule(margin=0.5))

The rule (`PruneRule`, core/sampling_params.py: one per request, read from its first output's
params) is checked at checkpoints of output length: `after`, `after + every`, ... A checkpoint c
is taken once every unfinished branch has written at least c tokens. There each branch's score is
the mean log-probability (the model's raw distribution, as `logprobs` reports it) of its first c
tokens, or of all its tokens for a branch that finished shorter. An unfinished branch whose
score lies more than `margin` below the best score is pruned, the lowest first, while more than
`keep` branches are left (pruned branches do not count; finished ones do).

Invariants:
- The decision reads only the tokens and log-probabilities each branch wrote up to the
  checkpoint, never how far a branch got beyond it: batching, speculation, prefix hits and
  preemption do not change which branches are pruned, and a surviving branch's tokens equal
  those it writes in the same request without pruning (each branch samples from its own seeded
  stream: core/request.py make_generator).
- A pruned sequence is finished ("abort", detail "pruned", why in its `PruneNote`: request.py)
  in the step its checkpoint is taken, and goes to the step's frees: its blocks return in that
  step (blocks it shares stay with their other holders).
"""

from __future__ import annotations

from localpaged.core.request import PruneNote, Sequence, SequenceGroup


def score(seq: Sequence, checkpoint: int) -> float:
    """Mean log-probability of seq's first `checkpoint` output tokens (all, if it has fewer)."""
    lps = seq.logprobs[:checkpoint]
    return sum(lp.logprob for lp in lps) / len(lps) if lps else 0.0


def prune(group: SequenceGroup) -> list[Sequence]:
    """Take every checkpoint the group's branches have all reached; returns the sequences it
    prunes (finish reason set, `pruned` noted). The caller flushes their text and frees them."""
    rule = group.params.prune
    if rule is None or group.in_prompt_stage or group.beam is not None:
        return []
    pruned: list[Sequence] = []
    while True:
        live = group.unfinished_seqs()
        checkpoint = group.next_prune_check or rule.after
        if not live or min(s.num_output_tokens for s in live) < checkpoint:
            return pruned
        group.next_prune_check = checkpoint + rule.every
        standing = [s for s in group.seqs if s.pruned is None]
        scores = {s.seq_id: score(s, checkpoint) for s in standing}
        best = max(scores.values())
        behind = sorted((s for s in live if best - scores[s.seq_id] > rule.margin),
                        key=lambda s: (scores[s.seq_id], s.index))
        for seq in behind[:max(0, len(standing) - rule.keep)]:
            seq.finish_reason, seq.finish_detail = "abort", "pruned"
            seq.pruned = PruneNote(checkpoint, scores[seq.seq_id], best)
            pruned.append(seq)
