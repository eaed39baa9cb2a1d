"""What a step's logits become: tokens, forks, beam decisions, stops and request outputs.

`sample` takes the model runner's logits rows (one per sequence that reached its end this step)
and decides, per group: forks for parallel samples after the prompt (they share every prompt
block), the sampled token (sampler.py) and its stop rules, or a beam-search step
(beam_search.py). Decisions go into the step's `StepResult`, which the scheduler applies once
(`Scheduler.update_from_output`); nothing here touches blocks. `request_output` turns a group
into the `RequestOutput` callers see. Pure functions over the groups and the tokenizer.
See docs/architecture.md §5 step 5.
"""

from __future__ import annotations

import time

import torch

from localpaged.core import beam_search, pruning
from localpaged.core.request import Sequence, SequenceGroup, make_generator
from localpaged.core.sampling_params import SamplingParams
from localpaged.core.scheduler import Fork, SchedulerOutput, StepResult
from localpaged.engine.detokenizer import (
    decode,
    detokenize,
    find_stop,
    kept_special,
    visible_text,
)
from localpaged.engine.grammar import all_allowed, allowed_rows, allows, apply_mask, force_token
from localpaged.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from localpaged.engine.sampler import record, verify
from localpaged.engine.sampler import sample as sample_rows


def sample(out: SchedulerOutput, logits: torch.Tensor | None, row_of: dict[int, int],
           result: StepResult, tokenizer, masks: dict[int, torch.Tensor] | None = None
           ) -> list[SequenceGroup]:
    """Sample every sequence that reached its end; decisions go into result. Returns the groups
    that got a token (or a beam step). `masks`: grammar masks computed ahead by seq_id
    (grammar.step_masks); a constrained sequence missing there (a sample forked this step) has
    its mask computed here."""
    masks = masks or {}
    rows, seqs, params, groups = [], [], [], []     # groups[i] is seqs[i]'s
    verified: list[SequenceGroup] = []
    beams: dict[SequenceGroup, dict[int, torch.Tensor]] = {}
    for item in out.scheduled:
        if item.seq.seq_id not in row_of:
            continue
        group, row = item.group, row_of[item.seq.seq_id]
        if item.seq.num_draft_tokens:
            _verify_draft(group, item.seq, logits[row:row + 1 + item.seq.num_draft_tokens],
                          result, tokenizer, masks.get(item.seq.seq_id))
            verified.append(group)
            continue
        if group.beam is not None:
            beams.setdefault(group, {})[item.seq.seq_id] = _masked(logits[row], item.seq, masks)
            continue
        for seq in _fork_samples(group, item.seq, result):
            rows.append(row)
            seqs.append(seq)
            params.append(group.params_for(seq))
            groups.append(group)
    if rows:
        batch = logits if rows == list(range(len(logits))) else logits[torch.tensor(rows)]
        allowed = _allowed(seqs, masks, batch.shape[1])
        for seq, group, sampled in zip(seqs, groups, sample_rows(batch, seqs, params, allowed)):
            record(seq, sampled)
            check_stop(group, seq, result, tokenizer)
    groups += verified
    for group, beam_logits in beams.items():
        _beam_step(group, beam_logits, result, tokenizer)
        groups.append(group)
    now = time.monotonic()
    for group in dict.fromkeys(groups):
        group.first_token_time = group.first_token_time or now
        _prune(group, result, tokenizer)
    return groups


def _prune(group: SequenceGroup, result: StepResult, tokenizer) -> None:
    """Parallel thinking: branches behind at a checkpoint stop (core/pruning.py) and free
    their blocks in this step; the group ends if no branch is left running."""
    dropped = pruning.prune(group)
    for seq in dropped:
        detokenize(tokenizer, seq, final=True)
        result.frees.append(seq)
    if dropped and not group.unfinished_seqs() and group not in result.finished:
        result.finished.append(group)


def _allowed(seqs: list[Sequence], masks: dict[int, torch.Tensor], vocab: int) -> torch.Tensor | None:
    """The sampler's packed masks [S, W]: computed ahead where they were, now for the others;
    a row whose thinking budget is spent allows only the token its reasoning state forces
    (unless its grammar refuses that token: the grammar wins)."""
    forced = [s.reasoning.forced() if s.reasoning is not None else None for s in seqs]
    if all(s.grammar is None for s in seqs) and all(f is None for f in forced):
        return None
    bitmask = allowed_rows([None if s.seq_id in masks else s.grammar for s in seqs], vocab)
    if bitmask is None:                        # every mask was computed ahead, or none is needed
        bitmask = all_allowed(len(seqs), vocab)
    for i, s in enumerate(seqs):
        if s.seq_id in masks:
            bitmask[i] = masks[s.seq_id][0]
        if forced[i] is not None and allows(bitmask, i, forced[i]):
            force_token(bitmask, i, forced[i])
    return bitmask


def _verify_draft(group: SequenceGroup, seq: Sequence, logits: torch.Tensor,
                  result: StepResult, tokenizer, allowed: torch.Tensor | None) -> None:
    """Keep what the model confirms of seq's draft (sampler.verify), token by token through
    the stop rules; result.kept says how many of the step's positions keep their K/V."""
    draft = seq.token_ids[len(seq.token_ids) - seq.num_draft_tokens:]
    seq.drop_drafts()
    # engine/grammar.py: a draft was cut where the grammar refused it before it ran
    if allowed is None and seq.grammar is not None:
        allowed = seq.grammar.draft_masks(draft)
    chosen = verify(logits, seq, group.params_for(seq), draft, allowed)
    accepted = len(chosen) - 1
    recorded = 0
    for sampled in chosen:
        record(seq, sampled)
        recorded += 1
        check_stop(group, seq, result, tokenizer)
        if seq.is_finished:
            break
    result.kept[seq.seq_id] = 1 + min(recorded, accepted)    # the input token, accepted drafts
    result.drafts[seq.seq_id] = (len(draft), accepted)
    seq.drafted += len(draft)
    seq.accepted += accepted


