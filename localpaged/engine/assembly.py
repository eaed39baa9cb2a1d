"""The engine's set-up: from an EngineConfig to the parts an LLMEngine steps (`assemble`).

`assemble(config)` loads the model (runner.loader), resolves the device, dtype and KV dtype,
picks the attention backend (runner.startup_check), sizes the KV cache (`kv_plan`:
engine.kv_sizing), allocates the K/V tensors, builds the block manager, attaches the prefix
cache's disk tier, and assembles the scheduler, the model runner (decode graphs, the batch-1 CPU
decoder, a vision model's encoder cache), the drafter (n-grams or a draft model) and the grammar
compiler. It returns them as one typed `EngineParts`; LLMEngine keeps stepping, requests and
stats.

`block_manager` is a core.block_manager.BlockManager (block tables, in block ids): the
KVCacheManager, or for a model with sliding-window layers the HybridKVCacheManager (one per
KV-cache group, engine.kv_sizing sizing each group's pool); only `assemble` names either. Env
LOCALPAGED_SPECULATION (off | ngram | draft) overrides `EngineConfig.speculation` for every
engine of the process, and LOCALPAGED_DRAFT_MODEL its `draft_model` ("self": each engine's own
model, where its layers all attend fully; to run a test suite with draft-model speculation).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from localpaged.core.block_manager import BlockManager
from localpaged.core.config import SPECULATION, EngineConfig, background_shares_batch, check_choice
from localpaged.core.hybrid_kv_cache_manager import HybridKVCacheManager
from localpaged.core.kv_cache_manager import KVCacheManager
from localpaged.core.scheduler import Scheduler
from localpaged.core.speculation import Drafter
from localpaged.engine import kv_sizing
from localpaged.engine.draft_model import DraftModel
from localpaged.engine.grammar import GrammarCompiler
from localpaged.engine.multimodal import ImagePreprocessor
from localpaged.kernels import kv_quant
from localpaged.models import Model
from localpaged.models.attention import PagedAttention
from localpaged.quant.linear import kernels_summary, weight_formats, weights_summary
from localpaged.runner import loader, startup_check
from localpaged.runner.batch1_cpu import Batch1Decoder
from localpaged.runner.encoder_cache import EncoderCache
from localpaged.runner.kv_cache import KVCache, available_memory, bytes_per_block
from localpaged.runner.kv_disk import KVDiskStore, KVDiskTier, weights_identity
from localpaged.runner.kv_disk import fingerprint as kv_fingerprint
from localpaged.runner.model_runner import ModelRunner
from localpaged.runner.model_source import ModelSource


@dataclass
class EngineParts:
    """Everything `assemble` built, under the names LLMEngine keeps them by."""
    device: torch.device
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype
    model: Model
    tokenizer: object
    model_config: PretrainedConfig
    eos_token_ids: set[int]
    model_source: ModelSource
    weights_bytes: int
    weights_format: str
    kernels: str
    weight_formats: dict[str, int]
    max_model_len: int
    backend: PagedAttention
    kv_plan: kv_sizing.KVPlan
    kv_cache: KVCache
    block_manager: BlockManager
    kv_disk: KVDiskStore | None
    scheduler: Scheduler
    runner: ModelRunner
    encoder: EncoderCache | None      # a vision-language model: its tower's outputs per image
    images: ImagePreprocessor | None  # and its image preprocessing
    drafter: Drafter | None
    grammars: GrammarCompiler


def assemble(config: EngineConfig) -> EngineParts:
    """Load the model and build every part of an engine for `config`."""
    device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if config.device == "auto" else config.device))
    dtype = loader.resolve_dtype(config.dtype, device)
    kv_cache_dtype = kv_quant.resolve(config.kv_cache_dtype, dtype)
    loaded = loader.load(config.model, device, dtype, config.revision, config.quantization)
    model, model_config = loaded.model, loaded.config
    weights_bytes, weights_format = weights_summary(model)
    kernels, formats = kernels_summary(model), weight_formats(model)
    max_model_len = model_max_len(model_config, config)
    backend, graphs_ok = startup_check.select_backend(
        config.attention_backend, device, dtype, config.block_size, model.head_dim,
        kv_dtype=kv_cache_dtype)
    plan = kv_plan(config, model_config, model, device, kv_cache_dtype)
    num_blocks, num_cpu_blocks = plan.num_blocks, plan.num_cpu_blocks
    mc, groups = model_config, model.kv_groups
    kv_cache = KVCache(mc.num_hidden_layers, num_blocks, config.block_size,
                       mc.num_key_value_heads, model.head_dim, kv_cache_dtype,
                       device, num_cpu_blocks, groups.layer_group)
    keep_runs = device.type == "cpu"
    block_manager: BlockManager
    if groups.windows == (0,):        # one full-attention group: the plain manager
        block_manager = KVCacheManager(num_blocks[0], config.block_size,
                                       config.enable_prefix_caching, num_cpu_blocks[0],
                                       keep_runs=keep_runs)
    else:
        block_manager = HybridKVCacheManager(groups.windows, num_blocks, config.block_size,
                                             config.enable_prefix_caching, num_cpu_blocks,
                                             keep_runs=keep_runs)
    kv_disk = attach_disk(config, loaded.source, model, model_config, dtype, kv_cache_dtype,
                          weights_format, block_manager, kv_cache)
    shares = background_shares_batch(config.background_batch, device.type)
    scheduler = Scheduler(block_manager, config.max_num_seqs,
                          config.max_num_batched_tokens, config.preemption_mode, shares)
    graphs = None if config.enforce_eager or not graphs_ok else startup_check.build_decode_graphs(
        model, kv_cache.layers, backend, config.max_num_seqs,
        max_model_len, config.block_size, device, dtype)
    batch1 = None if config.enforce_eager else Batch1Decoder.create(
        model, kv_cache.layers, backend)
    # A vision-language model: its tower's outputs cached per image, its image preprocessing
    encoder = EncoderCache(loaded.vision) if loaded.vision is not None else None
    images = (ImagePreprocessor(loaded.processor, loaded.vision)
              if loaded.processor is not None else None)
    runner = ModelRunner(model, kv_cache, block_manager, backend, graphs, batch1, encoder)
    # LOCALPAGED_SPECULATION=ngram turns it on for every engine (to run any test suite with it)
    speculation = check_choice("LOCALPAGED_SPECULATION", os.environ.get(
        "LOCALPAGED_SPECULATION", config.speculation), SPECULATION)
    drafter = None if speculation == "off" else Drafter(
        config.num_speculative_tokens,
        build_draft_model(config, model, device, dtype, plan, loaded.tokenizer, mc.vocab_size)
        if speculation == "draft" else None,
        background_idle=not shares)
    grammars = GrammarCompiler(loaded.tokenizer, mc.vocab_size, set(loaded.eos_token_ids))
    return EngineParts(
        device=device, dtype=dtype, kv_cache_dtype=kv_cache_dtype, model=model,
        tokenizer=loaded.tokenizer, model_config=model_config,
        eos_token_ids=loaded.eos_token_ids, model_source=loaded.source,
        weights_bytes=weights_bytes, weights_format=weights_format,
        kernels=kernels, weight_formats=formats,
        max_model_len=max_model_len, backend=backend, kv_plan=plan, kv_cache=kv_cache,
        block_manager=block_manager, kv_disk=kv_disk, scheduler=scheduler, runner=runner,
        encoder=encoder, images=images, drafter=drafter, grammars=grammars)


def attach_disk(c: EngineConfig, src: ModelSource, model: Model,
                mc: PretrainedConfig, dtype: torch.dtype, kv_cache_dtype: torch.dtype,
                weights_format: str, block_manager: BlockManager,
                kv_cache: KVCache) -> KVDiskStore | None:
    """The prefix cache's disk tier (EngineConfig.kv_disk_dir), keyed by everything that
    decides a block's bytes; every KV-cache group keeps its own blocks there."""
    if c.kv_disk_dir is None:
        return None
    groups = model.kv_groups
    store = KVDiskStore(c.kv_disk_dir, kv_fingerprint(
        weights=weights_identity(src.path, src.gguf_file), format=weights_format,
        dtype=str(dtype), kv_dtype=str(kv_cache_dtype), block_size=c.block_size,
        layers=mc.num_hidden_layers, kv_heads=mc.num_key_value_heads,
        head_dim=model.head_dim, windows=groups.windows,
        layer_group=list(groups.layer_group)), int(c.kv_disk_gb * 2**30))
    if store.usable:
        block_manager.attach_disk(KVDiskTier(store, kv_cache))
    return store


