"""The functions behind the chat UI's events, without a browser: ui/controller.py (send,
regenerate, edit, compare, stop, fork, settings, search), ui/render.py (escaping, markers,
stats), ui/engine_panel/logic.py (branches sharing KV blocks) and ui/models/logic.py (a failed load keeps the
current model). A tiny random model stands in for a real one: its text is noise, but greedy
decoding is deterministic, which is what these tests compare."""

from __future__ import annotations

import html
import re
import threading
from types import SimpleNamespace

import pytest
from helpers.step_gate import StepGate, shared_step
from helpers.tiny_models import build
from helpers.ui_helpers import TinyBackend, tiny_backend

from localpaged import LLM, ModelNotFoundError
from localpaged.ui import engine_panel as kvmap
from localpaged.ui import markdown, render
from localpaged.ui.controller import ChatController, ChatError
from localpaged.ui.models import FALLBACK_CHAT_TEMPLATE, ModelManager, local_factory
from localpaged.ui.store import Store
from localpaged.ui.redraw import BACKGROUND_S, FOREGROUND_S
from localpaged.ui.turns import Turn

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 24}
# The tiny tokenizer knows characters U+0100..U+02FC (ASCII maps to one unknown id), so prompts
# that must differ are written in that range.
P1, P2, P3 = "ĀāĂăĄąĆćĈĉĊċČčĎďĐđĒēĔĕĖėĘęĚěĜĝĞğ" * 2, "ƀƁƂƃƄƅƆƇƈƉƊƋƌƍƎƏ" * 3, "ȀȁȂȃȄȅȆȇȈȉȊȋ" * 4


@pytest.fixture(scope="module")
def backend(tiny_root):
    yield from tiny_backend(build("llama-gqa", tiny_root), num_kv_blocks=256, record_steps=True)


@pytest.fixture
def ctl(backend, tmp_path):
    store = Store(tmp_path / "conversations.db")
    c = ChatController(store, lambda: backend, GREEDY, tmp_path / "ui_state.json")
    yield c
    c.stop_all()
    store.close()


def run(turn, timeout=60):
    assert turn.wait(timeout), "generation did not finish"
    assert turn.error is None, turn.error
    return turn


def test_send_streams_and_saves(ctl):
    cid = ctl.new_conversation().id
    turn = ctl.send(cid, P1)
    seen = [len(t.replies[0].text) for t in turn.updates(interval=0.0)]
    run(turn)
    assert seen[-1] > 0 and turn.done
    path = ctl.store.active_path(cid)
    assert [m.role for m in path] == ["user", "assistant"]
    reply = path[1]
    assert reply.status == "complete" and reply.content == turn.replies[0].text
    assert reply.stats["generated_tokens"] == 24 and reply.stats["ttft_s"] > 0
    assert reply.sampling["temperature"] == 0.0
    assert ctl.store.get_conversation(cid).title.startswith(P1[:10])


def test_a_reply_in_the_background_waits_until_shown_or_done():
    """The pause between two redraws of a reply: in the background it lasts BACKGROUND_S (a
    second: the follower then sends the tab's label only), less if the tab is shown (asked
    again every FOREGROUND_S) or the reply is done."""
    for end in ("shown", "done"):
        turn, shown = SimpleNamespace(done=False), threading.Event()
        pause = threading.Thread(target=Turn._pause, args=(turn, lambda: FOREGROUND_S
                                 if shown.is_set() else BACKGROUND_S))
        pause.start()
        pause.join(0.5)
        assert BACKGROUND_S >= 1.0 and pause.is_alive()    # no redraw while in the background
        shown.set() if end == "shown" else setattr(turn, "done", True)
        pause.join(2.0)
        assert not pause.is_alive(), end


def test_regenerate_keeps_siblings_and_skips_prefill(ctl):
    cid = ctl.new_conversation().id
    first = run(ctl.send(cid, P1)).replies[0].message_id
    second = run(ctl.regenerate(first)).replies[0].message_id
    assert ctl.store.siblings(second) == ([first, second], 1)
    view = ctl.view(cid)
    assert view.siblings[-1] == (2, 2) and view.path[-1].id == second
    assert ctl.store.get_message(second).stats["prefix_tokens_reused"] >= 16
    assert ctl.store.get_message(second).content == ctl.store.get_message(first).content  # greedy
    assert [m.id for m in ctl.switch(second, -1)][-1] == first
    assert "‹ 1/2 ›" in render.chat_messages(ctl.view(cid))[-1]["content"]
    ctl.switch(first, 1)
    assert "prefill skipped" in render.chat_messages(ctl.view(cid))[-1]["content"]


