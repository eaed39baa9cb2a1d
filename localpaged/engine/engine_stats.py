"""The engine's counters as one EngineStats: block usage, prefix-cache and scheduler counts,
speculation, per-KV-cache-group figures, the disk tier and the encoder cache (`engine_stats`).

Read-only over the parts engine.assembly built; LLMEngine.stats calls it between steps (the
engine thread only, like every read of the parts).
"""

from __future__ import annotations

from localpaged.core.request import Sequence
from localpaged.engine.assembly import EngineParts
from localpaged.engine.outputs import EngineStats, KVGroupStats


def engine_stats(p: EngineParts, with_block_tables: bool = False) -> EngineStats:
    kv, sched = p.block_manager, p.scheduler
    blocks = kv.usage()
    running = [s for g in sched.running for s in g.unfinished_seqs()]
    tables = {}
    if with_block_tables:          # group 0's held blocks (a sliding group 0's NULL entries
        # left out), one list per output: empty for one that ended before its siblings
        tables = {g.request_id: [[] if s.is_finished else kv.live_block_ids(s) for s in g.seqs]
                  for g in sched.running}
    return EngineStats(
        num_blocks=blocks.num_blocks, block_size=kv.block_size, blocks_in_use=blocks.in_use,
        blocks_cached=blocks.cached, blocks_free=blocks.free, blocks_shared=blocks.shared,
        blocks_without_sharing=blocks.table_entries, tokens_in_use=kv.num_stored_tokens(running),
        prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits,
        num_preemptions=sched.num_preemptions, num_swapped_out=sched.num_swapped_out,
        num_cpu_blocks=blocks.num_cpu_blocks, cpu_blocks_in_use=blocks.cpu_in_use,
        num_running=len(sched.running), num_waiting=len(sched.waiting),
        num_swapped=len(sched.swapped), block_tables=tables,
        weights_bytes=p.weights_bytes, weights_format=p.weights_format,
        draft_tokens=p.drafter.drafted if p.drafter else 0,
        accepted_draft_tokens=p.drafter.accepted if p.drafter else 0,
        kv_groups=_group_stats(p, running),
        prefix_cache_disk_hits=kv.prefix_cache_disk_hits,
        kv_disk=p.kv_disk.stats() if p.kv_disk is not None else None,
        kernels=p.kernels, weight_formats=dict(p.weight_formats),
        encoder_runs=p.encoder.runs if p.encoder else 0,
        encoder_cache_hits=p.encoder.hits if p.encoder else 0)


def _group_stats(p: EngineParts, running: list[Sequence]) -> tuple[KVGroupStats, ...]:
    """Per KV-cache group, for a model with windows (empty without: the fields above)."""
    kv = p.block_manager
    if kv.windows == (0,):
        return ()
    return tuple(KVGroupStats(
        window=w, num_layers=len(p.model.kv_groups.layers(g.group)),
        num_blocks=u.num_blocks, blocks_in_use=u.in_use, blocks_cached=u.cached,
        tokens_held=g.num_stored_tokens(running),
        bytes_saved=g.num_null_entries() * p.kv_plan.bytes_per_block[g.group])
        for g, w, u in zip(kv.groups, kv.windows, kv.group_usage()))
