"""The chat UI driven against a second localpaged server as its remote backend, end to end.

A real API server (localpaged/api/server.py over a tiny random model, tests/helpers/tiny_models.py) runs on
127.0.0.1 in a background thread; the UI's controller (ui/controller.py) talks to it only through
`localpaged.chat.remote.RemoteChatBackend`, as `localpaged --backend URL` does: a conversation, a
regenerate (two sibling replies, navigation between them), a three-column comparison and a pick,
and the engine panel saying it has nothing to show for a remote engine. Greedy decoding is
deterministic on the server, which is what the replies are compared on; at the end the server's
engine holds no KV block.
"""

from __future__ import annotations

import time

import pytest
from helpers.tiny_models import build
from helpers.ui_helpers import controller, run

from localpaged import LLM
from localpaged.api.server import build_app, make_server, start_in_thread
from localpaged.chat.remote import RemoteChatBackend
from localpaged.engine.async_engine import AsyncEngine
from localpaged.ui import engine_panel as kvmap
from localpaged.ui import render

MODEL = "tiny-remote"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 16}
# The tiny tokenizer knows characters U+0100..U+02FC, one token each.
P1, P2 = "ĀāĂăĄąĆćĈĉĊċČčĎďĐđĒēĔĕĖėĘęĚěĜĝĞğ" * 2, "ƀƁƂƃƄƅƆƇƈƉƊƋƌƍƎƏ" * 3


@pytest.fixture(scope="module")
def server_engine(tiny_root):
    llm = LLM(build("llama-gqa", tiny_root), num_kv_blocks=256, max_num_seqs=16)
    llm.engine.tokenizer.chat_template = CHAT_TEMPLATE
    engine = AsyncEngine(llm.engine)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def base_url(server_engine):
    server = make_server(build_app(server_engine, MODEL), "127.0.0.1", 0, log_level="warning")
    start_in_thread(server)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True


@pytest.fixture
def ctl(base_url, tmp_path):
    backend = RemoteChatBackend(base_url)                # the model: the server's first
    yield from controller(backend, tmp_path, GREEDY)


def finished(ctl, turn) -> list:
    """The turn's replies as saved: complete, with text and stats."""
    msgs = [ctl.store.get_message(r.message_id) for r in turn.replies]
    for m in msgs:
        assert m.status == "complete" and m.content, (m.status, m.content)
        assert m.stats["generated_tokens"] > 0 and m.stats["finish_reason"] in ("stop", "length")
    return msgs


def wait_no_blocks(engine: AsyncEngine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (s := engine.stats()).blocks_in_use or s.num_running or s.num_waiting:
        assert time.monotonic() < deadline, f"the server's engine is not idle: {s}"
        time.sleep(0.02)


def test_conversation_regenerate_and_compare_over_a_remote_server(ctl, server_engine):
    backend = ctl.backend()
    assert backend.model_name == MODEL and not backend.supports_kv_stats

    # a conversation: send, the reply streams back and is saved
    cid = ctl.new_conversation().id
    turn = ctl.send(cid, P1)
    seen = [len(t.replies[0].text) for t in turn.updates(interval=0.0)]
    run(turn)
    assert seen[-1] > 0
    (first,) = finished(ctl, turn)
    assert [m.role for m in ctl.store.active_path(cid)] == ["user", "assistant"]
    assert first.content == turn.replies[0].text and first.sampling["temperature"] == 0.0
    assert ctl.store.get_conversation(cid).title.startswith(P1[:10])

    # regenerate: a sibling reply (greedy: the same text; the server reuses the prompt's blocks)
    (second,) = finished(ctl, run(ctl.regenerate(first.id)))
    assert ctl.store.siblings(second.id) == ([first.id, second.id], 1)
    assert second.content == first.content and second.stats["prefix_tokens_reused"] > 0
    view = ctl.view(cid)
    assert view.siblings[-1] == (2, 2) and view.path[-1].id == second.id
    assert [m.id for m in ctl.switch(second.id, -1)][-1] == first.id
    assert "‹ 1/2 ›" in render.chat_messages(ctl.view(cid))[-1]["content"]
    assert [m.id for m in ctl.switch(first.id, 1)][-1] == second.id
    user = ctl.store.active_path(cid)[0]
    tree = ctl.store.export_json(cid)["messages"]
    assert sorted((m["id"], m["parent_id"]) for m in tree) == \
        [(user.id, None), (first.id, user.id), (second.id, user.id)]

    # a comparison of three columns (one streaming request each), then a pick
    cmp_cid = ctl.new_conversation().id
    columns = [dict(GREEDY), {**GREEDY, "temperature": 1.0, "seed": 7}, {**GREEDY, "max_tokens": 5}]
    turn = run(ctl.compare(cmp_cid, P2, columns))
    replies = finished(ctl, turn)
    assert len(replies) == 3 and replies[2].stats["finish_reason"] == "length"
    alone = finished(ctl, run(ctl.send(ctl.new_conversation().id, P2)))[0]
    assert replies[0].content == alone.content              # a greedy column = greedy alone
    cmp_user = ctl.store.active_path(cmp_cid)[0]
    assert [c.id for c in ctl.store.children(cmp_user.id)] == [r.id for r in replies]
    assert ctl.view(cmp_cid).siblings[-1] == (1, 3)
    picked = ctl.pick(replies[1].id)
    assert picked[-1].id == replies[1].id and picked[-1].sampling["seed"] == 7
    assert ctl.view(cmp_cid).siblings[-1] == (2, 3)

    # the engine panel: no KV blocks to show for a remote engine
    snap = kvmap.KvMap(ctl).collect([cid, cmp_cid])
    assert not snap.available and not snap.rows and snap.stats is None
    assert "not available for a remote engine" in snap.note and MODEL in snap.note
    assert "not available for a remote engine" in kvmap.render_panel(snap)
    assert backend.stats() is None and backend.prompt_blocks(ctl.prompt_messages(cid, None)) == []

    # the server's engine freed every block
    assert not any(ctl.busy(c) for c in (cid, cmp_cid))
    wait_no_blocks(server_engine)


def test_compare_stats_are_per_column_over_a_remote_server(ctl):
    cid = ctl.new_conversation().id
    turn = run(ctl.compare(cid, P1, [dict(GREEDY), {**GREEDY, "max_tokens": 5}]))
    assert [r.stats["generated_tokens"] for r in finished(ctl, turn)] == [16, 5]


def test_remote_backend_has_no_weights_format_or_quantization_choice(base_url, server_engine):
    """The header shows the weights' format only for our own engine: a remote server's weights
    are not ours to describe (even when, as here, the server is a localpaged with a format)."""
    from localpaged.ui.models.view import header
    from localpaged.ui.models import ModelManager
    backend = RemoteChatBackend(base_url)
    mm = ModelManager(lambda name, progress: RemoteChatBackend(base_url, model=name),
                      backend=backend)
    assert server_engine.stats().weights_format.startswith("float32 ·")
    assert mm.quantization is None and mm.weights_format == ""
    assert header(mm).endswith(f"<code>{backend.model_name}</code></div></div>")
    with pytest.raises(ValueError, match="quantization: this backend loads no weights"):
        mm.load(MODEL, "int4")
