"""A step's drafts before and after the forward: cut to what the grammar and the thinking
budget allow, or made by jump-forward (`constrain_drafts`), then accounted to the drafter
(`account_drafts`).

Drafts exist only between `Drafter.attach` and their verification in one step (I14); a
constrained sequence's matcher accepts only what verification keeps (I16), so a draft cut here
is cut before the scheduler sees it.
"""

from __future__ import annotations

from localpaged.core.request import SequenceGroup
from localpaged.core.scheduler import SchedulerOutput, StepResult
from localpaged.core.speculation import Drafter, draft_room, eligible


def constrain_drafts(running: list[SequenceGroup], jump_forward: bool) -> set[int]:
    """Drafts cut before a position a thinking budget forces, and drafts of constrained
    sequences cut at the first token their grammar refuses; where a
    decoding sequence has no draft and its grammar forces text next, that text's tokens are
    its draft (jump-forward: verified in this one step, kept exactly as decoding would keep
    them). Returns the seq_ids drafted by jump-forward."""
    jumped: set[int] = set()
    for group in running:
        for seq in group.unfinished_seqs():
            if seq.reasoning is not None and seq.num_draft_tokens:   # reasoning_budget.py
                draft = seq.token_ids[len(seq.token_ids) - seq.num_draft_tokens:]
                seq.drop_drafts(keep=seq.reasoning.check_draft(draft))
            if seq.grammar is None or seq.num_uncomputed_tokens != 1 + seq.num_draft_tokens:
                continue
            if seq.num_draft_tokens:
                draft = seq.token_ids[len(seq.token_ids) - seq.num_draft_tokens:]
                seq.drop_drafts(keep=seq.grammar.check_draft(draft))
            elif jump_forward and eligible(group) and (
                    tokens := seq.grammar.jump_forward(draft_room(group, seq))):
                if seq.reasoning is not None:
                    tokens = tokens[:seq.reasoning.check_draft(tokens)]
                if not tokens:
                    continue
                seq.token_ids.extend(tokens)
                seq.num_draft_tokens = len(tokens)
                jumped.add(seq.seq_id)
    return jumped


def account_drafts(drafter: Drafter, out: SchedulerOutput, result: StepResult,
                   seconds: float) -> None:
    """Per sequence, what its draft earned; for a decode-only step, what it cost."""
    decode_only = bool(out.scheduled)
    for item in out.scheduled:
        drafted, accepted = result.drafts.get(item.seq.seq_id, (0, 0))
        if drafted:
            drafter.verified(item.seq, drafted, accepted)
        # runner.is_decode as it was at the forward (computed tokens move on in _update)
        decode_only &= item.seq.num_computed_tokens > 0 and item.num_tokens == 1 + drafted
    if decode_only:       # the verification's cost: the draft model's is its own figure
        drafter.cost.observe(seconds - drafter.model_seconds,
                             sum(d for d, _ in result.drafts.values()))
