"""One streaming reply of a turn as the UI shows it (`LiveReply`: text, status, tokens, logprobs,
reasoning, prefill progress) and its stats from an engine output (`reply_stats`).

A LiveReply is ahead of the store by up to a second (ui/turns.py: Turn writes it); its
token_ids are always in step with its text, a continued reply's earlier tokens first
(`prefix_ids`), so Continue can resume token-exact, and `choices()` is in step with token_ids
or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localpaged.chat.images import images_from_cache
from localpaged.engine.multimodal import ImagePrompt
from localpaged.engine.outputs import RequestOutput

from .store import TokenChoice


@dataclass
class LiveReply:
    """What the UI shows of one streaming reply (the store lags behind by up to a second)."""
    message_id: int
    text: str = ""
    status: str = "streaming"
    stats: dict[str, Any] = field(default_factory=dict)
    token_ids: list[int] | None = None      # the whole reply's tokens (None: unknown, remote)
    prefix_ids: list[int] = field(default_factory=list)   # a continued reply's earlier tokens
    progress: tuple[int, int] | None = None  # last prefill progress: (computed, total) tokens
    reasoning: str = ""                     # the reply's reasoning, apart from its text
    # each token's logprob and top alternatives: a continued reply's earlier tokens', then the
    # engine's for the new ones (None: the backend reports none)
    prefix_choices: list[TokenChoice] = field(default_factory=list)
    logprobs: list | None = None

    def extra(self) -> dict[str, Any] | None:
        """What the reply's row keeps in `extra` besides its text."""
        return {"reasoning": self.reasoning} if self.reasoning else None

    def choices(self) -> list[TokenChoice] | None:
        """Every token's choice, in step with token_ids; None when the engine gave none."""
        if self.logprobs is None or self.token_ids is None:
            return None
        new = [TokenChoice(t.token_id, t.logprob,
                           tuple(sorted(t.top.items(), key=lambda kv: -kv[1])))
               for t in self.logprobs]
        choices = self.prefix_choices + new
        return choices if len(choices) == len(self.token_ids) else None



def reply_stats(out: RequestOutput, i: int, now: float, first: float | None, started: float,
                images: ImagePrompt | None, beam: bool) -> dict[str, Any]:
    """Column i's stats after `out`: tokens, TTFT and tokens/s (the engine's metrics, else the
    turn's own clock: `first`, when its first text arrived; `started`, when the turn began),
    prefix reuse, images, reasoning, drafts, beam score, pruning, released blocks."""
    comp, m = out.outputs[i], out.metrics
    n = len(comp.token_ids) if comp.token_ids else (
        comp.num_tokens if comp.num_tokens is not None else (m.num_generated_tokens if m else 0))
    ttft = m.time_to_first_token if m and m.time_to_first_token is not None else (
        None if first is None else first - started)
    end = m.finished_time if m and m.finished_time is not None and out.finished else now
    start = m.first_token_time if m and m.first_token_time is not None else first
    tps = (n - 1) / (end - start) if start is not None and n > 1 and end > start else None
    stats = {"prompt_tokens": len(out.prompt_token_ids or []), "generated_tokens": n,
             "ttft_s": ttft, "tokens_per_s": tps,
             "prefix_tokens_reused": m.num_cached_tokens if m else None,
             "prefix_tokens_from_disk": m.num_disk_tokens if m else None,
             "finish_reason": comp.finish_reason,
             "finish_detail": getattr(comp, "finish_detail", None)}
    cached = images_from_cache(images, m.num_cached_tokens if m else None)
    if cached is not None:
        stats["images_from_cache"] = cached
        stats["image_tower_runs"] = m.num_encoder_runs
    if getattr(comp, "reasoning_tokens", 0):
        stats["reasoning_tokens"] = comp.reasoning_tokens
    if getattr(comp, "draft_tokens", 0):
        stats["draft_tokens"] = comp.draft_tokens
        stats["accepted_draft_tokens"] = comp.accepted_draft_tokens
    if beam:
        stats["beam_score"] = comp.cumulative_logprob   # final: logprob / length
    if getattr(comp, "pruned", None) is not None:     # parallel thinking stopped it
        p = comp.pruned
        stats["pruned"] = {"at": p.at, "score": p.score, "best": p.best}
    if getattr(comp, "released_blocks", None) is not None:
        stats["released_blocks"] = comp.released_blocks
    return stats
