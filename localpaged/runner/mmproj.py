"""llama.cpp's vision projector files (`mmproj*.gguf`, general.architecture "clip") beside a GGUF
text model: the vision tower, its config and an image processor, so a GGUF Gemma 3, Idefics3 or
SmolVLM takes images as its safetensors checkpoint does.

    mmproj_files(folder)                          # the projector files in a model's folder
    is_mmproj(path)                               # "mmproj" in the name, architecture "clip"
    load_mmproj(path, text_config, tokenizer, device, dtype) -> (whole config, tower, processor)

What a file holds (llama.cpp's converters, gguf-py's constants): `clip.vision.*` sizes
(image_size, patch_size, embedding_length, feed_forward_length, block_count,
attention.head_count, attention.layer_norm_epsilon, image_mean, image_std,
projector.scale_factor), the projector type (`clip.projector_type` or
`clip.vision.projector_type`), the tensors `v.*` (the SigLIP encoder, named alike for every
type) and `mm.*` (the projector). The encoder's two MLP matrices are told apart by shape, as
older files swap their names. One table entry per projector type (PROJECTORS) says the rest:
where the encoder sits in the tower's names, the projector's tensors, the text model it goes
beside, the image tokens its vocabulary must hold, its config and its processor:

- `gemma3`: Gemma3Vision; `mm.input_projection`, `mm.soft_emb_norm` (stored as 1 + weight:
  llama.cpp multiplies by it directly); `mm_tokens_per_image` from the pooling kernel
  (`projector.scale_factor`, or llama.cpp's 4); transformers' Gemma3Processor with
  `<start_of_image>`, `<image_soft_token>`, `<end_of_image>` named on the tokenizer as Gemma's
  tokenizer names them.
- `idefics3` (Idefics3 and SmolVLM alike): Idefics3Vision, whose connector is `mm.model.fc`;
  the pixel shuffle's `scale_factor` from `projector.scale_factor` (transformers' 2 where
  absent); transformers' Idefics3Processor (image tokens, fake tokens around each crop, the
  `<row_i_col_j>` and `<global-img>` tags) with the Idefics3 image processor, whose crops are
  `image_size` and whose resize caps the longest edge at `clip.vision.preproc_image_size`
  (the model's `size.longest_edge`; where a file lacks it, 4 x image_size, transformers'
  default and every released model's ratio).

Each processor wraps the GGUF's own tokenizer and chat template, with the file's image mean
and std. Another projector type is refused by name.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import (Gemma3Config, Gemma3ImageProcessorPil, Gemma3Processor, Idefics3Config,
                          Idefics3ImageProcessorPil, Idefics3Processor, PretrainedConfig)

from localpaged.models.vision import VisionTower
from localpaged.quant.gguf import float_tensor
from localpaged.quant.gguf_file import GgufFile
from localpaged.runner.gguf_metadata import read_metadata
from localpaged.runner.vision_loader import build_tower

logger = logging.getLogger(__name__)

# v.blk.N.<gguf> -> <encoder>.encoder.layers.N.<transformers'> (the MLP by shape, below)
LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_out": "self_attn.out_proj",
               "ln1": "layer_norm1", "ln2": "layer_norm2"}
ENCODER_NAMES = {"v.patch_embd": "embeddings.patch_embedding",
                 "v.position_embd": "embeddings.position_embedding", "v.post_ln": "post_layernorm"}
BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)$")


@dataclass(frozen=True)
class Projector:
    """What one projector type of llama.cpp's needs beyond the SigLIP encoder they share."""
    text_model: str                      # the model_type of the text model it goes beside
    encoder: str                         # the SigLIP encoder's prefix in the tower's names
    names: dict[str, str]                # the projector's tensors: GGUF name -> the tower's
    plus_one: frozenset[str]             # of those, stored as 1 + weight
    tokens: Callable[[dict], list[str]]  # (metadata) -> image tokens the vocabulary must hold
    # (metadata, text config, vision config fields, token ids) -> the whole model's config
    config: Callable[[dict, PretrainedConfig, dict, dict[str, int]], PretrainedConfig]
    # (metadata, the whole config, tokenizer) -> transformers' processor
    processor: Callable[[dict, PretrainedConfig, object], object]


def is_mmproj(path: str) -> bool:
    """A file named as llama.cpp, LM Studio and Ollama name projectors (`mmproj` in its name)
    whose architecture is "clip"; a model's own file is never opened for this."""
    name = os.path.basename(path).lower()
    return "mmproj" in name and read_metadata(path)[0].get("general.architecture") == "clip"


