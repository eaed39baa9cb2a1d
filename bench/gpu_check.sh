#!/usr/bin/env bash
# One prepared check for a machine with CUDA, run from anywhere; finishes within 10 minutes.
#   1. install the project (pip install -e .[test]; offline machines fall back to --no-deps;
#      SKIP_INSTALL=1 skips this)
#   2. the kernel tests, compiled for the GPU (TRITON_INTERPRET unset): tests/kernels/test_kernels.py and
#      the sliding-window cases of every kernel, tests/kernels/test_kernels_window.py
#   3. the quantized-matmul kernel tests (tests/quant/test_quant_kernels.py, and the GGUF block-format
#      kernel with a Q4_K_M file on the GPU: tests/kernels/test_triton_ggml.py), compiled
#   4. the engine-vs-transformers equality tests with the Triton backend, where present
#   5. bench/gpu_kernels.py: paged decode (Triton) vs contiguous SDPA, bandwidth and ratio, and
#      decode with a sliding window of 1,024 against full attention
#   6. bench/gpu_quant.py: int8/int4 and GGUF Q4_K/Q6_K/Q8_0 matmul vs fp16, batch-1 weight
#      bandwidth
#   7. bench/throughput.py --device cuda --quick, where present
#   8. bench/latency.py --cuda-graphs: batch-1 decode tok/s with and without CUDA graphs, equal
#      tokens, fraction of HBM bandwidth (cuda_graphs.json); on the bundled SmolLM2 where it is
#      installed, else on the committed tiny Q4_K_M file (graphs and equal tokens only; the
#      throughput step too)
# Wheels in .whl/ (a folder git ignores, carried to a machine without a registry: gguf, say) are
# installed first, into /tmp/site, which goes on PYTHONPATH.
# Each step has its own timeout and a share of one overall deadline; a failing step does not stop
# the others. Results go to $OUT if set, else bench/results/: gpu_check.json (per step: exit
# status, seconds), gpu_check.log (all output), gpu_kernels.json and gpu_quant.json (the kernel
# benchmarks).
set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${OUT:-bench/results}
mkdir -p "$DEST"
LOG="$DEST/gpu_check.log"
: >"$LOG"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset TRITON_INTERPRET
DEADLINE=$(($(date +%s) + 550))   # steps' own limits sum to 590, the deadline caps them (the
                                  # last steps get what is left); kills add <= 10 s each
STEPS=""

# step NAME LIMIT_S CMD...: run CMD (a command or an exported function) under
# min(LIMIT_S, time left to the deadline); log its output, record its exit status.
step() {
    local name=$1 limit=$2 rc t0 left
    shift 2
    left=$((DEADLINE - $(date +%s)))
    ((left < limit)) && limit=$left
    t0=$(date +%s)
    if ((limit <= 5)); then
        rc=124
        echo "=== $name: skipped, out of time" | tee -a "$LOG"
    else
        echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
        timeout -k 10 "$limit" bash -c '"$@"' step "$@" 2>&1 | tee -a "$LOG"
        rc=$?
    fi
    echo "=== $name: rc=$rc in $(($(date +%s) - t0))s" | tee -a "$LOG"
    STEPS="$STEPS${STEPS:+,}\"$name\": {\"rc\": $rc, \"seconds\": $(($(date +%s) - t0))}"
    return $rc
}

install_project() {
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
            || return 1
    fi
    if [[ ${SKIP_INSTALL:-0} == 1 ]]; then
        echo "SKIP_INSTALL=1: using the installed project"
        return 0
    fi
    "$PY" -m pip install -q --retries 0 --timeout 5 -e ".[test]" && return 0
    echo "full install failed (offline?): installing the project alone"
    "$PY" -m pip install -q --no-deps --no-build-isolation -e .
}

engine_tests() {
    local files=() f
    for f in tests/engine/test_engine_triton.py tests/engine/test_hf_equality.py; do
        [[ -f $f ]] && files+=("$f")
    done
    if ((${#files[@]} == 0)); then
        echo "no engine equality test files: nothing to run"
        return 0
    fi
    "$PY" -m pytest -q -rfE -p no:cacheprovider "${files[@]}"
}

# the model of the last two steps: the bundled SmolLM2, else the committed tiny Q4_K_M file
model() {
    "$PY" -c "from localpaged.runner.model_source import bundled_gguf_path as p
print(p() or 'tests/data/ggml/tiny-llama-Q4_K_M.gguf')"
}

cuda_graphs() {
    "$PY" bench/latency.py --cuda-graphs --gguf "$(model)" --out "$DEST/cuda_graphs.json"
}

throughput() {
    if [[ ! -f bench/throughput.py ]]; then echo "bench/throughput.py absent: skipped"; return 0; fi
    "$PY" bench/throughput.py --device cuda --quick --model "$(model)" --skip llamacpp
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'available', torch.cuda.is_available(), 'triton', triton.__version__)"; } 2>&1 | tee -a "$LOG"

[[ -d .whl ]] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PY DEST
export -f install_project engine_tests model throughput cuda_graphs
step install 60 install_project
step kernel_tests 130 "$PY" -m pytest -q -p no:cacheprovider -rfEs tests/kernels/test_kernels.py \
    tests/kernels/test_kernels_window.py
step quant_tests 110 "$PY" -m pytest -q -p no:cacheprovider -rfEs tests/quant/test_quant_kernels.py \
    tests/kernels/test_triton_ggml.py
step engine_tests 90 engine_tests
step bench_kernels 55 "$PY" bench/gpu_kernels.py --out "$DEST/gpu_kernels.json"
step bench_quant 60 "$PY" bench/gpu_quant.py --out "$DEST/gpu_quant.json"
step throughput 30 throughput
step cuda_graphs 55 cuda_graphs

printf '{"steps": {%s}}\n' "$STEPS" >"$DEST/gpu_check.json"
echo "wrote gpu_check.json, gpu_check.log, gpu_kernels.json, gpu_quant.json in $DEST"
grep -q '"rc": [1-9]' "$DEST/gpu_check.json" && exit 1
exit 0
