"""Continue in the chat app: a reply that stopped before its natural end is
marked with the reason and extended in place from its stored token ids. Greedy "stop after k
tokens, then Continue" equals one uninterrupted reply token for token, with the prompt's and the
reply's full blocks found in the prefix cache (prefill skipped). Oracle: the uninterrupted
greedy reply of the same engine, and the tokenizer's decode."""

from __future__ import annotations

import pytest

from localpaged.ui import render
from localpaged.ui.context.logic import ContextError
from localpaged.ui.controller import ChatError

from helpers.step_gate import StepGate
from helpers.tiny_models import build
from helpers.ui_helpers import controller, run, tiny_backend

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 40}
PROMPT = "ĀāĂăĄąĆćĈĉĊċČčĎďĐđĒēĔĕĖėĘęĚěĜĝĞğ" * 2


@pytest.fixture(scope="module")
def backend(tiny_root):
    yield from tiny_backend(build("llama-gqa", tiny_root), num_kv_blocks=128)


@pytest.fixture
def ctl(backend, tmp_path):
    yield from controller(backend, tmp_path, GREEDY)


@pytest.fixture(scope="module")
def short_backend(tiny_root):
    """The same model capped at 320 tokens of context (as --max-model-len does)."""
    yield from tiny_backend(build("llama-gqa", tiny_root), num_kv_blocks=128, max_model_len=320)


@pytest.fixture
def short_ctl(short_backend, tmp_path):
    yield from controller(short_backend, tmp_path, GREEDY)


def reply_of(ctl, turn):
    return ctl.store.get_message(turn.replies[0].message_id)


def test_length_stop_then_continue_equals_one_uninterrupted_reply(ctl, backend):
    cid = ctl.new_conversation().id
    whole = reply_of(ctl, run(ctl.send(cid, PROMPT)))
    assert len(whole.token_ids) == 40 and whole.stats["finish_detail"] == "max_tokens"
    k = 21
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": k})
    cut = reply_of(ctl, run(ctl.regenerate(whole.id)))        # a sibling, stopped at k tokens
    assert cut.token_ids == whole.token_ids[:k]
    assert "■ stopped: the reply reached its token limit" in render.footer(cut, (2, 2))
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 40 - k})
    turn = run(ctl.continue_reply(cut.id))
    done = reply_of(ctl, turn)
    assert done.id == cut.id and done.token_ids == whole.token_ids     # token-exact, in place
    assert done.content == backend.decode(whole.token_ids)
    # The prompt and the first k reply tokens came from the prefix cache but the last: full
    # blocks, then the start of the block the whole reply filled (a private copy).
    prompt_len = cut.stats["prompt_tokens"]
    assert done.stats["prefix_tokens_reused"] == prompt_len + k - 1
    assert done.stats["generated_tokens"] == 40
    assert f"prefill skipped: {done.stats['prefix_tokens_reused']} tokens" in \
        render.footer(done, (2, 2))
    assert len(ctl.store.messages(cid)) == 3                 # no new message: the same reply
    copy = ctl.store.active_path(ctl.fork(done.id).id)[-1]   # a fork keeps the token ids
    assert copy.token_ids == done.token_ids


STOP_AFTER = 3


def test_stop_mid_reply_then_continue(ctl, backend):
    """Stop lands mid-reply by construction: the engine holds the step that samples token
    STOP_AFTER + 1 until Stop was pressed with STOP_AFTER tokens shown; that step's token is the
    last one. Continue then yields the uninterrupted reply."""
    cid = ctl.new_conversation().id
    whole = reply_of(ctl, run(ctl.send(cid, PROMPT[::-1])))
    assert len(whole.token_ids) == 40
    with StepGate(backend.llm_engine, STOP_AFTER + 1) as held:
        turn = ctl.regenerate(whole.id)
        for t in turn.updates(interval=0.0):
            if len(t.replies[0].token_ids or []) == STOP_AFTER:
                held.wait_held()
                assert ctl.stop(cid)
                break
    run(turn)
    cut = reply_of(ctl, turn)
    assert cut.status == "stopped" and cut.token_ids == whole.token_ids[:STOP_AFTER + 1]
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 40 - len(cut.token_ids)})
    done = reply_of(ctl, run(ctl.continue_reply(cut.id)))
    assert done.token_ids == whole.token_ids and done.status == "complete"


def test_what_cannot_be_continued(ctl):
    cid = ctl.new_conversation().id
    reply = reply_of(ctl, run(ctl.send(cid, PROMPT)))
    user = ctl.store.get_message(reply.parent_id)
    with pytest.raises(ChatError, match="only a reply"):
        ctl.continue_reply(user.id)
    ctl.store.update_message(reply.id, stats={"finish_detail": "eos"})
    with pytest.raises(ChatError, match="ended naturally"):
        ctl.continue_reply(reply.id)
    ctl.store.update_message(reply.id, stats={"finish_detail": "max_tokens"})
    later = ctl.store.add_message(cid, reply.id, "user", "and then?")
    with pytest.raises(ChatError, match="messages after it"):
        ctl.continue_reply(reply.id)
    ctl.store.delete_message(later.id)
    old = ctl.store.add_message(cid, user.id, "assistant", "from an older version",
                                status="stopped")                   # no token ids stored
    with pytest.raises(ValueError, match="no stored tokens"):
        ctl.continue_reply(old.id)


def test_continue_a_reply_that_filled_the_context(short_ctl, short_backend):
    """Continue leaves out older turns (drop_oldest) and resumes from the stored tokens."""
    ctl = short_ctl
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 8})
    run(ctl.send(cid, PROMPT[:4]))
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 1000})
    long = reply_of(ctl, run(ctl.send(cid, PROMPT)))
    assert long.stats["finish_detail"] == "max_model_len" and not long.stats.get("context_dropped")
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 8})
    ctl.set_context_policy(cid, "error")
    with pytest.raises(ContextError, match="cannot be continued"):
        ctl.continue_reply(long.id)
    ctl.set_context_policy(cid, "drop_oldest")
    done = reply_of(ctl, run(ctl.continue_reply(long.id)))
    assert done.stats["context_dropped"] == 2 and len(done.token_ids) == len(long.token_ids) + 8
    assert done.token_ids[:len(long.token_ids)] == long.token_ids
    kept = [{"role": "user", "content": PROMPT}]
    prompt = short_backend.engine.tokenizer.apply_chat_template(
        kept, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert done.stats["prompt_tokens"] == len(prompt) + len(long.token_ids)
    shown = render.chat_messages(ctl.view(cid))
    assert "2 earlier messages are not in the model's context" in shown[2]["content"]
