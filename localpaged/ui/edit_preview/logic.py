"""The edit cost, in plain Python: before an edit is saved, the prompt tokens the new branch
reuses from the prefix cache and the tokens it must prefill, as the engine would admit it now
(`backend.cached_prefix_tokens`). They are the `num_cached_tokens` the engine reports when the
edit is then saved, unless the cache changes in between (other requests may evict blocks).
"""

from __future__ import annotations

from localpaged.chat.backend import ChatBackend, is_local

from ..context.logic import chat_prompt
from ..images.logic import image_parts
from ..store import Store


def edit_cost(store: Store, backend: ChatBackend | None, message_id: int,
              text: str) -> tuple[int, int] | None:
    """(reused, prefilled) tokens for editing user message `message_id` into `text`; None for
    another message or over a remote backend."""
    m = store.get_message(message_id)
    if m.role != "user" or not is_local(backend):
        return None
    path = store.path_to(m.parent_id) if m.parent_id is not None else []
    edited = chat_prompt(store.get_conversation(m.conversation_id).system_prompt, path, store)
    images = image_parts(m.extra, store)             # an edit keeps the original's images
    new = {"role": "user", "content": [*images, {"type": "text", "text": text}] if images else text}
    try:
        reused, total = backend.cached_prefix_tokens(edited + [new])
    except ValueError:          # images a text-only model cannot count: the edit says why
        return None
    return reused, total - reused
