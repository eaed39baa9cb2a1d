"""The engine panel's numbers, in plain Python: `KvMap.collect` gathers, for every branch (leaf
path) of every open conversation, the KV blocks that hold it: the live block table while the
branch is generating, else the cached blocks of its prompt (`backend.cached_blocks` of its token
ids, kept per branch between ticks). A block in several branches' lists is shared: stored once,
referenced by each. The engine's side is `backend.stats()` (EngineStats) and the backend's
block lookups; view.py draws the snapshot.
"""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass, field

from localpaged.engine.outputs import EngineStats

from ..context.logic import chat_prompt
from ..controller import Branch, ChatController

MAX_BRANCHES = 6          # per conversation


@dataclass
class BranchRow:
    conversation_id: int
    title: str
    branch: int                       # 1-based among the conversation's branches
    branches: int
    active: bool                      # the branch the tab shows
    live: bool                        # generating now (its blocks are the live block table)
    blocks: list[int] = field(default_factory=list)
    ended: str = ""                   # a reply of a live turn that ended before its siblings:
                                      # why, and the blocks it gave back


@dataclass
class KvSnapshot:
    available: bool
    note: str = ""
    stats: EngineStats | None = None
    rows: list[BranchRow] = field(default_factory=list)

    def sharing(self) -> dict[int, int]:
        """block id -> number of branch rows holding it."""
        count: dict[int, int] = {}
        for row in self.rows:
            for b in set(row.blocks):
                count[b] = count.get(b, 0) + 1
        return count


def ended_note(stats: dict) -> str:
    """`pruned at token 48 · gave back 3 blocks` for a reply that ended while its siblings go
    on (parallel thinking's pruning, or its own end)."""
    pruned, freed = stats.get("pruned"), stats.get("released_blocks")
    why = f"pruned at token {int(pruned['at'])}" if pruned else "ended"
    return why + (f" · gave back {int(freed)} blocks" if freed is not None else "")


class KvMap:
    """Collects the engine panel's snapshot. Tokenizing every branch on every one-second tick
    would cost a chat template per branch per tick, so each branch's prompt token ids are kept
    per leaf message id with a signature of what they were made from (system prompt, the
    path's ids and texts); a branch is re-tokenized only when its signature changes. The block
    lookup itself runs every tick (the prefix cache changes under us). Invariant: a cached
    entry belongs to the backend in `_backend` (a model swap clears the cache). Thread-safe:
    ticks of several pages run at once."""

    def __init__(self, controller: ChatController) -> None:
        self.controller = controller
        self._ids: dict[int, tuple[tuple, object]] = {}   # leaf id -> (signature, its prompt)
        self._backend = None
        self._lock = threading.Lock()

    def collect(self, cids: list[int]) -> KvSnapshot:
        backend = self.controller.backend()
        if backend is None:
            return KvSnapshot(False, "No model is loaded yet.")
        if not getattr(backend, "supports_kv_stats", False):
            return KvSnapshot(False, "KV-cache statistics are not available for a remote engine "
                                     f"({html.escape(str(getattr(backend, 'model_name', '')))}).")
        with self._lock:
            if backend is not self._backend:
                self._ids, self._backend = {}, backend
        stats = backend.stats()
        snap, seen = KvSnapshot(True, stats=stats), set()
        for cid in cids:
            try:
                snap.rows += self._branch_rows(backend, stats, cid, seen)
            except KeyError:
                continue                      # deleted meanwhile
        with self._lock:                      # forget branches no page shows any more
            self._ids = {leaf: v for leaf, v in self._ids.items() if leaf in seen}
        return snap

    def _branch_rows(self, backend, stats: EngineStats, cid: int, seen: set[int]) -> list[BranchRow]:
        conv, branches = self.controller.branches(cid)
        turn = self.controller.turn(cid)
        live = {} if turn is None or turn.done else {r.message_id: i for i, r in enumerate(turn.replies)}
        tables = stats.block_tables.get(turn.request_id, []) if live else []
        rows = []
        for n, br in enumerate(branches[:MAX_BRANCHES]):
            row = BranchRow(cid, conv.title, n + 1, len(branches), br.active, br.leaf_id in live)
            if row.live and len(tables) == len(live):
                i = live[br.leaf_id]
                row.blocks = list(tables[i])
                if not row.blocks:
                    row.ended = ended_note(turn.replies[i].stats)
            else:
                seen.add(br.leaf_id)
                row.blocks = backend.cached_blocks(self._prompt(backend, conv, br))
            rows.append(row)
        return rows

    def _prompt(self, backend, conv, branch: Branch):
        """The branch's prompt as a request would send it: token ids, or an ImagePrompt (its
        images' blocks are keyed by their hashes); remembered per branch until it changes."""
        signature = (conv.system_prompt, tuple((m.id, m.content) for m in branch.path))
        with self._lock:
            hit = self._ids.get(branch.leaf_id)
        if hit is not None and hit[0] == signature:
            return hit[1]
        try:
            messages = chat_prompt(conv.system_prompt, branch.path, self.controller.store)
            prompt = backend.request_prompt(messages)
        except ValueError:          # images this model takes none of: no blocks to show
            prompt = []
        with self._lock:
            self._ids[branch.leaf_id] = (signature, prompt)
        return prompt
