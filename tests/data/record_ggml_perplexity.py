"""Record llama.cpp's perplexity on each committed tiny GGUF (tests/data/ggml/*.gguf) over a fixed
token sequence, in tests/data/ggml/llamacpp_perplexity.json, for tests/quant/test_ggml_perplexity.py
(which compares ours with it and cannot run llama.cpp itself).

Run by hand (not by the tests), from the repository root:

    PYTHONPATH=/tmp/work/lcp-site:/tmp/gg/extra .venv/bin/python tests/data/record_ggml_perplexity.py

with llama-cpp-python 0.3.36 (see tests/data/make_ggml_models.py for how it was built).

Tokens (`token_ids()`): N_TOKENS ids drawn uniformly, with replacement, by
torch.Generator().manual_seed(SEED) (torch.randint) from the NORMAL tokens of the tiny vocabulary
(tests/helpers/ggml_models.py vocabulary(): the 256 byte tokens and the merges; no control or unused
token), in id order. The ids are stored in the JSON too, and the test uses the stored ones.

Perplexity: llama.cpp evaluates the ids in one context (Llama(logits_all=True), eval), then
exp(mean cross-entropy of each token after the first under the logits of the position before it),
as bench/perplexity.py llamacpp_perplexity and localpaged.runner.prompt_logprobs.perplexity.
"perplexity" is with llama.cpp's defaults (the figure the test compares with); a second table
is with an F32 KV cache (llama.cpp's default is F16; ours is float32), for information.

Why 512 tokens: on these random-weight models, two implementations whose arithmetic agrees to
float rounding still differ by ~0.03 nats per token (a difference of 1e-7 somewhere flips the
int8 rounding of an activation, which these models amplify; llama.cpp's F16 KV cache adds to
it). That is noise of ~0.035 / sqrt(n) in log perplexity: 0.25% at 200 tokens, 0.16% at 512,
well inside the test's 0.5%.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))           # tests/, for ggml_models

import ggml_models

DATA = os.path.join(HERE, "ggml")
RECORD = os.path.join(DATA, "llamacpp_perplexity.json")
SEED, N_TOKENS = 0, 512
COMMAND = "PYTHONPATH=/tmp/work/lcp-site:/tmp/gg/extra .venv/bin/python tests/data/record_ggml_perplexity.py"


def token_ids(seed: int = SEED, n: int = N_TOKENS) -> list[int]:
    import gguf
    _, types, _ = ggml_models.vocabulary()
    normal = [i for i, t in enumerate(types) if t == int(gguf.TokenType.NORMAL)]
    g = torch.Generator().manual_seed(seed)
    return [normal[i] for i in torch.randint(len(normal), (n,), generator=g).tolist()]


def llamacpp_perplexity(path: str, ids: list[int], **options) -> float:
    """llama.cpp's perplexity of ids; options go to Llama (e.g. type_k=0, type_v=0: an F32 KV
    cache instead of its default F16; n_ctx, n_batch: else the whole text in one batch)."""
    from llama_cpp import Llama
    settings = {"n_ctx": max(256, len(ids)), "n_batch": max(512, len(ids)), **options}
    llm = Llama(path, logits_all=True, n_threads=2, verbose=False, **settings)
    llm.eval(ids)
    logits = torch.tensor(llm.scores[:len(ids)], dtype=torch.float32)
    llm.close()
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    return math.exp(float(nll))


def main() -> None:
    import llama_cpp
    ids = token_ids()
    files = sorted(glob.glob(os.path.join(DATA, "*.gguf")))
    perplexities, f32_kv = {}, {}
    for path in files:
        name = os.path.basename(path)
        perplexities[name] = ppl = llamacpp_perplexity(path, ids)
        f32_kv[name] = ppl32 = llamacpp_perplexity(path, ids, type_k=0, type_v=0)
        print(f"{name}: llama.cpp perplexity {ppl:.4f} (F32 KV cache: {ppl32:.4f})")
    record = {
        "llama-cpp-python": llama_cpp.__version__,
        "command": COMMAND,
        "tokens": {"seed": SEED, "n": N_TOKENS,
                   "rule": "torch.randint(len(normal), (n,), generator=torch.Generator()"
                           ".manual_seed(seed)) indexing the NORMAL token ids of "
                           "tests/helpers/ggml_models.py vocabulary() in id order (no control or unused "
                           "token)",
                   "ids": ids},
        "perplexity": perplexities,
        "perplexity with an F32 KV cache (type_k=type_v=0; for information)": f32_kv,
    }
    write_record(RECORD, record, ids)
    print(f"recorded {len(files)} files in {os.path.relpath(RECORD)}")


def write_record(path: str, record: dict, ids: list[int]) -> None:
    """The record as indented JSON, its token ids on one line."""
    text = json.dumps(record, indent=1)
    text = text.replace(json.dumps(ids, indent=1).replace("\n", "\n  "), json.dumps(ids))
    with open(path, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
