"""ContextWindow: exact counts against the real SmolLM2 chat template (apply_chat_template is the
oracle), whole turns dropped oldest first and no more than needed (checked by brute force), clear
errors; and a tiny engine whose context is small keeps answering a conversation that outgrows it."""

import os
import random

import pytest
from helpers.engine_helpers import greedy

from localpaged import LLM
from localpaged.chat.context_window import (
    ContextOverflowError,
    ContextWindow,
    SystemPromptTooLongError,
    split_turns,
)

WORDS = ("the king walked into a castle where many knights , waited for news of war ; é 中 "
         "  \n\n 42 <|im_start|> café").split(" ")


@pytest.fixture(scope="module")
def smol_tokenizer(request, smollm2_gguf):
    """The bundled SmolLM2's tokenizer and chat template (a required part: conftest's
    smollm2_gguf). Converting it from the GGUF takes ~10 s, so the converted files are kept in
    pytest's cache, keyed by the GGUF's size and mtime (a later run loads them in well under a
    second)."""
    path = smollm2_gguf
    from transformers import AutoTokenizer
    st = os.stat(path)
    cache = getattr(request.config, "cache", None)        # None with -p no:cacheprovider
    cached = cache and cache.mkdir(f"smollm2-tokenizer-{st.st_size}-{int(st.st_mtime)}")
    if cached and (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached))
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    if cached:
        tok.save_pretrained(str(cached))
    return tok


def _chat(rng: random.Random, turns: int, words: int = 30, system: bool = True) -> list[dict]:
    msgs = [{"role": "system", "content": "You are terse."}] if system else []
    for i in range(turns):
        for role in ("user", "assistant"):
            n = rng.randint(1, words)
            msgs.append({"role": role, "content": " ".join(rng.choice(WORDS) for _ in range(n))})
    return msgs


def _oracle(tok, msgs, **kw) -> list[int]:
    kw.setdefault("add_generation_prompt", True)
    return list(tok.apply_chat_template(msgs, tokenize=True, return_dict=False, **kw))


def test_count_tokens_is_exact(smol_tokenizer):
    cw = ContextWindow(smol_tokenizer, 8192)
    assert cw.piecewise                        # the cached piece-by-piece count is in use
    rng = random.Random(0)
    for trial in range(12):
        msgs = _chat(rng, rng.randint(0, 6), system=trial % 3 != 0)[:-1]   # ends on a user turn
        draft = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12)))
        sent = msgs + ([{"role": "user", "content": draft}] if draft else [])
        if not sent:
            continue
        assert cw.count_tokens(msgs, draft) == len(_oracle(smol_tokenizer, sent))
        assert cw.count_tokens(msgs, draft) == len(cw.token_ids(sent))      # cached pieces
    tail = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once upon a"}]
    assert cw.count_tokens(tail, continue_final_message=True) == len(
        _oracle(smol_tokenizer, tail, add_generation_prompt=False, continue_final_message=True))


def _brute_force_drop(tok, msgs, limit, reserve) -> int:
    """Fewest whole turns to leave out so prompt + reserve fits (apply_chat_template only)."""
    head, turns = split_turns(msgs)
    for k in range(len(turns)):
        kept = head + [m for t in turns[k:] for m in t]
        if len(_oracle(tok, kept)) + reserve <= limit:
            return k
    raise AssertionError("nothing fits")


@pytest.mark.parametrize("share", [0.3, 0.6, 0.95])
def test_drop_oldest_drops_fewest_whole_turns(smol_tokenizer, share):
    rng = random.Random(int(share * 100))
    msgs = _chat(rng, 10)[:-1]                 # system, 9 user/assistant pairs, a user message
    reserve = 32
    limit = int((len(_oracle(smol_tokenizer, msgs)) + reserve) * share)
    fit = ContextWindow(smol_tokenizer, limit).fit(msgs, reserve, "drop_oldest")
    assert fit.token_ids == _oracle(smol_tokenizer, fit.messages)
    assert fit.num_tokens + reserve <= limit
    k = _brute_force_drop(smol_tokenizer, msgs, limit, reserve)
    head, turns = split_turns(msgs)
    assert fit.num_dropped == sum(len(t) for t in turns[:k]) > 0
    assert fit.messages == msgs[:1] + msgs[fit.first_kept:]      # the system prompt stays
    assert fit.first_kept == 1 + fit.num_dropped
    assert msgs[fit.first_kept]["role"] == "user"                # a turn starts the kept part


