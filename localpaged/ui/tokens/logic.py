"""A reply token by token, and a branch at any of its tokens (no Gradio here).

Every token of a local reply is kept with its logprob and the top alternatives the model weighed
there (`store/alternatives.py`; the backend asks the engine for them with every reply).
`TokenBranches.tokens` lays a reply out as its tokens' texts with their probabilities; `branch`
makes a new sibling reply that keeps the reply's first `index` tokens, puts the chosen token at
`index` and goes on generating (Continue's request: the conversation's prompt followed by the
reply's token ids). The engine's prefix cache holds all of that prompt but the chosen token:
whole blocks, and a copy of the block where the branch leaves the reply
(`core/partial_prefix.py`), so the branch's first new token comes after one decode step, which
its footer shows as "prefill skipped: N tokens". The original reply is untouched; the branch is
one more sibling (`‹ 2/2 ›`), exported and imported like any message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from localpaged.chat.backend import ChatBackend

from ..store import Store, TokenChoice
from ..turn_registry import TurnRegistry
from ..turns import ChatError, Turn

_WINDOW = 6                            # tokens decoded before each one to find its text
NO_TOKENS = ("this reply has no token data: only replies the local engine wrote keep their "
             "tokens' alternatives")


@dataclass(frozen=True)
class Alternative:
    token_id: int
    text: str
    prob: float


@dataclass(frozen=True)
class TokenView:
    """Token `index` of a reply: its text (empty for a token that only completes a character
    later, or a special token), its probability and the alternatives there, likeliest first."""
    index: int
    token_id: int
    text: str
    prob: float
    alternatives: tuple[Alternative, ...]


class TokenBranches:
    def __init__(self, turns: TurnRegistry, store: Store,
                 backend: Callable[[], ChatBackend | None],
                 continue_reply: Callable[..., Turn]) -> None:
        self.turns, self.store, self._backend = turns, store, backend
        self._continue = continue_reply

    def tokens(self, message_id: int) -> list[TokenView] | None:
        """The reply's tokens with their probabilities and alternatives; None when it kept
        none (a user message, a remote backend's reply, an imported one)."""
        m = self.store.get_message(message_id)
        decode = getattr(self._backend(), "decode", None)
        choices = self._choices(m)
        if choices is None or decode is None:
            return None
        pieces = _pieces(decode, m.token_ids)
        return [TokenView(i, c.token_id, piece, _prob(c.logprob),
                          tuple(Alternative(t, decode([t]), _prob(lp)) for t, lp in c.top))
                for i, (c, piece) in enumerate(zip(choices, pieces))]

    def branch(self, message_id: int, index: int, token_id: int, sampling=None) -> Turn:
        """A new sibling of the reply: its tokens 0 .. index-1, then token_id, then what the
        model writes next (with `sampling`, default the conversation's, as Continue)."""
        m = self.store.get_message(message_id)
        self.turns.check_idle(m.conversation_id)
        choices = self._choices(m)
        if choices is None:
            raise ChatError(NO_TOKENS)
        if not 0 <= index < len(m.token_ids):
            raise ChatError(f"token {index} is not in this reply (it has {len(m.token_ids)})")
        here = choices[index]
        listed = dict(here.top)
        if token_id not in listed:
            raise ChatError("pick one of the alternatives listed for that token")
        backend = self._backend()
        if backend is None:
            raise ChatError("no model is loaded")
        ids = [*m.token_ids[:index], token_id]
        kept = [*choices[:index], TokenChoice(token_id, listed[token_id], here.top)]
        branch = self.store.add_message(
            m.conversation_id, m.parent_id, "assistant", backend.decode(ids), m.sampling,
            status="stopped", stats={"branched_from": m.id, "branched_at": index})
        self.store.update_message(branch.id, token_ids=ids)
        self.store.set_alternatives(branch.id, kept)
        return self._continue(branch.id, sampling)

    def _choices(self, m) -> list[TokenChoice] | None:
        """A reply's token choices, one per token id; None when it kept none."""
        choices = self.store.alternatives(m.id) if m.role == "assistant" else []
        return choices if m.token_ids and len(choices) == len(m.token_ids) else None


def _prob(logprob: float) -> float:
    return math.exp(logprob) if logprob > -1e30 else 0.0


def _pieces(decode: Callable[[list[int]], str], ids: list[int]) -> list[str]:
    """Each token's share of the decoded text: what decoding it adds to the tokens before it
    (a few of them, as the engine's detokenizer does, so a reply costs linear time). Tokens
    that end inside a character add nothing; the one that completes it carries what they began."""
    pieces: list[str] = []
    done = 0                               # tokens 0 .. done-1 have given their text
    for k in range(len(ids)):
        start = max(0, done - _WINDOW)
        while start > 0 and decode(ids[start:done]).startswith("\ufffd"):
            start -= 1                     # the window must not begin inside a character
        before, text = decode(ids[start:done]), decode(ids[start:k + 1])
        if text.endswith("\ufffd") or not text.startswith(before):
            pieces.append("")
            continue
        pieces.append(text[len(before):])
        done = k + 1
    return pieces
