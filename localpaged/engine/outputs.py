"""What the engine hands back: request outputs (streamed and final) and engine statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from localpaged.core.request import TokenLogprob

# Why an output finished, finer than OpenAI's finish_reason (which stays "stop" / "length" /
# "abort"): the UI shows it, and offers Continue for every detail but the natural ends.
FINISH_DETAILS: dict[str, str] = {
    "eos": "the model ended its reply",
    "stop_token": "a stop token was generated",
    "stop_string": "a stop string was generated",
    "max_tokens": "the reply reached its token limit (max_tokens)",
    "max_model_len": "the reply reached the model's context length",
    "kv_cache_full": "the KV cache was full",
    "abort": "stopped",
}
NATURAL_ENDS = frozenset({"eos", "stop_token", "stop_string"})


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
    finish_detail: str | None = None   # a key of FINISH_DETAILS once finished (local engine)

    @property
    def can_continue(self) -> bool:
        """Finished before its natural end (length, memory, Stop): Continue may extend it."""
        if self.finish_detail is None:                  # remote: only OpenAI's reasons
            return self.finish_reason in ("length", "abort")
        return self.finish_detail not in NATURAL_ENDS


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
    # SamplingParams.prompt_logprobs: one entry per prompt token, the first None (as vLLM)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # Prefill progress: prompt tokens whose K/V are in the cache (prefix hits included), of
    # num_prompt_tokens. Below it, a chunked prefill is still reading the prompt.
    num_computed_prompt_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def prefilling(self) -> bool:
        return not self.finished and self.num_computed_prompt_tokens < self.num_prompt_tokens


@dataclass(frozen=True)
class EngineInfo:
    """What an engine serves, fixed for its life: callers in any thread may read it."""
    model: str                         # the name asked for (EngineConfig.model), not the file
    device: str                        # "cpu" or "cuda"
    max_model_len: int                 # the model's context, capped by EngineConfig.max_model_len
    context_limit: int                 # prompt + reply of one request: max_model_len or the cache
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int


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


@dataclass(frozen=True)
class SeqStep:
    """One sequence's part of an engine step."""
    request_id: str
    seq_id: int
    num_tokens: int                    # tokens run through the model: a prompt chunk, 1 to decode


@dataclass(frozen=True)
class StepRecord:
    """What one engine step ran (EngineConfig.record_steps): every scheduled sequence, in
    scheduling order. Requests in one record shared that step's batch."""
    index: int                         # the step's number in this engine, from 0
    seqs: tuple[SeqStep, ...]

    @property
    def request_ids(self) -> set[str]:
        return {s.request_id for s in self.seqs}

    def num_tokens(self, request_id: str) -> int:
        """Tokens this step computed for the request, over all its sequences."""
        return sum(s.num_tokens for s in self.seqs if s.request_id == request_id)
