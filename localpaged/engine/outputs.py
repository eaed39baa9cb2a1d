"""What the engine hands back: request outputs (streamed and final) and engine statistics.

A `RequestOutput` is either full (every token, the whole text and logprobs so far: what
`LLMEngine.step` returns and what iterating a RequestStream yields) or a delta (`delta=True`:
per completion only what is new since the stream's previous output; its scalar fields, such as
finish_reason, metrics and prefill progress, are current). `DeltaCursor` turns a request's
successive full outputs into deltas; `OutputAccumulator` adds deltas back up, into one larger
delta or the full output.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from localpaged.core.request import PruneNote, TokenLogprob

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
    "pruned": "pruned (behind the other branches)",
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
    draft_tokens: int = 0              # speculative decoding: tokens drafted for this output
    accepted_draft_tokens: int = 0     # of those, tokens it kept
    reasoning_tokens: int = 0          # output tokens inside its reasoning, markers excluded
                                       # (SamplingParams.reasoning_markers; 0 without them)
    pruned: PruneNote | None = None    # SamplingParams.prune stopped it (core/pruning.py)
    released_blocks: int | None = None  # blocks it gave back when it ended before its siblings

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
    num_disk_tokens: int = 0           # of num_cached_tokens, read back from the disk tier
    num_encoder_runs: int = 0          # vision tower runs for its images (0: none, or all cached)
    num_encoder_hits: int = 0          # of its images' lookups, those the encoder cache answered

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
    # The outputs hold only what is new since the previous output of the stream (see above).
    delta: bool = False

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def prefilling(self) -> bool:
        return not self.finished and self.num_computed_prompt_tokens < self.num_prompt_tokens


class DeltaCursor:
    """What one stream has sent so far, per completion index: (tokens, text chars, logprobs).

    Assumes a completion only grows (tokens, text and logprobs are appended to, never changed):
    true of sampling; a beam search reorders its beams, so its streams send full outputs.
    """

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, int, int]] = {}
        self._prompt_logprobs = -1            # how many prompt logprobs were sent

    def delta(self, out: RequestOutput) -> RequestOutput:
        """out (full) as a delta past what this cursor sent before; the cursor moves on."""
        return replace(out, outputs=[self._advance(o) for o in out.outputs],
                       prompt_logprobs=self._new_prompt_logprobs(out.prompt_logprobs),
                       delta=True)

    def _advance(self, o: CompletionOutput) -> CompletionOutput:
        tokens, chars, lps = self._sent.get(o.index, (0, 0, 0))
        self._sent[o.index] = (len(o.token_ids), max(chars, len(o.text)), len(o.logprobs or ()))
        return replace(o, text=o.text[chars:], token_ids=o.token_ids[tokens:],
                       logprobs=None if o.logprobs is None else o.logprobs[lps:])

    def _new_prompt_logprobs(self, lps: list | None) -> list | None:
        """The prompt's logprobs when they changed (they grow while a prompt is prefilled)."""
        if lps is None or len(lps) == self._prompt_logprobs:
            return None
        self._prompt_logprobs = len(lps)
        return lps


