"""localpaged: a PagedAttention inference engine (after vLLM) and a local chat workstation.

The public names below are imported on first use (PEP 562), so `import localpaged.cli` (the app's
start, which serves its loading page before torch is imported) does not pay for torch and
transformers; `from localpaged import LLM` works as ever."""

from __future__ import annotations

from localpaged.core.lazy import lazy_exports

_EXPORTS = {
    "EngineConfig": "localpaged.core.config",
    "SamplingParams": "localpaged.core.sampling_params",
    "LLM": "localpaged.engine.llm",
    "LLMEngine": "localpaged.engine.llm_engine",
    "CompletionOutput": "localpaged.engine.outputs",
    "EngineStats": "localpaged.engine.outputs",
    "RequestOutput": "localpaged.engine.outputs",
    "DEFAULT_MODEL": "localpaged.runner.model_source",
    "ModelNotFoundError": "localpaged.runner.model_source",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
