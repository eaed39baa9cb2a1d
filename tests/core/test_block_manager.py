"""The BlockManager contract (core/block_manager.py): both managers implement every member it
states, with its parameters, and a scheduler, runner and engine built on either read only those."""

import pytest
from helpers.contracts import unmet

from localpaged.core.block_manager import BlockManager
from localpaged.core.hybrid_kv_cache_manager import HybridKVCacheManager
from localpaged.core.kv_cache_manager import KVCacheManager
from localpaged.core.request import Sequence

MANAGERS = {
    "plain": lambda: KVCacheManager(32, 4, True, num_cpu_blocks=8),
    "hybrid": lambda: HybridKVCacheManager((0, 8), [32, 16], 4, True, [8, 4]),
}


@pytest.mark.parametrize("kind", MANAGERS)
def test_each_manager_implements_every_member(kind):
    manager = MANAGERS[kind]()
    assert isinstance(manager, BlockManager)
    assert unmet(BlockManager, manager) == []


@pytest.mark.parametrize("kind", MANAGERS)
def test_the_members_answer_alike(kind):
    """One sequence through the contract's calls: every group's table and the whole's agree."""
    manager = MANAGERS[kind]()
    seq = Sequence(list(range(10)), 10, 0, None)               # 2 full blocks of 4 + 2 tokens
    assert manager.admit([seq], 64) == [0]
    assert manager.block_ids(seq) == manager.group_block_ids(0, seq)
    assert len(manager.groups) == len(manager.windows)
    assert [len(g.block_ids(seq)) for g in manager.groups] == [3] * len(manager.groups)
    assert manager.usage().in_use == 3
    manager.free(seq)
    manager.check(expect_empty=True)


def test_the_layers_above_core_name_no_manager_class():
    """Only the engine's constructor picks a class; everything else holds a BlockManager."""
    from helpers import REPO
    for path in ("localpaged/core/scheduler.py", "localpaged/runner/model_runner.py"):
        text = (REPO / path).read_text()
        assert "KVCacheManager" not in text, path