def mmproj_files(folder: str) -> list[str]:
    """The vision projector files in `folder`, in name order."""
    return [p for p in sorted(glob.glob(os.path.join(folder, "*.gguf"))) if is_mmproj(p)]


def load_mmproj(path: str, text_config: PretrainedConfig, tokenizer, device: torch.device,
                dtype: torch.dtype) -> tuple[PretrainedConfig, VisionTower, object]:
    """(the whole model's config, the tower with the file's weights, the image processor)."""
    meta, _ = read_metadata(path)
    kind = meta.get("clip.vision.projector_type", meta.get("clip.projector_type"))
    projector = PROJECTORS.get(kind)
    if projector is None:
        raise ValueError(f"{path}: vision projector type {kind!r} is not supported "
                         f"(supported: {', '.join(repr(k) for k in PROJECTORS)})")
    if text_config.model_type != projector.text_model:
        raise ValueError(f"{path}: a vision projector of type {kind!r} goes beside a "
                         f"{projector.text_model} text model, not {text_config.model_type}")
    vision = _vision_fields(meta)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in projector.tokens(meta)}
    missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ValueError(f"{path}: the text model's vocabulary lacks the image tokens of vision "
                         f"projector type {kind!r} ({', '.join(missing)})")
    config = projector.config(meta, text_config, vision, ids)
    tower = build_tower(config, _weights(GgufFile(path), projector), device, dtype)
    return config, tower, projector.processor(meta, config, tokenizer)


def _vision_fields(meta: dict) -> dict:
    """The SigLIP encoder's config fields from the file's clip.vision.* keys."""
    def need(key: str):
        value = meta.get(f"clip.vision.{key}")
        if value is None:
            raise ValueError(f"the vision projector file has no clip.vision.{key}")
        return value
    return dict(hidden_size=int(need("embedding_length")),
                intermediate_size=int(need("feed_forward_length")),
                num_hidden_layers=int(need("block_count")),
                num_attention_heads=int(need("attention.head_count")),
                layer_norm_eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
                image_size=int(need("image_size")), patch_size=int(need("patch_size")))


def _weights(file: GgufFile, projector: Projector) -> dict[str, torch.Tensor]:
    """The file's tensors under the tower's names, the converters' conventions undone."""
    out: dict[str, torch.Tensor] = {}
    enc = projector.encoder
    for t in file.tensors:
        value = float_tensor(file, t)
        base, _, suffix = t.name.rpartition(".")
        m = BLOCK.match(t.name)
        if t.name in projector.names:
            out[projector.names[t.name]] = value - 1 if t.name in projector.plus_one else value
        elif base in ENCODER_NAMES:
            out[f"{enc}.{ENCODER_NAMES[base]}.{suffix}"] = value
        elif m and m.group(2) in LAYER_NAMES:
            out[f"{enc}.encoder.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}.{suffix}"] = value
        elif m and m.group(2) in ("ffn_up", "ffn_down"):
            out[f"mlp:{m.group(1)}:{m.group(2)}:{suffix}"] = value
        else:
            raise ValueError(f"{file.path}: tensor {t.name} is not one of this vision tower's")
    for key in [k for k in out if k.startswith("mlp:") and k.endswith(":weight")]:
        _, layer, _, _ = key.split(":")
        w, b = out.pop(key), out.pop(key.replace(":weight", ":bias"))
        # fc1 widens (hidden -> intermediate), fc2 narrows: one of each per layer
        fc = "fc1" if w.shape[0] > w.shape[1] else "fc2"
        out[f"{enc}.encoder.layers.{layer}.mlp.{fc}.weight"] = w
        out[f"{enc}.encoder.layers.{layer}.mlp.{fc}.bias"] = b
    return out


def _mean_std(meta: dict) -> dict:
    return dict(image_mean=list(meta.get("clip.vision.image_mean", [0.5] * 3)),
                image_std=list(meta.get("clip.vision.image_std", [0.5] * 3)))


# Gemma 3 ----------------------------------------------------------------------------------------
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>",
                 "eoi_token": "<end_of_image>"}
GEMMA3_SCALE = 4                  # llama.cpp's Gemma 3 pooling kernel where the file has none


