"""The messages a handler shows the user (Gradio toasts) and the errors it turns into them.

Gradio renders toast messages as HTML: anything that may carry user text is escaped here.
"""

from __future__ import annotations

import html

import gradio as gr

from .store import StoreError
from .turns import ChatError

# What a handler reports as a toast instead of failing: bad input, a refused action, a store
# that cannot be written, a conversation or message deleted meanwhile.
USER_ERRORS = (ValueError, ChatError, StoreError, KeyError)


def why(exc: BaseException) -> str:
    return str(exc).strip("'\"") or type(exc).__name__


def warn(message: str) -> None:
    gr.Warning(html.escape(message))


def info(message: str) -> None:
    gr.Info(html.escape(message))


def error(message: str) -> gr.Error:
    return gr.Error(html.escape(message))