def _fork_samples(group: SequenceGroup, seq: Sequence, result: StepResult) -> list[Sequence]:
    """After the prompt, n > 1 samples fork from it, sharing every prompt block."""
    if not group.in_prompt_stage or group.width == 1:
        return [seq]
    for i in range(1, group.width):
        seed_index = 0 if group.column_params else i     # a column samples like a lone request
        child = seq.fork(i, make_generator(group.params_for_index(i).seed, seed_index))
        if group.column_params:                          # a column keeps its own constraint
            child.grammar = group.new_grammar(i)
            child.reasoning = group.new_reasoning(i)
            child.text_special = kept_special(group.params_for_index(i))
        result.forks.append(Fork(seq, child))
        group.seqs.append(child)
    return list(group.seqs)


def _masked(row: torch.Tensor, seq: Sequence, masks: dict[int, torch.Tensor]) -> torch.Tensor:
    """A beam's logits with the tokens its grammar refuses at -inf (beam scores are then the
    log-probabilities among the allowed tokens)."""
    allowed = _allowed([seq], masks, row.shape[0])
    return row if allowed is None else apply_mask(row[None], allowed)[0]


def _beam_step(group: SequenceGroup, logits: dict[int, torch.Tensor], result: StepResult,
               tokenizer) -> None:
    decision = beam_search.step(group, logits)
    if decision is None:
        return                                   # some beam still waits for its logits
    group.seqs = decision.beams
    result.forks.extend(decision.forks)
    result.frees.extend(decision.frees)
    if decision.finished is not None:            # done: the hypotheses replace the beams
        result.frees.extend(decision.beams)
        group.seqs = beam_search.hypothesis_seqs(
            group, decision.finished,
            lambda ids: decode(tokenizer, ids, kept_special(group.params)))
        result.finished.append(group)


def check_stop(group: SequenceGroup, seq: Sequence, result: StepResult, tokenizer) -> None:
    """Detokenize seq's new token, then stop token ids / EOS / stop strings / max_tokens /
    max_model_len; a finished group goes to result.finished, a finished sibling to frees."""
    p = group.params_for(seq)
    token = seq.token_ids[-1]
    new_text = detokenize(tokenizer, seq)
    if seq.grammar is not None and seq.grammar.is_terminated:      # nothing may follow
        seq.finish_reason, seq.finish_detail = "stop", "eos"
    elif token in p.stop_token_ids or (token in group.eos_token_ids and not p.ignore_eos):
        seq.finish_reason, seq.stop_reason = "stop", (token if token in p.stop_token_ids else None)
        seq.finish_detail = "stop_token" if token in p.stop_token_ids else "eos"
    elif (stop := find_stop(seq, new_text, p.stop, p.include_stop_str_in_output)) is not None:
        seq.finish_reason, seq.stop_reason, seq.finish_detail = "stop", stop, "stop_string"
    elif p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens:
        seq.finish_reason, seq.finish_detail = "length", "max_tokens"
    elif len(seq.token_ids) >= group.max_model_len:
        seq.finish_reason, seq.finish_detail = "length", "max_model_len"
    if seq.is_finished and seq.finish_detail != "stop_string":
        detokenize(tokenizer, seq, final=True)     # flush a held-back partial character
    if not group.unfinished_seqs():
        result.finished.append(group)
    elif seq.is_finished:
        result.frees.append(seq)     # its siblings go on; only unfinished seqs hold blocks


def request_output(group: SequenceGroup) -> RequestOutput:
    """The group as callers see it now (texts so far, metrics, prefill progress)."""
    outputs = [_completion(s, group.params_for(s)) for s in group.seqs]
    metrics = RequestMetrics(group.arrival_time, group.first_token_time, group.finished_time,
                             group.num_cached_tokens or 0,
                             sum(s.num_output_tokens for s in group.seqs),
                             group.num_disk_tokens, group.num_encoder_runs,
                             group.num_encoder_hits)
    prompt_len = len(group.prompt_token_ids)
    computed = min(group.seqs[0].num_computed_tokens, prompt_len) \
        if group.in_prompt_stage and not group.is_finished else prompt_len
    return RequestOutput(group.request_id, group.prompt, group.prompt_token_ids, outputs,
                         group.is_finished, metrics,
                         prompt_logprobs=list(group.prompt_logprobs)
                         if group.params.prompt_logprobs is not None else None,
                         num_computed_prompt_tokens=computed)


def _completion(seq: Sequence, p: SamplingParams) -> CompletionOutput:
    detail = seq.finish_detail or {"stop": "eos", "length": "max_tokens"}.get(
        seq.finish_reason, seq.finish_reason)      # beam hypotheses set only the reason
    return CompletionOutput(seq.index, visible_text(seq, p.stop), seq.output_token_ids,
                            seq.finish_reason, seq.stop_reason,
                            # a copy: the engine thread appends to seq.logprobs while
                            # a consumer reads this output (a stream re-sent tokens)
                            list(seq.logprobs) if p.logprobs is not None else None,
                            seq.cumulative_logprob, finish_detail=detail,
                            draft_tokens=seq.drafted, accepted_draft_tokens=seq.accepted,
                            reasoning_tokens=seq.reasoning.count if seq.reasoning else 0,
                            pruned=seq.pruned, released_blocks=seq.released_blocks)