def _gemma3_config(meta: dict, text_config: PretrainedConfig, vision: dict,
                   ids: dict[str, int]) -> PretrainedConfig:
    scale = int(meta.get("clip.vision.projector.scale_factor", GEMMA3_SCALE))
    side = vision["image_size"] // vision["patch_size"] // scale
    return Gemma3Config(text_config=text_config.to_dict(), vision_config=dict(vision, vision_use_head=False),
                        mm_tokens_per_image=side ** 2,
                        image_token_index=ids[GEMMA3_TOKENS["image_token"]],
                        boi_token_index=ids[GEMMA3_TOKENS["boi_token"]],
                        eoi_token_index=ids[GEMMA3_TOKENS["eoi_token"]],
                        tie_word_embeddings=text_config.tie_word_embeddings)


def _gemma3_processor(meta: dict, config: PretrainedConfig, tokenizer) -> Gemma3Processor:
    """Gemma3Processor over the GGUF's tokenizer, whose image tokens are named on it first
    (boi_token, image_token, eoi_token), as transformers names them when it loads Gemma 3's
    own tokenizer_config.json (the same call, which has no public form)."""
    size = config.vision_config.image_size
    images = Gemma3ImageProcessorPil(size={"height": size, "width": size}, **_mean_std(meta))
    tokenizer._set_model_specific_special_tokens(special_tokens=dict(GEMMA3_TOKENS))
    return Gemma3Processor(images, tokenizer, image_seq_length=config.mm_tokens_per_image,
                           chat_template=getattr(tokenizer, "chat_template", None))


# Idefics3 / SmolVLM -----------------------------------------------------------------------------
IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
IDEFICS3_SCALE = 2                # transformers' Idefics3Config.scale_factor where the file has none
IDEFICS3_EDGE_CROPS = 4           # transformers' default longest edge: 4 crops per side


def _idefics3_longest_edge(meta: dict) -> int:
    """(clip.vision.image_size is there: _vision_fields checked it.)"""
    size = int(meta["clip.vision.image_size"])
    return int(meta.get("clip.vision.preproc_image_size", IDEFICS3_EDGE_CROPS * size))


def _idefics3_tokens(meta: dict) -> list[str]:
    """The processor's tokens, and the row/column tag of every crop the resize allows."""
    side = math.ceil(_idefics3_longest_edge(meta) / int(meta["clip.vision.image_size"]))
    return IDEFICS3_TOKENS + [f"<row_{r}_col_{c}>" for r in range(1, side + 1)
                              for c in range(1, side + 1)]


def _idefics3_config(meta: dict, text_config: PretrainedConfig, vision: dict,
                     ids: dict[str, int]) -> PretrainedConfig:
    return Idefics3Config(text_config=text_config.to_dict(), vision_config=vision,
                          scale_factor=int(meta.get("clip.vision.projector.scale_factor", IDEFICS3_SCALE)),
                          image_token_id=ids["<image>"],
                          tie_word_embeddings=text_config.tie_word_embeddings)


def _idefics3_processor(meta: dict, config: PretrainedConfig, tokenizer) -> Idefics3Processor:
    """Idefics3Processor over the GGUF's tokenizer (its image tokens are already special
    tokens of the vocabulary: the processor's add_special_tokens adds none)."""
    if "clip.vision.preproc_image_size" not in meta:
        logger.info("the vision projector has no clip.vision.preproc_image_size: images are "
                    "resized to at most %d pixels a side", _idefics3_longest_edge(meta))
    vc = config.vision_config
    images = Idefics3ImageProcessorPil(size={"longest_edge": _idefics3_longest_edge(meta)},
                                       max_image_size={"longest_edge": vc.image_size}, **_mean_std(meta))
    per_crop = (vc.image_size // vc.patch_size) ** 2 // config.scale_factor ** 2
    return Idefics3Processor(images, tokenizer, image_seq_len=per_crop,
                             chat_template=getattr(tokenizer, "chat_template", None))


PROJECTORS = {
    "gemma3": Projector(
        text_model="gemma3_text", encoder="vision_tower",
        names={"mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
               "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight"},
        plus_one=frozenset({"mm.soft_emb_norm.weight"}),
        tokens=lambda meta: list(GEMMA3_TOKENS.values()), config=_gemma3_config,
        processor=_gemma3_processor),
    "idefics3": Projector(
        text_model="llama", encoder="vision_model",
        names={"mm.model.fc.weight": "connector.modality_projection.proj.weight"},
        plus_one=frozenset(), tokens=_idefics3_tokens, config=_idefics3_config,
        processor=_idefics3_processor),
}
