"""The sidebar's organisation and branch deletion without a browser (ui/sidebar/logic.py,
ui/delete_branch/logic.py, through ChatController): a search hit that exists only in a sibling
branch opens that branch; deleting a branch removes only its subtree, stops the turn writing
into it and leaves the engine holding none of its blocks (EngineStats.blocks_in_use, the KV
map's rows); import from a file adds one conversation and never touches the others; pinned
first, archived hidden unless asked, tags. A tiny random model stands in for a real one."""

from __future__ import annotations

import json
import threading

import pytest
from helpers.step_gate import StepGate
from helpers.store_versions import check_active_invariant
from helpers.tiny_models import build
from helpers.ui_helpers import controller, run, tiny_backend

from localpaged.ui import engine_panel as kvmap
from localpaged.ui.sidebar.logic import MAX_IMPORT_BYTES, ImportFailed, ListQuery
from localpaged.ui.turns import ChatError

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 12}
P1, P2 = "ĀāĂăĄąĆćĈĉĊċČčĎďĐđĒēĔĕĖėĘęĚěĜĝĞğ" * 2, "ƀƁƂƃƄƅƆƇƈƉƊƋƌƍƎƏ" * 3


@pytest.fixture(scope="module")
def backend(tiny_root):
    yield from tiny_backend(build("llama-gqa", tiny_root), num_kv_blocks=256)


@pytest.fixture
def ctl(backend, tmp_path):
    yield from controller(backend, tmp_path, GREEDY)


def in_use(backend) -> int:
    return backend.stats().blocks_in_use


def test_a_word_only_in_a_sibling_branch_is_found_and_opens_that_branch(ctl):
    cid = ctl.new_conversation().id
    first = run(ctl.send(cid, P1))
    u1 = ctl.store.active_path(cid)[0]
    run(ctl.edit(u1.id, P2 + " zebracorn"))                   # a sibling user message
    u1b = ctl.store.active_path(cid)[0]
    ctl.switch(u1b.id, -1)                                    # back to the first branch
    assert [m.id for m in ctl.view(cid).path] == [u1.id, first.replies[0].message_id]
    assert "zebracorn" not in " ".join(m.content for m in ctl.view(cid).path)
    [hit] = ctl.organise.hits("zebrac")
    assert (hit.message_id, hit.conversation_id) == (u1b.id, cid)
    assert ("zebracorn", True) in hit.parts()
    assert [c.id for c in ctl.search("zebracorn")] == [cid]
    assert ctl.organise.open_hit(hit.message_id) == cid
    shown = ctl.view(cid)
    assert shown.path[0].id == u1b.id and len(shown.path) == 2   # the hit's branch, its reply
    assert shown.siblings[0] == (2, 2)


def test_deleting_a_branch_while_it_generates_frees_its_blocks(ctl, backend):
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 400})
    kept = run(ctl.send(cid, P1)).replies[0].message_id       # the branch that stays
    assert in_use(backend) == 0
    with StepGate(backend.llm_engine, 3) as held:
        turn = ctl.regenerate(kept)                           # its sibling, generating
        held.wait_held()
        doomed = turn.replies[0].message_id
        assert in_use(backend) > 0                            # the running request's table
        plan = ctl.branch_deletion.plan(doomed)
        assert plan.generating and plan.count == 1 and "stopped first" in plan.question()
        done = threading.Thread(target=ctl.branch_deletion.delete, args=(doomed,))
        done.start()
        held.release()
        done.join(30)
    assert turn.done and not ctl.busy(cid)
    assert in_use(backend) == 0                               # the engine holds nothing of it
    assert backend.stats().blocks_cached > 0                  # evictable, not lost memory
    with pytest.raises(KeyError):
        ctl.message(doomed)
    assert [m.id for m in ctl.view(cid).path][-1] == kept     # the sibling stays, active
    assert ctl.store.siblings(kept) == ([kept], 0)
    check_active_invariant(ctl.store, cid)
    snap = kvmap.KvMap(ctl).collect([cid])
    assert [r.branches for r in snap.rows] == [1]             # the KV map: one branch left


