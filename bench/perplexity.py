"""Perplexity of the bundled SmolLM2 on tests/data/paragraph.txt: localpaged fp32 / int8 / int4
(through prompt logprobs, as an evaluation client would) beside llama.cpp on the same GGUF and the
same token ids, in one run. `--record` writes llama.cpp's figure to tests/data/ for the quality
test (tests/test_quant_smollm2.py), which cannot run llama.cpp itself.

    python bench/perplexity.py [--record]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

from localpaged import LLM
from localpaged.runner import loader
from localpaged.runner.prompt_logprobs import perplexity

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "..", "tests", "data", "paragraph.txt")
RECORD = os.path.join(HERE, "..", "tests", "data", "paragraph_llamacpp.json")


def llamacpp_perplexity(gguf: str, ids: list[int]) -> float:
    from llama_cpp import Llama
    llm = Llama(gguf, logits_all=True, n_ctx=512, n_threads=2, verbose=False)
    llm.eval(ids)
    logits = torch.tensor(llm.scores[:len(ids)], dtype=torch.float32)
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    return math.exp(float(nll))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help=f"write llama.cpp's figure to {RECORD}")
    args = ap.parse_args()
    gguf = loader.bundled_gguf_path()
    text = open(TEXT).read().strip()
    results: dict = {}
    ids: list[int] = []
    for q in ("none", "int8", "int4"):
        llm = LLM(gguf, quantization=q, num_kv_blocks=32)
        ids = llm.tokenizer(text)["input_ids"]
        results[q] = {"perplexity": perplexity(llm, ids), "weights": llm.stats().weights_format}
        del llm
    try:
        results["llama.cpp Q4_1"] = {"perplexity": llamacpp_perplexity(gguf, ids)}
    except ImportError:
        print("llama-cpp-python is not installed: llama.cpp skipped", file=sys.stderr)
    fp32 = results["none"]["perplexity"]
    print(f"{len(ids)} tokens of {os.path.relpath(TEXT)}")
    print(f"{'weights':<16}{'perplexity':>12}{'vs fp32':>10}")
    for name, r in results.items():
        print(f"{name:<16}{r['perplexity']:>12.3f}{r['perplexity'] / fp32 - 1:>+10.2%}")
    out = os.path.join(HERE, "results", f"perplexity-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump({"tokens": len(ids), "results": results}, f, indent=2)
    if args.record and "llama.cpp Q4_1" in results:
        with open(RECORD, "w") as f:
            json.dump({"llama.cpp Q4_1": results["llama.cpp Q4_1"]["perplexity"],
                       "transformers-equal fp32 (localpaged none)": fp32, "tokens": len(ids),
                       "command": "python bench/perplexity.py --record",
                       "llama-cpp-python": __import__("llama_cpp").__version__}, f, indent=2)
        print(f"recorded in {os.path.relpath(RECORD)}")


if __name__ == "__main__":
    main()
