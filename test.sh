#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite, offline, on CPU. Args pass to pytest.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q -rs "$@"
