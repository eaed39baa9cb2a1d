""""Stop and ask me" asks: under context policy "error", a send that no longer fits raises
ContextAsk (how many of the oldest messages dropping would leave out) and the tab's handler
opens its dialog instead of a toast; each choice does what it says. "Drop the oldest": the
request goes out without the oldest turns (the messages the recording backend was handed,
checked against the tokenizer's own chat template) and the conversation keeps its policy;
"edit" and "cancel" send nothing and lose nothing (the text stays in the box, the store is as
it was). Without a browser: ui/chat/events.py's ChatEvents over the tiny model."""

from __future__ import annotations

import threading

import pytest
from helpers.step_gate import StepGate
from test_ui_context import WORDS, _tiny
from helpers.ui_helpers import controller, recording_backend, run

from localpaged.ui.chat.events import ChatEvents
from localpaged.ui.context.logic import ContextAsk, ContextError
from localpaged.ui.settings.logic import SAMPLING_KEYS
from localpaged.ui.tabs.events import TabSet
from localpaged.ui.values import KEEP

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 8}
MAX_POS = 160           # the context limit comes from the model's window


@pytest.fixture(scope="module")
def backend(tiny_root):
    yield from recording_backend(_tiny(tiny_root, MAX_POS), num_kv_blocks=64)


@pytest.fixture
def ctl(backend, tmp_path):
    yield from controller(backend, tmp_path, GREEDY)


def fill_until_it_asks(ctl, cid) -> tuple[str, ContextAsk]:
    """Send words until one no longer fits: that word and the ContextAsk it raised."""
    for word in WORDS:
        try:
            run(ctl.send(cid, word))
        except ContextAsk as exc:
            return word, exc
    raise AssertionError("the conversation never outgrew the context")


def asking_tab(ctl) -> tuple[ChatEvents, int, list, list, str]:
    """Tab 0's handlers on a conversation under "Stop and ask me" filled until a word no
    longer fits: (events, its id, the slots, the greedy sampling fields, that word)."""
    cid = ctl.new_conversation().id
    ctl.set_context_policy(cid, "error")
    word, _ = fill_until_it_asks(ctl, cid)
    return (ChatEvents(ctl, TabSet(ctl)), cid, [cid, None, None, None],
            [GREEDY[k] for k in SAMPLING_KEYS], word)


