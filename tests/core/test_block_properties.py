"""Property-based block accounting: random add / fork / append / free / abort / preempt / swap
/ speculate (a draft written, part of it accepted, the rest given back) sequences keep the
invariants of docs/architecture.md §2 (I1-I5, I14), checked both here (independently) and by
KVCacheManager.check(); the same machine runs over HybridKVCacheManager (a full group beside
sliding-window groups, and a model whose every layer slides), where blocks wholly before a
window must be NULL entries and everything else holds in every group."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from localpaged.core.block_pool import NULL_BLOCK, BlockOpKind, BlockPool
from localpaged.core.hybrid_kv_cache_manager import HybridKVCacheManager
from localpaged.core.kv_cache_manager import KVCacheManager
from localpaged.core.prefix_cache import hash_block
from localpaged.core.request import Sequence

B = 4
NUM_BLOCKS = 24


def chain_hash(tokens: tuple) -> bytes:
    h = None
    for i in range(len(tokens) // B):
        h = hash_block(h, list(tokens[i * B:(i + 1) * B]))
    return h


class BlockMachine(RuleBasedStateMachine):
    keep_runs = False

    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, B, enable_prefix_caching=True, num_cpu_blocks=12,
                                 keep_runs=self.keep_runs)
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.waiting: list[Sequence] = []
        # (group, device block) -> tokens up to its end, when full
        self.content: dict[tuple[int, int], tuple] = {}

    @property
    def groups(self) -> list[KVCacheManager]:
        """The managers of each KV-cache group (the plain manager is one group)."""
        return getattr(self.kv, "groups", [self.kv])

    def live(self) -> list[Sequence]:
        return self.running + self.swapped

    # ---- helpers ------------------------------------------------------------------------------
    def compute(self, seq: Sequence, n: int) -> None:
        """What the model runner and the post-step update do: write n tokens' K/V, then count
        them computed and cache the blocks that became full."""
        self.write(seq, n)
        seq.num_computed_tokens += n
        self.kv.cache_full_blocks(seq)

    def write(self, seq: Sequence, n: int) -> None:
        """What the model runner does: carry out copies, then write n tokens' K/V."""
        for op in self.kv.take_block_ops():
            if op.kind is not BlockOpKind.COPY:       # swaps only move bytes we track below
                continue
            g = op.group
            # a batched op reads all its sources before it writes (kernels' copy_blocks)
            read = {src: self.content.get((g, src)) for src, _ in op.pairs}
            for src, dst in op.pairs:
                # a private copy (ref 1) or a cached block's new holder (free: ref 0)
                assert self.groups[g].pool.blocks[dst].ref_count <= 1
                if read[src] is None:
                    self.content.pop((g, dst), None)
                else:
                    self.content[(g, dst)] = read[src]
        for g, group in enumerate(self.groups):
            table = group.tables[seq.seq_id]
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                block = table[pos // B]
                assert block is not NULL_BLOCK, "write into a NULL entry"
                assert block.ref_count == 1, "write into a shared block"
                if pos % B == B - 1:
                    self.content[(g, block.block_id)] = tuple(seq.token_ids[:pos + 1])
                elif pos % B == 0:
                    self.content.pop((g, block.block_id), None)

    def append_token(self, seq: Sequence, token: int) -> None:
        seq.token_ids.append(token)
        if self.kv.allocate_slots(seq, 1):
            self.compute(seq, 1)
        else:
            seq.token_ids.pop()

    # ---- rules --------------------------------------------------------------------------------
    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=14))
    def add(self, tokens):
        seq = Sequence(tokens, len(tokens), 0, None)
        hits = self.kv.find_cached_prefix(seq)
        n = len(tokens) - self.kv.hit_tokens(hits)
        if (tail := getattr(hits, "tail", None)) is not None:     # a hit ending inside a block
            shared = len(hits) * B + tail.num_tokens
            assert 0 < tail.num_tokens < B and shared < len(tokens)
            assert self.content[(0, tail.block.block_id)][:shared] == tuple(tokens[:shared])
        if self.kv.allocate_slots(seq, n, hits):
            self.compute(seq, n)
            self.running.append(seq)
        else:
            self.waiting.append(seq)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), token=st.integers(0, 2))
    def append(self, i, token):
        self.append_token(self.running[i % len(self.running)], token)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), token=st.integers(0, 2),
          draft=st.lists(st.integers(0, 2), min_size=1, max_size=7), accepted=st.integers(0, 7))
    def speculate(self, i, token, draft, accepted):
        """A decode step with a draft, as the scheduler and the verification do it: room for
        the token and its draft (the draft dropped first when blocks are short), K/V written
        for all of them, `accepted` drafts kept as tokens, the rest leave; only the token and
        the accepted drafts count as computed, and blocks only rejected positions used are
        given back."""
        seq = self.running[i % len(self.running)]
        seq.token_ids += [token, *draft]
        seq.num_draft_tokens = len(draft)
        if not self.kv.allocate_slots(seq, 1 + len(draft)):
            seq.drop_drafts()
            if not self.kv.allocate_slots(seq, 1):
                seq.token_ids.pop()
                return
        self.write(seq, 1 + seq.num_draft_tokens)
        kept = min(accepted, seq.num_draft_tokens)
        seq.drop_drafts(keep=kept)
        seq.num_draft_tokens = 0                       # the accepted drafts are tokens now
        seq.num_computed_tokens += 1 + kept
        self.kv.trim(seq, seq.num_computed_tokens)
        self.kv.cache_full_blocks(seq)
        assert len(self.kv.tables[seq.seq_id]) == -(-seq.num_computed_tokens // B)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        parent = self.running[i % len(self.running)]
        child = parent.fork(1, None)
        self.kv.fork(parent, child)
        self.running.append(child)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), width=st.integers(2, 4), token=st.integers(0, 2))
    def fork_group_and_diverge(self, i, width, token):
        """n > 1 sampling or a beam step: fork width-1 children, then each appends its own token."""
        parent = self.running[i % len(self.running)]
        group = [parent]
        for _ in range(width - 1):
            child = parent.fork(1, None)
            self.kv.fork(parent, child)
            group.append(child)
            self.running.append(child)
        for k, seq in enumerate(group):
            self.append_token(seq, (token + k) % 3)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        self.kv.free(self.running.pop(i % len(self.running)))

    @precondition(lambda self: self.waiting)
    @rule()
    def abort_waiting(self):
        self.kv.free(self.waiting.pop(0))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def preempt_recompute(self, i):
        seq = self.running.pop(i % len(self.running))
        self.kv.reset_computed(seq)
        self.waiting.append(seq)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def swap_out(self, i):
        seq = self.running[i % len(self.running)]
        if self.kv.can_swap_out([seq]):
            self.running.remove(seq)
            self.kv.swap_out([seq])           # device bytes stay: a cached block remains valid
            self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule()
    def swap_in(self):
        seq = self.swapped[0]
        if self.kv.can_swap_in([seq]):
            self.swapped.pop(0)
            self.kv.swap_in([seq])
            for g, group in enumerate(self.groups):             # the restored bytes
                for i, block in enumerate(group.tables[seq.seq_id]):
                    if block is NULL_BLOCK:
                        continue
                    end = (i + 1) * B
                    if end <= seq.num_computed_tokens:
                        self.content[(g, block.block_id)] = tuple(seq.token_ids[:end])
                    else:
                        self.content.pop((g, block.block_id), None)
            self.running.append(seq)

    @precondition(lambda self: self.waiting)
    @rule()
    def resume_waiting(self):
        seq = self.waiting[0]
        hits = self.kv.find_cached_prefix(seq)
        n = len(seq.token_ids) - self.kv.hit_tokens(hits)
        if self.kv.allocate_slots(seq, n, hits):
            self.waiting.pop(0)
            self.compute(seq, n)
            self.running.append(seq)

    @precondition(lambda self: self.waiting)
    @rule(budget=st.integers(1, 20))
    def admit_waiting(self, budget):
        """The scheduler's admission: prefix hits, watermark and allocation in one call."""
        seq = self.waiting[0]
        free_before = [g.pool.num_free for g in self.groups]
        cached = self.kv.admit([seq], budget)
        if cached is None:                     # nothing held, in any group
            assert [g.pool.num_free for g in self.groups] == free_before
            assert all(seq.seq_id not in g.tables for g in self.groups)
            return
        self.waiting.pop(0)
        assert seq.num_computed_tokens == cached[0] < len(seq.token_ids)
        assert all(g.pool.num_free >= g.watermark_blocks for g in self.groups)
        n = min(seq.num_uncomputed_tokens, budget)
        self.compute(seq, n)
        if seq.num_uncomputed_tokens:          # the rest of the prompt, as the next steps would
            if not self.kv.allocate_slots(seq, seq.num_uncomputed_tokens):
                self.kv.reset_computed(seq)
                self.waiting.append(seq)
                return
            self.compute(seq, seq.num_uncomputed_tokens)
        self.running.append(seq)

    # ---- invariants ---------------------------------------------------------------------------
    @invariant()
    def manager_check_passes(self):
        self.kv.check(seqs=self.live())

    @invariant()
    def ref_counts_match_tables(self):
        for group in self.groups:
            for tables, pool in ((group.tables, group.pool), (group.cpu_tables, group.cpu_pool)):
                holders: dict[int, int] = {}
                for table in tables.values():
                    for block in table:
                        if block is not NULL_BLOCK:
                            holders[block.block_id] = holders.get(block.block_id, 0) + 1
                for block in pool.blocks:
                    assert block.ref_count == holders.get(block.block_id, 0)
            for block in group.pool.blocks:
                assert (block.block_id in group.pool.free_queue) == (block.ref_count == 0)

    @invariant()
    def cached_hash_describes_stored_tokens(self):
        for g, group in enumerate(self.groups):
            for h, block in group.pool.cached.items():
                assert block.block_hash == h
                assert chain_hash(self.content[(g, block.block_id)]) == h

    @invariant()
    def no_hash_for_an_uncomputed_block(self):
        for group in self.groups:
            for seq in self.running:
                for i, block in enumerate(group.tables[seq.seq_id]):
                    if block.block_hash is not None:
                        assert (i + 1) * B <= seq.num_computed_tokens

    @invariant()
    def sliding_groups_hold_only_their_window(self):
        """Blocks wholly before the window of the next query (at num_computed_tokens) are NULL,
        the others real; so a table holds at most ceil((W + B - 2) / B) blocks."""
        for group in self.groups:
            window = getattr(group, "window", 0)
            if not window:
                continue
            for seq in self.live():
                table = group.tables.get(seq.seq_id) or group.cpu_tables[seq.seq_id]
                dead = max(0, (seq.num_computed_tokens - window + 1) // B)
                assert [b is NULL_BLOCK for b in table] == [i < dead for i in range(len(table))]
                assert len(table) - dead <= -(-(window + B - 2) // B)

    def teardown(self):
        for seq in self.running + self.swapped + self.waiting:
            self.kv.free(seq)
        for group in self.groups:
            assert group.pool.num_free == group.pool.num_blocks, \
                "a block is still held after every request ended"
            assert all(b.ref_count == 0 for b in group.pool.blocks)
            assert group.cpu_pool.num_free == group.cpu_pool.num_blocks
        self.kv.check(expect_empty=True)


class RunsMachine(BlockMachine):
    """The same, with tables kept back to back (cached blocks moved out of the way: the CPU)."""
    keep_runs = True


class HybridMachine(BlockMachine):
    """A full-attention group beside two sliding groups (windows 5 and 9, smaller pools)."""
    windows, sizes = (0, 5, 9), [NUM_BLOCKS, 10, 12]

    def __init__(self):
        RuleBasedStateMachine.__init__(self)
        self.kv = HybridKVCacheManager(self.windows, self.sizes, B, enable_prefix_caching=True,
                                       num_cpu_blocks=[12] * len(self.windows),
                                       keep_runs=self.keep_runs)
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.waiting: list[Sequence] = []
        self.content: dict[tuple[int, int], tuple] = {}


class AllSlidingMachine(HybridMachine):
    """Every layer slides (Mistral): one sliding group, its tables kept back to back."""
    windows, sizes, keep_runs = (6,), [14], True


TestBlockMachine = BlockMachine.TestCase
TestBlockMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRunsMachine = RunsMachine.TestCase
TestRunsMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestHybridMachine = HybridMachine.TestCase
TestHybridMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestAllSlidingMachine = AllSlidingMachine.TestCase
TestAllSlidingMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def _cache_order(pool) -> list:
    """The cached hashes in eviction order."""
    return [pool.blocks[i].block_hash for i in pool.free_queue if pool.blocks[i].block_hash]


def _two_pools_with_cached_blocks():
    """Twin pools: blocks 0-5 computed and cached (0-2 freed last), 6-7 plain free."""
    pools = []
    for _ in range(2):
        pool = BlockPool(8)
        blocks = [pool.allocate() for _ in range(6)]
        for b in blocks:
            pool.register(b, bytes([b.block_id]))
        for b in blocks[3:] + blocks[:3]:
            pool.decref(b)
        pools.append(pool)
    return pools


def test_allocate_next_takes_the_next_block_and_keeps_the_cache_as_allocate_would():
    plain, runs = _two_pools_with_cached_blocks()
    runs.incref(runs.lookup(bytes([1])))                     # a prefix hit: a table ends with 1
    plain.incref(plain.lookup(bytes([1])))
    for _ in range(4):                                       # 2 plain free blocks, then evictions
        plain.allocate()
    got = [runs.allocate_next(last) for last in (1, 2, 3, 4)]
    assert [b.block_id for b, _ in got] == [2, 3, 4, 5]     # one run after block 1
    moves = [m for _, m in got if m]
    assert [src for src, _ in moves] == [2, 3, 4, 5]        # each held cached tokens: moved
    assert _cache_order(runs) == _cache_order(plain)          # the same tokens, the same order
    for src, dst in moves:
        assert runs.lookup(bytes([src])) is None or runs.lookup(bytes([src])).block_id == dst


def test_allocate_next_falls_back_to_the_queue_head():
    pool = BlockPool(4)
    a, b = pool.allocate(), pool.allocate()                  # 0, 1 held
    assert pool.allocate_next(1)[0].block_id == 2             # free: taken
    assert pool.allocate_next(0) == (pool.blocks[3], None)    # 1 is held: the head (3) instead
    assert pool.blocks[3].ref_count == 1