def test_edit_makes_a_branch_and_keeps_the_old(ctl):
    cid = ctl.new_conversation().id
    run(ctl.send(cid, P1))
    run(ctl.send(cid, P2))
    old_user = ctl.store.active_path(cid)[2]
    run(ctl.edit(old_user.id, P3))
    path = ctl.store.active_path(cid)
    assert path[2].content == P3 and len(path) == 4
    ids, index = ctl.store.siblings(path[2].id)
    assert ids == [old_user.id, path[2].id] and index == 1
    assert ctl.switch(path[2].id, 1)[2].id == old_user.id        # wraps round to the old one
    with pytest.raises(ChatError):
        ctl.edit(path[1].id, "replies are not edited")


def test_compare_three_columns_one_request(ctl, backend):
    cid = ctl.new_conversation().id
    columns = [dict(GREEDY), {**GREEDY, "temperature": 1.0, "seed": 7}, {**GREEDY, "max_tokens": 5}]
    turn = run(ctl.compare(cid, P2, columns))
    assert len(turn.replies) == 3
    texts = [r.text for r in turn.replies]
    alone = run(ctl.send(ctl.new_conversation().id, P2)).replies[0].text
    assert texts[0] == alone                                # a greedy column = greedy alone
    assert turn.replies[2].stats["generated_tokens"] == 5
    user = ctl.store.active_path(cid)[0]
    assert [c.id for c in ctl.store.children(user.id)] == [r.message_id for r in turn.replies]
    picked = ctl.pick(turn.replies[1].message_id)
    assert picked[-1].id == turn.replies[1].message_id and picked[-1].sampling["seed"] == 7
    with pytest.raises(ChatError):
        ctl.compare(cid, P2, 5)


def test_compare_samples_of_the_same_settings(ctl):
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "", {**GREEDY, "temperature": 1.0, "seed": 3})
    turn = run(ctl.compare(cid, P1, 2))
    seeds = [ctl.store.get_message(r.message_id).sampling["seed"] for r in turn.replies]
    assert seeds == [3, 4]


def test_three_conversations_at_once_match_each_alone(ctl, backend):
    prompts = [P1, P2, P3]
    alone = [run(ctl.send(ctl.new_conversation().id, p)).replies[0].text for p in prompts]
    cids = [ctl.new_conversation().id for _ in prompts]
    ctl.update_settings(cids[0], "", {**GREEDY, "max_tokens": 24})
    with StepGate(backend.llm_engine) as held:    # the first step waits until all three are sent
        turns = [ctl.send(c, p) for c, p in zip(cids, prompts)]
        held.release()
        together = [run(t).replies[0].text for t in turns]
    assert together == alone
    assert shared_step(backend.engine.step_records(), [t.request_id for t in turns]), \
        "the conversations did not share an engine batch"


def test_fields_edited_at_once_are_all_kept(ctl):
    """Each settings box saves only its own field: edits of several fields handled by several
    threads at once (the UI's quick queue) all stay; a refused value changes nothing."""
    cid = ctl.new_conversation().id
    edits = {"temperature": 0.0, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 3,
             "max_tokens": 24, "system_prompt": "ĀāĂ"}
    threads = [threading.Thread(target=ctl.update_setting, args=(cid, k, v)) for k, v in edits.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    system_prompt, sampling = ctl.settings(cid)
    untouched = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                 "reasoning_budget": None, "enable_thinking": True}
    assert {**sampling, "system_prompt": system_prompt} == {**edits, **untouched}
    with pytest.raises(ValueError, match="top_p"):
        ctl.update_setting(cid, "top_p", 0)
    assert ctl.settings(cid) == (system_prompt, sampling)


def test_stop_keeps_the_text(ctl, backend):
    """Stop while the reply runs (the engine holds its 5th step until Stop was pressed with 4
    tokens shown): the reply keeps its text, 5 tokens, saved as stopped."""
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 900})
    with StepGate(backend.llm_engine, 5) as held:
        turn = ctl.send(cid, P1)
        for t in turn.updates(interval=0.0):
            if len(t.replies[0].token_ids or []) == 4:
                break
        held.wait_held()
        assert ctl.busy(cid) and ctl.stop(cid)
    assert turn.wait(30)
    msg = ctl.store.get_message(turn.replies[0].message_id)
    assert msg.status == "stopped" and msg.stats["generated_tokens"] == 5
    assert msg.content == turn.replies[0].text and msg.content
    assert "stopped" in render.chat_messages(ctl.view(cid))[-1]["content"]