def template_len(backend, messages) -> int:
    return len(backend.engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_the_controller_says_how_many_would_be_dropped(ctl, backend):
    cid = ctl.new_conversation().id
    ctl.set_context_policy(cid, "error")
    word, asked = fill_until_it_asks(ctl, cid)
    assert asked.dropped > 0 and asked.dropped % 2 == 0          # whole turns
    rows = ctl.store.messages(cid)
    backend.sent.clear()
    turn = run(ctl.send(cid, word, policy="drop_oldest"))       # the dialog's first choice
    messages, _ = backend.sent[-1]
    path = [{"role": m.role, "content": m.content} for m in rows if m.id in
            {p.id for p in ctl.store.path_to(rows[-1].id)}]
    assert messages == path[asked.dropped:] + [{"role": "user", "content": word}]
    limit, reserve = backend.engine.context_limit(), min(GREEDY["max_tokens"], MAX_POS // 4)
    assert template_len(backend, messages) + reserve <= limit
    assert template_len(backend, path[asked.dropped - 2:] + messages[-1:]) + reserve > limit
    reply = ctl.store.get_message(turn.replies[0].message_id)
    assert reply.stats["context_dropped"] == asked.dropped
    assert ctl.conversation(cid).context_policy == "error"      # one request, not the setting


def test_a_message_too_long_even_alone_is_refused_not_asked(ctl):
    cid = ctl.new_conversation().id
    ctl.set_context_policy(cid, "error")
    run(ctl.send(cid, WORDS[0]))
    with pytest.raises(ContextError) as info:
        ctl.send(cid, "".join(WORDS[1:9]))
    assert not isinstance(info.value, ContextAsk)


def test_the_dialog_and_each_choice(ctl, backend):
    ev, cid, slots, fields, word = asking_tab(ctl)
    rows, sent = ctl.store.messages(cid), len(backend.sent)
    (asked,) = list(ev.send(slots, 0, word, "", *fields))
    assert asked.ask.visible is True and "no longer fits" in asked.ask_md
    assert "oldest message" in asked.ask_md and asked.msg is KEEP   # the text stays in the box
    assert ctl.store.messages(cid) == rows and len(backend.sent) == sent and not ctl.busy(cid)
    # Edit and Cancel only close the dialog (wired in wire_chat_tab: no handler sends).
    # Drop the oldest: sent with them left out, the box emptied, the dialog closed.
    steps = list(ev.send_dropping(slots, 0, word, "", *fields))
    assert steps[0].msg == "" and steps[0].ask.visible is False
    messages, _ = backend.sent[-1]
    assert messages[-1] == {"role": "user", "content": word} and len(messages) < len(rows) + 1
    path = ctl.store.active_path(cid)
    assert path[-2].content == word and path[-1].status == "complete"
    assert path[-1].stats["context_dropped"] > 0


def test_a_message_sent_while_a_reply_streams_waits_for_it(ctl, backend):
    """Enter during a reply: the handler waits for the reply's end, then sends (nothing is
    dropped, the first reply is not cut)."""
    ev = ChatEvents(ctl, TabSet(ctl))
    cid = ctl.new_conversation().id
    slots = [cid, None, None, None]
    fields = [GREEDY[k] for k in SAMPLING_KEYS]
    with StepGate(backend.llm_engine, step=2) as gate:           # the first reply is running
        first = ctl.send(cid, WORDS[0])
        gate.wait_held()
        threading.Timer(0.5, gate.release).start()              # ends while the send waits
        steps = list(ev.send(slots, 0, WORDS[1], "", *fields))
    assert first.done and steps[0].msg == ""
    path = ctl.store.active_path(cid)
    assert [m.content for m in path[::2]] == [WORDS[0], WORDS[1]]
    assert path[1].status == "complete" and path[1].stats["generated_tokens"] == 8
    assert path[3].status == "complete"


def test_regenerate_and_edit_ask_too(ctl, backend):
    """Regenerate and edit of a message whose prompt no longer fits open the same dialog (what
    it does in its words; no "edit my message" for a regenerate), store and send nothing, and
    its "drop the oldest" does that regenerate or edit with the oldest messages left out."""
    ev, cid, slots, fields, word = asking_tab(ctl)
    run(ctl.send(cid, word, policy="drop_oldest"))
    user, reply = ctl.store.active_path(cid)[-2:]
    with pytest.raises(ContextAsk):
        ctl.regenerate(reply.id)
    rows, sent = ctl.store.messages(cid), len(backend.sent)
    (asked,) = list(ev.regenerate(slots, 0, None, "", *fields))
    assert asked.ask.visible is True and "Regenerate with the" in asked.ask_md
    assert asked.ask_for == {"action": "regenerate", "message_id": reply.id, "text": ""}
    assert asked.ask_edit.visible is False and asked.ask_drop.value.endswith("regenerate")
    assert ctl.store.messages(cid) == rows and len(backend.sent) == sent and not ctl.busy(cid)
    steps = list(ev.ask_drop(slots, 0, asked.ask_for, "", "", "", *fields))
    assert steps[0].ask.visible is False
    new = ctl.store.active_path(cid)[-1]
    assert new.parent_id == user.id and new.id != reply.id and new.status == "complete"
    assert new.stats["context_dropped"] > 0 and ctl.conversation(cid).context_policy == "error"
    # Edit: the text goes back into the edit box; the dialog sends what that box then holds.
    edited = word[::-1]
    rows, sent = ctl.store.messages(cid), len(backend.sent)
    (asked,) = list(ev.edit(slots, 0, len(ctl.store.active_path(cid)) - 2, edited, "", *fields))
    assert asked.ask_for == {"action": "edit", "message_id": user.id, "text": edited}
    assert asked.edit_row.visible is True and asked.edit_box == edited
    assert "edited message was not sent" in asked.ask_md and asked.ask_edit.visible is False
    assert ctl.store.messages(cid) == rows and len(backend.sent) == sent
    changed = edited[:-1]
    list(ev.ask_drop(slots, 0, asked.ask_for, "", changed, "", *fields))
    path = ctl.store.active_path(cid)
    assert path[-2].content == changed and path[-2].parent_id == user.parent_id
    assert path[-1].status == "complete" and path[-1].stats["context_dropped"] > 0
    assert backend.sent[-1][0][-1] == {"role": "user", "content": changed}
