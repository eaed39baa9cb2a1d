"""localpaged: a PagedAttention inference engine (after vLLM) and a local chat workstation."""

from localpaged.config import EngineConfig
from localpaged.engine import LLMEngine
from localpaged.llm import LLM
from localpaged.loader import DEFAULT_MODEL, ModelNotFoundError
from localpaged.outputs import CompletionOutput, EngineStats, RequestOutput
from localpaged.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput",
           "CompletionOutput", "EngineStats", "ModelNotFoundError", "DEFAULT_MODEL"]
