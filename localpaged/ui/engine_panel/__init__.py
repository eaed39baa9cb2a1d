"""The engine panel: KV-cache numbers and the block map of the open conversations' branches,
refreshed once a second. Its face, for tests: the KV map's collector and its drawing."""

from .logic import KvMap, KvSnapshot
from .view import render_panel

__all__ = ["KvMap", "KvSnapshot", "render_panel"]
