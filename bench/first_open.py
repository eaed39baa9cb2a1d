"""The first open of a GGUF file: `LLM(path)` to ready, and the config and tokenizer alone.

    python bench/first_open.py [--model FILE ...] [--rounds 3] [--meta-module FILE] [--transformers]

Each figure is one fresh Python process (nothing of an earlier run in memory), its median over
--rounds; the file is read once beforehand (warm in the page cache), and $LOCALPAGED_CACHE_DIR
(runner/gguf_meta.py) is an empty folder for every process, so nothing converted before is found.
Per model:
- open: seconds from `LLM(path)` called to it returning (imports done, and the CPU extension
  loaded from its cache, before);
- meta: `gguf_meta.config_and_tokenizer(folder, file)` alone (what the loader calls);
- tokenizer: the tokenizer alone, read from the file: `tokenizer_from_metadata(read_metadata)`,
  or with --transformers transformers' conversion, `AutoTokenizer.from_pretrained(gguf_file=)`;
- extension: the CPU extension's load from its cache, in the same processes (a run in which it
  compiled instead, its sources changed meanwhile, is run again).
--meta-module FILE runs every measure with FILE in place of runner/gguf_meta.py (another
version of it, e.g. `git show <commit>:localpaged/runner/gguf_meta.py > old.py`), the rest of the
tree as it is: the same load with that version's config and tokenizer.
Models: the bundled SmolLM2 and Gemma 3 270M unless --model is given. The machine's load average
is recorded beside the figures (a shared machine's waits are in them). Writes
bench/results/first_open-<time>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.machine import cpu_flags, cpu_model, write_results  # noqa: E402

MEASURES = ("open", "meta", "tokenizer")
COMPILED_S = 20.0       # the extension took longer to be ready: compiled, not loaded from cache

CHILD = r"""
import importlib.util, json, os, sys, time
measure, path, meta_module, transformers_tokenizer = sys.argv[1:5]
if meta_module:                       # another version of runner/gguf_meta.py, in its place
    spec = importlib.util.spec_from_file_location("localpaged.runner.gguf_meta", meta_module)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
from localpaged import LLM
from localpaged.kernels import cpu_extension
from localpaged.runner import gguf_meta
folder, name = os.path.split(path)
start = time.perf_counter()
cpu_extension.BUILD.wait(1800)        # the kernels first: their cached load is timed apart
extension = time.perf_counter() - start
if measure == "open":
    start = time.perf_counter()
    LLM(path)
elif measure == "meta":
    start = time.perf_counter()
    gguf_meta.config_and_tokenizer(folder, name)
elif transformers_tokenizer == "1":
    from transformers import AutoTokenizer
    start = time.perf_counter()
    AutoTokenizer.from_pretrained(folder, gguf_file=name)
else:
    from localpaged.runner.gguf_metadata import read_metadata
    from localpaged.runner.gguf_tokenizer import tokenizer_from_metadata
    start = time.perf_counter()
    tokenizer_from_metadata(read_metadata(path)[0])
print(json.dumps({"seconds": time.perf_counter() - start, "extension": extension}))
"""


def _warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def _run(measure: str, path: str, meta_module: str, transformers_tokenizer: bool) -> dict:
    """One fresh process's figure; run again where the CPU extension compiled meanwhile (its
    sources changed under a shared checkout) instead of loading from its cache."""
    for _ in range(3):
        with tempfile.TemporaryDirectory(prefix="first-open-cache-") as cache:
            env = {**os.environ, "LOCALPAGED_CACHE_DIR": cache, "HF_HUB_OFFLINE": "1"}
            out = subprocess.run(
                [sys.executable, "-c", CHILD, measure, path, meta_module or "",
                 "1" if transformers_tokenizer else "0"],
                env=env, capture_output=True, text=True, check=False)
        if out.returncode:
            raise RuntimeError(f"{measure} of {path} failed:\n{out.stderr[-3000:]}")
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        if figures["extension"] < COMPILED_S:
            return figures
    raise RuntimeError("the CPU extension compiled in three runs in a row")


def _bundled() -> list[str]:
    from localpaged.runner import gguf_meta, model_source
    paths = [model_source.bundled_gguf_path(),
             model_source.bundled_gemma3_path(str(gguf_meta.default_cache_root() / "models"))]
    return [p for p in paths if p]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a .gguf file (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--meta-module", help="a version of runner/gguf_meta.py to measure instead")
    ap.add_argument("--transformers", action="store_true",
                    help="the tokenizer alone through transformers' conversion")
    args = ap.parse_args(argv)
    models = args.model or _bundled()
    result = {"machine": {"cpu": cpu_model(), "features": cpu_flags(),
                          "cores": os.cpu_count(), "load_before": os.getloadavg()},
              "command": " ".join(["python", "bench/first_open.py"] + sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M"),
              "meta_module": args.meta_module, "transformers_tokenizer": args.transformers,
              "models": {}}
    print(f"{'model':<40} " + " ".join(f"{m + ' s':>12}" for m in (*MEASURES, "extension")))
    for path in models:
        _warm(path)
        figures = {}
        for measure in MEASURES:
            runs = [_run(measure, path, args.meta_module, args.transformers)
                    for _ in range(args.rounds)]
            figures[measure] = {"median": statistics.median(r["seconds"] for r in runs),
                                "runs": [r["seconds"] for r in runs]}
            figures.setdefault("extension", []).extend(r["extension"] for r in runs)
        figures["extension"] = {"median": statistics.median(figures["extension"]),
                                "runs": figures["extension"]}
        result["models"][path] = figures
        print(f"{os.path.basename(path):<40} "
              + " ".join(f"{figures[m]['median']:>12.2f}" for m in (*MEASURES, "extension")),
              flush=True)
    result["machine"]["load_after"] = os.getloadavg()
    write_results("first_open", result)


if __name__ == "__main__":
    main()