def test_deleting_a_message_removes_only_its_subtree(ctl):
    cid = ctl.new_conversation().id
    a1 = run(ctl.send(cid, P1)).replies[0].message_id
    a2 = run(ctl.send(cid, P2)).replies[0].message_id
    u1 = ctl.store.active_path(cid)[0].id
    run(ctl.edit(u1, P2))                                     # a second root, active
    other = ctl.new_conversation().id
    run(ctl.send(other, P1))
    before = ctl.store.export_json(other)
    path = ctl.store.active_path(cid)
    ctl.switch(path[0].id, -1)                                # show the first root again
    plan = ctl.branch_deletion.plan(a1)
    assert (plan.count, plan.replies, plan.generating) == (3, 2, False)
    assert "the 2 messages below it" in plan.question()
    ctl.branch_deletion.delete(a1)                            # a1, its follow-up and reply
    assert [m.id for m in ctl.store.active_path(cid)] == [u1]
    assert len(ctl.store.messages(cid)) == 3                  # u1 and the edited branch
    with pytest.raises(KeyError):
        ctl.message(a2)
    assert ctl.store.export_json(other) == before
    check_active_invariant(ctl.store, cid)
    ctl.branch_deletion.delete(u1)                            # a root: the other root shows
    assert [m.id for m in ctl.view(cid).path] == [path[0].id, path[1].id]
    check_active_invariant(ctl.store, cid)


def test_a_stop_that_does_not_end_deletes_nothing(ctl, backend):
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 400})
    with StepGate(backend.llm_engine, 2) as held:
        turn = ctl.send(cid, P1)
        held.wait_held()
        reply = turn.replies[0].message_id
        with pytest.raises(ChatError, match="nothing was deleted"):
            ctl.branch_deletion.delete(reply, wait=0.2)        # the engine is held in a step
        assert ctl.message(reply).id == reply
    assert turn.wait(30)
    assert in_use(backend) == 0


def export_all(ctl):
    return {c.id: ctl.store.export_json(c.id) for c in ctl.store.list_conversations()}


def test_import_adds_one_conversation_and_never_touches_the_others(ctl, tmp_path):
    cid = ctl.new_conversation().id
    run(ctl.send(cid, P1))
    ctl.store.set_tags(cid, ["mine"])
    good = tmp_path / "good.json"
    good.write_text(ctl.export(cid, "json"), encoding="utf-8")
    before = export_all(ctl)
    new = ctl.organise.import_file(good)
    assert new.id not in before and new.tags == ["mine"]
    after = export_all(ctl)
    assert {k: v for k, v in after.items() if k != new.id} == before
    assert [m["content"] for m in after[new.id]["messages"]] == \
        [m["content"] for m in before[cid]["messages"]]
    data = json.loads(good.read_text())
    bad_message = dict(data, messages=[dict(data["messages"][0], content={"x": 1})])
    cases = {"not.json": b"{not json", "bom-less-latin1.json": "{\"é\": 1}".encode("latin-1"),
             "nan.json": json.dumps(dict(data, conversation=dict(
                 data["conversation"], created=float("nan")))).encode(),
             "deep.json": b"[" * 100_000 + b"]" * 100_000, "list.json": b"[]",
             "field.json": json.dumps(bad_message).encode()}
    for name, raw in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(ValueError) as e:
            ctl.organise.import_file(tmp_path / name)
        assert str(e.value), name
        assert export_all(ctl) == after, name
    with pytest.raises(ImportFailed, match="could not read"):
        ctl.organise.import_file(tmp_path / "missing.json")
    with pytest.raises(ValueError, match=r"messages\[0\]\.content: expected a string"):
        ctl.organise.import_file(tmp_path / "field.json")
    assert MAX_IMPORT_BYTES >= 64_000_000                      # room for validate's caps


