"""Constrained decoding: what it costs, and why the engine uses xgrammar.

In one run, on the bundled SmolLM2 (its GGUF, its own kernels, 2 threads):
  1. The two libraries side by side on SmolLM2's tokenizer (49,152 tokens): building the
     tokenizer's index, compiling each schema, and the mask and advance of each token along a
     valid reply (the cost every decode step pays per constrained sequence). xgrammar and
     llguidance are both well kept and both on PyPI with CPU wheels.
  2. The engine: decode tokens/s of one chat replying under a JSON schema, with jump-forward
     and without, against the same chat unconstrained; all greedy, one run each, side by side.
     Schema-heavy output (keys, brackets, enums) is where jump-forward drafts forced text.
  3. The cost of a compile: the first request with a schema (compile included) against the
     second (cached).
Prints a table and writes bench/results/grammar-<time>.json.

    python bench/grammar.py [--tokens 96] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.machine import write_results  # noqa: E402

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]}},
        "required": ["name", "age", "tags", "address"], "additionalProperties": False},
    "records": {"type": "object", "properties": {"rows": {"type": "array", "maxItems": 6, "items": {
        "type": "object", "properties": {
            "id": {"type": "integer"}, "status": {"enum": ["open", "closed", "pending"]},
            "priority": {"enum": ["low", "medium", "high"]}, "done": {"type": "boolean"}},
        "required": ["id", "status", "priority", "done"], "additionalProperties": False}}},
        "required": ["rows"], "additionalProperties": False},
}
SAMPLE = {"person": {"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"],
                     "address": {"city": "London", "zip": "12345"}},
          "records": {"rows": [{"id": i, "status": "open", "priority": "high", "done": False}
                               for i in range(6)]}}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return []
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")
    return [f for f in wanted if f in flags]


def _per_token_us(fill, accept, ids) -> float:
    start = time.perf_counter()
    for t in ids:
        fill()
        assert accept(t), t
    return (time.perf_counter() - start) / len(ids) * 1e6


def libraries(tok, vocab: int) -> dict:
    import xgrammar as xgr
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch as lgt
    except ImportError:
        print("llguidance is not installed (pip install llguidance): xgrammar alone")
        llguidance = None
    out = {}
    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info)
    out["xgrammar_index_s"] = time.perf_counter() - start
    if llguidance is not None:
        start = time.perf_counter()
        ltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
        out["llguidance_index_s"] = time.perf_counter() - start
    for name, schema in SCHEMAS.items():
        text = json.dumps(SAMPLE[name])
        ids = tok.encode(text, add_special_tokens=False)
        start = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(schema))
        out[f"{name}_xgrammar_compile_ms"] = (time.perf_counter() - start) * 1e3
        m, bitmask = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, vocab)
        out[f"{name}_xgrammar_token_us"] = _per_token_us(
            lambda: m.fill_next_token_bitmask(bitmask), m.accept_token, ids)
        out[f"{name}_tokens"] = len(ids)
        if llguidance is None:
            continue
        start = time.perf_counter()
        lm = llguidance.LLMatcher(ltok, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)))
        out[f"{name}_llguidance_compile_ms"] = (time.perf_counter() - start) * 1e3
        lmask = lgt.allocate_token_bitmask(1, vocab)
        out[f"{name}_llguidance_token_us"] = _per_token_us(
            lambda: lgt.fill_next_token_bitmask(lm, lmask, 0), lm.consume_token, ids)
    return out


def engine_runs(path: str, tokens: int) -> dict:
    from localpaged import LLM, SamplingParams
    from localpaged.core.guided import GuidedDecoding
    out = {}
    messages = [{"role": "user", "content": "List six support tickets as JSON records with an id, "
                 "a status, a priority and whether each is done."}]
    guided = GuidedDecoding.json_schema(SCHEMAS["records"])
    runs = {"unconstrained": (True, None), "schema": (True, guided), "schema_no_jump": (False, guided)}
    for name, (jump, spec) in runs.items():
        llm = LLM(path, jump_forward=jump)
        prompt = llm.apply_chat_template(messages)
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=spec is None, guided=spec)
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8))      # warm
        start = time.perf_counter()
        result = llm.generate([prompt], params)[0]
        seconds = time.perf_counter() - start
        c = result.outputs[0]
        out[name] = {"tokens": len(c.token_ids), "seconds": seconds,
                     "tok_s": len(c.token_ids) / seconds, "finish": c.finish_reason,
                     "jump_forward_tokens": llm.engine.jump_forward_tokens,
                     "text": c.text[:200]}
        if spec is not None:        # the compile: a new schema's first request and its second
            fresh = GuidedDecoding.json_schema(dict(SCHEMAS["person"], title=f"t{jump}"))
            short = SamplingParams(temperature=0.0, max_tokens=1, guided=fresh)
            start = time.perf_counter()
            llm.generate([prompt], short)
            first = time.perf_counter() - start
            start = time.perf_counter()
            llm.generate([prompt], short)
            out[name]["first_request_ms"] = first * 1e3
            out[name]["cached_request_ms"] = (time.perf_counter() - start) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=160, help="the longest reply")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from localpaged.runner import gguf_meta, loader
    path = loader.bundled_gguf_path()
    tok = gguf_meta.config_and_tokenizer(os.path.dirname(path), os.path.basename(path))[1]
    result = {"machine": {"cpu": cpu_model(), "features": cpu_flags(), "threads": args.threads,
                          "torch": torch.__version__},
              "command": " ".join(["python", "bench/grammar.py"] + sys.argv[1:]),
              "libraries": libraries(tok, len(tok)), "engine": engine_runs(path, args.tokens)}
    lib, eng = result["libraries"], result["engine"]
    print(f"machine: {result['machine']}")
    print("| schema | tokens | xgrammar compile ms | llguidance compile ms | xgrammar us/token | "
          "llguidance us/token |\n|---|---:|---:|---:|---:|---:|")
    for name in SCHEMAS:
        lg = (f"{lib[f'{name}_llguidance_compile_ms']:.1f}", f"{lib[f'{name}_llguidance_token_us']:.1f}") \
            if f"{name}_llguidance_compile_ms" in lib else ("-", "-")
        print(f"| {name} | {lib[f'{name}_tokens']} | {lib[f'{name}_xgrammar_compile_ms']:.1f} | "
              f"{lg[0]} | {lib[f'{name}_xgrammar_token_us']:.1f} | {lg[1]} |")
    print(f"tokenizer index: xgrammar {lib['xgrammar_index_s']:.2f} s, "
          f"llguidance {lib.get('llguidance_index_s', float('nan')):.2f} s")
    base = eng["unconstrained"]["tok_s"]
    print("| run | tokens | tok/s | vs unconstrained | jump-forward tokens | finish |\n"
          "|---|---:|---:|---:|---:|---|")
    for name, r in eng.items():
        print(f"| {name} | {r['tokens']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | "
              f"{r['jump_forward_tokens']} | {r['finish']} |")
    for name in ("schema", "schema_no_jump"):
        print(f"{name}: a new schema's first request {eng[name]['first_request_ms']:.1f} ms, "
              f"cached {eng[name]['cached_request_ms']:.1f} ms")
    write_results("grammar", result)


if __name__ == "__main__":
    main()
