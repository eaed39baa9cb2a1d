"""Shared test code: tiny random models (tiny_models, ggml_models), engine and transformers
oracles (engine_helpers, quant_helpers), the chat controller over a tiny engine (tiny_chat,
ui_helpers), gates that hold an engine's step (step_gate), the store's writers and old versions,
an API server over a tiny engine (api_server), fakes of the Hub (hub_fakes), the import graph of the house rules (import_graph) and the
pytest plugin that keeps speculation drafting (always_draft).

tests/ is on sys.path in a pytest run (conftest.py's folder), so tests import
`from helpers import tiny_models` or `from helpers.engine_helpers import greedy`.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]     # the repository's root
DATA = REPO / "tests" / "data"                 # committed models and texts
