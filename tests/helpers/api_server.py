"""An API server over a tiny engine, for the tests of the OpenAI-compatible API and of what
serves through it: a uvicorn server in a background thread (start_server, stop_server), the
engine it serves (make_engine: a toy chat template, step records), a server over a model with
its own template (serve_model), a server that follows the UI's model switches
(serve_switchable), and prompts whose tokens differ one by one (words)."""

from __future__ import annotations

import time

import httpx
import openai

from helpers.step_gate import StepGate
from localpaged import LLM, LLMEngine
from localpaged.api import ServedModel
from localpaged.api.server import build_app, make_server, start_in_thread
from localpaged.engine.async_engine import AsyncEngine

MODEL = "tiny-llama"
API_KEY = "sk-test-123"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
MAX_NUM_SEQS = 16
_LLM_ENGINES: dict[AsyncEngine, LLMEngine] = {}


def words(i: int, n: int = 12) -> str:
    """A prompt of n in-vocabulary characters, different for each i."""
    return "".join(chr(0x100 + (i * 37 + j * 11) % 256) for j in range(n))


def chat_msgs(i: int) -> list[dict]:
    return [{"role": "system", "content": words(100 + i, 4)}, {"role": "user", "content": words(i)}]


def start_server(engine: AsyncEngine, api_key: str | None = None, app=None):
    """Serve build_app(engine) (or app) on 127.0.0.1 at a free port; returns (base_url, server)."""
    app = app if app is not None else build_app(engine, MODEL, api_key)
    server = make_server(app, "127.0.0.1", 0, log_level="warning")
    start_in_thread(server)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}", server


def stop_server(server) -> None:
    server.should_exit = True


def make_engine(model_path: str) -> AsyncEngine:
    """An AsyncEngine over the tiny model (conftest's tiny_llama), with a toy chat template and
    step records."""
    llm = LLM(model_path, num_kv_blocks=256, max_num_seqs=MAX_NUM_SEQS, record_steps=True)
    llm.engine.tokenizer.chat_template = CHAT_TEMPLATE
    engine = AsyncEngine(llm.engine)
    _LLM_ENGINES[engine] = llm.engine
    return engine


def gate(engine: AsyncEngine, step: int = 1) -> StepGate:
    """A StepGate (tests/helpers/step_gate.py) on the thread of an engine made by make_engine."""
    return StepGate(_LLM_ENGINES[engine], step)


def steps_of(engine: AsyncEngine, request_id: str) -> int:
    """How many engine steps ran the request (its step records)."""
    return sum(request_id in r.request_ids for r in engine.step_records())


def wait_idle(engine: AsyncEngine, timeout: float = 10.0) -> None:
    """Until no request runs or waits and no KV block is held (cached blocks are fine)."""
    deadline = time.monotonic() + timeout
    while True:
        s = engine.stats()
        if s.blocks_in_use == 0 and s.num_running == 0 and s.num_waiting == 0:
            return
        if time.monotonic() > deadline:
            sched = engine._engine.scheduler
            groups = [(g.request_id, g.status, g.width, len(g.seqs), g.params)
                      for g in list(sched.waiting) + list(sched.running)]
            raise AssertionError(f"engine not idle: {s}; {groups}")
        time.sleep(0.02)


def serve_model(path: str):
    """A server over the model at path with its own chat template: yields (engine, an httpx
    client on its /v1); a generator for a module fixture."""
    engine = AsyncEngine(LLM(path, num_kv_blocks=128, max_num_seqs=8).engine)
    url, server = start_server(engine)
    yield engine, httpx.Client(base_url=url + "/v1", timeout=60)
    stop_server(server)
    engine.shutdown()


def serve_switchable(llm: LLM):
    """The UI's model manager over a chat backend on `llm`, and a server whose API follows it:
    (backend, manager, server, openai client)."""
    from localpaged.chat.backend import LocalChatBackend
    from localpaged.ui.models import ModelManager, local_factory
    llm.tokenizer.chat_template = CHAT_TEMPLATE
    first = LocalChatBackend(AsyncEngine(llm.engine))
    mm = ModelManager(local_factory(num_kv_blocks=64), backend=first)
    mm.served = served = ServedModel(first.engine, first.model_name)
    url, server = start_server(None, app=build_app(served))
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
    return first, mm, server, c
