"""A reply token by token and a branch at any token, through ChatController on the tiny model:
every reply keeps each token's probability and top alternatives (in the store, beside the
message); the token texts add up to the reply; a branch at a token in the middle of a block
keeps the reply up to it, puts the chosen alternative, gets all its prompt but that token from
the prefix cache (one decode step) and writes what a fresh engine writes after the same tokens;
the original reply is untouched and the branch is its sibling."""

from __future__ import annotations

import math

import pytest
from helpers.engine_helpers import greedy
from helpers.tiny_chat import GREEDY, P1, controller, engine_backend, run

from localpaged import LLM
from localpaged.ui.tokens.logic import _pieces
from localpaged.ui.turns import ChatError


@pytest.fixture(scope="module")
def backend(tiny_root):
    with engine_backend(tiny_root) as b:
        yield b


def test_branch_at_a_token(backend, tmp_path, tiny_llama):
    with controller(backend, tmp_path, {**GREEDY, "max_tokens": 40}) as ctl:
        cid = ctl.new_conversation().id
        reply_id = run(ctl.send(cid, P1)).replies[0].message_id
        reply = ctl.store.get_message(reply_id)
        tokens = ctl.reply_tokens(reply_id)
        assert [t.token_id for t in tokens] == reply.token_ids and len(tokens) == 40
        assert "".join(t.text for t in tokens) == backend.decode(reply.token_ids)
        for t in tokens:                    # greedy: the token is the likeliest listed
            assert 0 < t.prob <= 1 and t.alternatives[0].token_id == t.token_id
            assert math.isclose(t.alternatives[0].prob, t.prob, rel_tol=1e-2)
            assert len(t.alternatives) == 5
        assert ctl.reply_tokens(ctl.store.active_path(cid)[0].id) is None     # a user message

        prompt = reply.stats["prompt_tokens"]
        index = next(i for i in range(5, 30) if 3 <= (prompt + i) % 16 <= 12)   # mid-block
        alt = tokens[index].alternatives[1].token_id
        turn = run(ctl.branch_at_token(reply_id, index, alt))
        branch = ctl.store.get_message(turn.replies[0].message_id)
        assert branch.token_ids[:index + 1] == reply.token_ids[:index] + [alt]
        assert branch.parent_id == reply.parent_id and branch.status == "complete"
        assert branch.stats["prefix_tokens_reused"] == prompt + index    # all but the new token
        assert branch.stats["branched_from"] == reply_id
        fresh = LLM(tiny_llama, enable_prefix_caching=False)
        ids = backend.prompt_ids(ctl.prompt_messages(cid, reply.parent_id)) + branch.token_ids[:index + 1]
        want = fresh.generate([ids], greedy(len(branch.token_ids) - index - 1))[0].outputs[0]
        assert branch.token_ids[index + 1:] == want.token_ids
        assert ctl.store.get_message(reply_id).token_ids == reply.token_ids          # untouched
        assert ctl.store.siblings(branch.id)[0] == [reply_id, branch.id]
        again = ctl.reply_tokens(branch.id)                   # the branch keeps its own tokens
        assert [t.token_id for t in again] == branch.token_ids
        assert again[index].alternatives == tokens[index].alternatives

        copy = ctl.fork(branch.id)                            # a new conversation keeps them
        assert ctl.reply_tokens(ctl.store.active_path(copy.id)[-1].id) == again

        with pytest.raises(ChatError, match="pick one of the alternatives"):
            ctl.branch_at_token(reply_id, index, 10 ** 6)
        with pytest.raises(ChatError, match="not in this reply"):
            ctl.branch_at_token(reply_id, 40, alt)
        ctl.store.db.execute("DELETE FROM token_alternatives")
        assert ctl.reply_tokens(reply_id) is None
        with pytest.raises(ChatError, match="no token data"):
            ctl.branch_at_token(reply_id, index, alt)


def test_token_texts_of_the_bundled_tokenizer(smollm2_gguf):
    """Characters split over several tokens: the token that completes one carries it."""
    import os

    from localpaged.runner.gguf_meta import config_and_tokenizer
    smollm2_tokenizer = config_and_tokenizer(os.path.dirname(smollm2_gguf),
                                             os.path.basename(smollm2_gguf))[1]
    text = "naïve café — 東京 🎉 done"
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    pieces = _pieces(lambda i: smollm2_tokenizer.decode(i, skip_special_tokens=True), ids)
    assert "".join(pieces) == text and len(pieces) == len(ids)