def test_bad_input_is_reported_and_nothing_is_lost(ctl):
    cid = ctl.new_conversation().id
    with pytest.raises(ValueError, match="top_p"):
        ctl.update_settings(cid, "", {**GREEDY, "top_p": 0})
    assert ctl.settings(cid)[1]["top_p"] == 1.0
    with pytest.raises(ValueError, match="too long for the model's context"):
        ctl.send(cid, "x" * 5000)                             # longer than the context
    assert ctl.store.active_path(cid) == []   # refused before storing: no orphan
    ctl.store.add_message(cid, None, "user", "x" * 5000)     # one left unanswered earlier
    with pytest.raises(ValueError, match="too long for the model's context"):
        ctl.send(cid, "")                 # empty text retries the unanswered message
    with pytest.raises(ChatError):
        ctl.send(ctl.new_conversation().id, "   ")
    assert not ctl.busy(cid)


def test_branches_share_kv_blocks_in_the_engine_panel(ctl):
    cid = ctl.new_conversation().id
    first = run(ctl.send(cid, P1 + P2)).replies[0].message_id
    run(ctl.regenerate(first))
    snap = kvmap.KvMap(ctl).collect([cid])
    assert len(snap.rows) == 2 and snap.available
    shared = set(snap.rows[0].blocks) & set(snap.rows[1].blocks)
    assert len(shared) >= 4                                  # the ~80-token prompt
    assert all(snap.sharing()[b] == 2 for b in shared)
    page = kvmap.render_panel(snap)
    assert f'data-shared="{len(shared)}"' in page and "Prefix hits" in page
    assert f"Kernels: {snap.stats.kernels} · weights: float32 100%" in page   # what serves the model


def test_kv_map_tokenizes_a_branch_only_when_it_changes(ctl, backend, monkeypatch):
    """The engine panel ticks every second: unchanged branches keep their token ids, a new
    branch or a new system prompt is tokenized again; blocks match an uncached lookup."""
    cid = ctl.new_conversation().id
    first = run(ctl.send(cid, P1)).replies[0].message_id
    calls = []
    real = backend.prompt_ids
    monkeypatch.setattr(backend, "prompt_ids", lambda msgs: calls.append(msgs) or real(msgs))
    kv = kvmap.KvMap(ctl)

    def blocks_uncached() -> list[list[int]]:
        _, branches = ctl.branches(cid)
        return [real_blocks(ctl.prompt_messages(cid, b.leaf_id)) for b in branches]

    def real_blocks(msgs):
        return backend.cached_blocks(real(msgs))

    def tick() -> tuple[int, kvmap.KvSnapshot]:
        """(tokenizer calls the tick made, its snapshot)"""
        before = len(calls)
        snap = kv.collect([cid])
        return len(calls) - before, snap

    n1, tick1 = tick()
    n2, tick2 = tick()
    assert (n1, n2) == (1, 0)                                # nothing changed: no tokenizer
    assert [r.blocks for r in tick2.rows] == [r.blocks for r in tick1.rows] == blocks_uncached()
    run(ctl.regenerate(first))
    n3, tick3 = tick()
    assert n3 == 1 and len(tick3.rows) == 2                  # only the new branch
    assert [r.blocks for r in tick3.rows] == blocks_uncached()
    ctl.update_settings(cid, "ĀĂĄ", GREEDY)                  # every branch's prompt changed
    assert [tick()[0], tick()[0]] == [2, 0]


def test_html_and_script_are_shown_as_text(ctl):
    cid = ctl.new_conversation("<img src=x onerror=alert(1)>").id
    evil = "<script>alert('x')</script> **bold** `<b>code</b>`\n```html\n<i>raw</i>\n```\n&amp;"
    ctl.store.add_message(cid, None, "user", evil)
    content = render.chat_messages(ctl.view(cid))[0]["content"]
    assert "<script>" not in content and "&lt;script&gt;alert('x')&lt;/script&gt;" in content
    assert "<code>&lt;b&gt;code&lt;/b&gt;</code>" in content and "<strong>bold</strong>" in content
    assert '<code class="language-html">' in content and "<i" not in content
    assert "\n<i>raw</i>\n" in html.unescape(re.sub(r"<[^>]+>", "", content))   # code, verbatim
    assert content.count("<p>") == 2 and "<p>&amp;</p>" in content      # the entity, as text
    panel = kvmap.render_panel(kvmap.KvMap(ctl).collect([cid]))
    assert "<img" not in panel and "&lt;img src=x" in panel


