"""System-prompt presets and the defaults new conversations start with, in plain Python.

A preset is a named system prompt: the built-in ones (BUILT_IN, never stored, so an upgrade can
mend them) and the ones the user saved (the store's `presets` table; a saved name shadows a
built-in one). Choosing a preset on a tab fills that conversation's system prompt.

The defaults (the store's app setting DEFAULTS_KEY: system prompt, sampling settings, context
policy) are what `ChatController.new_conversation` gives a new chat; a tab's "Use for new
chats" saves its conversation's settings as the defaults. Sampling defaults are checked when
saved and again when read (the file may be older or edited), over the app's own defaults (the
command line's), so a key missing from the stored defaults takes the app's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..store import Store
from ..store.schema import CONTEXT_POLICIES
from .logic import check_sampling

DEFAULTS_KEY = "defaults"
BUILT_IN: dict[str, str] = {
    "Helpful assistant": "You are a helpful assistant. Answer accurately and say so when you "
                         "are not sure.",
    "Concise": "Answer briefly and directly: a few sentences at most, no preamble.",
    "Code helper": "You are an expert programmer. Answer with working code in fenced code "
                   "blocks, then a short explanation.",
    "Translator": "Translate the user's message into English; if it is English, into French. "
                  "Reply with the translation only.",
}


@dataclass(frozen=True)
class Defaults:
    """What a new conversation starts with."""
    system_prompt: str
    sampling: dict[str, Any]
    context_policy: str


class Presets:
    """The presets and the new-chat defaults of one store; `app_sampling` (checked already) is
    the app's own sampling defaults, under the stored ones."""

    def __init__(self, store: Store, app_sampling: dict[str, Any]) -> None:
        self.store, self.app_sampling = store, app_sampling

    def all(self) -> dict[str, str]:
        """Every preset by name: the built-in ones, then the saved (a saved name wins)."""
        return {**BUILT_IN, **dict(self.store.presets())}

    def names(self) -> list[str]:
        return list(self.all())

    def prompt(self, name: str) -> str:
        """The system prompt of preset `name`; KeyError naming it when there is none."""
        presets = self.all()
        if name not in presets:
            raise KeyError(f"no preset named {name!r}")
        return presets[name]

    def save(self, name: str, system_prompt: str) -> str:
        """Save the preset (overwriting one of the same name); returns the name as stored."""
        if not system_prompt.strip():
            raise ValueError("the system prompt is empty: write one first, then save it")
        name = " ".join((name or "").split())
        self.store.save_preset(name, system_prompt)
        return name

    def defaults(self) -> Defaults:
        """The stored defaults, each part checked (a part that does not pass: the app's)."""
        stored = self.store.app_setting(DEFAULTS_KEY, {})
        stored = stored if isinstance(stored, dict) else {}
        try:
            sampling = check_sampling(stored.get("sampling") or {}, self.app_sampling).values
        except (TypeError, ValueError):
            sampling = dict(self.app_sampling)
        prompt = stored.get("system_prompt")
        policy = stored.get("context_policy")
        return Defaults(prompt if isinstance(prompt, str) else "", sampling,
                        policy if policy in CONTEXT_POLICIES else CONTEXT_POLICIES[0])

    def save_defaults(self, system_prompt: str, sampling: dict[str, Any],
                      context_policy: str) -> Defaults:
        """Make these the defaults of new conversations (ValueError naming a bad field)."""
        checked = check_sampling(sampling, self.app_sampling).values
        if context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {list(CONTEXT_POLICIES)}")
        self.store.set_app_setting(DEFAULTS_KEY, {"system_prompt": system_prompt,
                                                  "sampling": checked,
                                                  "context_policy": context_policy})
        return self.defaults()
