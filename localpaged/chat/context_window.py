"""Fitting a chat into the model's context window: exact token counts and dropping old turns.

`ContextWindow(tokenizer, limit)` owns one question: will this conversation fit, and if not,
what is sent instead? Counts are exact: they come from the model's own chat template and
tokenizer, never from an estimate. `limit` is the most tokens one request may hold (prompt plus
reply), which `LLMEngine.context_limit()` gives (the smaller of the model's context and the KV
cache); the UI never needs to know about blocks.

- `count_tokens(messages, draft)`: tokens the next request will use (the gauge). Fast for long
  chats: the rendered template is cut at the tokenizer's special tokens (HF tokenizers split
  them out before anything else, so no token spans one; checked on a probe at first use) and
  each piece's count is cached, so typing re-encodes only the draft.
- `fit(messages, reserve, policy)`: the prompt to send. Policy "drop_oldest" leaves out the
  oldest whole turns after the system prompt (a turn is a user message and every reply up to
  the next user message: they leave together, never half a message); policy "error" raises
  `ContextOverflowError` saying how far over the limit the chat is. A system prompt that alone
  leaves no room raises `SystemPromptTooLongError` under either policy.
"""

from __future__ import annotations

import copy
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

Policy = Literal["drop_oldest", "error"]
POLICIES: tuple[str, ...] = ("drop_oldest", "error")
DEFAULT_REPLY_RESERVE = 512     # room kept for a reply whose max_tokens is not given
Messages = list[dict]


class ContextOverflowError(ValueError):
    """The prompt plus the reserve for the reply do not fit in the context limit."""

    def __init__(self, message: str, num_tokens: int, reserve: int, limit: int) -> None:
        super().__init__(message)
        self.num_tokens = num_tokens          # prompt tokens that would be sent
        self.reserve = reserve                # tokens kept for the reply
        self.limit = limit
        self.over_by = num_tokens + reserve - limit   # > 0: tokens to remove to fit


class SystemPromptTooLongError(ContextOverflowError):
    """The system prompt alone (with the reply's reserve) does not fit: no turn can help."""


@dataclass
class ContextFit:
    """What to send: the kept messages, their exact token ids, and what was left out."""
    messages: Messages         # the system prompt(s), then the kept turns, in order
    token_ids: list[int]       # == apply_chat_template(messages, ...) of exactly these messages
    num_dropped: int           # messages left out after the system prompt (0: nothing dropped)
    first_kept: int            # index in the input list of the first kept non-system message
    limit: int
    reserve: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def split_turns(messages: Messages) -> tuple[Messages, list[Messages]]:
    """(leading system messages, turns). A turn starts at each user message; messages before
    the first user message (e.g. an assistant greeting) form a turn of their own."""
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    turns: list[Messages] = []
    for m in messages[head:]:
        if not turns or m.get("role") == "user":
            turns.append([])
        turns[-1].append(m)
    return list(messages[:head]), turns