def test_fits_untouched_and_error_policy(smol_tokenizer):
    msgs = _chat(random.Random(5), 6)[:-1]
    n = len(_oracle(smol_tokenizer, msgs))
    fit = ContextWindow(smol_tokenizer, n + 10).fit(msgs, 10, "error")
    assert (fit.num_dropped, fit.messages, fit.token_ids) == (0, msgs, _oracle(smol_tokenizer, msgs))
    with pytest.raises(ContextOverflowError, match="3 tokens over the context limit") as e:
        ContextWindow(smol_tokenizer, n + 7).fit(msgs, 10, "error")
    assert (e.value.over_by, e.value.num_tokens, e.value.limit) == (3, n, n + 7)
    assert not isinstance(e.value, SystemPromptTooLongError)


@pytest.mark.parametrize("policy", ["drop_oldest", "error"])
def test_system_prompt_longer_than_context(smol_tokenizer, policy):
    system = {"role": "system", "content": "rule " * 300}
    msgs = [system, {"role": "user", "content": "hi"}]
    n = len(_oracle(smol_tokenizer, [system]))
    with pytest.raises(SystemPromptTooLongError, match="system prompt alone is") as e:
        ContextWindow(smol_tokenizer, 256).fit(msgs, 16, policy)
    assert e.value.num_tokens == n and e.value.over_by == n + 16 - 256


def test_latest_message_too_long_and_bad_input(smol_tokenizer):
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "word " * 400}]
    with pytest.raises(ContextOverflowError, match="latest message alone"):
        ContextWindow(smol_tokenizer, 256).fit(msgs, 16, "drop_oldest")
    cw = ContextWindow(smol_tokenizer, 256)
    with pytest.raises(ValueError, match=r"policy must be one of \['drop_oldest', 'error'\]"):
        cw.fit(msgs, 16, "truncate")
    with pytest.raises(ValueError, match="reserve must be in"):
        cw.fit(msgs, 0)
    with pytest.raises(ValueError, match="messages must not be empty"):
        cw.fit([], 16)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("max_model_len,num_kv_blocks", [(128, 64), (None, 6)])
def test_tiny_engine_keeps_answering_past_its_context(tiny_llama, max_model_len, num_kv_blocks):
    """Context capped by max_model_len (128), or by the KV cache (6 blocks of 16 = 96)."""
    kw = {"max_model_len": max_model_len} if max_model_len else {}
    llm = LLM(tiny_llama, num_kv_blocks=num_kv_blocks, block_size=16, **kw)
    llm.tokenizer.chat_template = CHATML
    limit = llm.engine.context_limit()
    assert limit == (max_model_len or num_kv_blocks * 16)
    cw = ContextWindow(llm.tokenizer, limit)
    msgs = [{"role": "system", "content": "be"}]
    dropped = []
    for i in range(6):
        msgs.append({"role": "user", "content": f"q{i}"})
        fit = cw.fit(msgs, reserve=8)
        out = llm.generate([fit.token_ids], greedy(8))[0].outputs[0]
        assert out.finish_detail == "max_tokens"                  # never cut by memory
        assert len(fit.token_ids) + 8 <= limit
        msgs.append({"role": "assistant", "content": out.text})
        dropped.append(fit.num_dropped)
    assert dropped[0] == 0 and dropped[-1] > 0
    assert dropped == sorted(dropped) and all(d % 2 == 0 for d in dropped)   # whole turns
