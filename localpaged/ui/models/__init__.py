"""The model behind the chat app: loading and swapping it (logic.py), the header's model badge
and the model panel (view.py, events.py). Its face, for the CLI and the API tests:
`ModelManager`, `local_factory`, `FALLBACK_CHAT_TEMPLATE`."""

from .logic import FALLBACK_CHAT_TEMPLATE, ModelManager, local_factory

__all__ = ["FALLBACK_CHAT_TEMPLATE", "ModelManager", "local_factory"]
