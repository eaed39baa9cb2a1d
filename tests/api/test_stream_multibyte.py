"""The real SmolLM2 tokenizer and chat template through the streaming paths (engine, OpenAI API
via the `openai` client, the UI controller): characters split across byte-level tokens (accents,
emoji, CJK, Greek) stream as whole characters, and the streamed text concatenated equals
`tokenizer.decode` of the generated ids.

The model is a "successor" model over SmolLM2's vocabulary: one layer whose attention and MLP
write nothing, so the logits depend only on the current token's embedding; embeddings are
one-hot for the tokens of TEXT (and for the newline that ends every prompt, the chat template's
included) and the output head maps each to the next token of TEXT, cyclically. Greedy decoding
therefore writes TEXT's token ids over and over, whatever the prompt: the expected ids are known
before anything runs, and `tokenizer.decode` of them is the oracle.
"""

from __future__ import annotations

import os
import time

import openai
import pytest
import torch

from localpaged import LLM, SamplingParams
from localpaged.api.server import build_app, make_server, start_in_thread
from localpaged.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow        # loads the tokenizer from the bundled SmolLM2 GGUF

TEXT = "Héllo 🦙 世界, naïve café 😀 日本語 Ωμέγα €!"   # 33 distinct byte-level tokens
NEWLINE = 198                        # "Ċ": the last token of every prompt used here
MODEL = "smol-successor"


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(os.path.dirname(smollm2_gguf),
                                         gguf_file=os.path.basename(smollm2_gguf))


@pytest.fixture(scope="module")
def chain(tokenizer) -> list[int]:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert len(set(ids)) == len(ids) and NEWLINE not in ids          # a successor function
    assert tokenizer.decode([NEWLINE]) == "\n"
    assert sum("\ufffd" in tokenizer.decode([i]) for i in ids) >= 10   # many partial characters
    return ids


def expected(chain: list[int], n: int) -> list[int]:
    return [chain[i % len(chain)] for i in range(n)]


@pytest.fixture(scope="module")
def model_dir(tokenizer, chain, tmp_path_factory) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    hidden = 64
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):        # the init's draws seeded; the global RNG kept
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()       # attention adds nothing to the residual
        layer.mlp.down_proj.weight.zero_()          # nor does the MLP
        model.model.embed_tokens.weight.normal_(0, 0.01, generator=torch.Generator().manual_seed(0))
        model.lm_head.weight.zero_()
        sources = [NEWLINE] + chain                 # slot k: a one-hot embedding
        targets = [chain[0]] + chain[1:] + [chain[0]]
        for k, (src, dst) in enumerate(zip(sources, targets)):
            model.model.embed_tokens.weight[src] = torch.nn.functional.one_hot(
                torch.tensor(k), hidden).float()
            model.lm_head.weight[dst, k] = 10.0
    path = str(tmp_path_factory.mktemp("successor") / MODEL)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def engine(model_dir):
    llm = LLM(model_dir, num_kv_blocks=64)
    eng = AsyncEngine(llm.engine)
    yield eng
    eng.shutdown()


def check_stream(pieces: list[str], ids: list[int], tokenizer) -> None:
    """Concatenated pieces equal decode(ids); no piece carries half a character."""
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces), pieces
    assert len([p for p in pieces if p]) > 3                         # it did stream


@pytest.mark.parametrize("n", [66, 3 * 33 + 4])   # whole cycles; ending inside a character
def test_engine_stream_decodes_as_tokenizer(engine, tokenizer, chain, n):
    # through the engine's own stream: cumulative text, ids known in advance
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    texts, final = [], None
    for out in engine.generate([NEWLINE], params):
        texts.append(out.outputs[0].text)
        final = out
    ids = final.outputs[0].token_ids
    assert ids == expected(chain, n)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))    # cumulative
    assert not any("\ufffd" in t for t in texts[:-1])
    # An incomplete character is held back until the token completing it arrives
    # (localpaged/engine/detokenizer.py); a request that ends first flushes it, so the final text is
    # exactly the decode of every output id (an unfinished character as U+FFFD).
    whole = max(k for k in range(len(ids) + 1) if not tokenizer.decode(ids[:k]).endswith("\ufffd"))
    assert (whole == len(ids)) == (n % len(chain) == 0)
    assert texts[-1] == tokenizer.decode(ids)


@pytest.fixture(scope="module")
def client(engine):
    server = make_server(build_app(engine, MODEL), "127.0.0.1", 0, log_level="warning")
    start_in_thread(server)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                        timeout=60)
    server.should_exit = True


def test_api_streams_whole_characters(client, tokenizer, chain):
    n = 2 * len(chain)
    chunks = list(client.completions.create(model=MODEL, prompt=[NEWLINE], max_tokens=n,
                                            temperature=0, stream=True))
    check_stream([c.choices[0].text for c in chunks if c.choices], expected(chain, n), tokenizer)
    chat = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Écris « 世界 » 🦙"}], max_tokens=n,
        temperature=0, stream=True))
    pieces = [c.choices[0].delta.content or "" for c in chat if c.choices]
    check_stream(pieces, expected(chain, n), tokenizer)
    assert [c.choices[0].finish_reason for c in chat if c.choices][-1] == "length"


def test_ui_controller_streams_whole_characters(engine, tokenizer, chain, tmp_path):
    from localpaged.chat.backend import LocalChatBackend
    from localpaged.ui.controller import ChatController
    from localpaged.ui.store import Store
    n = 2 * len(chain)
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
                "max_tokens": n}
    store = Store(tmp_path / "conversations.db")
    backend = LocalChatBackend(engine)
    ctl = ChatController(store, lambda: backend, sampling, tmp_path / "ui_state.json")
    try:
        cid = ctl.new_conversation().id
        turn = ctl.send(cid, "Dis « bonjour » en 日本語 😀")
        texts = [t.replies[0].text for t in turn.updates(interval=0.0)]
        assert turn.wait(60) and turn.error is None, turn.error
        want = tokenizer.decode(expected(chain, n))
        assert turn.replies[0].text == want and want.startswith(texts[-1])
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
        assert not any("\ufffd" in t for t in texts), texts
        assert len(set(texts)) > 3
        deadline = time.monotonic() + 10            # saved as it was shown
        while store.get_message(turn.replies[0].message_id).content != want:
            assert time.monotonic() < deadline, "the reply was not saved"
            time.sleep(0.02)
    finally:
        ctl.stop_all()
        store.close()
