"""A conversation's settings, in plain Python: the sampling keys the UI shows and their defaults,
checking user input (`check_sampling`) and reading and writing a conversation's system prompt
and sampling settings (`ConversationSettings`, the settings reader every generating feature is
given).

Checked once, when written: the check coerces the fields and builds the engine's SamplingParams
(the params validate themselves, naming a bad field), and what it returns (`Sampling`) carries
those params on to the request. The store holds settings only as checked, so reading them just
fills in the defaults.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from localpaged.core.sampling_params import SamplingParams

from ..store import Store

# Order matters: it is the order of the settings fields on a chat tab and a compare column.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens")
# The penalties against repeating tokens (in a chat tab's third row of fields; a compare
# column takes the conversation's). Stored beside SAMPLING_KEYS in the same settings dict; the
# neutral values change nothing.
PENALTY_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty")
# The thinking budget of a reasoning model (tokens; None: no limit, 0: answer at once): the
# engine closes the reasoning once it is spent (core/reasoning_budget.py); a model that marks
# no reasoning ignores it.
REASONING_KEYS = ("reasoning_budget",)
# Switches for the chat template, not the sampler: enable_thinking (False: the template's
# no-thinking prompt, as Qwen3's writes an empty <think></think>), passed only where the model's
# template reads it (chat/backend.py with_thinking); stored with the other settings.
TEMPLATE_KEYS = ("enable_thinking",)
EXTRA_KEYS = PENALTY_KEYS + REASONING_KEYS + TEMPLATE_KEYS    # a chat tab's third row of fields
ALL_KEYS = SAMPLING_KEYS + EXTRA_KEYS
PARAM_KEYS = tuple(k for k in ALL_KEYS if k not in TEMPLATE_KEYS)   # SamplingParams fields
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 0.95, "top_k": 0, "min_p": 0.0,
                                    "seed": None, "max_tokens": 512, "repetition_penalty": 1.0,
                                    "presence_penalty": 0.0, "frequency_penalty": 0.0,
                                    "reasoning_budget": None, "enable_thinking": True}
_OPTIONAL = ("seed", "max_tokens", "reasoning_budget")       # blank: None
_INTEGERS = ("top_k",) + _OPTIONAL
_BOOLEANS = {True: True, False: False, "true": True, "false": False}


@dataclass(frozen=True)
class Sampling:
    """Sampling settings that passed the check: `values` (ALL_KEYS) and `params`, the
    engine params the check built from them."""
    values: dict[str, Any]
    params: SamplingParams

    @classmethod
    def of(cls, values: dict[str, Any]) -> "Sampling":
        return cls(values, to_params(values))

    def columns(self, k: int, first_seed: int = 0) -> list[SamplingParams]:
        """Params for k replies decoded together: reply i is seeded seed + first_seed + i when
        a seed is set. The params already built serve the reply seeded with the seed itself."""
        return [self.params if first_seed + i == 0 else to_params(self.values, first_seed + i)
                for i in range(k)]


def check_sampling(settings: dict[str, Any] | None, base: dict[str, Any] | None = None) -> Sampling:
    """Known keys only (ALL_KEYS), numbers coerced (blank seed: None), missing keys from
    base/defaults; raises ValueError naming the field when a value is not acceptable to the
    engine."""
    out = {**DEFAULT_SAMPLING, **(base or {})}
    for key in ALL_KEYS:
        value = (settings or {}).get(key, out[key])
        if value in ("", None):
            value = None if key in _OPTIONAL else DEFAULT_SAMPLING[key]
        elif key in TEMPLATE_KEYS:
            if not isinstance(value, (bool, str)) or _BOOLEANS.get(value) is None:
                raise ValueError(f"{key} must be true or false, got {value!r}")
            value = _BOOLEANS[value]
        elif key in _INTEGERS:
            value = int(float(value))
        else:
            value = float(value)
        out[key] = value
    return Sampling.of({k: out[k] for k in ALL_KEYS})


def to_params(settings: dict[str, Any], seed_offset: int = 0) -> SamplingParams:
    seed = settings.get("seed")
    return SamplingParams(temperature=settings["temperature"], top_p=settings["top_p"],
                          top_k=settings["top_k"], min_p=settings["min_p"],
                          seed=None if seed is None else seed + seed_offset,
                          max_tokens=settings["max_tokens"],
                          **{k: settings.get(k, DEFAULT_SAMPLING[k]) for k in EXTRA_KEYS
                             if k in PARAM_KEYS})


def sampling_record(params: SamplingParams) -> dict[str, Any]:
    """What a reply's row keeps of the params that produced it."""
    p = vars(params)
    return {k: p[k] for k in PARAM_KEYS}


def from_fields(values: tuple | list) -> dict[str, Any]:
    """A settings dict from field values given in SAMPLING_KEYS order."""
    if len(values) != len(SAMPLING_KEYS):
        raise ValueError(f"sampling: expected {len(SAMPLING_KEYS)} values "
                         f"({', '.join(SAMPLING_KEYS)}), got {len(values)}")
    return dict(zip(SAMPLING_KEYS, values))


class ConversationSettings:
    """Reads and writes a conversation's system prompt and sampling settings; `default` (checked
    once, here) is what a new conversation starts with and what fills in a missing key."""

    def __init__(self, store: Store, default_sampling: dict[str, Any] | None = None) -> None:
        self.store = store
        self.default = check_sampling(default_sampling).values
        # One read-merge-write at a time: a send's save of the sampling fields and a field's own
        # save, handled at once by two threads, cannot undo each other (re-entrant:
        # update_one calls update).
        self._lock = threading.RLock()

    def read(self, cid: int) -> tuple[str, dict[str, Any]]:
        """(system prompt, sampling values) as stored, missing keys from the defaults."""
        conv = self.store.get_conversation(cid)
        stored = {k: conv.sampling[k] for k in ALL_KEYS if k in conv.sampling}
        return conv.system_prompt, {**self.default, **stored}

    def thinking(self, cid: int) -> bool:
        """The conversation's enable_thinking (a template whose reasoning can be switched off)."""
        return bool(self.read(cid)[1]["enable_thinking"])

    def sampling(self, cid: int) -> Sampling:
        """The stored sampling settings with their params (for a request made without a tab's
        fields: the API of the controller, a background turn)."""
        return Sampling.of(self.read(cid)[1])

    def update(self, cid: int, system_prompt: str, sampling: dict[str, Any]) -> Sampling:
        """Save both; returns the sampling settings checked (their params serve the request
        that follows). A key `sampling` leaves out keeps its stored value (a tab's send passes
        SAMPLING_KEYS; the penalties were saved as they were edited). Raises ValueError naming
        a bad field; nothing is saved then."""
        with self._lock:
            old_prompt, old = self.read(cid)
            checked = check_sampling(sampling, old)
            if system_prompt != old_prompt or checked.values != old:  # else keep the list order
                self.store.update_conversation(cid, system_prompt=system_prompt,
                                               sampling=checked.values)
            return checked

    def update_one(self, cid: int, key: str, value: Any) -> Sampling:
        """One field edited ("system_prompt" or a sampling key): merged into what is stored, so
        quick edits of two fields, handled at once by two threads, cannot undo each other."""
        with self._lock:
            system_prompt, sampling = self.read(cid)
            if key == "system_prompt":
                return self.update(cid, value or "", sampling)
            return self.update(cid, system_prompt, {**sampling, key: value})
