"""How often a streaming reply redraws in the page: often in the tab in view, rarely elsewhere.

`Turn.updates` (ui/turns.py) wakes its follower at most every FOREGROUND_S; a follower of a
reply in a tab that is not shown asks `RedrawInterval` and waits BACKGROUND_S instead.
"""

from __future__ import annotations

from collections.abc import Callable

# How often a streaming reply wakes its follower: the selected tab's ten times a second (a
# redraw each); a tab in the background once a second, and its follower then sends only the
# tab's label (chat/events.py `follow_turn`: the ● mark, which, sent only at the start, can be
# lost when two replies start at once) until it is shown or the reply ends. Every redraw costs
# the page a Gradio update of the whole chat, so only the tab in view redraws often.
FOREGROUND_S, BACKGROUND_S = 0.1, 1.0


class RedrawInterval:
    """`Turn.updates`' interval for a reply of `conversation_id`: FOREGROUND_S while its tab is
    the selected one (`selected()`: the selected tab's conversation, None when unknown: then
    every tab counts as shown), else BACKGROUND_S. `shown` is the last call's answer (True
    before the first), for the follower: the selected tab is read once per call, not again."""

    def __init__(self, selected: Callable[[], int | None], conversation_id: int) -> None:
        self.selected, self.conversation_id, self.shown = selected, conversation_id, True

    def __call__(self) -> float:
        self.shown = self.selected() in (None, self.conversation_id)
        return FOREGROUND_S if self.shown else BACKGROUND_S
