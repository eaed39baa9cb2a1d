"""Beam search inside the engine, with the same selection rules as transformers' `generate`.

The beams of a request are the sequences of one SequenceGroup. Each step, once every running
beam has its next-token logits, the best `2 * width` continuations (more with several EOS ids)
are ranked by accumulated log-probability. Continuations that end (EOS or max_tokens) among the
top `width` become finished hypotheses, scored `logprob / length ** length_penalty`; the best
`width` others become the new beams. A new beam forks its parent (sharing every block; the next
append copies a shared last block), a parent chosen by no beam is freed at once.
Stopping follows transformers: `early_stopping` True, False (heuristic) or "never".
"""

from __future__ import annotations

import torch

from localpaged.request import Sequence, SequenceGroup

NEG = -1.0e9


def step(engine, group: SequenceGroup, logits: dict[int, torch.Tensor]) -> None:
    """Advance group's beams by one token, given logits for (some of) its running beams."""
    pending = group.beam_logits
    pending.update(logits)
    beams = group.unfinished_seqs()
    if any(b.seq_id not in pending for b in beams):
        return                                   # wait until every beam has been computed
    rows = torch.stack([pending.pop(b.seq_id) for b in beams]).float().cpu()
    candidates = _top_candidates(group, beams, rows)
    _update_finished(group, candidates)
    running = [c for c in candidates if not c[3]][:group.beam.beam_width]
    _advance(engine, group, beams, running)
    if _done(group, candidates, running):
        _finish(engine, group)


def _top_candidates(group, beams: list[Sequence], rows: torch.Tensor) -> list[tuple]:
    """(score, parent, token, ends) for the best continuations, best first."""
    width = group.beam.beam_width
    eos = set() if group.params.ignore_eos else group.eos_token_ids
    logprobs = torch.log_softmax(rows, dim=-1) + torch.tensor([b.cumulative_logprob for b in beams])[:, None]
    k = max(2, 1 + len(eos)) * width
    scores, flat = logprobs.flatten().topk(min(k, logprobs.numel()))
    vocab = rows.shape[1]
    out = []
    for score, index in zip(scores.tolist(), flat.tolist()):
        parent, token = beams[index // vocab], index % vocab
        length = parent.num_output_tokens + 1
        ends = token in eos or length >= group.params.max_tokens or \
            len(parent.token_ids) + 1 >= group.max_model_len
        out.append((score, parent, token, ends))
    return out


def _update_finished(group: SequenceGroup, candidates: list[tuple]) -> None:
    """Candidates that end among the top `width` compete for the `width` finished slots."""
    width, penalty = group.beam.beam_width, group.beam.length_penalty
    if not group.beam_improvable or (group.beam.early_stopping is True and len(group.finished_beams) >= width):
        return
    for score, parent, token, ends in candidates[:width]:
        if ends:
            length = parent.num_output_tokens + 1
            group.finished_beams.append((score / length ** penalty, parent.output_token_ids + [token], token))
    group.finished_beams.sort(key=lambda f: -f[0])
    del group.finished_beams[width:]


def _advance(engine, group: SequenceGroup, beams: list[Sequence], running: list[tuple]) -> None:
    """New beams: the first child of a parent reuses it, others fork it; unchosen parents free."""
    claimed: set[int] = set()
    new_beams: list[tuple[Sequence, int, float]] = []
    for score, parent, token, _ends in running:
        if parent.seq_id in claimed:
            child = parent.fork(len(new_beams), None)
            engine.kv.fork(parent, child)
        else:
            claimed.add(parent.seq_id)
            child = parent
        new_beams.append((child, token, score))
    for beam in beams:
        if beam.seq_id not in claimed:
            engine.kv.free(beam)
    for index, (seq, token, score) in enumerate(new_beams):
        seq.token_ids.append(token)
        seq.cumulative_logprob = score
        seq.index = index
    group.seqs = [seq for seq, _, _ in new_beams]


def _done(group: SequenceGroup, candidates: list[tuple], running: list[tuple]) -> bool:
    """transformers' stopping rule for one request."""
    width, penalty = group.beam.beam_width, group.beam.length_penalty
    full = len(group.finished_beams) >= width
    if running and full:
        best = running[0][0]
        prompt_len = group.seqs[0].prompt_len
        cur = len(group.seqs[0].token_ids) - prompt_len
        if group.beam.early_stopping == "never" and penalty > 0.0:
            cur = group.params.max_tokens
        if best / cur ** penalty <= group.finished_beams[-1][0]:
            group.beam_improvable = False
    if group.beam.early_stopping is True and full:
        return True
    return not group.beam_improvable or all(c[3] for c in candidates) or not running


def _finish(engine, group: SequenceGroup) -> None:
    """Replace the running beams by the finished hypotheses, best first."""
    for beam in group.seqs:
        engine.kv.free(beam)
    prompt = group.prompt_token_ids
    finished = []
    for index, (score, tokens, last) in enumerate(group.finished_beams):
        seq = Sequence(prompt + tokens, len(prompt), index, None)
        seq.cumulative_logprob = score
        seq.text = engine.tokenizer.decode(tokens, skip_special_tokens=True)
        seq.finish_reason = "stop" if last in group.eos_token_ids and not group.params.ignore_eos else "length"
        finished.append(seq)
    group.seqs = finished
    engine.groups.pop(group.request_id, None)
    engine._finish(group)
