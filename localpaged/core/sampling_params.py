"""SamplingParams: what a request asks of the sampler, validated at construction.

Invalid values raise ValueError naming the field, so the UI and the API can show the user
exactly what to fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from localpaged.core.config import check_choice
from localpaged.core.guided import GuidedDecoding
from localpaged.core.reasoning_budget import ReasoningMarkers

GREEDY_EPSILON = 1e-5

INTERACTIVE = "interactive"
BACKGROUND = "background"
PRIORITIES = (INTERACTIVE, BACKGROUND)     # scheduling classes; see scheduler.py for what they mean

# Stop strings are matched after every token, and a stream holds back up to the longest one's
# length less one character (text that may be the start of a stop string): both stay small.
MAX_STOP_STRINGS = 16            # OpenAI allows 4; vLLM-style clients send a few more
MAX_STOP_CHARS = 200             # a few lines of text: a stream is never held back more
MAX_DRAFT_SOURCES = 8            # earlier replies a request may draft from
MAX_DRAFT_SOURCE_TOKENS = 16_384


def check_priority(priority: object) -> str:
    """Return priority if it is a supported scheduling class, else raise a ValueError naming them."""
    return check_choice("priority", priority, PRIORITIES)


@dataclass(frozen=True)
class PruneRule:
    """Parallel thinking's rule for stopping the branches that fall behind (core/pruning.py)."""
    margin: float = 0.5        # nats of mean log-probability behind the best branch
    after: int = 32            # the first checkpoint, in output tokens
    every: int = 16            # tokens between checkpoints
    keep: int = 1              # branches never pruned below this many

    def __post_init__(self) -> None:
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) \
                or not math.isfinite(self.margin) or self.margin < 0:
            raise ValueError(f"PruneRule.margin must be a number >= 0, got {self.margin!r}")
        for name in ("after", "every", "keep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PruneRule.{name} must be an integer >= 1, got {value!r}")

    def describe(self) -> str:
        """The rule in words, as the chat shows it."""
        return (f"every {self.every} tokens from token {self.after}, a branch whose mean "
                f"log-probability falls more than {self.margin:g} below the best is pruned "
                f"(at least {self.keep} kept)")



@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 or -1: no top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = 16         # None: up to the model's context
    ignore_eos: bool = False
    logprobs: int | None = None         # top logprobs per token besides the chosen one
    prompt_logprobs: int | None = None  # same, for every prompt token (the first gets None)
    include_stop_str_in_output: bool = False
    speculative: bool = True            # may be drafted when the engine speculates
    # Token ids that replies to this prompt may repeat (earlier siblings of a regenerated reply,
    # the old branch's reply of an edited message): speculation drafts from them too.
    draft_sources: tuple[tuple[int, ...], ...] = ()
    # "interactive": someone is waiting for it; "background": runs on capacity left over (see
    # scheduler.py), preempted first.
    priority: str = INTERACTIVE
    # The output must match this (engine/grammar.py masks every token the grammar refuses).
    guided: GuidedDecoding | None = None
    # A reasoning model's markers (core/reasoning_budget.py): its reasoning tokens are counted,
    # and after `reasoning_budget` of them the engine writes the closing marker itself. A budget
    # without markers does nothing (the chat's setting, for a model that marks no reasoning).
    reasoning_markers: ReasoningMarkers | None = None
    reasoning_budget: int | None = None
    # Special tokens the reply's text keeps (it leaves the others out): a tool-call family's
    # markers (chat/tools/formats.py: ToolFormat.marker_ids), for its parser. The reasoning
    # markers' special tokens are kept as well.
    text_special_tokens: tuple[int, ...] = ()
    # Parallel thinking (n > 1 or columns): branches that fall behind are stopped early
    # (core/pruning.py); read from the request's first output's params.
    prune: PruneRule | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.draft_sources = tuple(tuple(src) for src in self.draft_sources or ())
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        checks = [
            ("n", _is_int(self.n) and self.n >= 1, "must be an integer >= 1"),
            ("temperature", _is_num(self.temperature) and self.temperature >= 0,
             "must be a number >= 0"),
            ("top_p", _is_num(self.top_p) and 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", _is_int(self.top_k) and self.top_k >= 0, "must be -1, 0 or a positive integer"),
            ("min_p", _is_num(self.min_p) and 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("repetition_penalty", _is_num(self.repetition_penalty)
             and 0.01 <= self.repetition_penalty <= 100, "must be in [0.01, 100]"),
            ("presence_penalty", _is_num(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
             "must be in [-2, 2]"),
            ("frequency_penalty", _is_num(self.frequency_penalty)
             and -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("seed", self.seed is None or _is_int(self.seed), "must be an integer or None"),
            ("max_tokens", self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
             "must be an integer >= 1 or None"),
            ("logprobs", self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
             "must be an integer in [0, 20] or None"),
            ("prompt_logprobs", self.prompt_logprobs is None
             or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= 20),
             "must be an integer in [0, 20] or None"),
            ("stop", len(self.stop) <= MAX_STOP_STRINGS
             and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in self.stop),
             (f"must be at most {MAX_STOP_STRINGS} non-empty strings of at most "
              f"{MAX_STOP_CHARS} characters")),
            ("stop_token_ids", all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
             "must be non-negative integers"),
            ("speculative", isinstance(self.speculative, bool), "must be True or False"),
            ("guided", self.guided is None or isinstance(self.guided, GuidedDecoding),
             "must be a GuidedDecoding or None"),
            ("draft_sources", len(self.draft_sources) <= MAX_DRAFT_SOURCES
             and all(len(src) <= MAX_DRAFT_SOURCE_TOKENS and all(_is_int(t) and t >= 0 for t in src)
                     for src in self.draft_sources),
             f"must be at most {MAX_DRAFT_SOURCES} lists of at most {MAX_DRAFT_SOURCE_TOKENS} "
             "token ids"),
            ("reasoning_markers", self.reasoning_markers is None
             or isinstance(self.reasoning_markers, ReasoningMarkers),
             "must be a ReasoningMarkers or None"),
            ("reasoning_budget", self.reasoning_budget is None
             or (_is_int(self.reasoning_budget) and self.reasoning_budget >= 0),
             "must be an integer >= 0 or None"),
            ("prune", self.prune is None or isinstance(self.prune, PruneRule),
             "must be a PruneRule or None"),
            ("text_special_tokens", isinstance(self.text_special_tokens, tuple)
             and all(_is_int(t) and t >= 0 for t in self.text_special_tokens),
             "must be a tuple of token ids"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} {rule}, got {_shown(getattr(self, name))}")
        check_choice("SamplingParams.priority", self.priority, PRIORITIES)

    @property
    def greedy(self) -> bool:
        """Temperatures this close to 0 would overflow the logits: they mean greedy, as in vLLM."""
        return self.temperature < GREEDY_EPSILON

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def _shown(value: object, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters (a refused list may be long)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x
