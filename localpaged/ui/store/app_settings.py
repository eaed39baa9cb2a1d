"""App-wide settings and saved system-prompt presets (part of `Store`): the `app_settings`
table (a key and its JSON value; the app keeps `defaults` there, what a new conversation
starts with) and the `presets` table (a name and its system prompt). Schema version 4.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .db import StoreBase, guarded

PRESET_NAME_MAX = 80


class AppSettings(StoreBase):

    @guarded
    def app_setting(self, key: str, default: Any = None) -> Any:
        """The stored JSON value of `key`, or `default` when it is missing or unreadable
        (another program may have written the file)."""
        rows = self._rows("SELECT value FROM app_settings WHERE key = ?", [key])
        try:
            return json.loads(rows[0]["value"]) if rows else default
        except (TypeError, ValueError):
            return default

    @guarded
    def set_app_setting(self, key: str, value: Any) -> None:
        with self._write():
            self.db.execute("INSERT INTO app_settings (key, value) VALUES (?, ?) ON CONFLICT"
                            "(key) DO UPDATE SET value = excluded.value", [key, json.dumps(value)])

    @guarded
    def presets(self) -> list[tuple[str, str]]:
        """The saved presets as (name, system prompt), by name."""
        rows = self._rows("SELECT name, system_prompt FROM presets ORDER BY name")
        return [(str(r["name"]), str(r["system_prompt"] or "")) for r in rows]

    @guarded
    def save_preset(self, name: str, system_prompt: str) -> None:
        """Save (or overwrite) the preset `name`; ValueError for an empty or over-long name."""
        name = " ".join(name.split())
        if not name or len(name) > PRESET_NAME_MAX:
            raise ValueError(f"a preset needs a name of 1 to {PRESET_NAME_MAX} characters")
        with self._write():
            self.db.execute("INSERT INTO presets (name, system_prompt, created) VALUES (?, ?, ?)"
                            " ON CONFLICT(name) DO UPDATE SET system_prompt ="
                            " excluded.system_prompt", [name, system_prompt, time.time()])

    @guarded
    def delete_preset(self, name: str) -> bool:
        with self._write():
            return self.db.execute("DELETE FROM presets WHERE name = ?", [name]).rowcount > 0
