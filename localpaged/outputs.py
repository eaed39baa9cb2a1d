"""What the engine hands back: request outputs (streamed and final) and engine statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from localpaged.request import TokenLogprob


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None          # "stop", "length", "abort" or None while running
    stop_reason: str | int | None = None   # the stop string or token id that ended it
    logprobs: list[TokenLogprob] | None = None
    cumulative_logprob: float = 0.0
    num_tokens: int | None = None      # tokens generated, where token_ids are unknown (remote)


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None
    finished_time: float | None
    num_cached_tokens: int             # prompt tokens served from the prefix cache
    num_generated_tokens: int

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics


@dataclass
class EngineStats:
    """Public view of the KV cache and scheduler; the UI and /metrics read only this."""
    num_blocks: int
    block_size: int
    blocks_in_use: int                 # ref_count > 0
    blocks_cached: int                 # ref_count == 0, still findable by the prefix cache
    blocks_free: int                   # ref_count == 0, no cached content
    blocks_shared: int                 # ref_count > 1
    blocks_without_sharing: int        # what the block tables would hold if nothing were shared
    tokens_in_use: int                 # slots of held blocks storing a token (shared: once)
    prefix_cache_queries: int          # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int             # of those, tokens found
    num_preemptions: int
    num_swapped_out: int
    num_cpu_blocks: int
    cpu_blocks_in_use: int
    num_running: int
    num_waiting: int
    num_swapped: int
    block_tables: dict[str, list[list[int]]] = field(default_factory=dict)  # request -> per seq
    weights_bytes: int = 0             # resident model weights (packed tables counted once)
    weights_format: str = ""           # e.g. "int4 g32 · 97 MB", "float32 · 540 MB"

    @property
    def kv_utilization(self) -> float:
        """Share of the slots in held blocks that hold a token (paper: under 4% waste)."""
        return self.tokens_in_use / max(1, self.blocks_in_use * self.block_size)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_cache_hits / max(1, self.prefix_cache_queries)
