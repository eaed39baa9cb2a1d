"""Make tests/data/ggml/: tiny GGUF models in K-quant and IQ4_XS formats, quantized by llama.cpp's
own quantizer (llama_model_quantize), from the F32 tiny models of tests/helpers/ggml_models.py.

Run by hand (not by the tests), from the repository root:

    PYTHONPATH=/tmp/work/lcp-site:/tmp/gg/extra .venv/bin/python tests/data/make_ggml_models.py --check

with llama-cpp-python 0.3.36 (built from its sdist, llama_cpp_python-0.3.36.tar.gz, CPU only)
installed in /tmp/work/lcp-site (diskcache, which `import llama_cpp` needs, in /tmp/gg/extra).
That is the command that made the committed files. The F32 sources (seed 0) are written to a
temporary folder and not kept; tests/helpers/ggml_models.py writes them again on demand.

Files: tiny-llama-{Q4_K_M,Q5_K_M,Q6_K,Q3_K_M,Q2_K,IQ4_XS,IQ4_NL}.gguf and tiny-qwen2-Q4_K_M.gguf.
A file type llama.cpp refuses (the IQ types that need an importance matrix) is skipped with a
message. `--check` lists the tensor types of every file (gguf.GGUFReader), loads each with
transformers and generates, and compares llama.cpp's greedy output with transformers' on the F32
sources (a check of the q/k permutation and the tokenizer metadata).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))           # tests/, for ggml_models

import ggml_models

OUT = os.path.join(HERE, "ggml")
MODELS = [("llama", "Q4_K_M"), ("llama", "Q5_K_M"), ("llama", "Q6_K"), ("llama", "Q3_K_M"),
          ("llama", "Q2_K"), ("llama", "IQ4_XS"), ("llama", "IQ4_NL"), ("qwen2", "Q4_K_M")]
PROMPTS = ["the cat and the dog", "Once upon a time in the west", "1 2 3 4 5"]


def quantize(llama_cpp, src: str, dst: str, ftype: str) -> bool:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        print(f"SKIPPED {os.path.basename(dst)}: llama_model_quantize returned {rc}")
        if os.path.exists(dst):
            os.remove(dst)
        return False
    return True


def tensor_types(path: str) -> dict[str, int]:
    import gguf
    reader = gguf.GGUFReader(path)
    return dict(collections.Counter(t.tensor_type.name for t in reader.tensors))


def hf_generate(path: str, prompt: str, n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    ids = tok(prompt)["input_ids"]
    with torch.inference_mode():
        out = model.eval().generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)
    return ids, out[0, len(ids):].tolist()


def llama_cpp_generate(llama_cpp, path: str, ids: list[int], n: int) -> list[int]:
    llm = llama_cpp.Llama(path, n_ctx=256, n_threads=os.cpu_count() or 1, verbose=False)
    out = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                              repeat_penalty=1.0):
        out.append(token)
        if len(out) == n:
            break
    llm.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="verify every file (see above)")
    args = parser.parse_args()
    import llama_cpp
    print(f"llama-cpp-python {llama_cpp.__version__}")
    os.makedirs(OUT, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = {arch: ggml_models.write_tiny_gguf(tmp, arch, "F32") for arch in
                   sorted({a for a, _ in MODELS})}
        for arch, ftype in MODELS:
            dst = os.path.join(OUT, f"tiny-{arch}-{ftype}.gguf")
            if quantize(llama_cpp, sources[arch], dst, ftype):
                made.append(dst)
        if args.check:
            for arch, src in sources.items():
                for prompt in PROMPTS:
                    ids, want = hf_generate(src, prompt, 12)
                    got = llama_cpp_generate(llama_cpp, src, ids, 12)
                    print(f"F32 {arch}: llama.cpp greedy == transformers: {got == want} "
                          f"({prompt!r}: {got})")
    total = 0
    for path in made:
        size = os.path.getsize(path)
        total += size
        line = f"{os.path.basename(path)}: {size / 1e6:.2f} MB"
        if args.check:
            _, gen = hf_generate(path, PROMPTS[0], 8)
            line += f", tensor types {tensor_types(path)}, transformers generates {gen}"
        print(line)
    print(f"total {total / 1e6:.2f} MB in {OUT}")


if __name__ == "__main__":
    main()
