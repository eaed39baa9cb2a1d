"""One conversation at a time: TTFT and decode tokens/s, localpaged vs transformers vs llama.cpp.

On the bundled SmolLM2 GGUF (or --gguf), greedy, one request at a time:
  * a short chat (chat prompt, --short-tokens new tokens) and a ~1,000-token conversation;
  * localpaged in float32 and bfloat16 (and int8/int4 when LLM accepts `quantization=`);
  * transformers fp32 on the same weights (dequantized from the GGUF);
  * llama.cpp (llama-cpp-python, the GGUF as is) when installed, else a note;
  * regenerate of the long conversation: TTFT cold (empty prefix cache) vs hot (cached prefix);
  * a per-step breakdown of one decode (scheduler, prepare, forward, logits, sample+finish),
    and, from torch.profiler, the time per step inside matmuls vs outside them;
  * UI-visible TTFT: first content chunk of the OpenAI API's stream, through a real server;
  * --disk-restart: the next message of a ~2,000-token conversation after a restart, with the
    KV disk tier (read back at admission, or prefetched) and without it.
Prints a table and writes bench/results/latency-<time>.json. The runs are side by side in one
process: compare ratios, not absolute times, on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from localpaged import LLM, SamplingParams  # noqa: E402
from localpaged.runner.model_source import bundled_gguf_path  # noqa: E402

# aten::bmm: models.linear's float32 one-row path; localpaged::int4_matmul: the CPU extension's
# int4 kernel. Decode attention (a C++ kernel or SDPA) counts as outside the matmuls.
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm_for_cpu", "aten::linear", "localpaged::int4_matmul")
PARAGRAPH = ("The lighthouse keeper wrote every evening about the weather, the ships that "
             "passed, and the small repairs the old tower needed. ")


def short_chat() -> list[dict]:
    return [{"role": "user", "content": "Write a short poem about the sea at night."}]


def long_chat(target_tokens: int, tokenizer) -> list[dict]:
    """A conversation of about target_tokens prompt tokens (alternating turns)."""
    msgs: list[dict] = []
    while True:
        msgs += [{"role": "user", "content": "Tell me more. " + PARAGRAPH * 3},
                 {"role": "assistant", "content": PARAGRAPH * 3}]
        ids = tokenizer.apply_chat_template(msgs + [{"role": "user", "content": "Summarize."}],
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        if len(ids) >= target_tokens:
            return msgs + [{"role": "user", "content": "Summarize."}]


# ---- localpaged ---------------------------------------------------------------------------------
def lp_run(llm: LLM, prompt: list[int], max_tokens: int) -> dict:
    """TTFT and decode tok/s of one greedy request (fixed length: ignore_eos)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.monotonic()
    out = llm.generate(prompt, params)[0]
    m = out.metrics
    ttft = m.first_token_time - start
    decode_s = m.finished_time - m.first_token_time
    n = len(out.outputs[0].token_ids)
    return {"ttft_ms": round(1000 * ttft, 1),
            "decode_tok_s": round((n - 1) / decode_s, 2) if decode_s > 0 else None,
            "tokens": n}


