"""The alternatives of each token of a reply (part of `Store`): the `token_alternatives` table,
schema version 7. For every token the engine generated it keeps the token's logprob and the top
few tokens the model weighed there with theirs, so the chat can shade a reply by probability and
branch it at any token with another choice (`ui/tokens/`).

A row holds one reply's tokens packed (`pack`): a header (k, the count of tokens), then per
token its id and logprob (int32, float32) and k ids (int32, -1 where fewer were kept) and k
logprobs (float16). Kept apart from `messages` so that loading a conversation never reads them;
deleted with their message (ON DELETE CASCADE).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .db import StoreBase, guarded

_HEADER = struct.Struct("<BI")


@dataclass(frozen=True)
class TokenChoice:
    """One generated token: its id and logprob, and the top tokens there, most likely first."""
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def pack(choices: list[TokenChoice]) -> bytes:
    k = max((len(c.top) for c in choices), default=0)
    row = struct.Struct(f"<if{k}i{k}e")
    out = [_HEADER.pack(k, len(choices))]
    for c in choices:
        top = list(c.top)[:k]
        ids = [t for t, _ in top] + [-1] * (k - len(top))
        lps = [max(lp, -65000.0) for _, lp in top] + [0.0] * (k - len(top))
        out.append(row.pack(c.token_id, c.logprob, *ids, *lps))
    return b"".join(out)


def unpack(data: bytes) -> list[TokenChoice]:
    k, n = _HEADER.unpack_from(data)
    row = struct.Struct(f"<if{k}i{k}e")
    if len(data) != _HEADER.size + n * row.size:
        raise ValueError("token alternatives: the row's length does not match its header")
    out = []
    for i in range(n):
        token, lp, *rest = row.unpack_from(data, _HEADER.size + i * row.size)
        ids, lps = rest[:k], rest[k:]
        out.append(TokenChoice(token, lp, tuple((t, float(v)) for t, v in zip(ids, lps) if t >= 0)))
    return out


class TokenAlternatives(StoreBase):

    @guarded
    def set_alternatives(self, message_id: int, choices: list[TokenChoice]) -> None:
        """Keep a reply's token choices (replacing what it had)."""
        with self._write():
            self.db.execute("INSERT OR REPLACE INTO token_alternatives (message_id, data)"
                            " VALUES (?, ?)", [message_id, pack(choices)])

    @guarded
    def alternatives(self, message_id: int) -> list[TokenChoice]:
        """A reply's token choices, in order; empty when none were kept (a reply from a remote
        backend, an imported or older one) or the row is damaged."""
        row = self.db.execute("SELECT data FROM token_alternatives WHERE message_id = ?",
                              [message_id]).fetchone()
        if row is None:
            return []
        try:
            return unpack(bytes(row[0]))
        except (ValueError, struct.error, TypeError):
            return []
