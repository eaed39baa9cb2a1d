"""Compare, in plain Python: one prompt, several replies decoded in one batch, as siblings (the
first shown until another is picked). The columns' params are built once here, from the
conversation's settings (k samples: seed + i when a seed is set), from one settings dict per
column (each checked), for a beam search of width k, or for "Think N ways": k samples whose
branches that fall behind are pruned (core/pruning.py; beams and pruning need the local engine);
the request itself is the chat's (`ChatTurns.generate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from localpaged.chat.backend import ChatBackend, is_local
from localpaged.core.sampling_params import PruneRule
from localpaged.core.sampling_params import SamplingParams

from ..chat.logic import ChatTurns
from ..settings.logic import ConversationSettings, check_sampling
from ..turn_registry import TurnRegistry
from ..turns import ChatError, Turn

MAX_COLUMNS = 4


class CompareTurns:
    def __init__(self, turns: TurnRegistry, backend: Callable[[], ChatBackend | None],
                 settings: ConversationSettings, chat: ChatTurns) -> None:
        self.turns, self.backend, self.settings, self.chat = turns, backend, settings, chat

    def compare(self, cid: int, text: str, columns: list[dict[str, Any]] | int) -> Turn:
        """`columns`: a number of samples of the conversation's settings or one settings dict
        per column (a bad value: ValueError naming it, nothing stored)."""
        k = columns if isinstance(columns, int) else len(columns)
        if not 2 <= k <= MAX_COLUMNS:
            raise ChatError(f"compare takes 2 to {MAX_COLUMNS} columns, not {k}")
        if isinstance(columns, int):
            params = self.settings.sampling(cid).columns(k)
        else:
            _, base = self.settings.read(cid)
            params = [check_sampling(c, base).params for c in columns]
        return self._run(cid, text, params)

    def compare_beams(self, cid: int, text: str, width: int) -> Turn:
        """The `width` final beams of one beam search over the prompt, as columns (the best
        shown first), each with its score. Needs the local engine."""
        if not is_local(self.backend()):
            raise ChatError("beam search needs the local engine: the remote backend "
                            "(--backend) has none; compare samples or settings instead")
        if not 2 <= width <= MAX_COLUMNS:
            raise ChatError(f"compare takes 2 to {MAX_COLUMNS} beams, not {width}")
        return self._run(cid, text, self.settings.sampling(cid).columns(width), beam=width)

    def think(self, cid: int, text: str, k: int, rule: PruneRule) -> Turn:
        """Think N ways: k samples of the conversation's settings (its thinking budget each)
        over the one prompt, pruned by `rule` as they go; the survivors are the columns."""
        if not is_local(self.backend()):
            raise ChatError("Think N ways prunes branches inside the engine: the remote backend "
                            "(--backend) cannot; compare samples instead")
        if not 2 <= k <= MAX_COLUMNS:
            raise ChatError(f"Think N ways takes 2 to {MAX_COLUMNS} branches, not {k}")
        sampling = self.settings.sampling(cid)
        if sampling.params.greedy:
            raise ChatError("Think N ways samples its branches: with temperature 0 they would "
                            "all be the same; set a temperature above 0 in the settings")
        return self._run(cid, text, [replace(p, prune=rule) for p in sampling.columns(k)])

    def _run(self, cid: int, text: str, params: list[SamplingParams], beam: int = 0) -> Turn:
        """A compare prompt: a user message at the end of the shown path, answered k times."""
        if not text.strip():
            raise ChatError("type a prompt to compare")
        self.turns.check_idle(cid)
        path = self.chat.store.active_path(cid)
        return self.chat.generate(cid, path[-1].id if path else None, params, user_text=text,
                                  beam=beam)
