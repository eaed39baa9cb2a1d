"""What the model manager remembers between runs, in the store's `app_settings` (key -> JSON):

  models.last      the name (Hub id or path) of the last model that loaded; the next start
                   loads it unless --model is given (localpaged/cli.py)
  models.defaults  {name: {"quantization", "max_model_len", "sampling"}}: per model, the weights
                   format and context length it last loaded with, and the sampling settings
                   saved for it (settings.presets: they become the new chats' defaults when the
                   model loads)
  models.folders   the folders searched for GGUF files, in the order they were added

Values read back are checked (another program may have written the file): anything of the
wrong type reads as missing. No Gradio here.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

log = logging.getLogger(__name__)

LAST_KEY, DEFAULTS_KEY, FOLDERS_KEY = "models.last", "models.defaults", "models.folders"
MAX_FOLDERS = 32


class AppSettingsStore(Protocol):
    def app_setting(self, key: str, default: Any = None) -> Any: ...
    def set_app_setting(self, key: str, value: Any) -> None: ...


class NewChatDefaults(Protocol):           # settings.presets.Presets
    def defaults(self): ...
    def save_defaults(self, system_prompt: str, sampling: dict[str, Any],
                      context_policy: str): ...


class ModelMemory:
    """The store's model settings; `presets` (optional) receives a model's saved sampling."""

    def __init__(self, store: AppSettingsStore, presets: NewChatDefaults | None = None) -> None:
        self.store, self.presets = store, presets

    # ---- the last model --------------------------------------------------------------------
    def last_model(self) -> str | None:
        name = self.store.app_setting(LAST_KEY)
        return name if isinstance(name, str) and name.strip() else None

    def loaded(self, name: str, quantization: str | None, max_model_len: int | None) -> None:
        """`name` loaded with these settings: it is the last model, they are its defaults, and
        its saved sampling (if any) becomes the new chats' default."""
        self.store.set_app_setting(LAST_KEY, name)
        self._update(name, quantization=quantization, max_model_len=max_model_len)
        sampling = self.defaults(name).get("sampling")
        if sampling and self.presets is not None:
            d = self.presets.defaults()
            self.presets.save_defaults(d.system_prompt, {**d.sampling, **sampling},
                                       d.context_policy)

    def start_model(self, given: str | None, fallback: str,
                    max_model_len: int | None = None) -> tuple[str, dict[str, Any]]:
        """(name, factory options) for the app's start: `given` (--model) as the command line
        says; else the last model with its remembered weights format and context length (a
        `max_model_len` given on the command line wins); else `fallback`."""
        if given:
            return given, {}
        last = self.last_model()
        if last is None:
            return fallback, {}
        options = {k: v for k, v in self.defaults(last).items() if k != "sampling"}
        if max_model_len:
            options["max_model_len"] = max_model_len
        return last, options

    def load_at_start(self, factory, name: str, options: dict[str, Any], progress,
                      fallback: str, remembered: bool):
        """The start's load (`start_model`'s choice) through `factory`, remembered. When the
        name was `remembered` (no --model) and no longer loads (its file moved), `fallback`
        loads instead, with a warning, so the app still starts. Returns (name, backend)."""
        try:
            backend = factory(name, progress, **options)
        except Exception as exc:
            if not remembered or name == fallback:
                raise                       # what the command line asked for: its error
            log.warning("the last model, %s, did not load (%s): loading %s", name, exc, fallback)
            name, options = fallback, {}
            backend = factory(name, progress)
        given = getattr(factory, "engine_options", {})          # the command line's
        self.loaded(name, options.get("quantization") or getattr(factory, "quantization", None),
                    options.get("max_model_len") or given.get("max_model_len"))
        return name, backend

    # ---- per-model defaults ----------------------------------------------------------------
    def defaults(self, name: str) -> dict[str, Any]:
        """What `name` last loaded with and its saved sampling: only the keys that are known."""
        entry = self._all().get(name)
        if not isinstance(entry, dict):
            return {}
        out: dict[str, Any] = {}
        if isinstance(entry.get("quantization"), str):
            out["quantization"] = entry["quantization"]
        if isinstance(entry.get("max_model_len"), int) and entry["max_model_len"] > 0:
            out["max_model_len"] = entry["max_model_len"]
        if isinstance(entry.get("sampling"), dict):
            out["sampling"] = entry["sampling"]
        return out

    def save_sampling(self, name: str) -> dict[str, Any]:
        """The new chats' current sampling defaults saved as `name`'s; returns them."""
        if self.presets is None:
            raise ValueError("sampling defaults need the chat app's settings")
        if not name.strip():
            raise ValueError("load a model first: its sampling defaults are saved under its name")
        sampling = dict(self.presets.defaults().sampling)
        self._update(name, sampling=sampling)
        return sampling

    def _all(self) -> dict[str, Any]:
        stored = self.store.app_setting(DEFAULTS_KEY, {})
        return stored if isinstance(stored, dict) else {}

    def _update(self, name: str, **values: Any) -> None:
        every = self._all()
        entry = every.get(name) if isinstance(every.get(name), dict) else {}
        entry.update({k: v for k, v in values.items() if v is not None})
        every[name] = entry
        self.store.set_app_setting(DEFAULTS_KEY, every)

    # ---- watched folders -------------------------------------------------------------------
    def folders(self) -> list[str]:
        stored = self.store.app_setting(FOLDERS_KEY, [])
        return [f for f in stored if isinstance(f, str)] if isinstance(stored, list) else []

    def add_folder(self, folder: str) -> list[str]:
        """Watch `folder` (an existing directory; ~ expanded, made absolute); returns the list.
        ValueError saying why for a path that is not a directory."""
        folder = (folder or "").strip()
        if not folder:
            raise ValueError("type the path of a folder that holds .gguf files")
        path = os.path.abspath(os.path.expanduser(folder))
        if not os.path.isdir(path):
            raise ValueError(f"{folder} is not a folder on this machine")
        folders = self.folders()
        if path not in folders:
            if len(folders) >= MAX_FOLDERS:
                raise ValueError(f"at most {MAX_FOLDERS} folders; remove one first")
            folders.append(path)
            self.store.set_app_setting(FOLDERS_KEY, folders)
        return folders

    def remove_folder(self, folder: str) -> list[str]:
        folders = [f for f in self.folders() if f != folder]
        self.store.set_app_setting(FOLDERS_KEY, folders)
        return folders


class MemoryStore:
    """An AppSettingsStore in memory, for a ModelManager without the app's store (tests, a
    demo built without the CLI): nothing outlives the process."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def app_setting(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def set_app_setting(self, key: str, value: Any) -> None:
        self._values[key] = value
