"""Requests into sequence groups: tokenizing and checking a prompt against the model and the
KV cache (`check_prompt`, `kv_capacity_tokens`), compiling its constraints (`compile_guided`) and
building its `SequenceGroup` (`build_group`, LLMEngine.make_group's body).

Nothing here touches engine state (no scheduler, no block is held): AsyncEngine.submit runs it
in the caller's thread, so bad input raises ValueError there at once.
"""

from __future__ import annotations

from collections.abc import Iterator

from localpaged.core.config import EngineConfig
from localpaged.core.request import BeamParams, BeamState, Sequence, SequenceGroup, make_generator
from localpaged.core.sampling_params import SamplingParams, check_priority
from localpaged.engine import kv_sizing
from localpaged.engine.assembly import EngineParts
from localpaged.engine.detokenizer import kept_special, start_offsets
from localpaged.engine.grammar import GrammarCompiler
from localpaged.engine.multimodal import ImagePrompt, prompt_images


def build_group(p: EngineParts, config: EngineConfig, ids_counter: Iterator[int],
                prompt: str | list[int] | ImagePrompt, params: SamplingParams | None,
                request_id: str | None, beam: BeamParams | None,
                column_params: list[SamplingParams] | None,
                priority: str | None) -> SequenceGroup:
    """LLMEngine.make_group (its doc says what each argument asks); a request id, when none is
    given, is the next of `ids_counter`, drawn only once the prompt is checked."""
    if column_params is not None and not column_params:
        raise ValueError("column_params must not be empty")
    params = column_params[0] if column_params else (params or SamplingParams())
    priority = check_priority(params.priority if priority is None else priority)
    if isinstance(prompt, str):
        text, ids = prompt, p.tokenizer.encode(prompt, add_special_tokens=True)
    elif isinstance(prompt, ImagePrompt):          # engine/multimodal.py
        text, ids = prompt.text, [int(t) for t in prompt.token_ids]
    else:
        text, ids = None, [int(t) for t in prompt]
    check_prompt(p, config, ids)
    images = prompt_images(prompt, ids, p.encoder.tower if p.encoder else None)
    grammars = compile_guided(p.grammars, column_params or [params])
    request_id = request_id or f"req-{next(ids_counter)}"
    seq = Sequence(ids, len(ids), 0, make_generator(params.seed, 0))
    seq.detok_state = start_offsets(len(ids))
    seq.images = images
    group = SequenceGroup(request_id, text, ids, params, [seq], set(p.eos_token_ids),
                          p.max_model_len, beam, column_params=column_params,
                          beam_state=BeamState() if beam else None,
                          priority=priority, grammars=grammars)
    seq.grammar = group.new_grammar(0)
    seq.reasoning = group.new_reasoning(0)
    seq.text_special = kept_special(group.params_for_index(0))
    if params.prune is not None and (beam is not None or group.width < 2):
        raise ValueError("SamplingParams.prune stops branches that fall behind: it needs "
                         "n > 1 or several columns, and no beam search")
    if group.width > config.max_num_seqs:
        raise ValueError(f"the request needs {group.width} sequences at once (n, columns or "
                         f"beam width); this engine runs at most "
                         f"max_num_seqs={config.max_num_seqs}")
    return group


def compile_guided(grammars: GrammarCompiler, params: list[SamplingParams]) -> tuple:
    """Each output's compiled `guided` constraint (a GrammarError, a ValueError naming it,
    for one the library refuses); () when none is constrained."""
    if all(p.guided is None for p in params):
        return ()
    return tuple(None if p.guided is None else grammars.compile(p.guided) for p in params)


def check_prompt(p: EngineParts, config: EngineConfig, ids: list[int]) -> None:
    """A ValueError unless the prompt is non-empty, its ids are in the vocabulary, it is
    shorter than max_model_len and it fits the whole KV cache with one new token."""
    if not ids:
        raise ValueError("prompt is empty")
    vocab = p.model_config.vocab_size
    if any(t < 0 or t >= vocab for t in ids):
        raise ValueError(f"prompt token ids must be in [0, {vocab})")
    if len(ids) >= p.max_model_len:
        raise ValueError(f"prompt is {len(ids)} tokens; the model's context is "
                         f"{p.max_model_len} tokens (prompt plus at least one new token)")
    bm = p.block_manager
    capacity = kv_capacity_tokens(p, config)
    if len(ids) + 1 > capacity:
        raise ValueError(f"prompt is {len(ids)} tokens; the whole KV cache holds {capacity} "
                         f"({bm.pool.num_blocks} blocks of {bm.block_size})")


def kv_capacity_tokens(p: EngineParts, config: EngineConfig) -> int:
    """LLMEngine.kv_capacity_tokens: tokens the whole KV cache holds."""
    bm, c = p.block_manager, config
    window = p.kv_plan.windows[0]
    if window and bm.pool.num_blocks >= kv_sizing.sliding_blocks_needed(
            window, bm.block_size, 1, c.max_num_batched_tokens):
        return p.max_model_len
    return bm.pool.num_blocks * bm.block_size
