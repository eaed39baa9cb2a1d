"""Beam search inside the engine, with the same selection rules as transformers' `generate`.

The beams of a request are the sequences of one SequenceGroup; what carries over between steps
(logits of beams computed so far this round, the finished hypotheses, whether a running beam can
still win) lives in the group's typed `BeamState` (request.py). Each step, once every running beam has its
next-token logits, the best `2 * width` continuations (more with several EOS ids) are ranked by
accumulated log-probability. Continuations that end (EOS or max_tokens) among the top `width`
become finished hypotheses, scored `logprob / length ** length_penalty`; the best `width` others
become the new beams. A new beam forks its parent (sharing every block; the next append copies a
shared last block), a parent chosen by no beam is freed at once.
Stopping follows transformers: `early_stopping` True, False (heuristic) or "never".

This module decides; it holds no block and touches no engine state. `step` returns a `BeamStep`
(new beams, forks, frees, and the finished hypotheses once the search is over) that the engine
applies through the scheduler's post-step update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from localpaged.core.request import BeamState, FinishedBeam, Sequence, SequenceGroup
from localpaged.core.scheduler import Fork


@dataclass
class Candidate:
    score: float              # cumulative log-probability with this token
    parent: Sequence
    token: int
    ends: bool                # EOS, max_tokens or the model's context reached


@dataclass
class BeamStep:
    """The decisions of one beam step, for the engine to apply."""
    beams: list[Sequence]                  # the running beams now, best first (tokens appended)
    forks: list[Fork]                      # new beams sharing their parent's blocks
    frees: list[Sequence]                  # old beams no new beam continues
    finished: list[FinishedBeam] | None    # set once the search is over: the results, best first


def step(group: SequenceGroup, logits: dict[int, torch.Tensor]) -> BeamStep | None:
    """Advance group's beams by one token, given logits for (some of) its running beams.

    Returns None while some running beam still waits for its logits."""
    state = group.beam_state
    state.pending_logits.update(logits)
    beams = group.unfinished_seqs()
    if any(b.seq_id not in state.pending_logits for b in beams):
        return None
    rows = torch.stack([state.pending_logits.pop(b.seq_id) for b in beams]).float().cpu()
    candidates = _top_candidates(group, beams, rows)
    _update_finished(group, state, candidates)
    running = [c for c in candidates if not c.ends][:group.beam.beam_width]
    decision = _advance(beams, running)
    if _done(group, state, candidates, running, decision.beams):
        decision.finished = list(state.finished)
    return decision


def _top_candidates(group: SequenceGroup, beams: list[Sequence], rows: torch.Tensor) -> list[Candidate]:
    """The best continuations, best first."""
    width = group.beam.beam_width
    eos = set() if group.params.ignore_eos else group.eos_token_ids
    logprobs = torch.log_softmax(rows, dim=-1) + torch.tensor([b.cumulative_logprob for b in beams])[:, None]
    k = max(2, 1 + len(eos)) * width
    scores, flat = logprobs.flatten().topk(min(k, logprobs.numel()))
    vocab = rows.shape[1]
    out = []
    for score, index in zip(scores.tolist(), flat.tolist()):
        if score == float("-inf"):          # a token a grammar refuses (engine/grammar.py)
            break
        parent, token = beams[index // vocab], index % vocab
        length = parent.num_output_tokens + 1
        ends = token in eos or length >= group.params.max_tokens or \
            len(parent.token_ids) + 1 >= group.max_model_len
        out.append(Candidate(score, parent, token, ends))
    return out


def _update_finished(group: SequenceGroup, state: BeamState, candidates: list[Candidate]) -> None:
    """Candidates that end among the top `width` compete for the `width` finished slots."""
    width, penalty = group.beam.beam_width, group.beam.length_penalty
    if not state.improvable or (group.beam.early_stopping is True and len(state.finished) >= width):
        return
    for c in candidates[:width]:
        if c.ends:
            length = c.parent.num_output_tokens + 1
            state.finished.append(FinishedBeam(c.score / length ** penalty,
                                               c.parent.output_token_ids + [c.token], c.token))
    state.finished.sort(key=lambda f: -f.score)
    del state.finished[width:]


def _advance(beams: list[Sequence], running: list[Candidate]) -> BeamStep:
    """New beams: the first child of a parent reuses it, others fork it; unchosen parents free."""
    claimed: set[int] = set()
    new_beams: list[Sequence] = []
    forks: list[Fork] = []
    for c in running:
        if c.parent.seq_id in claimed:
            child = c.parent.fork(len(new_beams), None)
            forks.append(Fork(c.parent, child))
        else:
            claimed.add(c.parent.seq_id)
            child = c.parent
        new_beams.append(child)
    frees = [beam for beam in beams if beam.seq_id not in claimed]
    # Forks above copied their parent's tokens before any of this step's tokens is appended.
    for index, (seq, c) in enumerate(zip(new_beams, running)):
        seq.keep(c.token)
        seq.cumulative_logprob = c.score
        seq.index = index
    return BeamStep(new_beams, forks, frees, None)


def _done(group: SequenceGroup, state: BeamState, candidates: list[Candidate],
          running: list[Candidate], new_beams: list[Sequence]) -> bool:
    """transformers' stopping rule for one request."""
    width, penalty = group.beam.beam_width, group.beam.length_penalty
    full = len(state.finished) >= width
    if running and full:
        best = running[0].score
        cur = new_beams[0].num_output_tokens
        if group.beam.early_stopping == "never" and penalty > 0.0:
            cur = group.params.max_tokens
        if best / cur ** penalty <= state.finished[-1].score:
            state.improvable = False
    if group.beam.early_stopping is True and full:
        return True
    return not state.improvable or all(c.ends for c in candidates) or not running


def hypothesis_seqs(group: SequenceGroup, finished: list[FinishedBeam],
                    decode: Callable[[list[int]], str]) -> list[Sequence]:
    """The finished hypotheses as the group's final sequences, best first. Each one's reasoning
    state is its tokens' from the prompt on (the count of its reasoning tokens, as a sample's)."""
    prompt = group.prompt_token_ids
    seqs = []
    for index, f in enumerate(finished):
        seq = Sequence(prompt + f.token_ids, len(prompt), index, None)
        seq.reasoning = group.new_reasoning(0)
        if seq.reasoning is not None:
            for token in f.token_ids:
                seq.reasoning.advance(token)
        seq.cumulative_logprob = f.score
        seq.text = decode(f.token_ids)
        eos = f.last_token in group.eos_token_ids and not group.params.ignore_eos
        seq.finish_reason = "stop" if eos else "length"
        seqs.append(seq)
    return seqs
