"""Sequences and sequence groups: the engine's unit of work.

A SequenceGroup is one user request. It starts with one Sequence (the prompt); parallel sampling
(n > 1) and beam search fork more sequences from it, which share the prompt's KV blocks. The
scheduler admits, runs, preempts and resumes a group as a whole (all-or-nothing).
"""

from __future__ import annotations

import enum
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from localpaged.core.multimodal import ImageSpan
from localpaged.core.reasoning_budget import ReasoningState
from localpaged.core.sampling_params import INTERACTIVE, SamplingParams

_seq_ids = itertools.count()


def make_generator(seed: int | None, index: int) -> torch.Generator:
    """Sample i of a seeded request draws from its own stream, derived from (seed, i)."""
    g = torch.Generator()
    g.manual_seed(random.getrandbits(63) if seed is None else (seed * 1_000_003 + index) % 2**63)
    return g


class Grammar(Protocol):
    """The grammar state of one sequence (engine/grammar.py: SequenceGrammar). Invariant: it has
    accepted exactly the sequence's output tokens."""

    def fork(self) -> "Grammar": ...

    def accept(self, token: int) -> None: ...

    @property
    def is_terminated(self) -> bool: ...


class GrammarSource(Protocol):
    """A compiled constraint (engine/grammar.py: CompiledGrammar): each sequence's start state."""

    def matcher(self) -> Grammar: ...


class GroupStatus(enum.Enum):
    WAITING = "waiting"      # queued, or preempted by recompute; holds no blocks
    RUNNING = "running"      # holds device blocks
    SWAPPED = "swapped"      # preempted by swap; holds CPU blocks only
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float]     # the most likely tokens (id -> logprob), chosen token aside


@dataclass(frozen=True)
class PruneNote:
    """Why core/pruning.py stopped a branch: at which checkpoint, its score and the best one there."""
    at: int                    # the checkpoint (output tokens)
    score: float               # this branch's mean log-probability over its first `at` tokens
    best: float                # the best branch's, at the same checkpoint


class Sequence:
    """One stream of tokens: the prompt followed by what was generated for it."""

    def __init__(self, token_ids: list[int], prompt_len: int, index: int,
                 generator: torch.Generator | None) -> None:
        self.seq_id = next(_seq_ids)
        self.token_ids = list(token_ids)
        self.prompt_len = prompt_len
        self.index = index                      # which output of its request it is
        self.generator = generator              # per-sequence RNG: seeded output is batch-independent
        # Tokens whose K/V are in the cache; invariant: 0 <= num_computed_tokens <= len(token_ids).
        self.num_computed_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.finish_detail: str | None = None      # why, finer (outputs.FINISH_DETAILS)
        self.logprobs: list[TokenLogprob] = []
        self.cumulative_logprob = 0.0
        self.text = ""                          # detokenized output, stop string handled
        self.detok_state = (0, 0)               # (prefix_offset, read_offset) into output tokens
        # Speculative draft tokens at the end of token_ids, within one step (core/speculation.py)
        self.num_draft_tokens = 0
        self.drafted = 0                        # draft tokens verified for it so far
        self.accepted = 0                       # of those, tokens it kept
        self.grammar: Grammar | None = None     # SamplingParams.guided's state, forked with it
        # SamplingParams.reasoning_markers' state (tokens spent thinking, forced closing marker)
        self.reasoning: ReasoningState | None = None
        # Special tokens its text keeps (engine/detokenizer.py: kept_special of its params)
        self.text_special: tuple[int, ...] = ()
        # The prompt's images (core/multimodal.py): part of its blocks' hashes; kept by forks
        self.images: tuple[ImageSpan, ...] = ()
        self.pruned: PruneNote | None = None    # why core/pruning.py stopped it early
        # Blocks its free returned to the pool while its siblings went on (None: not freed so)
        self.released_blocks: int | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def keep(self, token: int) -> None:
        """Append a token the sequence keeps (sampled or chosen by a beam step, never a draft);
        its grammar and reasoning state advance with it."""
        if self.grammar is not None:
            self.grammar.accept(token)
        if self.reasoning is not None:
            self.reasoning.advance(token)
        self.token_ids.append(token)

    def drop_drafts(self, keep: int = 0) -> None:
        """Keep only the first `keep` draft tokens; the others leave token_ids."""
        drop = self.num_draft_tokens - max(0, keep)
        if drop > 0:
            del self.token_ids[-drop:]
            self.num_draft_tokens -= drop

    def fork(self, index: int, generator: torch.Generator | None) -> "Sequence":
        child = Sequence(self.token_ids, self.prompt_len, index, generator)
        child.num_computed_tokens = self.num_computed_tokens   # KVCacheManager.fork sets it again
        child.logprobs = list(self.logprobs)
        child.cumulative_logprob = self.cumulative_logprob
        child.text, child.detok_state = self.text, self.detok_state
        child.grammar = self.grammar.fork() if self.grammar is not None else None
        child.reasoning = self.reasoning.copy() if self.reasoning is not None else None
        child.text_special = self.text_special
        child.images = self.images
        return child


