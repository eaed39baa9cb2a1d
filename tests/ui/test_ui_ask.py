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
    ev = ChatEvents(ctl, TabSet(ctl))
    cid = ctl.new_conversation().id
    ctl.set_context_policy(cid, "error")
    slots = [cid, None, None, None]
    fields = [GREEDY[k] for k in SAMPLING_KEYS]
    word, _ = fill_until_it_asks(ctl, cid)
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
