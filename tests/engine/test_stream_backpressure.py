"""A streaming client that stops reading costs the server no more than its reply: the engine
keeps generating into the stream's one buffer (deltas added up, not queued), other requests are
served meanwhile, and the process's resident memory stays flat.

Also the stream's two views: deltas that add up to the full outputs a plain iteration yields.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import time

import pytest
from helpers import tiny_models
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from localpaged import LLM, SamplingParams
from localpaged.api.server import build_app, make_server, start_in_thread
from localpaged.engine.async_engine import AsyncEngine
from localpaged.engine.outputs import OutputAccumulator

MODEL = "tiny-long"
REPLY_TOKENS = 4000
RSS_SLACK = 50 * 2**20
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def long_model(tmp_path_factory) -> str:
    """The tiny random Llama with room for a 4,000-token reply."""
    path = str(tmp_path_factory.mktemp("models") / "llama-long")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = LlamaConfig(num_attention_heads=4, num_key_value_heads=2,
                             **{**tiny_models.COMMON, "max_position_embeddings": 8192})
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tiny_models._tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(long_model):
    llm = LLM(long_model, num_kv_blocks=1024, max_num_seqs=8)
    llm.engine.tokenizer.chat_template = CHAT_TEMPLATE
    engine = AsyncEngine(llm.engine)
    uv = make_server(build_app(engine, MODEL), "127.0.0.1", 0, log_level="warning")
    start_in_thread(uv)
    yield uv.servers[0].sockets[0].getsockname()[1], engine
    uv.should_exit = True
    engine.shutdown()


def rss() -> int:
    """This process's resident set (the server runs in it), in bytes."""
    with open(f"/proc/{os.getpid()}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def stalled_stream(port: int, body: dict) -> socket.socket:
    """Send a streaming request, read its response headers, then read nothing more."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)    # fills at once
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def chat(port: int, max_tokens: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
                 body=json.dumps({"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                                  "messages": [{"role": "user", "content": "hello"}]}))
    resp = conn.getresponse()
    assert resp.status == 200
    out = json.loads(resp.read())
    conn.close()
    return out


def test_a_stalled_stream_keeps_memory_flat_and_others_served(server):
    port, engine = server
    chat(port, 4)                                     # warm up: first-request allocations
    sock = stalled_stream(port, {
        "model": MODEL, "stream": True, "max_tokens": REPLY_TOKENS, "ignore_eos": True,
        "logprobs": True, "top_logprobs": 20, "temperature": 0,
        "messages": [{"role": "user", "content": "tell me everything"}]})
    try:
        start, peak, served = rss(), 0, 0
        deadline = time.monotonic() + 600
        while engine.stats().num_running or engine.stats().num_waiting:
            assert time.monotonic() < deadline, "the stalled request never finished"
            if served < 3:                            # others go on while it is stalled
                assert chat(port, 3)["usage"]["completion_tokens"] == 3
                served += 1
            peak = max(peak, rss())
            time.sleep(0.2)
        peak = max(peak, rss())
        assert served == 3
        assert peak - start < RSS_SLACK, f"RSS grew {(peak - start) / 2**20:.0f} MB"
    finally:
        sock.close()


def test_deltas_add_up_to_the_full_outputs(server):
    """A delta carries only what is new; added up they give what a plain iteration yields."""
    _, engine = server
    params = SamplingParams(max_tokens=40, temperature=0.0, logprobs=3, ignore_eos=True)
    full = list(engine.submit([1, 5, 9], params))
    total, sizes = OutputAccumulator(from_start=True), []

    async def read_deltas():
        async for delta in engine.submit([1, 5, 9], params).deltas():
            assert delta.delta
            sizes.append(len(delta.outputs[0].token_ids))
            total.add(delta)
    asyncio.run(read_deltas())
    whole = total.output()
    assert not whole.delta and whole.finished
    assert whole.outputs[0].token_ids == full[-1].outputs[0].token_ids
    assert whole.outputs[0].text == full[-1].outputs[0].text
    assert len(whole.outputs[0].logprobs) == 40
    assert sum(sizes) == 40 and max(sizes) < 40          # streamed in pieces, no repeats
    # The plain iteration's outputs are cumulative, and one yielded early is not changed later.
    lengths = [len(o.outputs[0].token_ids) for o in full]
    assert lengths == sorted(lengths) and lengths[0] < 40 == lengths[-1]
    assert [len(o.outputs[0].logprobs) for o in full] == lengths
