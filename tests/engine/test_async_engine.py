"""The async driver: concurrent streams in one batch give transformers' greedy tokens (a cancelled
stream a prefix of them), cancellation frees blocks."""

import asyncio
import threading
import time

from helpers.engine_helpers import greedy, hf_greedy, prompts
from helpers.step_gate import StepGate, shared_step

from localpaged import LLM
from localpaged.engine.async_engine import AsyncEngine


def wait_idle(engine: AsyncEngine, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.blocks_in_use == 0:
            return stats
        time.sleep(0.05)
    raise AssertionError(f"engine not idle: {engine.stats()}")


def test_eight_concurrent_streams_and_one_cancel(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=128, record_steps=True)
    batch = prompts(8, seed=11)
    expected = [hf_greedy(tiny_llama, p, 30) for p in batch]
    engine = AsyncEngine(llm.engine)
    gate = StepGate(llm.engine)         # the first step waits until all eight are submitted

    async def consume(i, stream):
        chunks, tokens = 0, []
        async for out in stream:
            chunks += 1
            tokens = out.outputs[0].token_ids
            if i == 3 and len(tokens) >= 5:
                break                                     # cancel mid-way
        return chunks, tokens

    async def main():
        streams = [engine.submit(p, greedy(30)) for p in batch]
        gate.release()
        return streams, await asyncio.gather(*[consume(i, s) for i, s in enumerate(streams)])

    streams, results = asyncio.run(main())
    gate.close()
    for i, (chunks, tokens) in enumerate(results):
        if i == 3:
            assert 5 <= len(tokens) < 30 and tokens == expected[i][:len(tokens)]
        else:
            assert tokens == expected[i] and chunks > 1           # streamed, not one final blob
    # They ran in one batch: the step after the held one runs every request (submitted while
    # it was held, none finished by then).
    assert shared_step(engine.step_records(), [s.request_id for s in streams])
    wait_idle(engine)
    engine.shutdown()


def test_sync_streams_from_threads_and_bad_request(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=64)
    engine = AsyncEngine(llm.engine)
    results = {}

    def worker(i):
        for out in engine.submit([1, 5 + i, 9], greedy(12)):
            results[i] = out
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(results[i].finished for i in range(4))
    assert [results[i].outputs[0].token_ids for i in range(4)] == \
        [hf_greedy(tiny_llama, [1, 5 + i, 9], 12) for i in range(4)]
    try:
        engine.submit([1] * 5000, greedy(3))
    except ValueError as exc:
        assert "context" in str(exc)
    else:
        raise AssertionError("too-long prompt accepted")
    wait_idle(engine)
    engine.shutdown()
