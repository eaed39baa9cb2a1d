"""The KV disk tier's wiring: the conversation a tab shows is read back whenever the page's
tabs or the selected tab change (a restore after a restart included), and the clear button."""

from __future__ import annotations

from ..event_settings import QUICK
from ..toasts import info
from .logic import KVDiskActions
from .view import KVDiskUI


def wire_kv_disk(ui: KVDiskUI, page, actions: KVDiskActions) -> None:
    def shown(slots, current) -> None:
        slots = slots or []
        if current is not None and 0 <= current < len(slots):
            actions.prefetch(slots[current])

    for state in (page.ui.slots, page.ui.current):
        state.change(shown, [page.ui.slots, page.ui.current], None, **QUICK)
    ui.clear.click(lambda: info(actions.clear()), None, None, **QUICK)