def test_pinned_first_archived_hidden_unless_asked_and_tags(ctl):
    a, b, c = (ctl.new_conversation(t).id for t in ("alpha", "beta", "gamma"))
    assert [x.id for x in ctl.search()] == [c, b, a]
    ctl.organise.toggle_pinned(a)
    ctl.organise.toggle_archived(b)
    assert [x.id for x in ctl.search()] == [a, c]
    assert [x.id for x in ctl.search({"text": "", "archived": True})] == [a, c, b]
    assert [x.id for x in ctl.search({"text": "bet", "archived": True})] == [b]
    ctl.organise.set_tags(c, "work, later")
    ctl.organise.set_tags(b, "work")
    assert ctl.organise.tags() == ["later", "work"]
    assert [x.id for x in ctl.search({"tag": "work"})] == [c]
    assert [x.id for x in ctl.search({"tag": "work", "archived": True})] == [c, b]
    ctl.organise.toggle_archived(b)
    ctl.organise.toggle_pinned(a)
    assert [x.id for x in ctl.search()] == [c, b, a]
    assert ListQuery.of({"text": 3, "archived": "yes", "tag": ""}) == ListQuery()
    assert ListQuery.of(" q ") == ListQuery("q")
    ctl.save_open_tabs([b])
    ctl.organise.toggle_archived(b)
    assert ctl.open_tabs() == [b]                              # an open tab stays open


class _Page:
    """What SidebarEvents reads of the page: its tab set."""

    def __init__(self, ctl) -> None:
        from localpaged.ui.tabs.events import TabSet
        self.tabs = TabSet(ctl)


def test_the_sidebar_and_delete_handlers(ctl, tmp_path):
    """sidebar/events.py and delete_branch/events.py as Gradio calls them (no browser)."""
    from localpaged.ui.delete_branch.events import DeleteBranchEvents
    from localpaged.ui.sidebar.events import SidebarEvents
    from localpaged.ui.sidebar.view import ALL_TAGS, hit_label

    ev, slots = SidebarEvents(ctl, _Page(ctl)), [None] * 4
    path = tmp_path / "in.json"
    src = ctl.new_conversation("source").id
    ctl.store.add_message(src, None, "user", 'ask <b onmouseover="x()">bold</b> quokka')
    path.write_text(ctl.export(src, "json"))
    opened = ev.import_file(slots, 0, str(path))
    cid = opened.slots[opened.current]
    assert cid != src and ctl.conversation(cid).title == "source"
    (tmp_path / "bad.json").write_text("{")
    refused = ev.import_file(opened.slots, opened.current, str(tmp_path / "bad.json"))
    assert refused.slots == opened.slots and len(ctl.search()) == 2

    query, hits = ev.query("quokka", False, ALL_TAGS)
    assert query == {"text": "quokka", "archived": False, "tag": None}
    found = ctl.organise.hits(query)
    assert len(found) == 2 and '<b onmouseover="x()">bold</b> «quokka»' in hit_label(found[0])
    assert [value for _, value in hits.choices] == [h.message_id for h in found]
    assert "2 messages" in hits.label
    mid = next(h.message_id for h in found if h.conversation_id == cid)
    shown = ev.open_hit(opened.slots, opened.current, mid)
    assert shown.slots[shown.current] == cid
    assert ev.open_hit(opened.slots, 0, 10**9).slots == opened.slots     # gone: a toast

    d = DeleteBranchEvents(ctl)
    i = shown.slots.index(cid)
    group, question, pending = d.ask(shown.slots, i, None)
    assert pending == mid and "Delete this message?" in question
    assert ctl.message(mid).id == mid                               # asking deletes nothing
    d.delete(shown.slots, i, pending)
    assert ctl.store.messages(cid) == [] and len(ctl.store.messages(src)) == 1
