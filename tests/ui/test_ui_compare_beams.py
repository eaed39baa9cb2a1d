"""Compare's beam-search mode through the controller: the k columns are the k
final beams of one engine beam search over the shared prompt, equal, tokens and scores, to
`LLM.beam_search` on the same prompt ids (a separate engine of the same model); the KV map shows
the running beams sharing blocks; over a remote backend the mode is refused with a reason."""

from __future__ import annotations

import pytest

from localpaged.ui import engine_panel as kvmap
from localpaged.ui.compare.events import CompareEvents
from localpaged.ui.compare.view import NEW_CONVERSATION
from localpaged.ui.controller import ChatController, ChatError
from localpaged.ui.store import Store

from helpers.step_gate import StepGate
from helpers.tiny_chat import GREEDY, P1, controller, engine_backend, run, tiny_llm

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def backend(tiny_root):
    with engine_backend(tiny_root) as b:
        yield b


def test_beam_columns_equal_llm_beam_search(backend, tiny_root, tmp_path):
    with controller(backend, tmp_path, {**GREEDY, "max_tokens": MAX_TOKENS}) as ctl:
        cid = ctl.new_conversation().id
        # The panel while the beams run: the engine holds the search's 4th step, so the
        # stats snapshot is the one after step 3 (three beams, forked after the prompt).
        with StepGate(backend.llm_engine, 4) as held:
            turn = ctl.compare_beams(cid, P1, 3)
            held.wait_held()
            snap = kvmap.KvMap(ctl).collect([cid])
        run(turn)
        live = [row for row in snap.rows if row.live and row.blocks]
        shared = {b for b, n in snap.sharing().items() if n > 1}
        user = ctl.store.active_path(cid)[0]
        ids = backend.prompt_ids(ctl.prompt_messages(cid, user.id))
        replies = [ctl.store.get_message(r.message_id) for r in turn.replies]
    assert len(live) == 3 and shared, "the KV map did not show three beams sharing blocks"
    assert len({tuple(r.token_ids) for r in turn.replies}) == 3    # three different beams
    ref = tiny_llm(tiny_root).beam_search(ids, beam_width=3, max_tokens=MAX_TOKENS)[0]
    assert [r.token_ids for r in turn.replies] == [c.token_ids for c in ref.outputs]
    assert [m.content for m in replies] == [c.text for c in ref.outputs]
    assert [m.stats["beam_score"] for m in replies] == pytest.approx(
        [c.cumulative_logprob for c in ref.outputs], abs=1e-5)
    assert [m.parent_id for m in replies] == [user.id] * 3       # siblings: one prompt
    assert backend.requests[-1] == "beam"


def test_compare_tab_shows_each_beam_score(backend, tmp_path):
    with controller(backend, tmp_path) as ctl:
        steps = list(CompareEvents(ctl).run(NEW_CONVERSATION, P1, 2, False, [()] * 4, beam=True))
        cid = steps[-1].state["cid"]
        beams = [ctl.store.get_message(m) for m in steps[-1].state["messages"]]
        prompt = ctl.store.active_path(cid)[0]
    assert [b.parent_id for b in beams] == [prompt.id] * 2
    for line, b in zip(steps[-1].stats[:2], beams):
        assert f"score {b.stats['beam_score']:.3f}" in line
    assert beams[0].stats["beam_score"] >= beams[1].stats["beam_score"]      # best first


def test_beam_mode_needs_the_local_engine(tmp_path):
    class Remote:                                 # anything that is not the in-process engine
        model_name, supports_kv_stats = "remote", False

    store = Store(tmp_path / "c.db")
    ctl = ChatController(store, lambda: Remote(), GREEDY)
    cid = ctl.new_conversation().id
    with pytest.raises(ChatError, match="remote backend"):
        ctl.compare_beams(cid, P1, 3)
    assert ctl.store.active_path(cid) == []        # nothing written
    store.close()