def test_fork_rename_delete_search(ctl):
    cid = ctl.new_conversation().id
    run(ctl.send(cid, P1))
    reply = ctl.store.active_path(cid)[1]
    fork = ctl.fork(reply.id)
    assert [m.content for m in ctl.store.active_path(fork.id)] == [P1, reply.content]
    assert fork.title.startswith("⎇ ")
    ctl.rename(cid, "Trip notes")
    assert [c.id for c in ctl.search("trip")] == [cid]
    assert fork.id in [c.id for c in ctl.search(P1[:6])]     # message content matches too
    with pytest.raises(ChatError):
        ctl.rename(cid, "  ")
    assert ctl.delete(cid) and cid not in [c.id for c in ctl.search()]
    assert "# " in ctl.export(fork.id) and '"messages"' in ctl.export(fork.id, "json")


def test_open_tabs_survive_a_restart(ctl, backend, tmp_path):
    a, b = ctl.new_conversation().id, ctl.new_conversation().id
    ctl.save_open_tabs([a, b, 999])
    again = ChatController(ctl.store, lambda: backend, GREEDY, tmp_path / "ui_state.json")
    assert again.open_tabs() == [a, b]


def test_no_model_yet_and_a_missing_model_keeps_the_current(backend):
    mm = ModelManager(local_factory(num_kv_blocks=64), backend=backend)
    job = mm.load("/no/such/model")
    assert job.done.wait(30)
    assert job.phase == "failed" and "ModelNotFoundError" in job.error
    assert mm.backend is backend and "Still using" in mm.status()
    assert issubclass(ModelNotFoundError, FileNotFoundError)


def test_no_model_loaded_yet(tmp_path):
    store = Store(tmp_path / "c.db")
    ctl = ChatController(store, lambda: None)
    cid = ctl.new_conversation().id
    with pytest.raises(ChatError, match="no model"):
        ctl.send(cid, "hello")
    assert [m.content for m in store.active_path(cid)] == ["hello"]   # kept for later
    store.close()


def test_model_swap_stops_running_replies_and_keeps_them(tiny_root, tmp_path):
    """The swap happens while a reply runs on the old model (its engine holds the reply's second
    step until the new model is in): the reply is stopped there and keeps its two tokens."""
    path = build("llama-gqa", tiny_root)
    llm = LLM(path, num_kv_blocks=128)
    llm.tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    first = TinyBackend(llm.engine)
    mm = ModelManager(local_factory(num_kv_blocks=128), backend=first)
    store = Store(tmp_path / "c.db")
    ctl = ChatController(store, lambda: mm.backend, {**GREEDY, "max_tokens": 900})
    mm.on_swap = ctl.stop_all
    cid = ctl.new_conversation().id
    with StepGate(llm.engine, 2) as held:
        turn = ctl.send(cid, P1)
        held.wait_held()
        job = mm.load(path)
        assert mm.load("another") is job                     # one load at a time
        assert job.done.wait(60) and job.error is None and mm.backend is not first
        assert mm.job.phase == "ready" and "Loaded" in mm.status()
    assert turn.wait(30)
    msg = store.get_message(turn.replies[0].message_id)
    assert msg.status == "stopped" and msg.stats["generated_tokens"] == 2 and msg.content
    run(ctl.send(cid, P2))                                   # the new model answers
    assert first.engine._stopped.wait(30)                    # the old engine is shut down
    mm.backend.engine.shutdown()
    store.close()


def test_model_picker_quantization_and_the_header_format(tiny_root):
    """A load uses the chosen weight format (the factory's default, i.e. the CLI flag, when none
    is chosen); the header shows the engine's own stats: format and megabytes."""
    from localpaged.ui.models.view import header
    path = build("llama-gqa", tiny_root)
    mm = ModelManager(local_factory(num_kv_blocks=32, quantization="int8"))
    assert mm.quantization == "int8" and mm.weights_format == ""
    with pytest.raises(ValueError, match="quantization must be one of 'auto', 'none', 'int8', "
                                         "'int4', got 'int3'"):
        mm.load(path, "int3")
    sizes = {}
    for choice, fmt in ((None, "int8 ·"), ("int4", "int4 g32 ·"), ("none", "float32 ·")):
        job = mm.load(path, choice)
        assert job.done.wait(60) and job.error is None, job.error
        stats = mm.backend.stats()
        assert stats.weights_format.startswith(fmt)
        mb = stats.weights_bytes / 1e6
        assert f"{mb:.2g} MB" in stats.weights_format             # tiny: under 10 MB
        assert f"<code>{path}</code> · <span class='lp-weights'>{stats.weights_format}" \
            in header(mm)
        sizes[fmt] = stats.weights_bytes
    # packed weights take less memory (a float32 weight is 4 bytes, int8 1, int4 1/2 + scales)
    assert sizes["int4 g32 ·"] < sizes["int8 ·"] < sizes["float32 ·"]
    mm.backend.engine.shutdown()


