"""EngineConfig: every knob of the engine in one validated place, and the choices it offers.

Each choice (quantization, dtype, preemption mode, attention backend, background batching) is
declared once here; the CLI, the UI and the loader read the tuples below, and `check_choice` is
the one check (EngineConfig runs it for every choice field when it is built). Request-level
choices (the priority) are declared in sampling_params.py, which uses the same check.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

QUANTIZATION = ("auto", "none", "int8", "int4")     # auto: a GGUF keeps its bit width (loader)
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: float32 on CPU, bf16/fp16 on CUDA
PREEMPTION_MODES = ("recompute", "swap")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")  # auto: triton on CUDA, cpu on CPU
BACKGROUND_BATCH = ("auto", "share", "idle")        # auto: share on CUDA, idle on CPU
SPECULATION = ("off", "ngram", "draft")             # off: one token per step and sequence
# auto: the model's dtype; int8: one float32 scale per token and KV head (kernels/kv_quant.py)
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
CHOICES = {"quantization": QUANTIZATION, "preemption_mode": PREEMPTION_MODES,
           "attention_backend": ATTENTION_BACKENDS, "background_batch": BACKGROUND_BATCH,
           "speculation": SPECULATION, "kv_cache_dtype": KV_CACHE_DTYPES}


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """value when it is one of choices, else a ValueError naming the field and the choices."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def background_shares_batch(mode: str, device_type: str) -> bool:
    """Whether background work rides in the steps of interactive work (background_batch): "auto"
    shares on CUDA, where an extra batch row is nearly free, and waits for idle steps on CPU,
    where each row costs about what a lone request does."""
    check_choice("background_batch", mode, BACKGROUND_BATCH)
    return mode == "share" or (mode == "auto" and device_type == "cuda")


def default(name: str) -> Any:
    """EngineConfig's default for a field (what the CLI and the UI start from)."""
    return next(f.default for f in fields(EngineConfig) if f.name == name)


@dataclass
class EngineConfig:
    model: str
    device: str = "auto"                 # "auto": cuda when available, else cpu
    dtype: str = "auto"                  # DTYPES (or a torch.dtype); checked by loader.resolve_dtype
    block_size: int = 16
    num_kv_blocks: int | None = None     # None: size the cache from free memory
    kv_cache_memory_fraction: float = 0.3   # of available memory, when num_kv_blocks is None
    max_kv_cache_gb: float | None = 2.0  # CPU cap for the automatic size
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None     # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"   # PREEMPTION_MODES
    swap_space_gb: float = 1.0           # CPU block pool for preemption_mode="swap"
    attention_backend: str = "auto"      # ATTENTION_BACKENDS
    enforce_eager: bool = False          # True: no CUDA graphs (CUDA), no C++ batch-1 loop (CPU)
    revision: str | None = None
    debug_checks: bool = False           # check the block invariants after every step (slow)
    record_steps: bool = False           # keep a StepRecord per step (LLMEngine.step_records;
                                         # grows by one per step: for tests and tracing)
    quantization: str = "auto"           # QUANTIZATION; auto: a GGUF keeps its bit width,
                                         # safetensors load as is (loader.load)
    # Background requests in steps with interactive work: "share" (the leftover budget; cheap
    # where batch rows are nearly free, GPUs), "idle" (only steps without interactive work; on
    # CPUs a batch row costs about as much as a lone request), "auto": share on CUDA, else idle.
    background_batch: str = "auto"
    # Speculative decoding: "ngram" drafts tokens from each sequence's own prompt and output
    # (core/speculation.py), up to num_speculative_tokens a step, verified in one forward;
    # "draft" also asks draft_model (a small model with the same tokenizer, its own KV blocks:
    # engine/draft_model.py) where the n-grams find nothing.
    speculation: str = "off"             # SPECULATION
    num_speculative_tokens: int = 16     # the longest draft; DraftState picks each one's length
    draft_model: str | None = None       # a model name or path, as `model`; for "draft"
    # Constrained requests (SamplingParams.guided): where the grammar forces a run of text, its
    # tokens are drafted and verified in one step (engine/grammar.py: jump_forward); the output
    # is the same either way.
    jump_forward: bool = True
    # The KV cache's dtype (KV_CACHE_DTYPES): "auto" the model's; a smaller one holds more
    # tokens in the same memory (the block count from a budget grows), the kernels convert
    # on load (int8: a float32 scale per token and KV head, kernels/kv_quant.py).
    kv_cache_dtype: str = "auto"
    # The prefix cache's disk tier (runner/kv_disk.py): full blocks kept under this folder across
    # restarts, at most kv_disk_gb, least recently used first dropped. None: off.
    kv_disk_dir: str | None = None
    kv_disk_gb: float = 4.0

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be a power of two up to 128, got {self.block_size}")
        if not self.kv_disk_gb > 0:
            raise ValueError(f"kv_disk_gb must be > 0, got {self.kv_disk_gb}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 tokens (a prompt and a reply), "
                             f"got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        for name, choices in CHOICES.items():
            check_choice(name, getattr(self, name), choices)
        if self.swap_space_gb < 0:
            raise ValueError(f"swap_space_gb must be >= 0, got {self.swap_space_gb}")
        if self.speculation == "draft" and not self.draft_model:
            raise ValueError('speculation="draft" needs a draft_model (--draft-model): a small '
                             'model with the same tokenizer')
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in [1, 16], got "
                             f"{self.num_speculative_tokens}")
