"""The KV disk tier from the page: read the shown conversation's blocks back before the user
sends (`prefetch`, when a tab is opened or selected), and empty the tier (`clear`). Plain
Python over the store and the backend provider; a remote backend has no disk tier (no-ops)."""

from __future__ import annotations

from collections.abc import Callable

from localpaged.chat.backend import ChatBackend, is_local

from ..context.logic import prompt_messages
from ..store import Store


class KVDiskActions:
    def __init__(self, store: Store, backend: Callable[[], ChatBackend | None]) -> None:
        self.store, self.backend = store, backend

    def prefetch(self, cid: int | None) -> bool:
        """Start reading conversation cid's prompt (system prompt and shown path) back from the
        disk tier in the background; False when there is nothing to read or no local engine."""
        backend = self.backend()
        if cid is None or not is_local(backend):
            return False
        path = self.store.active_path(cid)
        if not path:
            return False
        backend.prefetch(prompt_messages(self.store, cid, path[-1].id))
        return True

    def clear(self) -> str:
        """Empty the disk tier; what happened, for a toast."""
        backend = self.backend()
        if not is_local(backend):
            return "There is no local engine, so no KV disk tier to clear."
        stats = backend.stats()
        if stats.kv_disk is None:
            return "The KV disk tier is off (--kv-disk-gb 0)."
        backend.clear_kv_disk()
        return (f"Clearing the KV disk tier: {stats.kv_disk.num_blocks} blocks, "
                f"{stats.kv_disk.num_bytes / 2**20:.1f} MiB.")
