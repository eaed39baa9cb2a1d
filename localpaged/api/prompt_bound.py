"""A prompt's length bounded before it is tokenized: text that certainly cannot fit the context
is refused without running the chat template or the tokenizer.

No token stands for more characters of text than its tokenizer's longest vocabulary entry
spells (byte-level BPE spells one character per byte, SentencePiece one per character;
byte-fallback and WordPiece entries spell more than they stand for), once the normalizer has
run; Unicode composition (NFC, NFKC: Qwen2's tokenizer) joins at most COMPOSITION code points
into one. So a text longer than `tokens * max_token_chars * COMPOSITION` characters cannot fit
in `tokens`. That holds for tokenizers whose normalizer deletes no text (those of the Llama
family this server loads) and for chat templates that keep each message's content (one that
trims it might fit a refused text, which would then be almost all whitespace). The bound is
loose on purpose: it only spares the tokenizer texts far too long; exact counts decide the rest.

    check_fits(tokenizer, chars, tokens, what, param)        # APIError when it cannot fit
    drop_turns_beyond(tokenizer, messages, tokens)           # for context_overflow="drop_oldest"
"""

from __future__ import annotations

import functools

from localpaged.api.errors import APIError
from localpaged.chat.context_window import Messages, split_turns

COMPOSITION = 4      # code points composed into one, at most (a Greek vowel with three marks)


@functools.lru_cache(maxsize=4)        # as many tokenizers as the loader keeps
def max_token_chars(tokenizer) -> int:
    """Characters of the longest entry of the tokenizer's vocabulary (added tokens included)."""
    return max(map(len, tokenizer.get_vocab()), default=1) or 1


def max_chars(tokenizer, tokens: int) -> int:
    """More characters than this cannot be `tokens` tokens or fewer."""
    return tokens * max_token_chars(tokenizer) * COMPOSITION


def chars_of(messages: Messages) -> int:
    """Characters of the messages' contents (what the chat template puts in the prompt)."""
    return sum(len(m.get("content") or "") for m in messages)


def check_fits(tokenizer, chars: int, tokens: int, what: str, param: str) -> None:
    """Refuse `chars` characters of text (`what`) that cannot be `tokens` tokens or fewer."""
    if chars > max_chars(tokenizer, tokens):
        raise APIError(f"{what} is {chars} characters: more than {tokens} tokens can hold "
                       f"(at most {max_chars(tokenizer, tokens)} characters with this model's "
                       f"tokenizer), and {tokens} tokens is what this model's context leaves "
                       "for it.", param=param, code="context_length_exceeded")


def drop_turns_beyond(tokenizer, messages: Messages, tokens: int) -> tuple[Messages, int]:
    """(the messages without the oldest whole turns whose text cannot fit in `tokens` beside the
    system prompt and the newer turns, how many messages were left out). What is kept still
    goes to ContextWindow.fit, which drops by exact counts; the last turn is always kept."""
    head, turns = split_turns(messages)
    if not turns:
        return messages, 0
    room = max_chars(tokenizer, tokens) - chars_of(head)
    first, used = len(turns) - 1, chars_of(turns[-1])
    while first > 0 and used + chars_of(turns[first - 1]) <= room:
        first -= 1
        used += chars_of(turns[first])
    return head + [m for turn in turns[first:] for m in turn], sum(map(len, turns[:first]))