def lp_breakdown(llm: LLM, prompt: list[int], steps: int) -> dict:
    """Per-step phases (StepTimings, where the engine has it) and matmul vs the rest (profiler)."""
    eng = llm.engine
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    result: dict = {}
    try:
        from localpaged.runner.model_runner import StepTimings
    except ImportError:                       # an engine without the timing hook
        StepTimings = None
    if StepTimings is not None:
        timings = StepTimings(sync_cuda=eng.device.type == "cuda")
        eng.add_request(None, prompt, params)
        eng.step()                            # prefill
        while eng.has_unfinished_requests():
            eng.step(timings)
        result["phases_ms"] = {k: round(v, 3) for k, v in timings.per_step_ms().items()}
    from torch.profiler import profile
    eng.add_request(None, prompt, params)
    eng.step()
    n = 0
    with profile() as prof:
        start, cpu_start = time.perf_counter(), time.thread_time()
        while eng.has_unfinished_requests():
            eng.step()
            n += 1
        wall, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
    matmul_us = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMUL_OPS)
    # ops dispatched from Python (top-level events), matmuls excepted: a load-independent count
    top = [e for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::")]
    result["profiled_step_ms"] = round(1000 * wall / n, 2)
    result["thread_cpu_ms_per_step"] = round(1000 * cpu / n, 2)
    result["matmul_ms_per_step"] = round(matmul_us / 1000 / n, 2)
    result["outside_matmul_ms_per_step"] = round(1000 * wall / n - matmul_us / 1000 / n, 2)
    result["ops_outside_matmul_per_step"] = round(
        sum(1 for e in top if e.name not in MATMUL_OPS) / n, 1)
    return result


def api_ttft(llm: LLM, messages: list[dict], repeats: int = 3) -> dict:
    """Time from sending a streaming chat request to its first content chunk (real server),
    beside the first output of the same kind of request submitted to the AsyncEngine directly.
    Only the engine thread touches the engine here; each request is a new prompt (cold)."""
    import httpx

    from localpaged.api.server import build_app, make_server, start_in_thread
    from localpaged.engine.async_engine import AsyncEngine
    engine = AsyncEngine(llm.engine)
    server = make_server(build_app(engine, "m"), "127.0.0.1", 0, log_level="warning")
    start_in_thread(server)
    port = server.servers[0].sockets[0].getsockname()[1]
    firsts, direct = [], []

    def fresh(i: int) -> list[dict]:
        return [{"role": "user", "content": f"{i}. " + messages[-1]["content"]}]
    try:
        with httpx.Client(timeout=300) as client:
            for i in range(repeats):
                body = {"model": "m", "messages": fresh(2 * i), "max_tokens": 8, "temperature": 0,
                        "stream": True}
                start, first = time.monotonic(), None
                with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                                   json=body) as resp:
                    for line in resp.iter_lines():
                        if first is None and '"content": "' in line and '"content": ""' not in line:
                            first = time.monotonic() - start
                firsts.append(first)
                ids = llm.apply_chat_template(fresh(2 * i + 1))
                start = time.monotonic()
                for out in engine.submit(ids, SamplingParams(max_tokens=8, temperature=0.0)):
                    if out.outputs[0].text:
                        direct.append(time.monotonic() - start)
                        break
    finally:
        server.should_exit = True
        engine.shutdown()
    best = min(f for f in firsts if f is not None)
    return {"api_first_content_ms": round(1000 * best, 1),
            "engine_first_text_ms": round(1000 * min(direct), 1)}


def localpaged_rows(gguf: str, args, prompts: dict[str, list[int]], messages) -> list[dict]:
    rows = []
    variants = [("fp32", {"dtype": "float32", "quantization": "none"}),
                ("bf16", {"dtype": "bfloat16", "quantization": "none"}),
                ("int8", {"dtype": "float32", "quantization": "int8"}),
                ("int4", {"dtype": "float32", "quantization": "int4"}),
                # the same with every step's layer loop in Python (runner/batch1_cpu.py off)
                ("int4 --eager", {"dtype": "float32", "quantization": "int4", "enforce_eager": True})]
    for name, kwargs in variants:
        if args.only_fp32 and name != "fp32":
            continue
        try:
            llm = LLM(gguf, num_kv_blocks=args.kv_blocks, **kwargs)
        except (TypeError, ValueError) as exc:   # quantization= absent or refused: skip
            print(f"localpaged {name}: skipped ({str(exc).splitlines()[0][:90]})")
            continue
        batch1 = getattr(llm.engine.runner, "batch1", None)
        if batch1 is not None:
            batch1.wait()                        # the C++ decode loop, built once per machine
        lp_run(llm, prompts["short"], 4)         # warm-up
        row = {"engine": f"localpaged {name}"}
        llm.reset_prefix_cache()
        row["short"] = lp_run(llm, prompts["short"], args.short_tokens)
        llm.reset_prefix_cache()
        row["long"] = lp_run(llm, prompts["long"], args.long_tokens)
        row["long_regenerate_hot"] = lp_run(llm, prompts["long"], args.long_tokens)
        if name in ("fp32", "int4"):
            llm.reset_prefix_cache()
            row["breakdown"] = lp_breakdown(llm, prompts["short"], args.short_tokens)
        if name == "fp32" and not args.no_api:
            row["api"] = api_ttft(llm, messages)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del llm
    return rows


