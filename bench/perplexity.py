"""Perplexity of the bundled SmolLM2 on tests/data/paragraph.txt: localpaged fp32 / int8 / int4
(through prompt logprobs, as an evaluation client would) beside llama.cpp on the same GGUF and the
same token ids, in one run. `--record` writes llama.cpp's figure to tests/data/ for the quality
test (tests/quant/test_quant_smollm2.py), which cannot run llama.cpp itself.

Then GGUF block formats kept natively (quantization "auto"; on CPU the extension's GGML kernel)
against llama.cpp on the same file and the same ids, on a longer text: LONG_SOURCES as of
LONG_COMMIT (git show, so that the text stays put while the documents change), concatenated,
tokenized, cut into `--windows` consecutive windows of WINDOW tokens, each evaluated on its own
(as llama.cpp's perplexity tool does with its chunks); the perplexity is exp(mean NLL) over all
windows. Files: the bundled Q4_1, and a Q4_K_M file that llama.cpp's quantizer makes once from it
(llama_model_quantize, allow_requantize) in CACHE. SmolLM2's hidden size 576 is not a multiple of
256, so llama.cpp falls back to other formats for the tensors whose rows are 576 long: the tensor
types of each file are listed. Needs llama-cpp-python for that part; `--no-native` skips it.

Why several windows and a standard error: both engines quantize activations to int8 per block
(llama.cpp's CPU backend for its quantized weights; ours as it does), and SmolLM2's
down-projection inputs hold outliers (large values in a 256-element block make its rounding step
coarse), so a float-rounding difference anywhere can flip an int8 rounding and move the following
logprobs. Per token, ours and llama.cpp differ, uncorrelated between tokens, by about as much as
llama.cpp with its default F16 KV cache differs from llama.cpp with an F32 one, so one window's
perplexity ratio carries a standard error that more windows shrink (docs/benchmarks.md, 'Real
models', has the figures). The table gives the ratio with 2 standard errors (from the per-token
differences) and each window's ratio.

    python bench/perplexity.py [--record] [--no-native] [--windows N]
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
from localpaged.core.sampling_params import SamplingParams
from localpaged.runner import model_source
from localpaged.runner.prompt_logprobs import perplexity

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "..", "tests", "data", "paragraph.txt")
RECORD = os.path.join(HERE, "..", "tests", "data", "paragraph_llamacpp.json")
ROOT = os.path.join(HERE, "..")
# The longer text: these files as they were at LONG_COMMIT (git show), so that it stays the same
# while the documents change
LONG_SOURCES = ("tests/data/paragraph.txt", "README.md", "docs/architecture.md")
LONG_COMMIT = "ec8a442db331574ad8629b544de1431db8ca19c9"
WINDOW = 1024
WINDOWS = 8
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "localpaged-bench")


def llamacpp_perplexity(gguf: str, ids: list[int]) -> float:
    return math.exp(-float(llamacpp_logprobs(gguf, [ids])[0].mean()))


def llamacpp_logprobs(gguf: str, windows: list[list[int]]) -> list[torch.Tensor]:
    """llama.cpp's logprob of each token after the first, per window (float64; its default
    settings; each window in a fresh context)."""
    from llama_cpp import Llama
    n = max(len(w) for w in windows)
    llm = Llama(gguf, logits_all=True, n_ctx=max(512, n), n_batch=max(512, n), n_threads=2,
                verbose=False)
    out = []
    for ids in windows:
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(ids)
        logits = torch.tensor(llm.scores[:len(ids)], dtype=torch.float64)
        lps = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])
        out.append(lps.squeeze(1))
    llm.close()
    return out


def our_logprobs(llm, ids: list[int]) -> torch.Tensor:
    """Our logprob of each token after the first, through prompt logprobs (as perplexity())."""
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    return torch.tensor([e.logprob for e in out.prompt_logprobs[1:]], dtype=torch.float64)


def q4_k_m_file(source: str) -> str:
    """SmolLM2 quantized to Q4_K_M by llama.cpp's quantizer from the bundled Q4_1 file, made once
    into CACHE (named after the source file and its size)."""
    name = os.path.basename(source).replace(".Q4_1.gguf", "").removesuffix(".gguf")
    dst = os.path.join(CACHE, f"{name}-{os.path.getsize(source)}.Q4_K_M.gguf")
    if not os.path.exists(dst):
        import ctypes

        import llama_cpp
        os.makedirs(CACHE, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
        params.allow_requantize = True
        params.nthread = os.cpu_count() or 1
        tmp = dst + ".part"
        rc = llama_cpp.llama_model_quantize(source.encode(), tmp.encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize returned {rc} for {source}")
        os.replace(tmp, dst)
    return dst


def tensor_types(path: str) -> dict[str, list[str]]:
    """Tensor names by GGML type, in file order."""
    from localpaged.quant.gguf_file import GgufFile
    out: dict[str, list[str]] = {}
    for t in GgufFile(path).tensors:
        out.setdefault(t.kind, []).append(t.name)
    return out


def describe_types(types: dict[str, list[str]]) -> list[str]:
    """One line per type: its count and its tensors, with the block number folded (blk.N.)."""
    import re
    lines = []
    for kind, names in sorted(types.items(), key=lambda kv: -len(kv[1])):
        folded: dict[str, list[int]] = {}
        for n in names:
            m = re.match(r"blk\.(\d+)\.(.*)", n)
            key, block = (m.group(2), int(m.group(1))) if m else (n, -1)
            folded.setdefault(key, []).append(block)
        parts = [k if blocks == [-1] else f"{k} (blocks {_ranges(blocks)})"
                 for k, blocks in folded.items()]
        lines.append(f"{kind:<6}{len(names):>4}  {', '.join(parts)}")
    return lines


def _ranges(blocks: list[int]) -> str:
    blocks, out, i = sorted(blocks), [], 0
    while i < len(blocks):
        j = i
        while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
            j += 1
        out.append(str(blocks[i]) if i == j else f"{blocks[i]}-{blocks[j]}")
        i = j + 1
    return ",".join(out)


def long_text() -> str:
    import subprocess
    return "\n\n".join(
        subprocess.run(["git", "-C", ROOT, "show", f"{LONG_COMMIT}:{p}"], check=True,
                       capture_output=True, text=True).stdout.strip() for p in LONG_SOURCES)


def long_windows(tokenizer, windows: int) -> list[list[int]]:
    text = long_text()
    ids = tokenizer(text)["input_ids"]
    if len(ids) < windows * WINDOW:
        raise ValueError(f"{LONG_SOURCES} hold {len(ids)} tokens, fewer than {windows} x {WINDOW}")
    return [ids[i * WINDOW:(i + 1) * WINDOW] for i in range(windows)]


def ppl(lps: torch.Tensor) -> float:
    return math.exp(-float(lps.mean()))


def native_rows(windows: int) -> dict:
    """GGUF formats kept natively (auto) vs llama.cpp on the same file and ids: the bundled Q4_1
    and llama.cpp's Q4_K_M of it."""
    from localpaged.kernels import cpu_extension
    bundled = model_source.bundled_gguf_path()
    kernel = cpu_extension.BUILD.wait() and hasattr(cpu_extension.BUILD.module, "ggml_matmul")
    print(f"CPU extension GGML kernel: {'yes' if kernel else 'NO (auto requantizes)'}")
    rows: dict = {}
    for label, path in (("Q4_1 (bundled)", bundled), ("Q4_K_M", q4_k_m_file(bundled))):
        types = tensor_types(path)
        print(f"\n{label}: {os.path.relpath(path) if path.startswith(ROOT) else path}")
        for line in describe_types(types):
            print(f"  {line}")
        llm = LLM(path, quantization="auto", num_kv_blocks=WINDOW // 16 + 2)
        chunks = long_windows(llm.tokenizer, windows)
        start = time.perf_counter()
        ours = [our_logprobs(llm, ids) for ids in chunks]
        ours_s = time.perf_counter() - start
        weights = llm.stats().weights_format
        del llm
        start = time.perf_counter()
        theirs = llamacpp_logprobs(path, chunks)
        theirs_s = time.perf_counter() - start
        d = torch.cat(ours) - torch.cat(theirs)        # log(ratio) = -mean(d)
        sem = float(d.std() / math.sqrt(d.numel()))
        rows[label] = {"file": path, "tensor_types": {k: len(v) for k, v in types.items()},
                       "tensors_by_type": types, "weights": weights,
                       "perplexity": ppl(torch.cat(ours)),
                       "llama.cpp perplexity": ppl(torch.cat(theirs)),
                       "ratio": ppl(torch.cat(ours)) / ppl(torch.cat(theirs)),
                       "ratio 2 s.e. (relative)": 2 * sem,
                       "per-token |logprob difference| mean": float(d.abs().mean()),
                       "windows": {"ours": [ppl(v) for v in ours],
                                   "llama.cpp": [ppl(v) for v in theirs],
                                   "ratio": [ppl(a) / ppl(b) for a, b in zip(ours, theirs)]},
                       "seconds": {"ours": ours_s, "llama.cpp": theirs_s}}
    print(f"\n{windows} windows of {WINDOW} tokens of {' + '.join(LONG_SOURCES)} "
          f"(at {LONG_COMMIT[:7]})")
    print(f"{'file':<16}{'weights (ours, auto)':<24}{'ours':>10}{'llama.cpp':>11}{'ratio':>9}"
          f"{'± 2 s.e.':>10}{'mean |d lp|':>12}  ratio per window")
    for label, r in rows.items():
        print(f"{label:<16}{r['weights']:<24}{r['perplexity']:>10.3f}"
              f"{r['llama.cpp perplexity']:>11.3f}{r['ratio']:>9.4f}"
              f"{r['ratio 2 s.e. (relative)']:>10.2%}"
              f"{r['per-token |logprob difference| mean']:>12.3f}  "
              + " ".join(f"{v:.4f}" for v in r["windows"]["ratio"]))
    return {"windows": windows, "window": WINDOW, "text": list(LONG_SOURCES),
            "text_commit": LONG_COMMIT, "kernel": kernel,
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help=f"write llama.cpp's figure to {RECORD}")
    ap.add_argument("--no-native", action="store_true",
                    help="skip the GGUF-native rows (Q4_1, Q4_K_M vs llama.cpp on a longer text)")
    ap.add_argument("--windows", type=int, default=WINDOWS,
                    help=f"windows of {WINDOW} tokens for the GGUF-native rows (default {WINDOWS})")
    args = ap.parse_args()
    gguf = model_source.bundled_gguf_path()
    with open(TEXT) as f:
        text = f.read().strip()
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
    native = None
    if not args.no_native:
        try:
            native = native_rows(args.windows)
        except ImportError:
            print("llama-cpp-python is not installed: the GGUF-native rows skipped", file=sys.stderr)
    out = os.path.join(HERE, "results", f"perplexity-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump({"tokens": len(ids), "results": results, "native": native}, f, indent=2)
    if args.record and "llama.cpp Q4_1" in results:
        with open(RECORD, "w") as f:
            json.dump({"llama.cpp Q4_1": results["llama.cpp Q4_1"]["perplexity"],
                       "transformers-equal fp32 (localpaged none)": fp32, "tokens": len(ids),
                       "command": "python bench/perplexity.py --record",
                       "llama-cpp-python": __import__("llama_cpp").__version__}, f, indent=2)
        print(f"recorded in {os.path.relpath(RECORD)}")


if __name__ == "__main__":
    main()