@dataclass
class _Parts:
    """One completion's pieces, in order."""
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class OutputAccumulator:
    """Outputs of one stream added up in order; `output()` is their sum.

    from_start: the first output added is the stream's first, so the sum is the full output
    (a RequestStream's reader). Otherwise the sum is one delta spanning those added (a stream's
    buffer for a reader that fell behind). A full output added replaces everything before it.
    """

    def __init__(self, from_start: bool = False) -> None:
        self._whole = from_start               # output() is full, not a delta
        self._last: RequestOutput | None = None
        self._prompt_logprobs: list | None = None
        self._parts: dict[int, _Parts] = {}

    def add(self, out: RequestOutput) -> None:
        if not out.delta:                      # a full output: it is the sum so far
            self._parts, self._prompt_logprobs, self._whole = {}, None, True
        for o in out.outputs:
            parts = self._parts.setdefault(o.index, _Parts())
            parts.token_ids.extend(o.token_ids)
            parts.texts.append(o.text)
            if o.logprobs is not None:
                parts.logprobs = parts.logprobs if parts.logprobs is not None else []
                parts.logprobs.extend(o.logprobs)
        self._prompt_logprobs = out.prompt_logprobs or self._prompt_logprobs
        self._last = out

    def output(self) -> RequestOutput:
        """The sum so far, in fresh lists (later adds do not change it)."""
        assert self._last is not None, "nothing added"
        return replace(self._last, outputs=[self._completion(o) for o in self._last.outputs],
                       prompt_logprobs=self._prompt_logprobs, delta=not self._whole)

    def _completion(self, o: CompletionOutput) -> CompletionOutput:
        parts = self._parts[o.index]
        if len(parts.texts) > 1:
            parts.texts[:] = ["".join(parts.texts)]
        return replace(o, token_ids=list(parts.token_ids),
                       text=parts.texts[0] if parts.texts else "",
                       logprobs=None if parts.logprobs is None else list(parts.logprobs))


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


@dataclass(frozen=True)
class KVGroupStats:
    """One KV-cache group of a model with sliding windows (models.layer_types.KVGroups)."""
    window: int                        # 0: full attention
    num_layers: int
    num_blocks: int                    # the group's own pool
    blocks_in_use: int                 # ref_count > 0
    blocks_cached: int                 # ref_count == 0, still findable by the prefix cache
    tokens_held: int                   # per layer of the group: slots of held blocks storing a
                                       # running sequence's computed token (shared: once)
    bytes_saved: int                   # blocks the window gave back that the running tables
                                       # would hold otherwise (NULL entries) x bytes of a block


@dataclass
class EngineStats:
    """Public view of the KV cache and scheduler; the UI and /metrics read only this.

    For a model with sliding windows the block figures (num_blocks .. tokens_in_use,
    block_tables) are group 0's: the full-attention group's, or the only group's when every
    layer slides; `kv_groups` has every group's."""
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
    block_tables: dict[str, list[list[int]]] = field(default_factory=dict)  # request -> per output
    weights_bytes: int = 0             # resident model weights (packed tables counted once)
    weights_format: str = ""           # e.g. "int4 g32 · 97 MB", "float32 · 540 MB"
    draft_tokens: int = 0              # speculative decoding: tokens drafted so far
    accepted_draft_tokens: int = 0     # of those, tokens the model confirmed
    kv_groups: tuple[KVGroupStats, ...] = ()   # per KV-cache group; empty without windows
    prefix_cache_disk_hits: int = 0    # of prefix_cache_hits, tokens read back from the disk tier
    kv_disk: object | None = None      # runner.kv_disk.DiskStats of the disk tier, None when off
    kernels: str = ""                  # what multiplies the weights (quant/linear.py
    #                                    kernels_summary): "cpu extension (avx2+vnni)", "reference"
    weight_formats: dict[str, int] = field(default_factory=dict)   # weights per format, most first
    encoder_runs: int = 0              # vision tower runs (one per image not in the encoder cache)
    encoder_cache_hits: int = 0        # image embeddings the encoder cache gave instead

    @property
    def window_bytes_saved(self) -> int:
        """KV bytes the sliding windows save now vs. holding every token in every layer."""
        return sum(g.bytes_saved for g in self.kv_groups)

    @property
    def formats_text(self) -> str:
        """weight_formats as shares of the weights, e.g. "Q4_K 78%, Q6_K 17%, float32 5%"."""
        total = max(1, sum(self.weight_formats.values()))
        shares = ((name, 100 * n / total) for name, n in self.weight_formats.items())
        return ", ".join(f"{name} {share:.0f}%" if share >= 0.5 else f"{name} <1%"
                         for name, share in shares)

    @property
    def draft_acceptance(self) -> float:
        return self.accepted_draft_tokens / max(1, self.draft_tokens)

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
