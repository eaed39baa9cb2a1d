"""Deleting a message and the branch below it, in plain Python: what the deletion would remove
(`BranchDeletion.plan`, for the question the UI asks first) and the deletion itself.

What goes: the message and every message below it (its subtree: the replies to it, their
follow-ups, every branch under them). What stays: its siblings, its ancestors, every other
branch; the tree's invariants hold after it (schema.py: the parent's newest remaining child,
or the newest remaining root, becomes active if the deleted one was, `MessageTree.delete_message`).

What the engine holds for a branch: the engine keeps no conversation state; a conversation's KV
blocks are held (ref count > 0) only by a running request, i.e. a turn of this app, interactive
or preparing alternatives in the background. Deleting a branch stops every turn writing into the
subtree and waits for it to end, so the engine frees its block tables (each block's ref count
drops by one; a block no other request holds is then free or cached-evictable, never in use).
Cached blocks stay in the prefix cache until evicted, keyed by their tokens: a new prompt with
the same tokens may reuse them, but no part of the app finds them as the deleted branch again
(the KV map lists branches from the store, see engine_panel/logic.py). A turn elsewhere in the
conversation (another branch) keeps running.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..prepared.logic import PreparedReplies
from ..store import Store
from ..turn_registry import TurnRegistry
from ..turns import ChatError, Turn

STOP_WAIT_S = 10.0


@dataclass
class DeletionPlan:
    """What deleting `message_id` removes: `count` messages (it included), `replies` of them
    the assistant's, and whether a turn is generating into them now."""
    message_id: int
    conversation_id: int
    role: str
    count: int
    replies: int
    generating: bool

    def question(self) -> str:
        """The confirmation's text (plain words and numbers: no user text)."""
        what = "this reply" if self.role == "assistant" else "this message"
        below = self.count - 1
        rest = (f" and the {below} message{'s' if below != 1 else ''} below it"
                if below else "")
        stop = " Its reply being generated is stopped first." if self.generating else ""
        return (f"Delete {what}{rest}? The other branches and the messages above it stay. "
                f"This cannot be undone.{stop}")


class BranchDeletion:
    def __init__(self, turns: TurnRegistry, store: Store, prepared: PreparedReplies) -> None:
        self.turns, self.store, self.prepared = turns, store, prepared

    def plan(self, message_id: int) -> DeletionPlan:
        """KeyError when there is no such message."""
        m = self.store.get_message(message_id)
        below = self.store.subtree(message_id)
        replies = sum(1 for x in below if x.role == "assistant")
        writing = self._turns_into(m.conversation_id, {x.id for x in below})
        return DeletionPlan(m.id, m.conversation_id, m.role, len(below), replies,
                            any(not t.done for t in writing))

    def delete(self, message_id: int, wait: float = STOP_WAIT_S) -> DeletionPlan:
        """Stop the turns writing into the subtree (waiting up to `wait` s for each to end,
        ChatError if one does not), then delete the subtree. Returns what was removed."""
        plan = self.plan(message_id)
        ids = {x.id for x in self.store.subtree(message_id)}
        for turn in self._turns_into(plan.conversation_id, ids):
            turn.stop()
            if not turn.wait(wait):
                raise ChatError("the reply below this message is still stopping: try again in "
                                "a moment (nothing was deleted)")
        self.store.delete_message(message_id)
        return plan

    def _turns_into(self, cid: int, ids: set[int]) -> list[Turn]:
        """The conversation's unfinished turns (interactive, background) with a reply in ids."""
        turns = [self.turns.turn(cid), self.prepared.turn(cid)]
        return [t for t in turns if t is not None and not t.done
                and any(r.message_id in ids for r in t.replies)]
