"""Memory while loading a GGUF, per weight format, each in a fresh subprocess, phase by phase.

    python bench/quant_memory.py [--model X.gguf] [--formats none,int8,int4]

What is measured (Linux /proc/self/status, in MiB):
- baseline: RSS after importing torch, transformers and localpaged, before `loader.load`;
- final resident: RSS right after `loader.load` returns (model, config, tokenizer still alive,
  after gc) minus the baseline, i.e. everything the load added and kept;
- peak while loading: the kernel's high-water mark of RSS (VmHWM, reset just before the load
  through /proc/self/clear_refs) minus the baseline;
- per phase of `loader.load` (config, tokenizer, GGUF tensors, install, load_state_dict, eos):
  RSS added and the phase's own peak above its start (VmHWM reset at the phase's start), by
  wrapping the names `loader.load` calls; nothing of the loader is re-implemented here;
- weights bytes: `quant.linear.weights_summary` (packed tables counted once), and the GGUF
  file's tensor bytes (sum of gguf.GGUFReader tensors' n_bytes) for the int4 ratio.
Targets: peak <= 1.5x final resident; int4 weight bytes <= 1.15x GGUF tensor bytes.
RSS counts file pages mapped in (RssFile) as well as anonymous memory: both are shown.
Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

MIB = 2**20
FORMATS = ["none", "int8", "int4"]
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def _status() -> dict[str, float]:
    """The RSS fields of /proc/self/status, in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) / 1024
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:    # "5": reset VmHWM to the current RSS
        f.write("5")


def _phase(name: str, fn, phases: list[dict]):
    """`fn` wrapped: records RSS added and the peak above its start while it ran."""
    def wrapped(*args, **kwargs):
        _reset_peak()
        start = _status()["VmRSS"]
        result = fn(*args, **kwargs)
        end = _status()
        if phases and phases[-1]["phase"] == name:        # one entry per phase (install: per layer)
            last = phases.pop()
            start = last["start_rss_mb"]
            end["VmHWM"] = max(end["VmHWM"], last["peak_rss_mb"])
        phases.append({"phase": name, "start_rss_mb": start, "added_mb": end["VmRSS"] - start,
                       "peak_above_start_mb": end["VmHWM"] - start, "peak_rss_mb": end["VmHWM"],
                       "rss_anon_mb": end["RssAnon"], "rss_file_mb": end["RssFile"]})
        return result
    return wrapped


def child(model: str, quantization: str) -> dict:
    import gc

    import gguf
    import torch
    import transformers  # noqa: F401 - imported before the baseline is taken

    from localpaged.quant.linear import weights_summary
    from localpaged.runner import loader, weight_placement

    phases: list[dict] = []
    loader.AutoConfig = SimpleNamespace(
        from_pretrained=_phase("config", transformers.AutoConfig.from_pretrained, phases))
    loader.AutoTokenizer = SimpleNamespace(
        from_pretrained=_phase("tokenizer", transformers.AutoTokenizer.from_pretrained, phases))
    for owner, name, label in ((loader, "read_gguf", "gguf tensors"),
                               (weight_placement, "install", "install packed"),
                               (loader, "load_weights", "load_state_dict"),
                               (loader, "_eos_ids", "eos ids")):
        setattr(owner, name, _phase(label, getattr(owner, name), phases))
    gc.collect()
    base = _status()
    _reset_peak()
    t0 = time.perf_counter()
    loaded = loader.load(model, torch.device("cpu"), torch.float32, quantization=quantization)
    load_s = time.perf_counter() - t0
    # the phases reset the high-water mark: the load's peak is the highest of theirs and the rest
    peak = max([_status()["VmHWM"]] + [p["peak_rss_mb"] for p in phases])
    gc.collect()
    after = _status()
    weights_bytes, weights_format = weights_summary(loaded.model)
    tensor_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(model).tensors)
    final = after["VmRSS"] - base["VmRSS"]
    return {"quantization": quantization, "weights": weights_format,
            "weights_bytes": weights_bytes, "gguf_tensor_bytes": tensor_bytes,
            "weights_over_gguf": weights_bytes / tensor_bytes, "load_s": load_s,
            "baseline_mb": base["VmRSS"], "final_resident_mb": final,
            "peak_while_loading_mb": peak - base["VmRSS"],
            "peak_over_final": (peak - base["VmRSS"]) / max(1e-9, final),
            "final_anon_mb": after["RssAnon"] - base["RssAnon"],
            "final_file_mb": after["RssFile"] - base["RssFile"], "phases": phases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a .gguf file (default: the bundled SmolLM2)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model is None:
        from localpaged.runner import model_source
        args.model = model_source.bundled_gguf_path()
    if args.child:
        print(json.dumps(child(args.model, args.child)))
        return
    rows = []
    print(f"{'format':6s} {'weights':22s} {'final MiB':>9s} {'peak MiB':>9s} {'peak/final':>10s}"
          f" {'w/gguf':>7s}   phases: +added (peak above start) MiB")
    for q in args.formats.split(","):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", q],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
        steps = ", ".join(f"{p['phase']} +{p['added_mb']:.0f} ({p['peak_above_start_mb']:.0f})"
                          for p in r["phases"])
        print(f"{q:6s} {r['weights']:22s} {r['final_resident_mb']:9.0f} "
              f"{r['peak_while_loading_mb']:9.0f} {r['peak_over_final']:9.2f}x "
              f"{r['weights_over_gguf']:6.2f}x   {steps}", flush=True)
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results",
                        f"quant-memory-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"model": args.model, "rows": rows}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
