"""Conversations that never dead-end: a chat grown past the model's
context window, or past what the KV cache holds, keeps getting replies with the oldest whole
turns left out of the prompt; the marker and the dropped count are right; "stop and ask me"
refuses with a clear message and stores nothing; the store never loses a message; the gauge
counts exactly what the next request sends; prefill progress shows while a prompt is read.

Oracle: the tokenizer's own `apply_chat_template` on the messages, independent of the
ContextWindow the app uses."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from localpaged.ui import render
from localpaged.ui.context.logic import ContextError
from localpaged.ui.context.view import gauge_html

from helpers.step_gate import StepGate
from helpers.tiny_models import build
from helpers.ui_helpers import controller, run, tiny_backend

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 8}
# One token per character in U+0100..U+02FC for the tiny tokenizer (ASCII is one unknown id).
WORDS = ["".join(chr(0x100 + (7 * i + j) % 500) for j in range(22)) for i in range(40)]


def _tiny(tiny_root: str, max_pos: int) -> str:
    """The tiny llama with max_position_embeddings set to max_pos (a copy of its folder)."""
    src = Path(build("llama-gqa", tiny_root))
    dst = src.parent / f"llama-gqa-pos{max_pos}"
    if not dst.exists():
        dst.mkdir()
        for f in src.iterdir():
            (dst / f.name).write_bytes(f.read_bytes())
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": max_pos}))
    return str(dst)


# The context limit comes from the model's window in one case, from the KV cache in the other.
CASES = {"window": dict(max_pos=160, num_kv_blocks=64),
         "kvcache": dict(max_pos=1024, num_kv_blocks=9, max_num_batched_tokens=48)}


@pytest.fixture(scope="module", params=list(CASES))
def backend(request, tiny_root):
    case = dict(CASES[request.param])
    yield from tiny_backend(_tiny(tiny_root, case.pop("max_pos")), **case)


@pytest.fixture
def ctl(backend, tmp_path):
    yield from controller(backend, tmp_path, GREEDY)


def template_len(backend, messages) -> int:
    return len(backend.engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def expected_dropped(backend, messages: list[dict], limit: int, reserve: int) -> int:
    """Fewest leading whole turns (user + reply) after the system prompt to leave out."""
    head = [m for m in messages if m["role"] == "system"]
    rest = messages[len(head):]
    for k in range(0, len(rest), 2):
        if template_len(backend, head + rest[k:]) + reserve <= limit:
            return k
    raise AssertionError("nothing fits")


def test_a_long_conversation_keeps_getting_replies(ctl, backend):
    limit = backend.engine.context_limit()
    # the room kept for the reply, by its rule (max_tokens, at most a quarter of the context),
    # computed here rather than by the code under test
    reserve = max(1, min(GREEDY["max_tokens"], limit // 4))
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "ɐɑɒ", GREEDY)
    sent, dropped_seen = [], []
    for i in range(10):
        before = [{"role": "system", "content": "ɐɑɒ"}] + [
            {"role": m.role, "content": m.content} for m in ctl.store.active_path(cid)]
        before.append({"role": "user", "content": WORDS[i]})
        want = expected_dropped(backend, before, limit, reserve)
        turn = run(ctl.send(cid, WORDS[i]))
        sent.append(WORDS[i])
        reply = ctl.store.get_message(turn.replies[0].message_id)
        assert reply.stats["generated_tokens"] >= 1 and reply.status == "complete"
        assert reply.stats.get("context_dropped", 0) == want
        # What the engine was sent is exactly the kept messages (head + path[want:]).
        kept = before[:1] + before[1 + want:]
        assert reply.stats["prompt_tokens"] == template_len(backend, kept)
        assert reply.stats["prompt_tokens"] + reserve <= limit
        dropped_seen.append(want)
    assert dropped_seen[0] == 0 and dropped_seen[-1] > 0       # grew past the limit
    # Nothing lost from the store: every message, in order, on the shown path.
    path = ctl.store.active_path(cid)
    assert [m.content for m in path if m.role == "user"] == sent
    assert len(path) == 20 and all(m.status == "complete" for m in path)
    # The marker sits on the first message the last reply's prompt kept.
    shown = render.chat_messages(ctl.view(cid))
    k = dropped_seen[-1]
    assert f"{k} earlier messages are not in the model's context" in shown[k]["content"]
    assert sum("not in the model's context" in m["content"] for m in shown) == 1
    # The gauge counts exactly what the next request would send (the whole path + the draft).
    usage = ctl.context_usage(cid, WORDS[11])
    full = before[:1] + [{"role": m.role, "content": m.content} for m in path]
    assert usage.tokens == template_len(backend, full + [{"role": "user", "content": WORDS[11]}])
    assert usage.limit == limit and usage.over and usage.dropped > 0
    assert "lp-gauge-over" in gauge_html(usage) and f"{usage.tokens:,} / {limit:,}" in \
        gauge_html(usage)


def test_stop_and_ask_me_stores_nothing_then_drop_goes_on(ctl, backend):
    cid = ctl.new_conversation().id
    assert ctl.context_usage(cid).tokens == 0                # a new chat: an empty gauge
    ctl.update_settings(cid, "", GREEDY)
    ctl.set_context_policy(cid, "error")
    with pytest.raises(ValueError, match="context_policy must be one of"):
        ctl.set_context_policy(cid, "truncate")
    refused = None
    for word in WORDS[:12]:
        rows = ctl.store.messages(cid)
        try:
            run(ctl.send(cid, word))
        except ContextError as exc:
            refused = str(exc)
            assert ctl.store.messages(cid) == rows          # no orphan message, nothing changed
            assert not ctl.busy(cid)
            break
    assert refused and "no longer fits" in refused and "not sent" in refused
    assert "Drop the oldest messages" in refused
    usage = ctl.context_usage(cid, word)
    assert usage.over and "sending will ask you first" in gauge_html(usage)
    ctl.set_context_policy(cid, "drop_oldest")
    turn = run(ctl.send(cid, word))
    reply = ctl.store.get_message(turn.replies[0].message_id)
    assert reply.stats["context_dropped"] > 0 and reply.stats["generated_tokens"] >= 1


def test_system_prompt_longer_than_the_context(ctl, backend):
    cid = ctl.new_conversation().id
    limit = backend.engine.context_limit()
    ctl.update_settings(cid, WORDS[0] * (limit // 20), GREEDY)
    for policy in ("drop_oldest", "error"):
        ctl.set_context_policy(cid, policy)
        with pytest.raises(ContextError, match="system prompt is too long"):
            ctl.send(cid, WORDS[1])
        assert ctl.store.messages(cid) == []
    ctl.update_settings(cid, "ɐ", GREEDY)                   # shortened: the chat goes on
    run(ctl.send(cid, WORDS[1]))


def test_a_reply_stopped_for_memory_is_marked_and_the_next_gets_replies(ctl, backend):
    """The issue's dead end: a reply that filled the context, then more messages."""
    limit = backend.engine.context_limit()
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 4 * limit})
    long = ctl.store.get_message(run(ctl.send(cid, WORDS[0])).replies[0].message_id)
    assert long.stats["finish_detail"] in ("kv_cache_full", "max_model_len")
    assert long.stats["prompt_tokens"] + long.stats["generated_tokens"] >= limit - 1
    assert "■ stopped: the" in render.footer(long, (1, 1))
    with pytest.raises(ContextError, match="cannot be continued"):       # nothing to leave out
        ctl.continue_reply(long.id)
    for word in WORDS[1:4]:
        reply = ctl.store.get_message(run(ctl.send(cid, word)).replies[0].message_id)
        assert reply.stats["generated_tokens"] >= 1 and reply.stats.get("context_dropped")
    assert len(ctl.store.active_path(cid)) == 8


@pytest.mark.parametrize("backend", ["kvcache"], indirect=True)    # the case that prefills in chunks
def test_prefill_progress_while_a_long_prompt_is_read(ctl, backend):
    assert backend.engine.info.max_num_batched_tokens < len(WORDS[0] * 3)
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "", GREEDY)
    # The second forward waits until the turn has read the first chunk's progress: a reader that
    # falls behind (a loaded machine) gets the chunks' outputs merged with the first token's.
    engine = backend.llm_engine
    with StepGate(engine, 2, module=engine.model.model.embed_tokens) as gate:
        turn = ctl.send(cid, WORDS[0] * 3)
        gate.wait_held()
        deadline = time.monotonic() + 30
        while turn.replies[0].progress is None and time.monotonic() < deadline:
            time.sleep(0.01)
    reply = run(turn).replies[0]
    done, total = reply.progress
    assert 0 < done < total == reply.stats["prompt_tokens"]
    assert render.prefill_note(1200, 3400) == "*reading the conversation: 1,200 / 3,400 tokens…*"

