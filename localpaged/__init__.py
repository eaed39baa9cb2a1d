"""localpaged: a PagedAttention inference engine (after vLLM) and a local chat workstation."""

from localpaged.core.config import EngineConfig
from localpaged.core.sampling_params import SamplingParams
from localpaged.engine.llm import LLM
from localpaged.engine.llm_engine import LLMEngine
from localpaged.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from localpaged.runner.loader import DEFAULT_MODEL, ModelNotFoundError

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput",
           "CompletionOutput", "EngineStats", "ModelNotFoundError", "DEFAULT_MODEL"]