@dataclass
class FinishedBeam:
    score: float              # cumulative log-probability / length ** length_penalty
    token_ids: list[int]      # the output tokens, the final one included
    last_token: int


@dataclass
class BeamState:
    """What beam search carries over between steps (core/beam_search.py decides)."""
    pending_logits: dict[int, torch.Tensor] = field(default_factory=dict)  # seq_id -> logits
    finished: list[FinishedBeam] = field(default_factory=list)   # best first, at most width
    improvable: bool = True                                       # a running beam may still win


@dataclass
class BeamParams:
    beam_width: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False


@dataclass(eq=False)
class SequenceGroup:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    eos_token_ids: set[int] = field(default_factory=set)    # the model's end-of-sequence ids
    max_model_len: int = 0
    beam: BeamParams | None = None
    priority: str = INTERACTIVE      # "interactive" | "background" (validated by the engine)
    status: GroupStatus = GroupStatus.WAITING
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    finished_time: float | None = None
    # Prompt tokens served from the prefix cache; None until first admitted (set once, there).
    num_cached_tokens: int | None = None
    num_disk_tokens: int = 0             # of those, read back from the disk tier (set with them)
    # Its images' vision-tower outputs: computed (tower runs) and taken from the encoder cache,
    # one count per image per prefill step that reads it (runner/image_batch.py)
    num_encoder_runs: int = 0
    num_encoder_hits: int = 0
    beam_state: BeamState | None = None  # beam search only: what the beam steps carry over
    column_params: list[SamplingParams] | None = None    # side-by-side: settings per output
    # Per output index (one entry, or one per column): the compiled constraint of its params'
    # `guided`, None where unconstrained; empty when nothing is constrained.
    grammars: tuple[GrammarSource | None, ...] = ()
    # params.prompt_logprobs: entry q for prompt token q, grown in order (see prompt_logprobs.py)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=lambda: [None])
    next_prune_check: int = 0            # core/pruning.py: the next checkpoint (0: the first)

    @property
    def width(self) -> int:
        """Sequences the group runs once forked: n samples, columns, or the beam width."""
        if self.beam is not None:
            return self.beam.beam_width
        return len(self.column_params) if self.column_params else self.params.n

    def params_for(self, seq: Sequence) -> SamplingParams:
        return self.params_for_index(seq.index)

    def params_for_index(self, index: int) -> SamplingParams:
        return self.column_params[index] if self.column_params else self.params

    def new_grammar(self, index: int) -> Grammar | None:
        """A fresh grammar state for output `index` (None: unconstrained)."""
        source = self.grammars[index if len(self.grammars) > 1 else 0] if self.grammars else None
        return source.matcher() if source is not None else None

    def new_reasoning(self, index: int) -> ReasoningState | None:
        """Output `index`'s reasoning state right after the prompt (None: no markers)."""
        p = self.params_for_index(index)
        return ReasoningState.start(p.reasoning_markers, p.reasoning_budget, self.prompt_token_ids)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs were asked for and some are missing: prefill from position 0."""
        return (self.params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < len(self.prompt_token_ids))

    def unfinished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.is_finished]

    @property
    def is_finished(self) -> bool:
        return self.status == GroupStatus.FINISHED

    @property
    def in_prompt_stage(self) -> bool:
        """True until the prompt's last token has been computed and the first token sampled."""
        return len(self.seqs) == 1 and self.seqs[0].num_output_tokens == 0
