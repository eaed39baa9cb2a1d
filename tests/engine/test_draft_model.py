"""Speculative decoding with a draft model (`speculation="draft"`, engine/draft_model.py): a
second model with the same tokenizer guesses where the n-grams find nothing, with its own KV
cache and block tables (shadows of the target's sequences).

The gold standard is decoding without speculation: greedy tokens equal token for token (and
transformers'), seeded sampling draws the same tokens, preemption by recompute and swap loses
nothing, with the target's and the draft's block invariants checked after every step
(debug_checks); a draft whose guesses are rejected gives their blocks back (trim), a finished
request leaves no draft block held.
"""

from __future__ import annotations

import pytest

from helpers.engine_helpers import hf_greedy
from localpaged import LLM, SamplingParams
from localpaged.core.config import EngineConfig
from localpaged.core.speculation import StepCost

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 6, [3, 4, 3, 4, 3, 4, 20, 21, 22] * 3, list(range(30, 80))]


@pytest.fixture
def always_draft(monkeypatch):
    """Drafting never stops for measured cost (wall time on a shared machine is noise)."""
    monkeypatch.setattr(StepCost, "observe", lambda *args, **kwargs: None)
    monkeypatch.setattr(StepCost, "observe_model", lambda *args, **kwargs: None)


@pytest.fixture(scope="module")
def other_llama(tiny_root):
    """A second tiny model with the same tokenizer and other weights: guesses partly right."""
    from helpers import tiny_models
    return tiny_models.build("llama-mqa-tied", tiny_root)


def greedy(max_tokens: int = 60, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def tokens(outs):
    return [[o.token_ids for o in out.outputs] for out in outs]


def drafting(target: str, draft: str, **engine) -> LLM:
    return LLM(target, speculation="draft", draft_model=draft, debug_checks=True,
               record_steps=True, **engine)


def draft_blocks_held(llm: LLM) -> int:
    return llm.engine.drafter.model.blocks.usage().in_use


@pytest.mark.parametrize("which", ["itself", "other"])
def test_greedy_equals_decoding_without_speculation(tiny_llama, other_llama, which, always_draft):
    draft = tiny_llama if which == "itself" else other_llama
    base_llm = LLM(tiny_llama, num_kv_blocks=64, record_steps=True)
    base = base_llm.generate(PROMPTS, greedy())
    llm = drafting(tiny_llama, draft, num_kv_blocks=64)
    spec = llm.generate(PROMPTS, greedy())
    assert tokens(spec) == tokens(base)
    assert spec[2].outputs[0].token_ids == hf_greedy(tiny_llama, PROMPTS[2], 60)
    stats = llm.stats()
    assert 0 < stats.accepted_draft_tokens <= stats.draft_tokens
    if which == "itself":        # the draft is the target: its guesses are the target's tokens
        assert stats.accepted_draft_tokens >= 0.9 * stats.draft_tokens
        assert len(llm.engine.step_records) < len(base_llm.engine.step_records) / 2
    else:                        # other weights: some guesses rejected, their blocks given back
        assert stats.accepted_draft_tokens < stats.draft_tokens
    assert draft_blocks_held(llm) == 0 and not llm.engine.drafter.model.shadows


def test_the_draft_model_drafts_where_the_ngrams_find_nothing(tiny_llama, always_draft):
    """A prompt whose tokens never repeat: n-gram lookup has nothing, the draft model does."""
    prompt = list(range(100, 160))
    ngram = LLM(tiny_llama, num_kv_blocks=64, speculation="ngram").generate([prompt], greedy(12))
    llm = drafting(tiny_llama, tiny_llama, num_kv_blocks=64)
    out = llm.generate([prompt], greedy(12))
    assert tokens(out) == tokens(ngram)
    assert llm.stats().draft_tokens > ngram[0].outputs[0].draft_tokens


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_and_a_full_draft_cache_lose_nothing(tiny_llama, other_llama, mode, always_draft):
    """14 target blocks preempt; the draft model gets 14 too, too few for three shadows, so
    shadows are dropped and restarted along the way."""
    base = LLM(tiny_llama, num_kv_blocks=64).generate(PROMPTS, greedy(80))
    llm = drafting(tiny_llama, other_llama, num_kv_blocks=14, preemption_mode=mode)
    spec = llm.generate(PROMPTS, greedy(80))
    assert llm.stats().num_preemptions > 0
    assert tokens(spec) == tokens(base)
    assert llm.stats().accepted_draft_tokens > 0 and draft_blocks_held(llm) == 0


def test_seeded_sampling_draws_the_same_tokens(tiny_llama, other_llama, always_draft):
    """A verification draws each position with the random number plain decoding uses there,
    so seeded samples are the same tokens with or without a draft model."""
    params = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.95, seed=7, n=2, ignore_eos=True)
    base = LLM(tiny_llama, num_kv_blocks=64).generate(PROMPTS, params)
    llm = drafting(tiny_llama, other_llama, num_kv_blocks=64)
    assert tokens(llm.generate(PROMPTS, params)) == tokens(base)
    assert llm.stats().draft_tokens > 0


