"""One conversation, decode tokens/s and load memory, per weight format, one run side by side.

    python bench/quant_decode.py [--model X.gguf] [--max-tokens 64]

Each format loads in its own subprocess so its peak RSS while loading is its own: reported as
(peak - RSS before loading) against (RSS after loading - RSS before loading), i.e. what
`loader.load` added (config, tokenizer and weights; no KV cache). Greedy, ignore_eos, the same chat prompt; tokens/s over the decode steps only.
Writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

FORMATS = ["none", "int8", "auto"]
PROMPT = [{"role": "user", "content": "Explain in a paragraph what a CPU does."}]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(model: str, quantization: str, max_tokens: int) -> dict:
    import gc

    import torch

    from localpaged import LLM, SamplingParams, loader
    from localpaged.quant.linear import weights_summary
    import transformers  # noqa: F401 - imported before the baseline is taken
    before = _rss_mb()
    t0 = time.perf_counter()
    loaded = loader.load(model, torch.device("cpu"), torch.float32, quantization=quantization)
    load_s = time.perf_counter() - t0
    after = _rss_mb()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    weights_mb = weights_summary(loaded.model)[0] / 2**20
    del loaded
    gc.collect()
    llm = LLM(model, quantization=quantization, num_kv_blocks=64)
    ids = llm.apply_chat_template(PROMPT)
    p = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=4))     # warm-up
    eng = llm.engine
    eng.add_request("r", ids, p)
    eng.step()                                                            # prefill + first token
    t0, steps = time.perf_counter(), 0
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    dt = time.perf_counter() - t0
    s = llm.stats()
    return {"quantization": quantization, "weights": s.weights_format, "weights_bytes": s.weights_bytes,
            "decode_tok_s": steps / dt, "load_s": load_s, "rss_before_mb": before,
            "rss_after_mb": after, "rss_peak_mb": peak, "weights_mb": weights_mb,
            "load_peak_over_final": (peak - before) / max(1e-9, after - before)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model is None:
        from localpaged import loader
        args.model = loader.bundled_gguf_path()
    if args.child:
        print(json.dumps(child(args.model, args.child, args.max_tokens)))
        return
    rows = []
    for q in FORMATS:
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", q,
                              "--max-tokens", str(args.max_tokens)], capture_output=True, text=True,
                             check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{q:5s} {r['weights']:24s} decode {r['decode_tok_s']:6.1f} tok/s  "
              f"load +{r['rss_after_mb'] - r['rss_before_mb']:.0f} MB, peak +"
              f"{r['rss_peak_mb'] - r['rss_before_mb']:.0f} MB ({r['load_peak_over_final']:.2f}x)",
              flush=True)
    base = rows[0]["decode_tok_s"]
    for r in rows:
        print(f"{r['quantization']:5s} {r['decode_tok_s'] / base:.2f}x fp32")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results", f"quant-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
