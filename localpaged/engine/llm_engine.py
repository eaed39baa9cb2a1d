"""LLMEngine: add_request / step / abort over the scheduler, model runner and KV cache.

One step: the scheduler picks the batch, the model runner moves blocks and runs the model, then
`output_processor` samples, forks parallel samples after the prompt, runs beam search,
detokenizes and applies stop rules. What that decided (forks, frees, finished groups) is a
`StepResult` that the scheduler's one post-step update applies (`Scheduler.update_from_output`);
abort and the out-of-memory path finish groups through the same update. The engine is single-threaded;
`async_engine.AsyncEngine` drives it from a background thread for concurrent callers.

Names: `block_manager` is a core.block_manager.BlockManager (block tables, in block ids), built
with every other part by engine.assembly (`assemble`: loading, KV sizing, the block manager,
scheduler, runner, drafter and disk tier); `kv_cache` holds the K/V tensors. A step's drafts
are cut or made by engine.draft_steps; `stats()` is engine.engine_stats over the parts;
`make_group` checks and builds a request by engine.request_building. With
`EngineConfig.debug_checks` (or env LOCALPAGED_DEBUG_CHECKS=1) every step ends with
`check_invariants()`.
See docs/architecture.md §5 (the life of a request, from make_group to the output).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

from localpaged.core.block_manager import BlockManager
from localpaged.core.config import EngineConfig
from localpaged.core.kv_cache_manager import InvariantError
from localpaged.core.request import BeamParams, Sequence, SequenceGroup
from localpaged.core.sampling_params import SamplingParams
from localpaged.core.scheduler import SchedulerOutput, StepResult
from localpaged.engine import request_building, step_decisions
from localpaged.engine.assembly import assemble
from localpaged.engine.detokenizer import detokenize
from localpaged.engine.draft_model import DraftModel
from localpaged.engine.draft_steps import account_drafts, constrain_drafts
from localpaged.engine.engine_stats import engine_stats
from localpaged.engine.grammar import step_masks
from localpaged.engine.multimodal import ImagePrompt, ids_and_images
from localpaged.engine.outputs import EngineInfo, EngineStats, RequestOutput, SeqStep, StepRecord
from localpaged.runner import prompt_logprobs
from localpaged.runner.model_runner import StepTimings, phase_of

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        p = assemble(config)          # engine/assembly.py: loading, KV sizing, every part
        self._parts = p               # for engine_stats and request_building: the fields below
        self.device, self.dtype, self.kv_cache_dtype = p.device, p.dtype, p.kv_cache_dtype
        self.model, self.tokenizer, self.model_config = p.model, p.tokenizer, p.model_config
        self.eos_token_ids, self.model_source = p.eos_token_ids, p.model_source
        self.weights_bytes, self.weights_format = p.weights_bytes, p.weights_format
        self.kernels, self.weight_formats = p.kernels, p.weight_formats
        self.max_model_len, self.backend, self.kv_plan = p.max_model_len, p.backend, p.kv_plan
        self.kv_cache, self.kv_disk = p.kv_cache, p.kv_disk
        self.block_manager: BlockManager = p.block_manager
        self.scheduler, self.runner = p.scheduler, p.runner
        self.encoder, self.images = p.encoder, p.images
        self.drafter, self.grammars = p.drafter, p.grammars
        self.jump_forward_tokens = 0      # tokens jump-forward drafted and the model kept
        # Grammar masks on a worker thread during the forward: on GPUs only (_masks_ahead)
        self.masks_during_forward = self.device.type == "cuda"
        self._mask_worker: ThreadPoolExecutor | None = None
        self.groups: dict[str, SequenceGroup] = {}        # unfinished requests by id
        self.debug_checks = config.debug_checks or os.environ.get("LOCALPAGED_DEBUG_CHECKS") == "1"
        self.num_tokens_computed = 0      # tokens run through the model (prefix hits skip it)
        # With EngineConfig.record_steps: one StepRecord per step (what ran together), else None.
        self.step_records: list[StepRecord] | None = [] if config.record_steps else None
        self._ids = itertools.count()
        logger.info("engine ready: %s on %s (%s), %d KV blocks of %d tokens (%s), backend %s; "
                    "weights %s by %s", self.model_source.description, self.device, self.dtype,
                    self.kv_plan.num_blocks[0], config.block_size, self.kv_cache_dtype,
                    self.backend.name, self.weights_format, self.kernels)
        if self.model.kv_groups.has_window:
            logger.info("KV-cache groups: %s", self.kv_plan.describe(config.block_size))

    # ---- requests -----------------------------------------------------------------------------
    def make_group(self, prompt: str | list[int] | ImagePrompt, params: SamplingParams | None = None,
                   request_id: str | None = None, beam: BeamParams | None = None,
                   column_params: list[SamplingParams] | None = None,
                   priority: str | None = None) -> SequenceGroup:
        """Tokenize and validate a request without touching engine state (thread-safe).

        `column_params` asks for one output per entry, each with its own settings, decoded
        together over the one shared prompt (side-by-side comparison); `params` is then ignored.
        `priority` ("interactive" | "background"; default: `params.priority`) is the scheduling
        class. Alternatives of a reply run as a background request with the same prompt tokens
        (n > 1 for several): it is admitted once that prompt's blocks are computed and shares
        them through the prefix cache.
        """
        return request_building.build_group(self._parts, self.config, self._ids, prompt, params,
                                            request_id, beam, column_params, priority)

    def add_group(self, group: SequenceGroup) -> None:
        if group.request_id in self.groups:
            raise ValueError(f"request id {group.request_id!r} is already running")
        self.groups[group.request_id] = group
        self.scheduler.add(group)

    def add_request(self, request_id: str | None, prompt: str | list[int] | ImagePrompt,
                    params: SamplingParams | None = None, priority: str | None = None) -> str:
        group = self.make_group(prompt, params, request_id, priority=priority)
        self.add_group(group)
        return group.request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        group = self.groups.get(request_id)
        if group is None:
            return None
        for seq in group.unfinished_seqs():
            self._end(seq, "abort", "abort")
        self._update(SchedulerOutput(), StepResult(finished=[group]))
        return step_decisions.request_output(group)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    # ---- the step -----------------------------------------------------------------------------
    def step(self, timings: StepTimings | None = None) -> list[RequestOutput]:
        """One engine step; `timings`, when given, accumulates seconds per phase."""
        phase = phase_of(timings)
        started = time.perf_counter()
        with phase("schedule"):
            if self.drafter is not None:
                self.drafter.attach(self.scheduler.running)
            jumped = constrain_drafts(self.scheduler.running, self.config.jump_forward)
            out = self.scheduler.schedule()
        masks = self._masks_ahead(out)
        logits, rows, prompt_lps = self.runner.execute(out, timings)
        prompt_logprobs.record(out.scheduled, prompt_lps)
        self.num_tokens_computed += out.num_tokens
        if self.step_records is not None:
            self.step_records.append(StepRecord(len(self.step_records), tuple(
                SeqStep(it.group.request_id, it.seq.seq_id, it.num_tokens) for it in out.scheduled)))
        result = StepResult()
        with phase("sample+finish"):
            touched = step_decisions.sample(out, logits, rows, result, self.tokenizer,
                                            masks.result() if masks is not None else None)
        for group in out.out_of_memory:
            logger.warning("request %s no longer fits in the KV cache: finished", group.request_id)
            for seq in group.unfinished_seqs():
                self._end(seq, "length", "kv_cache_full")
            result.finished.append(group)
            touched.append(group)
        for seq_id in jumped:           # jump-forward drafts are the grammar's, not speculation's
            drafted, accepted = result.drafts.pop(seq_id, (0, 0))
            self.jump_forward_tokens += accepted
        if self.drafter is not None:
            account_drafts(self.drafter, out, result, time.perf_counter() - started)
        self._update(out, result)
        # A prompt chunk that sampled nothing still reports its prefill progress.
        touched += [it.group for it in out.scheduled
                    if it.group.in_prompt_stage and not it.group.is_finished]
        with phase("outputs"):
            outputs = [step_decisions.request_output(g) for g in dict.fromkeys(touched)]
        if timings is not None:
            timings.steps += 1
        return outputs

    def _masks_ahead(self, out: SchedulerOutput):
        """A future of this step's grammar masks (grammar.step_masks), computed on a worker
        thread while the model runs on the GPU; None on CPU (the forward keeps every core busy:
        a third thread slows it more than the masks cost, bench/grammar.py), and when no
        scheduled sequence is constrained. The sampler computes what is not here."""
        if not self.masks_during_forward or not any(it.seq.grammar is not None and it.samples for it in out.scheduled):
            return None
        if self._mask_worker is None:
            self._mask_worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        return self._mask_worker.submit(step_masks, out.scheduled)

    def _end(self, seq: Sequence, reason: str, detail: str) -> None:
        """Finish seq from outside its own step (abort, out of memory), flushing its text."""
        seq.finish_reason, seq.finish_detail = reason, detail
        detokenize(self.tokenizer, seq, final=True)

    def _update(self, out: SchedulerOutput, result: StepResult) -> None:
        """The one way a step's decisions, and every finish, reach the scheduler and blocks."""
        self.scheduler.update_from_output(out, result)
        now = time.monotonic()
        for group in result.finished:
            self.groups.pop(group.request_id, None)
            group.finished_time = now
            if self.drafter is not None:
                self.drafter.forget(group.seqs)
        if self.debug_checks:
            self.check_invariants()

    def check_invariants(self) -> None:
        """Block accounting (KVCacheManager.check) plus: only live sequences hold blocks."""
        seqs = [s for g in self.groups.values() for s in g.unfinished_seqs()]
        self.block_manager.check(expect_empty=not self.groups, seqs=seqs)
        live = {s.seq_id for s in seqs}
        stray = (set(self.block_manager.tables) | set(self.block_manager.cpu_tables)) - live
        if stray:
            raise InvariantError(f"sequences {sorted(stray)} hold blocks but are not running")
        if self.drafter is not None and isinstance(self.drafter.model, DraftModel):
            self.drafter.model.check()

    # ---- introspection ------------------------------------------------------------------------
    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the whole KV cache holds: the most one request (prompt + reply) can use. A
        model whose every layer slides holds only a window per sequence: its cache bounds no
        request once its pool holds one sequence's window plus a whole prefill chunk."""
        return request_building.kv_capacity_tokens(self._parts, self.config)

    def context_limit(self) -> int:
        """The most tokens one request may hold, prompt plus reply: the smaller of the model's
        context (max_model_len, which follows EngineConfig.max_model_len) and the KV cache."""
        return min(self.max_model_len, self.kv_capacity_tokens)

    def info(self) -> EngineInfo:
        c = self.config
        return EngineInfo(c.model, self.device.type, self.max_model_len, self.context_limit(),
                          c.max_num_seqs, c.max_num_batched_tokens, c.block_size)

    def stats(self, with_block_tables: bool = False) -> EngineStats:
        return engine_stats(self._parts, with_block_tables)

    def prefetch(self, prompt: list[int] | ImagePrompt, max_blocks: int | None = None) -> int:
        """Read the blocks of the prompt's longest prefix that the disk tier holds into free KV
        blocks now, ahead of a request for them (a conversation opened), never evicting a
        block memory caches; at most max_blocks a call. Returns the blocks read (0: nothing
        left to read). Between steps only: the reads' LOAD ops, and any op decided before them,
        are carried out here, in order, as the next step would."""
        if self.kv_disk is None:
            return 0
        ids, images = ids_and_images(prompt)
        read = self.block_manager.prefetch(ids, max_blocks, images)
        for op in self.block_manager.take_block_ops():
            self.kv_cache.apply(op, self.backend)
        return read

    def clear_kv_disk(self) -> None:
        """Delete every block file of this model's disk tier (memory's cache stays)."""
        if self.kv_disk is not None:
            self.kv_disk.clear()

    def cached_prefix_blocks(self, prompt: list[int] | ImagePrompt) -> list[int]:
        """Ids of the cached blocks that hold a prefix of the prompt (for the UI's KV map)."""
        return self.block_manager.cached_prefix_block_ids(*ids_and_images(prompt))

    def cached_prefix_tokens(self, prompt: list[int] | ImagePrompt) -> int:
        """Prompt tokens a request for this prompt (token ids, or an ImagePrompt: its images'
        blocks are keyed by their hashes) would get from the prefix cache if admitted now (its
        `num_cached_tokens`); the rest it prefills. Read-only, counts no query. Admission
        always computes the last prompt token, so only tokens before it count."""
        return self.block_manager.cached_prefix_tokens(*ids_and_images(prompt))

