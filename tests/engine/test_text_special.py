"""SamplingParams.text_special_tokens: the special tokens a reply's text keeps (a tool-call
family's markers). Every output of a request carries the set, forks included, and the streamed
text holds those special tokens and drops the others, as the whole decode does."""

from helpers.engine_helpers import prompts

from localpaged import LLM, SamplingParams
from localpaged.engine.detokenizer import decode, detokenize


def test_a_reply_keeps_the_special_tokens_it_asks_for(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=32)
    tok, eng = llm.tokenizer, llm.engine
    special = sorted(i for i, t in tok.added_tokens_decoder.items() if t.special)
    keep, drop = special[-1], special[0]
    prompt = prompts(1, seed=2, lo=10, hi=11)[0]
    group = eng.make_group(prompt, SamplingParams(n=2, temperature=1.0, text_special_tokens=(keep,)),
                           "r")
    seq = group.seqs[0]
    assert seq.text_special == (keep,) and seq.fork(1, None).text_special == (keep,)
    reply = [40, keep, 41, drop, 42]
    for token in reply:                  # one token a step, as the engine streams them
        seq.token_ids.append(token)
        detokenize(tok, seq)
    detokenize(tok, seq, final=True)
    assert seq.text == decode(tok, reply, (keep,))
    assert tok.decode([keep]) in seq.text and tok.decode([drop]) not in seq.text
    assert decode(tok, reply) == tok.decode(reply, skip_special_tokens=True)
