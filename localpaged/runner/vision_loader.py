"""Loading a vision-language model: its text model goes through the loader like any other
(models/llama.py or models/gemma3.py on its `text_config`), its vision tower (models/vision/) is built here from
the same safetensors files, and its transformers processor (image preprocessing and the
placeholder tokens) is loaded beside the tokenizer.

Checkpoint names differ by family and by who saved the file; each tower class lists its own
(`TEXT_NAMES`, `CHECKPOINT_NAMES`: prefix -> ours, the first that matches wins):
Idefics3 / SmolVLM: `model.text_model.*` (the text model, whose names become `model.*`),
`model.vision_model.*` and `model.connector.*` (the tower's, without `model.`);
Gemma 3: `language_model.model.*` (or `model.language_model.*`), `vision_tower.vision_model.*`
(Google's files) or `vision_tower.*` (transformers 5), `multi_modal_projector.*`. Names under
none of them (`lm_head.weight`) are the text model's as they are. Float safetensors only:
int8/int4 quantization of the text model is refused by name. (A GGUF text model with
llama.cpp's mmproj file beside it loads through runner/mmproj.py instead.)
"""

from __future__ import annotations

import copy
import logging

import torch
from transformers import PretrainedConfig

from localpaged.models import VISION_LANGUAGE
from localpaged.models.vision import VisionTower

logger = logging.getLogger(__name__)


def is_vision_language(config: PretrainedConfig) -> bool:
    return getattr(config, "model_type", None) in VISION_LANGUAGE


def text_config(config: PretrainedConfig, quantization: str, prequantized: bool) -> PretrainedConfig:
    """The text model's config (tied embeddings as the whole model says); a ValueError for a
    weight form this loader does not read for vision-language models."""
    if quantization in ("int8", "int4") or prequantized:
        name = VISION_LANGUAGE[config.model_type][0]
        raise ValueError(f"{name}: vision-language models load from float safetensors only "
                         f"(quantization {quantization!r} is not supported for them)")
    text = copy.deepcopy(config.text_config)
    text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    return text


def split_weights(config: PretrainedConfig, state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(the text model's weights under our names, the tower's under its module's names, the
    tower's unused ones dropped); `state` is consumed."""
    tower = VISION_LANGUAGE[config.model_type][1]
    text, vision = {}, {}
    for key in list(state):
        tensor = state.pop(key)
        name = _rename(key, tower.CHECKPOINT_NAMES)
        if name is not None:
            if not name.startswith(tower.UNUSED):
                vision[name] = tensor
            continue
        text[_rename(key, tower.TEXT_NAMES) or key] = tensor      # else lm_head.weight as is
    return text, vision


def _rename(key: str, names: tuple[tuple[str, str], ...]) -> str | None:
    for prefix, ours in names:
        if key.startswith(prefix):
            return ours + key[len(prefix):]
    return None


def build_tower(config: PretrainedConfig, weights: dict[str, torch.Tensor],
                device: torch.device, dtype: torch.dtype) -> VisionTower:
    """The model's vision tower with `weights` (all of them, none missing or left over)."""
    tower = VISION_LANGUAGE[config.model_type][1](config)
    missing, unexpected = tower.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"vision weights do not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return tower.to(device=device, dtype=dtype).eval().requires_grad_(False)


# SmolVLMProcessor's image tokens, which it reads from the tokenizer where it names them;
# Idefics3Processor writes these
SMOLVLM_TOKENS = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                  "global_image_token": "<global-img>"}


def load_processor(path: str, model_type: str):
    """transformers' processor for the model (image preprocessing, the prompt's placeholder
    tokens), or None with a warning saying why when transformers cannot build it: the model
    then serves text, and a prompt with images is refused (engine/multimodal.py).

    SmolVLM: transformers' SmolVLMProcessor needs torchvision and num2words, both for videos
    only; for images it is Idefics3Processor's twin (the same placeholder text per crop, and
    SmolVLM's image processor is Idefics3's with SmolVLM's settings). So Idefics3Processor
    loads from SmolVLM's own files: its image processor (SmolVLMImageProcessor's PIL form
    where torchvision is missing, as transformers picks it), image_seq_len, chat template and
    tokenizer (tests/models/test_vision_models.py holds it equal to SmolVLMProcessor's
    images path)."""
    from transformers import AutoProcessor, Idefics3Processor
    smolvlm = model_type == "smolvlm"
    try:
        processor = (Idefics3Processor if smolvlm else AutoProcessor).from_pretrained(
            path, trust_remote_code=False)
    except (ImportError, OSError, ValueError, TypeError) as exc:
        logger.warning("the image processor of %s could not be loaded, so images are refused: "
                       "%s: %s", path, type(exc).__name__, str(exc).strip().splitlines()[0])
        return None
    if smolvlm:
        named = {k: getattr(processor.tokenizer, k, None) or v for k, v in SMOLVLM_TOKENS.items()}
        if named != SMOLVLM_TOKENS:
            logger.warning("the tokenizer of %s names other image tokens (%s) than Idefics3's "
                           "processor writes, so images are refused", path, named)
            return None
    return processor
