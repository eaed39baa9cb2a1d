#!/usr/bin/env bash
# Set up (first run only) and start the chat app on http://127.0.0.1:7860. Flags pass through:
#   ./app.sh --model Qwen/Qwen2.5-0.5B-Instruct --port 7861
set -euo pipefail
cd "$(dirname "$0")"
LOCALPAGED_SKIP_BROWSER=1 scripts/setup.sh
exec .venv/bin/python app.py "$@"