# ---- the KV disk tier across a restart -----------------------------------------------------------
def disk_restart(gguf: str, args, tok, chat) -> dict:
    """A ~--disk-prompt-token conversation answered by an engine with the disk tier, that engine
    gone ("the app restarted"), then one more message: TTFT of a new engine with the tier
    (reading the prefix back at admission, and after `prefetch` as an opened tab does) vs a
    new engine without it; the replies must be token-identical (greedy)."""
    import tempfile
    first = long_chat(args.disk_prompt, tok)
    kw = dict(num_kv_blocks=args.kv_blocks, dtype="float32", quantization="none")
    with tempfile.TemporaryDirectory(prefix="kv-disk-") as folder:
        before = LLM(gguf, kv_disk_dir=folder, **kw)
        reply = before.generate(chat(first), SamplingParams(max_tokens=32, temperature=0.0))[0]
        before.engine.kv_disk.flush()
        stored = before.stats().kv_disk
        del before
        second = chat(first + [{"role": "assistant", "content": reply.outputs[0].text},
                               {"role": "user", "content": "One more thing: a title for it?"}])
        runs = {}
        for name, disk, prefetch in (("tier off", None, False), ("tier on", folder, False),
                                     ("tier on, prefetched", folder, True)):
            llm = LLM(gguf, kv_disk_dir=disk, **kw)
            lp_run(llm, chat(short_chat()), 2)               # warm-up (a prefix of nothing here)
            read_s = None
            if prefetch:
                t = time.monotonic()
                while llm.engine.prefetch(second):
                    pass
                read_s = round(time.monotonic() - t, 3)
            params = SamplingParams(max_tokens=args.long_tokens, temperature=0.0, ignore_eos=True)
            start = time.monotonic()
            out = llm.generate(second, params)[0]
            runs[name] = {"ttft_ms": round(1000 * (out.metrics.first_token_time - start), 1),
                          "cached_tokens": out.metrics.num_cached_tokens,
                          "disk_tokens": out.metrics.num_disk_tokens,
                          "prefetch_s": read_s, "token_ids": out.outputs[0].token_ids}
            del llm
    off = runs["tier off"]
    off_ids = off["token_ids"]
    result = {"prompt_tokens": len(second), "stored_blocks": stored.num_blocks,
              "stored_mib": round(stored.num_bytes / 2**20, 1)}
    for name, r in runs.items():
        r["identical"] = r.pop("token_ids") == off_ids
        r["ttft_vs_off"] = round(r["ttft_ms"] / off["ttft_ms"], 3)
        result[name] = r
        print(f"{name:22s} TTFT {r['ttft_ms']:8.1f} ms ({100 * r['ttft_vs_off']:5.1f}% of off) · "
              f"{r['cached_tokens']} cached, {r['disk_tokens']} from disk · same tokens: "
              f"{r['identical']}" + (f" · prefetch {r['prefetch_s']} s" if r["prefetch_s"] else ""),
              flush=True)
    return result


# ---- peers --------------------------------------------------------------------------------------
@torch.inference_mode()
def hf_row(gguf: str, prompts: dict[str, list[int]], args) -> dict:
    from peers import load_hf
    model = load_hf(gguf, torch.float32)

    def run(prompt: list[int], n: int) -> dict:
        ids = torch.tensor([prompt])
        kw = dict(do_sample=False, pad_token_id=0)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        total = time.perf_counter() - start
        return _timing(ttft, total, out.shape[1] - len(prompt))

    return _peer_row("transformers fp32", run, prompts, args)


def llama_cpp_row(gguf: str, prompts: dict[str, list[int]], args) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama.cpp: skipped (llama-cpp-python is not installed)")
        return None
    llm = Llama(gguf, n_ctx=4096, n_threads=os.cpu_count(), verbose=False)

    def run(prompt: list[int], n: int) -> dict:
        llm.reset()
        start = time.perf_counter()
        first = None
        for i, _tok in enumerate(llm.generate(prompt, temp=0.0)):
            if first is None:
                first = time.perf_counter() - start
            if i + 1 >= n:
                break
        return _timing(first, time.perf_counter() - start, n)

    return _peer_row("llama.cpp Q4_1", run, prompts, args)


def _timing(ttft: float, total: float, tokens: int) -> dict:
    return {"ttft_ms": round(1000 * ttft, 1),
            "decode_tok_s": round((tokens - 1) / max(1e-9, total - ttft), 2), "tokens": tokens}


def _peer_row(name: str, run, prompts: dict[str, list[int]], args) -> dict:
    run(prompts["short"], 4)                  # warm-up
    row = {"engine": name, "short": run(prompts["short"], args.short_tokens),
           "long": run(prompts["long"], args.long_tokens)}
    print(json.dumps(row), flush=True)
    return row


