"""Think N ways through the controller and the compare tab's handler, on the tiny model: four
sampled branches over one prompt (its blocks shared by all four), the ones behind pruned at the
rule's checkpoint with their blocks given back (the KV map says so while the others run), the
survivors' tokens equal to each branch run alone with its own seed, nothing held after the turn,
and the majority vote of short final answers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localpaged import SamplingParams
from localpaged.core.sampling_params import PruneRule
from localpaged.ui import engine_panel as kvmap
from localpaged.ui.compare.events import CompareEvents, think_summary
from localpaged.ui.compare.view import NEW_CONVERSATION
from localpaged.ui.compare.vote import final_answer, normal_form, vote
from localpaged.ui.controller import ChatController, ChatError
from localpaged.ui.settings.logic import check_sampling
from localpaged.ui.store import Store

from helpers.step_gate import StepGate
from helpers.tiny_chat import GREEDY, P1, controller, engine_backend, run, tiny_llm

SAMPLED = {**GREEDY, "temperature": 1.0, "seed": 3, "max_tokens": 40}
RULE = PruneRule(margin=0.0, after=8, every=4, keep=2)


@pytest.fixture(scope="module")
def backend(tiny_root):
    with engine_backend(tiny_root) as b:
        yield b


def test_think_four_ways_prunes_frees_and_keeps_the_survivors_tokens(backend, tiny_root,
                                                                     tmp_path):
    with controller(backend, tmp_path, SAMPLED) as ctl:
        cid = ctl.new_conversation().id
        # Hold the 20th sampling step: the checkpoint at token 8 was taken in step 8.
        with StepGate(backend.llm_engine, 20) as held:
            turn = ctl.think(cid, P1, 4, RULE)
            held.wait_held()
            snap = kvmap.KvMap(ctl).collect([cid])
            during = backend.stats()
        run(turn)
        user = ctl.store.active_path(cid)[0]
        ids = backend.prompt_ids(ctl.prompt_messages(cid, user.id))
        replies = [ctl.store.get_message(r.message_id) for r in turn.replies]
        after = backend.stats()
    live = [row for row in snap.rows if row.live]
    running = [row for row in live if row.blocks]
    ended = [row for row in live if not row.blocks]
    assert len(running) == 2 and len(ended) == 2
    full_prompt_blocks = len(ids) // during.block_size
    shared = {b for b, n in snap.sharing().items() if n == 2}
    assert len(shared) >= full_prompt_blocks            # the prompt, held once for both
    for row in ended:
        assert row.ended.startswith("pruned at token 8 · gave back ")
    pruned = [m for m in replies if "pruned" in m.stats]
    assert len(pruned) == 2 and all(m.status == "stopped" for m in pruned)
    assert all(m.stats["pruned"]["at"] == 8 and m.stats["released_blocks"] >= 1 for m in pruned)
    assert [m.parent_id for m in replies] == [user.id] * 4
    assert after.blocks_in_use == 0                     # nothing held after the turn
    # each survivor equals its column run alone (its own seed, no siblings, no pruning)
    llm = tiny_llm(tiny_root)
    columns = check_sampling(SAMPLED).columns(4)
    for i, m in enumerate(replies):
        alone = llm.generate([ids], replace(columns[i], prune=None))[0].outputs[0]
        if "pruned" in m.stats:
            assert m.token_ids == alone.token_ids[:len(m.token_ids)]
        else:
            assert m.token_ids == alone.token_ids


def test_compare_tab_think_mode_shows_the_rule_the_pruned_and_the_vote(backend, tmp_path):
    with controller(backend, tmp_path, SAMPLED) as ctl:
        steps = list(CompareEvents(ctl).run(NEW_CONVERSATION, P1, 3, False, [()] * 4,
                                            think=True, margin=0.0))
        replies = [ctl.store.get_message(m) for m in steps[-1].state["messages"]]
        ctl_active_leaf = ctl.store.active_path(steps[-1].state["cid"])[-1].id
    first, last = steps[0].summary, steps[-1].summary
    assert "Think 3 ways" in first and "more than 0 below the best" in first
    assert "Majority vote" not in first                  # only once the turn is done
    pruned = [j for j, m in enumerate(replies) if "pruned" in m.stats]
    assert len(pruned) == 2                             # margin 0: all but the best
    for j in pruned:
        assert f"Branch {j + 1} pruned at token {PruneRule().after}" in last
        assert "pruned at token" in steps[-1].stats[j] and "gave back" in steps[-1].stats[j]
    assert ("Majority vote: <b>" in last) or ("No short final answers" in last)
    survivor = next(m for m in replies if "pruned" not in m.stats)
    assert ctl_active_leaf == survivor.id          # the conversation goes on with it


def test_think_needs_sampling_and_the_local_engine_and_a_good_margin(backend, tmp_path):
    with controller(backend, tmp_path, GREEDY) as ctl:
        cid = ctl.new_conversation().id
        with pytest.raises(ChatError, match="temperature"):
            ctl.think(cid, P1, 3, RULE)
        bad = list(CompareEvents(ctl).run(cid, P1, 3, False, [()] * 4, think=True, margin=-1))
        assert ctl.store.active_path(cid) == []           # nothing written
        assert len(bad) == 1 and bad[0].state is not None and bad[0].outs is not None

    class Remote:
        model_name, supports_kv_stats = "remote", False

    store = Store(tmp_path / "r.db")
    ctl = ChatController(store, lambda: Remote(), SAMPLED)
    with pytest.raises(ChatError, match="remote backend"):
        ctl.think(ctl.new_conversation().id, P1, 3, RULE)
    store.close()


@pytest.mark.parametrize("text, answer", [
    ("Let me think.\n\nSo the answer is **42**.", "42"),
    ("We get $\\boxed{7}$ in the end, not \\boxed{8}... wait: \\boxed{9}", "9"),
    ("Final answer: Paris", "Paris"),
    ("1. Tom had 17.\n2. The answer is 3.", "3"),
    ("Answer: 42\n\nI hope this helps", "42"),
    ("Steps:\n- add them\n- 42", "42"),
    ("x" * 200, None),
    ("", None),
    ("   \n  ", None),
])
def test_final_answer(text, answer):
    assert final_answer(text) == answer


def test_vote_counts_normal_forms_and_breaks_ties_by_order():
    v = vote(["The answer is 1,000.", "x" * 200, "1000", "answer: 999"])
    assert (v.answer, v.count, v.voters, v.columns) == ("1,000", 2, 3, (0, 2))
    assert vote(["a", "b"]).answer == "a"
    assert vote(["x" * 100]) is None
    assert normal_form("  Paris ") == normal_form("paris") and normal_form("3.0") == "3"


def test_summary_escapes_model_text():
    class Reply:
        def __init__(self, text):
            self.text, self.status, self.stats = text, "complete", {}

    class Turn:
        done, replies = True, [Reply("<img src=x onerror=alert(1)>"), Reply("<img src=x onerror=alert(1)>")]
    out = think_summary(Turn, PruneRule())
    assert "<img" not in out and "&lt;img" in out


def test_engine_params_carry_the_rule():
    params = [replace(p, prune=RULE) for p in check_sampling(SAMPLED).columns(2)]
    assert all(isinstance(p, SamplingParams) and p.prune == RULE for p in params)
