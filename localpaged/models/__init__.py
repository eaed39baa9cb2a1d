"""Model definitions whose attention reads and writes the paged KV cache, and their registry.

The registry maps a config's `model_type` to our class for it: the Llama family (models/llama.py:
Llama, Mistral, Qwen2, Qwen3) and Gemma 3's text model (models/gemma3.py). Every class has the
interface the engine uses (forward over a flat batch, compute_logits, use_norm_kernel, head_dim,
kv_groups, config, model.embed_tokens, model.layers, lm_head, rotary); only architectures listed
here load (`trust_remote_code` is never enabled). Vision-language models (VISION_LANGUAGE) are a
text model from ARCHITECTURES (their `text_config`) plus a vision tower (models/vision/);
runner/vision_loader.py splits a checkpoint into the two.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from localpaged.models.gemma3 import Gemma3ForCausalLM
from localpaged.models.llama import LlamaForCausalLM
from localpaged.models.vision.gemma3 import Gemma3Vision
from localpaged.models.vision.idefics3 import Idefics3Vision

Model = LlamaForCausalLM | Gemma3ForCausalLM       # what build_model makes

# model_type -> (transformers' class name, ours)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", LlamaForCausalLM),
    "mistral": ("MistralForCausalLM", LlamaForCausalLM),
    "qwen2": ("Qwen2ForCausalLM", LlamaForCausalLM),
    "qwen3": ("Qwen3ForCausalLM", LlamaForCausalLM),
    "gemma3_text": ("Gemma3ForCausalLM", Gemma3ForCausalLM),
}
# model_type -> (transformers' class name, our vision tower); the text model: its text_config's
VISION_LANGUAGE = {
    "idefics3": ("Idefics3ForConditionalGeneration", Idefics3Vision),
    "smolvlm": ("SmolVLMForConditionalGeneration", Idefics3Vision),
    "gemma3": ("Gemma3ForConditionalGeneration", Gemma3Vision),
}
SUPPORTED_ARCHITECTURES = {kind: name for kind, (name, _) in (ARCHITECTURES | VISION_LANGUAGE).items()}


def check_architecture(model_type: str | None, architectures: list[str] | None = None) -> None:
    """A ValueError naming the architecture and the supported ones, unless it is one of them."""
    if model_type not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES.values()))
        arch = (architectures or [model_type])[0]
        raise ValueError(f"unsupported architecture {arch}; supported: {supported}")


def build_model(config: PretrainedConfig) -> Model:
    check_architecture(config.model_type, getattr(config, "architectures", None))
    return ARCHITECTURES[config.model_type][1](config)


__all__ = ["ARCHITECTURES", "SUPPORTED_ARCHITECTURES", "VISION_LANGUAGE", "Gemma3ForCausalLM", "LlamaForCausalLM",
           "build_model", "check_architecture"]