def build_draft_model(c: EngineConfig, model: Model, device: torch.device,
                      dtype: torch.dtype, plan: kv_sizing.KVPlan, tokenizer: object,
                      vocab_size: int) -> DraftModel | None:
    """The draft model, with as many KV blocks of its own as the target's group 0 has, its
    weights as its file has them (quantization "auto": a draft is small and fast)."""
    name = os.environ.get("LOCALPAGED_DRAFT_MODEL") or c.draft_model
    if name == "self":
        if model.kv_groups.has_window:      # a draft attends fully: n-grams only
            return None
        name = c.model
    if not name:
        raise ValueError('speculation "draft" needs a draft model (EngineConfig.draft_model, '
                         '--draft-model)')
    return DraftModel(name, device, dtype, c.block_size, plan.num_blocks[0], tokenizer,
                      vocab_size, enforce_eager=c.enforce_eager)


def model_max_len(mc: PretrainedConfig, c: EngineConfig) -> int:
    """The model's context: max_position_embeddings, capped at EngineConfig.max_model_len.
    (Sliding-window layers attend over their window: models.layer_types.)"""
    limit = getattr(mc, "max_position_embeddings", 2048)
    return min(limit, c.max_model_len or limit)


def kv_plan(c: EngineConfig, mc: PretrainedConfig, model: Model, device: torch.device,
            kv_cache_dtype: torch.dtype) -> kv_sizing.KVPlan:
    """Blocks per KV-cache group, device and CPU swap (engine.kv_sizing: sliding groups get
    what their windows need, group 0 the rest). The device budget: num_kv_blocks when set
    (group 0's blocks), else kv_cache_memory_fraction x available_memory (on CPU at most
    max_kv_cache_gb); a budget that holds no block of every layer is a ValueError."""
    per_block = bytes_per_block(mc.num_hidden_layers, c.block_size, mc.num_key_value_heads,
                                model.head_dim, kv_cache_dtype)
    swap = c.swap_space_gb * 2**30 if c.preemption_mode == "swap" else 0
    budget = None
    if c.num_kv_blocks is None:
        available = available_memory(device)
        budget = available * c.kv_cache_memory_fraction
        capped = device.type == "cpu" and bool(c.max_kv_cache_gb)   # the cap is CPU's
        if capped:
            budget = min(budget, c.max_kv_cache_gb * 2**30)
        if budget < per_block:
            cap = f", capped at max_kv_cache_gb={c.max_kv_cache_gb}" if capped else ""
            raise ValueError(
                f"the automatic KV cache size (kv_cache_memory_fraction="
                f"{c.kv_cache_memory_fraction} of {available / 2**20:.1f} MiB available{cap}) "
                f"does not hold one block of {per_block:,} bytes; raise the fraction or the cap, "
                f"or set num_kv_blocks")
    return kv_sizing.plan(model.kv_groups, per_block // mc.num_hidden_layers,
                          c.block_size, c.max_num_seqs, c.max_num_batched_tokens,
                          c.num_kv_blocks, budget, swap)