def test_a_draft_model_with_another_tokenizer_is_refused(tiny_llama, smollm2_gguf):
    with pytest.raises(ValueError, match="tokenizer differs from the target"):
        LLM(tiny_llama, num_kv_blocks=16, speculation="draft", draft_model=smollm2_gguf)


def test_draft_speculation_needs_a_draft_model():
    with pytest.raises(ValueError, match="needs a draft_model"):
        EngineConfig(model="m", speculation="draft")


def test_a_shadow_rolled_back_drafts_as_a_fresh_one(other_llama):
    """After a verification that rejected every guess (the target's own token instead), the
    shadow's next draft equals what a draft model that never saw the guesses drafts: their K/V
    are no longer read, and the blocks only they filled are given back."""
    import torch
    from transformers import AutoTokenizer
    from localpaged.core.request import Sequence
    from localpaged.engine.draft_model import DraftModel

    def draft_model():    # blocks of 4 tokens
        return DraftModel(other_llama, torch.device("cpu"), torch.float32, 4, 64,
                          AutoTokenizer.from_pretrained(other_llama), 512)

    used = draft_model()
    seq = Sequence(list(range(30, 45)), 15, 0, None)
    guesses = used.propose([(seq, 8)])[seq.seq_id]
    shadow = used.shadows[seq.seq_id].seqs[0]
    assert len(guesses) == 8 and shadow.num_computed_tokens == 15 + 7   # the last guess: not yet
    assert len(used.blocks.tables[shadow.seq_id]) == 6                  # 22 computed tokens' slots
    seq.token_ids.append((guesses[0] + 1) % 512)                         # the target disagrees
    again = used.propose([(seq, 2)])[seq.seq_id]
    assert shadow.token_ids[:16] == seq.token_ids and shadow.num_computed_tokens == 16 + 1
    assert len(used.blocks.tables[shadow.seq_id]) == 5                  # 17 computed tokens' slots
    used.check()
    alone = Sequence(seq.token_ids, 16, 0, None)
    assert again == draft_model().propose([(alone, 2)])[alone.seq_id]
    used.forget([seq.seq_id])
    used.check()
    assert used.blocks.usage().in_use == 0


class FakeDraftModel:
    """Guesses `guess` tokens; records what it was asked."""
    caught_up = 0

    def __init__(self, guess: list[int]) -> None:
        self.guess, self.asked, self.forgotten = guess, [], []

    def propose(self, wanted):
        self.asked.append([k for _, k in wanted])
        return {seq.seq_id: self.guess[:k] for seq, k in wanted}

    def forget(self, seq_ids):
        self.forgotten += seq_ids


def decoding_group(tokens: list[int], prompt_len: int):
    from localpaged.core.request import Sequence, SequenceGroup
    seq = Sequence(tokens, prompt_len, 0, None)
    seq.num_computed_tokens = len(tokens) - 1
    return SequenceGroup("r", None, tokens[:prompt_len], greedy(200), [seq], max_model_len=4096), seq


def test_ngrams_first_the_model_where_they_fail_and_each_source_keeps_its_rate():
    """A sequence's first model draft comes after MODEL_AFTER steps without an n-gram match (the
    model then reads the whole prompt); an n-gram match drafts while n-grams keep up with the
    model; once their own acceptance is far below the model's, the model drafts, n-grams being
    retried every RETRY_NGRAM passes; a copy's pointer moves on under the model's drafts; forget
    reaches the model."""
    from localpaged.core.speculation import MODEL_AFTER, NGRAM_SLACK, RETRY_NGRAM, Drafter
    model = FakeDraftModel([70, 71, 72, 73])
    drafter = Drafter(4, model)
    group, seq = decoding_group(list(range(1, 11)), 9)                # nothing repeats

    def step(accepted: int) -> list[int]:
        drafter.cost.step = 1                                          # not a control step
        drafter.attach([group])
        draft = seq.token_ids[len(seq.token_ids) - seq.num_draft_tokens:]
        seq.drop_drafts()
        if draft:
            drafter.verified(seq, len(draft), min(accepted, len(draft)))
        return draft
    assert [step(4) for _ in range(MODEL_AFTER - 1)] == [[]] * (MODEL_AFTER - 1) and not model.asked
    assert step(4)[:2] == [70, 71] and len(model.asked) == 1
    seq.token_ids[-2:] = [2, 3]                                        # "2 3" occurred: n-grams
    assert step(0) == [4, 5, 6, 7] and len(model.asked) == 1           # tried first, all rejected
    for _ in range(3):
        drafter.states[seq.seq_id].update(4, 0)                        # and three more such drafts
    assert drafter.states[seq.seq_id].rate < drafter.model_states[seq.seq_id].rate - NGRAM_SLACK
    asked = len(model.asked)
    drafter.states[seq.seq_id].copy_from = 3
    moved = 0
    for _ in range(RETRY_NGRAM):                                       # the model drafts
        draft = step(4)
        assert draft[:2] == [70, 71]
        moved += len(draft) + 1                                        # all kept, and one more
    assert len(model.asked) == asked + RETRY_NGRAM
    assert drafter.states[seq.seq_id].copy_from == 3 + moved
    assert step(0)[0] != 70 and len(model.asked) == asked + RETRY_NGRAM   # n-grams retried
    drafter.forget([seq])
    assert model.forgotten == [seq.seq_id] and seq.seq_id not in drafter.model_states