class ContextWindow:
    def __init__(self, tokenizer, limit: int, cache_size: int = 4096,
                 template_kwargs: dict | None = None) -> None:
        if limit < 2:
            raise ValueError(f"limit must be >= 2 tokens, got {limit}")
        self.tokenizer = tokenizer
        self.limit = limit
        # Passed to every apply_chat_template call (the template's `tools=`: tool_calls.py).
        self.template_kwargs = dict(template_kwargs or {})
        self._piece_counts: OrderedDict[str, int] = OrderedDict()   # LRU: text piece -> tokens
        self._cache_size = cache_size
        self._special: set[str] = set()
        # One caller at a time: the LRU is not thread-safe, nor are HF fast tokenizers.
        self._lock = threading.RLock()
        self._splitter: re.Pattern | None | bool = False      # False: not decided yet

    def with_template_kwargs(self, template_kwargs: dict) -> "ContextWindow":
        """This window with other keyword arguments for the chat template (a conversation's
        enable_thinking), sharing its piece counts (a piece's count does not depend on them)."""
        view = copy.copy(self)
        view.template_kwargs = dict(template_kwargs)
        return view

    @property
    def piecewise(self) -> bool:
        """Whether counts are summed over cached pieces (else each count encodes the whole)."""
        with self._lock:
            if self._splitter is False:
                self._splitter = self._special_splitter()
            return self._splitter is not None

    # ---- exact counts -------------------------------------------------------------------------
    def _template(self, messages: Messages, add_generation_prompt: bool,
                  continue_final_message: bool, tokenize: bool):
        """The chat template; continuing the final message means no new generation prompt."""
        with self._lock:
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message, tokenize=tokenize,
                **({"return_dict": False} if tokenize else {}), **self.template_kwargs)

    def render(self, messages: Messages, add_generation_prompt: bool = True,
               continue_final_message: bool = False) -> str:
        return self._template(messages, add_generation_prompt, continue_final_message, False)

    def token_ids(self, messages: Messages, add_generation_prompt: bool = True,
                  continue_final_message: bool = False) -> list[int]:
        """Exactly what the engine is sent (the chat template, tokenized)."""
        return list(self._template(messages, add_generation_prompt, continue_final_message, True))

    def count_tokens(self, messages: Messages, draft: str | None = None,
                     add_generation_prompt: bool = True,
                     continue_final_message: bool = False) -> int:
        """Tokens the next request will use: messages, plus `draft` as a new user message when
        it is not empty. Equals len(token_ids(...)) of the same messages."""
        if draft:
            messages = [*messages, {"role": "user", "content": draft}]
        with self._lock:
            text = self.render(messages, add_generation_prompt, continue_final_message)
            if not self.piecewise:
                return len(self._encode(text))
            return sum(self._count_piece(p) for p in self._splitter.split(text) if p)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _count_piece(self, piece: str) -> int:
        n = self._piece_counts.get(piece)
        if n is None:
            n = 1 if piece in self._special else len(self._encode(piece))
            self._piece_counts[piece] = n
            if len(self._piece_counts) > self._cache_size:
                self._piece_counts.popitem(last=False)
        else:
            self._piece_counts.move_to_end(piece)
        return n

    def _special_splitter(self) -> re.Pattern | None:
        """A regex cutting text at special tokens (kept as pieces), or None where counting piece
        by piece may differ from encoding the whole: special tokens that strip the spaces beside
        them, or a probe text whose piecewise count differs. (`fit` re-encodes what it sends.)"""
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        special = [t for t in added.values() if getattr(t, "special", False)]
        if not special or any(getattr(t, "lstrip", False) or getattr(t, "rstrip", False)
                              for t in special):
            return None
        self._special = {str(t.content) for t in special}
        splitter = re.compile("(" + "|".join(re.escape(s) for s in
                                             sorted(self._special, key=len, reverse=True)) + ")")
        probe = "".join(f"{s} a\n b  {s}\n\nx" for s in sorted(self._special)[:4]) + " é  end"
        pieces = [p for p in splitter.split(probe) if p]
        whole = len(self._encode(probe))
        parts = sum(1 if p in self._special else len(self._encode(p)) for p in pieces)
        return splitter if whole == parts else None

    # ---- fitting ------------------------------------------------------------------------------
    def fit(self, messages: Messages, reserve: int, policy: str = "drop_oldest",
            add_generation_prompt: bool = True, continue_final_message: bool = False) -> ContextFit:
        """The prompt to send so that prompt + reserve <= limit (see the module docstring)."""
        if policy not in POLICIES:
            raise ValueError(f"context overflow policy must be one of {list(POLICIES)}, "
                             f"got {policy!r}")
        if not 1 <= reserve < self.limit:
            raise ValueError(f"reserve must be in [1, {self.limit - 1}] tokens (the context "
                             f"limit is {self.limit}), got {reserve}")
        if not messages:
            raise ValueError("messages must not be empty")
        flags = dict(add_generation_prompt=add_generation_prompt,
                     continue_final_message=continue_final_message)
        head, turns = split_turns(messages)
        budget = self.limit - reserve

        def kept(k: int) -> Messages:        # the prompt with the k oldest turns left out
            return head + [m for turn in turns[k:] for m in turn]

        count = self.count_tokens(kept(0), **flags)
        if count > budget and (policy == "error" or not turns):
            self._raise_if_system_too_long(head, reserve, flags)
            raise ContextOverflowError(
                f"the conversation is {count} tokens and the reply needs {reserve}: "
                f"{count + reserve - self.limit} tokens over the context limit of {self.limit}",
                count, reserve, self.limit)
        k = 0
        if count > budget:
            # Smallest k that fits: dropping more turns never lengthens the prompt.
            lo, hi = 1, len(turns) - 1
            if hi < lo or self.count_tokens(kept(hi), **flags) > budget:
                self._raise_if_system_too_long(head, reserve, flags)
                last = self.count_tokens(kept(len(turns) - 1), **flags)
                raise ContextOverflowError(
                    f"the latest message alone makes the prompt {last} tokens; with {reserve} "
                    f"for the reply that is {last + reserve - self.limit} over the context "
                    f"limit of {self.limit}", last, reserve, self.limit)
            while lo < hi:
                mid = (lo + hi) // 2
                if self.count_tokens(kept(mid), **flags) <= budget:
                    hi = mid
                else:
                    lo = mid + 1
            k = lo
        ids = self.token_ids(kept(k), **flags)
        if len(ids) > budget:       # the piecewise count disagreed with the tokenizer: never
            raise ContextOverflowError(                   # send an over-long prompt silently
                f"the prompt is {len(ids)} tokens and the reply needs {reserve}: over the "
                f"context limit of {self.limit}", len(ids), reserve, self.limit)
        dropped = sum(len(t) for t in turns[:k])
        return ContextFit(kept(k), ids, dropped, len(head) + dropped, self.limit, reserve)

    def _raise_if_system_too_long(self, head: Messages, reserve: int, flags: dict) -> None:
        if not head:
            return
        n = self.count_tokens(head, add_generation_prompt=True)
        if n + reserve > self.limit:
            raise SystemPromptTooLongError(
                f"the system prompt alone is {n} tokens; with {reserve} for the reply that is "
                f"{n + reserve - self.limit} over the context limit of {self.limit}: shorten "
                f"the system prompt or raise the context limit", n, reserve, self.limit)
