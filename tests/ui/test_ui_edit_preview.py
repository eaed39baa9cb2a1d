"""The cost preview on Edit: before an edited message is saved, the controller
says how many prompt tokens the new branch reuses from the prefix cache and how many it must
prefill; after saving, the engine's own report for that request (num_cached_tokens, stored as
prefix_tokens_reused) and its prompt length must be exactly those numbers. The cache holds a
prompt that ran as far as its blocks were filled: whole blocks, and the start of the block where
the edited prompt parts from it (copied)."""

from __future__ import annotations

import pytest

from localpaged.ui.controller import ChatController
from localpaged.ui.edit_preview import events as edit_preview
from localpaged.ui.store import Store

from helpers.tiny_chat import GREEDY, P1, P2, controller, engine_backend, run



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
    # Independently: the longest prefix shared with a prompt run before (each was followed by
    # its reply, so the block where they part was filled); the last prompt token is computed.
    common = max(_common_prefix(new, o) for o in old)
    assert reused == min(common, len(new) - 1) > 0
    assert edit_preview.cost_text(1184, prefill) == (
        f"Reuses 1,184 tokens from the cache, prefills {prefill}.")


def test_preview_text_and_none_for_a_reply_or_a_remote_backend(backend, tmp_path):
    """What the edit box shows, against numbers computed here: the edited prompt's tokens (the
    chat template through the tokenizer) and the prefix it shares with the prompt run before
    (the last token is always computed); the engine's cached_prefix_tokens agrees.
    Nothing is shown for a reply, a blank edit, or over a remote backend (any backend that is
    not the in-process engine), and the same message shows its preview again with the engine."""
    class Remote:
        model_name, supports_kv_stats = "remote", False

    store = Store(tmp_path / "conversations.db")
    current = [backend]
    ctl = ChatController(store, lambda: current[0], GREEDY, tmp_path / "ui_state.json")
    try:
        cid = ctl.new_conversation().id
        system = "Ş" * 40                                          # a system prompt to reuse
        ctl.update_settings(cid, system, ctl.settings(cid)[1])
        run(ctl.send(cid, P1))
        user, reply = store.active_path(cid)
        ran = backend.prompt_ids(ctl.prompt_messages(cid, user.id))
        edited = backend.engine.tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": P2}],
            add_generation_prompt=True, tokenize=True, return_dict=False)
        reused = min(_common_prefix(edited, ran), len(edited) - 1)
        assert reused > 0 and backend.engine.cached_prefix_tokens(edited) == reused
        want = f"Reuses {reused:,} tokens from the cache, prefills {len(edited) - reused:,}."
        assert edit_preview.preview(ctl, cid, 0, P2) == want
        assert ctl.edit_cost(reply.id, "x") is None               # only user messages are edited
        assert edit_preview.preview(ctl, cid, 1, P2) == ""
        assert edit_preview.preview(ctl, cid, 0, "  ") == ""
        current[0] = Remote()
        assert ctl.edit_cost(user.id, P2) is None
        assert edit_preview.preview(ctl, cid, 0, P2) == ""
        current[0] = backend
        assert edit_preview.preview(ctl, cid, 0, P2) == want
    finally:
        ctl.stop_all(wait=10)
        store.close()
    assert edit_preview.cost_text(None, None) == ""


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
