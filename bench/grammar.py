"""Constrained decoding: what it costs, and why the engine uses xgrammar.

In one run, on the bundled SmolLM2 (its GGUF, its own kernels, 2 threads):
  1. The two libraries side by side on SmolLM2's tokenizer (49,152 tokens): building the
     tokenizer's index, compiling each schema, and the mask and advance of each token along a
     valid reply (the cost every decode step pays per constrained sequence). xgrammar and
     llguidance are both well kept and both on PyPI with CPU wheels.
  2. The engine: decode tokens/s of one chat replying under a JSON schema, with jump-forward
     and without, against the same chat unconstrained; all greedy, side by side in one run
     (the three take turns, --rounds times; the median of each).
     Schema-heavy output (keys, brackets, enums) is where jump-forward drafts forced text.
  3. Applying a mask to the logits: the engine's kernel against xgrammar's CPU kernel.
  4. The cost of a compile: the first request with a schema (compile included) against the
     second (cached).
Prints a table and writes bench/results/grammar-<time>.json.

    python bench/grammar.py [--tokens 160] [--threads 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.machine import cpu_flags, cpu_model, write_results  # noqa: E402

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


def mask_apply(vocab: int) -> dict:
    """Applying a packed mask to one row of logits: the engine's kernel (kernels/token_mask.py)
    against xgrammar's own CPU kernel, for a mask allowing one token, about 500, or all but 4."""
    import xgrammar as xgr
    from localpaged.kernels import cpu_extension, token_mask
    if not cpu_extension.BUILD.wait():
        print("the CPU extension is not built: 'ours' is the plain-torch reference")
    words = (vocab + 31) // 32
    allowed = {"one": [1000], "some": list(range(0, vocab, 97)),
               "most": [t for t in range(vocab) if t not in (5, 6, 7, 40000)]}
    out = {}
    for name, ids in allowed.items():
        bits = torch.zeros(vocab + (-vocab) % 32, dtype=torch.bool)
        bits[ids] = True
        weights = (1 << torch.arange(32, dtype=torch.int64))
        packed = (bits.view(words, 32).long() * weights).sum(1)
        bitmask = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)[None]
        logits = torch.randn(1, vocab)
        for label, apply in (("ours", lambda: token_mask.mask_logits_(logits, bitmask)),
                             ("xgrammar", lambda: xgr.apply_token_bitmask_inplace(logits, bitmask))):
            apply()
            reps = 2000
            start = time.perf_counter()
            for _ in range(reps):
                apply()
            out[f"{name}_{label}_us"] = (time.perf_counter() - start) / reps * 1e6
    return out


def engine_runs(path: str, tokens: int, rounds: int) -> dict:
    """Each run `rounds` times, the runs taking turns in a rotating order (one engine per
    jump-forward setting, loaded and warmed once), so a slow moment of the machine falls on
    every run alike; the median is the figure."""
    from localpaged import LLM, SamplingParams
    from localpaged.core.guided import GuidedDecoding
    messages = [{"role": "user", "content": "List six support tickets as JSON records with an id, "
                 "a status, a priority and whether each is done."}]
    guided = GuidedDecoding.json_schema(SCHEMAS["records"])
    engines = {jump: LLM(path, jump_forward=jump) for jump in (True, False)}
    prompt = engines[True].apply_chat_template(messages)
    runs = {"unconstrained": (True, None), "schema": (True, guided), "schema_no_jump": (False, guided)}
    params = {name: SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=spec is None,
                                   guided=spec) for name, (_, spec) in runs.items()}
    for name, (jump, _) in runs.items():                                      # warm
        engines[jump].generate([prompt], params[name])
    out = {name: {"tok_s_each": []} for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            llm = engines[runs[name][0]]
            before = llm.engine.jump_forward_tokens
            start = time.perf_counter()
            c = llm.generate([prompt], params[name])[0].outputs[0]
            seconds = time.perf_counter() - start
            out[name]["tok_s_each"].append(len(c.token_ids) / seconds)
            out[name].update(tokens=len(c.token_ids), finish=c.finish_reason, text=c.text[:200],
                             jump_forward_tokens=llm.engine.jump_forward_tokens - before)
    for r in out.values():
        r["tok_s"] = statistics.median(r["tok_s_each"])
    for name in ("schema", "schema_no_jump"):   # the compile: a new schema's first request and its second
        llm = engines[runs[name][0]]
        fresh = GuidedDecoding.json_schema(dict(SCHEMAS["person"], title=f"t{name}"))
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
    ap.add_argument("--rounds", type=int, default=5, help="runs of each, taking turns (median)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from localpaged.runner import gguf_meta, model_source
    path = model_source.bundled_gguf_path()
    tok = gguf_meta.config_and_tokenizer(os.path.dirname(path), os.path.basename(path))[1]
    result = {"machine": {"cpu": cpu_model(), "features": cpu_flags(), "threads": args.threads,
                          "torch": torch.__version__},
              "command": " ".join(["python", "bench/grammar.py"] + sys.argv[1:]),
              "libraries": libraries(tok, len(tok)), "mask_apply": mask_apply(len(tok)),
              "engine": engine_runs(path, args.tokens, args.rounds)}
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
    apply = result["mask_apply"]
    print("mask applied to one row of logits, us: " + ", ".join(
        f"{name} ours {apply[name + '_ours_us']:.1f} / xgrammar {apply[name + '_xgrammar_us']:.1f}"
        for name in ("one", "some", "most")))
    base = eng["unconstrained"]["tok_s"]
    print("| run | tokens | tok/s (median) | vs unconstrained | jump-forward tokens | finish | "
          "tok/s of each round |\n|---|---:|---:|---:|---:|---|---|")
    for name, r in eng.items():
        each = " ".join(f"{x:.0f}" for x in r["tok_s_each"])
        print(f"| {name} | {r['tokens']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | "
              f"{r['jump_forward_tokens']} | {r['finish']} | {each} |")
    for name in ("schema", "schema_no_jump"):
        print(f"{name}: a new schema's first request {eng[name]['first_request_ms']:.1f} ms, "
              f"cached {eng[name]['cached_request_ms']:.1f} ms")
    write_results("grammar", result)


if __name__ == "__main__":
    main()