# ---- GPU: batch-1 decode with and without CUDA graphs --------------------------------------------
def cuda_graphs_check(gguf: str, args) -> dict:
    """Batch-1 greedy decode on CUDA, eager vs graphs: tok/s, equal tokens, HBM fraction."""
    prompt = list(range(1, 33))
    params = SamplingParams(max_tokens=args.short_tokens * 2, temperature=0.0, ignore_eos=True)
    result: dict = {"dtype": args.gpu_dtype}
    tokens = {}
    for name, eager in (("eager", True), ("graphs", False)):
        llm = LLM(gguf, device="cuda", dtype=args.gpu_dtype, enforce_eager=eager,
                  quantization="none", max_num_seqs=16, num_kv_blocks=256)
        result[f"{name}_graphs_captured"] = llm.engine.runner.graphs is not None
        llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0))     # warm-up
        torch.cuda.synchronize()
        run = lp_run(llm, prompt, params.max_tokens)
        tokens[name] = llm.generate(prompt, params)[0].outputs[0].token_ids
        result[f"{name}_decode_tok_s"] = run["decode_tok_s"]
        weight_bytes = sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())
        result["weight_bytes"] = weight_bytes
        result[f"{name}_hbm_fraction"] = round(weight_bytes * run["decode_tok_s"]
                                               / (args.hbm_gbps * 1e9), 4)
        del llm
        torch.cuda.empty_cache()
    result["tokens_equal"] = tokens["eager"] == tokens["graphs"]
    result["speedup"] = round(result["graphs_decode_tok_s"] / result["eager_decode_tok_s"], 2)
    print(json.dumps(result), flush=True)
    return result


# ---- report -------------------------------------------------------------------------------------
def print_table(rows: list[dict]) -> None:
    head = f"{'engine':<20} {'short TTFT ms':>13} {'short tok/s':>11} {'long TTFT ms':>12} " \
           f"{'long tok/s':>10} {'regen TTFT ms':>13}"
    print(head)
    print("-" * len(head))
    for r in rows:
        hot = r.get("long_regenerate_hot", {}).get("ttft_ms", "")
        print(f"{r['engine']:<20} {r['short']['ttft_ms']:>13} {r['short']['decode_tok_s']:>11} "
              f"{r['long']['ttft_ms']:>12} {r['long']['decode_tok_s']:>10} {hot:>13}")
    for r in rows:
        if "breakdown" in r:
            print(f"{r['engine']} per decode step: {r['breakdown']}")
        if "api" in r:
            print(f"{r['engine']} UI-visible TTFT through the API stream: {r['api']}")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default=None, help="default: the bundled SmolLM2 Q4_1 GGUF")
    p.add_argument("--short-tokens", type=int, default=64)
    p.add_argument("--long-prompt", type=int, default=1000, help="tokens in the long conversation")
    p.add_argument("--long-tokens", type=int, default=32)
    p.add_argument("--kv-blocks", type=int, default=512)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--only-fp32", action="store_true", help="localpaged fp32 only")
    p.add_argument("--no-peers", action="store_true", help="skip transformers and llama.cpp")
    p.add_argument("--no-api", action="store_true", help="skip the API stream measurement")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/latency-*.json)")
    p.add_argument("--disk-restart", action="store_true",
                   help="only: the next message of a conversation after a restart, KV disk tier "
                        "on vs off (TTFT, same tokens)")
    p.add_argument("--disk-prompt", type=int, default=2000, help="tokens of that conversation")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="only: batch-1 decode on CUDA with and without graphs (gpu_check.sh)")
    p.add_argument("--gpu-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--hbm-gbps", type=float, default=4800.0, help="peak HBM GB/s (H200: 4800)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    gguf = args.gguf or bundled_gguf_path()
    if args.cuda_graphs:
        result = {"cuda_graphs": cuda_graphs_check(gguf, args)}
        _write(result, args.out, "cuda-graphs")
        return result
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    messages = short_chat()
    chat = lambda m: list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,  # noqa: E731
                                                  return_dict=False))
    if args.disk_restart:
        result = {"disk_restart": disk_restart(gguf, args, tok, chat),
                  "gguf": os.path.basename(gguf), "torch_threads": torch.get_num_threads(),
                  "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        _write(result, args.out, "kv-disk-restart")
        return result
    prompts = {"short": chat(messages), "long": chat(long_chat(args.long_prompt, tok))}
    print(f"prompts: short {len(prompts['short'])} tokens, long {len(prompts['long'])} tokens; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    rows = localpaged_rows(gguf, args, prompts, messages)
    if not args.no_peers:
        rows.append(hf_row(gguf, prompts, args))
        cpp = llama_cpp_row(gguf, prompts, args)
        if cpp:
            rows.append(cpp)
    print_table(rows)
    result = {"gguf": os.path.basename(gguf), "args": vars(args), "rows": rows,
              "prompt_tokens": {k: len(v) for k, v in prompts.items()},
              "torch_threads": torch.get_num_threads(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    _write(result, args.out, "latency")
    return result


def _write(result: dict, path: str | None, stem: str) -> None:
    out = Path(path) if path else (Path(__file__).parent / "results" /
                                   f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
