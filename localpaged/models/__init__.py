"""Model definitions whose attention reads and writes the paged KV cache."""

from localpaged.models.llama import SUPPORTED_ARCHITECTURES, LlamaForCausalLM, build_model

__all__ = ["SUPPORTED_ARCHITECTURES", "LlamaForCausalLM", "build_model"]
