"""The cost preview on Edit (issue 10 item 4): before an edited message is saved, the controller
says how many prompt tokens the new branch reuses from the prefix cache and how many it must
prefill; after saving, the engine's own report for that request (num_cached_tokens, stored as
prefix_tokens_reused) and its prompt length must be exactly those numbers."""

from __future__ import annotations

import pytest

from localpaged.ui.edit_preview import events as edit_preview

from tiny_chat import P1, P2, controller, engine_backend, run


@pytest.fixture(scope="module")
def backend(tiny_root):
    with engine_backend(tiny_root) as b:
        yield b


@pytest.mark.parametrize("edit_at", ["second message", "first message"])
def test_edit_preview_equals_the_engine_prefix_hit(backend, tmp_path, edit_at):
    with controller(backend, tmp_path) as ctl:
        cid = ctl.new_conversation().id
        ctl.update_settings(cid, "Ş" * 40, ctl.settings(cid)[1])   # a system prompt to reuse
        run(ctl.send(cid, P1))
        run(ctl.send(cid, P2))
        path = ctl.store.active_path(cid)
        target = path[2] if edit_at == "second message" else path[0]
        text = target.content[:-5] + "ȌȍȎȏ"
        reused, prefill = ctl.edit_cost(target.id, text)
        reply = ctl.store.get_message(run(ctl.edit(target.id, text)).replies[0].message_id)
        old = [backend.prompt_ids(ctl.prompt_messages(cid, m.id)) for m in (path[0], path[2])]
        new = backend.prompt_ids(ctl.prompt_messages(cid, reply.parent_id))
    assert reused == reply.stats["prefix_tokens_reused"]           # what the engine reported
    assert reused + prefill == reply.stats["prompt_tokens"] == len(new)
    # Independently: the full blocks of the longest prefix shared with a prompt run before
    # (the last prompt token is always computed).
    common = max(_common_prefix(new, o) for o in old)
    assert reused == min(common, len(new) - 1) // 16 * 16 > 0
    assert edit_preview.cost_text(1184, prefill) == (
        f"Reuses 1,184 tokens from the cache, prefills {prefill}.")


def test_no_preview_for_a_reply_or_a_remote_backend(backend, tmp_path):
    with controller(backend, tmp_path) as ctl:
        cid = ctl.new_conversation().id
        reply = run(ctl.send(cid, P1)).replies[0].message_id
        assert ctl.edit_cost(reply, "x") is None               # only user messages are edited
        shown = edit_preview.preview(ctl, cid, 0, P2)            # what the edit box shows
        assert shown == edit_preview.cost_text(*ctl.edit_cost(ctl.message_at(cid, 0).id, P2))
        assert edit_preview.preview(ctl, cid, 0, "  ") == ""
    assert edit_preview.cost_text(None, None) == ""


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