def test_event_handlers_open_close_restore_and_send(ctl):
    """The Gradio adapters (ui/tabs/events.py, ui/chat/events.py): which tab shows what, and a
    streamed send."""
    from localpaged.ui.chat.events import ChatEvents
    from localpaged.ui.settings.logic import SAMPLING_KEYS
    from localpaged.ui.tabs.events import TabSet
    from localpaged.ui.tabs.view import N_SLOTS
    from localpaged.ui.values import KEEP
    tabs = TabSet(ctl)
    ev = ChatEvents(ctl, tabs)
    out = tabs.restore()
    assert len(out.chat) == N_SLOTS and all(t.chatbot is not KEEP for t in out.chat)
    slots = out.slots
    assert slots[0] is not None and slots[1:] == [None] * (N_SLOTS - 1)
    other = ctl.new_conversation().id
    opened = tabs.open(slots, 0, other)
    slots, current = opened.slots, opened.current
    assert slots[1] == other and current == 1
    again = tabs.open(slots, 0, other)                        # already open: just shown
    assert [again.slots, again.current] == [slots, 1]
    assert all(t.chatbot is KEEP for t in again.chat)
    assert ctl.open_tabs() == [slots[0], other]
    slots = tabs.close(slots, 1).slots
    assert slots[1] is None and ctl.open_tabs() == [slots[0]]
    steps = list(ev.send(slots, 0, P1, "", *[GREEDY[k] for k in SAMPLING_KEYS]))
    assert steps[0].msg == "" and steps[0].chatbot[0]["role"] == "user"
    last = steps[-1]
    assert [m["role"] for m in last.chatbot] == ["user", "assistant"] and last.sel == 1
    assert "24 tokens" in last.chatbot[1]["content"] and "Reply 2 of 2" in last.sel_md
    assert ev.chat(slots[0], 0).sel_md.startswith("Your message 1 of 2")


def test_download_is_skipped_offline(monkeypatch):
    from huggingface_hub import constants

    from localpaged.ui.models import logic as models
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    seen = []
    models._download("owner/name", lambda phase, detail: seen.append(phase))
    assert seen == []
    assert models._looks_like_hub_id("owner/name") and not models._looks_like_hub_id("/abs/path")


def test_compare_handler_with_own_settings_per_column(ctl):
    """ui/compare/events.py's run handler: each column decodes with its own fields; the streamed
    CompareValues end with each column's text, equal to the same prompt answered alone."""
    from localpaged.ui.compare.events import CompareEvents
    from localpaged.ui.compare.logic import MAX_COLUMNS
    from localpaged.ui.compare.view import NEW_CONVERSATION
    from localpaged.ui.settings.logic import SAMPLING_KEYS
    alone = run(ctl.send(ctl.new_conversation().id, P1)).replies[0].text
    short = {**GREEDY, "max_tokens": 5}
    per_column = [tuple(GREEDY[k] for k in SAMPLING_KEYS), tuple(short[k] for k in SAMPLING_KEYS)]
    per_column += [per_column[0]] * (MAX_COLUMNS - 2)
    steps = list(CompareEvents(ctl).run(NEW_CONVERSATION, P1, 2, True, per_column))
    last = steps[-1]
    assert last.prompt == "" and len(last.outs) == len(last.picks) == MAX_COLUMNS
    assert last.outs[0] == markdown.render(alone) and last.outs[2:] == [""] * (MAX_COLUMNS - 2)
    replies = [ctl.message(m) for m in last.state["messages"]]
    assert [r.stats["generated_tokens"] for r in replies] == [24, 5]
    assert [r.sampling["max_tokens"] for r in replies] == [24, 5]


def test_export_writes_markdown_and_the_whole_tree(ctl):
    import json

    from localpaged.ui.export.events import export_files
    cid = ctl.new_conversation("Ŀŀ notes").id
    first = run(ctl.send(cid, P1)).replies[0].message_id
    run(ctl.regenerate(first))
    md, js = export_files(ctl, cid)
    assert md.suffix == ".md" and js.suffix == ".json"
    tree = json.loads(js.read_text(encoding="utf-8"))
    assert tree == ctl.store.export_json(cid) and len(tree["messages"]) == 3    # both replies
    shown = ctl.view(cid).path
    assert md.read_text(encoding="utf-8").startswith("# ") and shown[-1].content in md.read_text(
        encoding="utf-8")