def test_the_app_speculates_from_the_conversation_by_default(tiny_llama, tmp_path):
    """`python app.py` drafts with n-grams unless told otherwise; the Python engine does not."""
    from localpaged import cli
    base = ["--model", tiny_llama, "--data-dir", str(tmp_path / "data"), "--num-kv-blocks", "32",
            "--kv-disk-gb", "0"]

    def drafter(*extra):
        app, ctl, models, store = cli.build(cli.parse_args([*base, *extra]))
        try:
            return models.backend.engine._engine.drafter
        finally:
            models.backend.engine.shutdown()
            store.close()
            app.state.instance_lock.release()
    assert drafter() is not None and drafter().model is None
    assert drafter("--speculation", "off") is None
    assert LLM(tiny_llama, num_kv_blocks=16).engine.drafter is None


def test_the_app_loads_a_model_whose_tokenizer_its_draft_model_does_not_share(tiny_llama,
                                                                               smollm2_gguf, caplog):
    """--draft-model is fixed at the start, a model picked later may have another tokenizer: the
    load succeeds, drafting from n-grams only, and says so in the log."""
    from localpaged.ui.models.logic import LocalFactory
    factory = LocalFactory(num_kv_blocks=16, engine_options={"speculation": "draft",
                                                             "draft_model": smollm2_gguf})
    with caplog.at_level("WARNING"):
        backend = factory(tiny_llama, lambda *args: None)
    try:
        drafter = backend.engine._engine.drafter
        assert drafter is not None and drafter.model is None
        assert any("tokenizer differs" in r.getMessage() and "n-gram drafts only" in r.getMessage()
                   for r in caplog.records)
    finally:
        backend.engine.shutdown()


def test_a_shadow_whose_guesses_the_target_kept_by_other_means_drafts_on(other_llama):
    """The target kept the model's first guesses through n-gram drafts since (the shadow already
    computed them): the shadow computes its last token again for the next guess's logits."""
    import torch
    from transformers import AutoTokenizer
    from localpaged.core.request import Sequence
    from localpaged.engine.draft_model import DraftModel
    model = DraftModel(other_llama, torch.device("cpu"), torch.float32, 4, 64,
                       AutoTokenizer.from_pretrained(other_llama), 512)
    seq = Sequence(list(range(30, 45)), 15, 0, None)
    guesses = model.propose([(seq, 8)])[seq.seq_id]
    seq.token_ids += guesses[:3]                       # all three already computed by the shadow
    assert model.propose([(seq, 2)])[seq.seq_id] == guesses[3:5]
    model.check()


def test_background_work_is_not_drafted_while_interactive_work_runs_and_it_idles():
    """With "idle" background batching a background group does not run beside interactive ones,
    so it gets no draft then (the draft model would guess for nothing); with "share" it does."""
    from localpaged.core.sampling_params import BACKGROUND
    from localpaged.core.speculation import MODEL_AFTER, Drafter
    for idle, drafted in ((True, [1]), (False, [1, 2])):
        model = FakeDraftModel([70, 71, 72])
        drafter = Drafter(4, model, background_idle=idle)
        fg, fg_seq = decoding_group(list(range(1, 11)), 9)
        bg, bg_seq = decoding_group(list(range(21, 31)), 9)
        bg.priority = BACKGROUND
        for _ in range(MODEL_AFTER):
            drafter.cost.step = 1
            drafter.attach([bg, fg])                  # the background group listed first
        asked = [seq.seq_id for seq in (fg_seq, bg_seq) if seq.num_draft_tokens]
        assert len(asked) == len(drafted) and asked[0] == fg_seq.seq_id, idle
