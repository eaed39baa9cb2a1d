"""Per-conversation sampling settings: the keys the UI shows, their defaults, cleaning user
input (a plain dict stored on the conversation) and its conversion to engine SamplingParams.
Pure Python: the controller and the Gradio side both use it.
"""

from __future__ import annotations

from typing import Any

from localpaged.core.sampling_params import SamplingParams

# Order matters: it is the order of the settings fields on a chat tab and a compare column.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens")
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 0.95, "top_k": 0, "min_p": 0.0,
                                    "seed": None, "max_tokens": 512}


def clean_sampling(settings: dict[str, Any] | None, base: dict[str, Any] | None = None) -> dict:
    """Known keys only, numbers coerced (blank seed: None), missing keys from base/defaults;
    raises ValueError naming the field when a value is not acceptable to the engine."""
    out = {**DEFAULT_SAMPLING, **(base or {})}
    for key in SAMPLING_KEYS:
        value = (settings or {}).get(key, out[key])
        if value in ("", None):
            value = None if key in ("seed", "max_tokens") else DEFAULT_SAMPLING[key]
        elif key in ("top_k", "seed", "max_tokens"):
            value = int(float(value))
        else:
            value = float(value)
        out[key] = value
    to_params(out)                        # validates: ValueError names the field
    return {k: out[k] for k in SAMPLING_KEYS}


def to_params(settings: dict[str, Any], seed_offset: int = 0) -> SamplingParams:
    seed = settings.get("seed")
    return SamplingParams(temperature=settings["temperature"], top_p=settings["top_p"],
                          top_k=settings["top_k"], min_p=settings["min_p"],
                          seed=None if seed is None else seed + seed_offset,
                          max_tokens=settings["max_tokens"])


def sampling_record(params: SamplingParams) -> dict[str, Any]:
    """What a reply's row keeps of the params that produced it."""
    p = vars(params)
    return {k: p[k] for k in SAMPLING_KEYS}


def from_fields(values: tuple | list) -> dict[str, Any]:
    """A settings dict from field values given in SAMPLING_KEYS order."""
    if len(values) != len(SAMPLING_KEYS):
        raise ValueError(f"sampling: expected {len(SAMPLING_KEYS)} values "
                         f"({', '.join(SAMPLING_KEYS)}), got {len(values)}")
    return dict(zip(SAMPLING_KEYS, values))
