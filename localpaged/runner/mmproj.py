"""llama.cpp's vision projector files (`mmproj*.gguf`, general.architecture "clip") beside a GGUF
text model: the vision tower, its config and an image processor, so a GGUF Gemma 3 takes images
as its safetensors checkpoint does.

    mmproj_files(folder)                          # the projector files in a model's folder
    is_mmproj(path)                               # "mmproj" in the name, architecture "clip"
    load_mmproj(path, text_config, tokenizer, device, dtype) -> (whole config, tower, processor)

What a file holds (llama.cpp's converters, gguf-py's constants): `clip.vision.*` sizes
(image_size, patch_size, embedding_length, feed_forward_length, block_count,
attention.head_count, attention.layer_norm_epsilon, image_mean, image_std,
projector.scale_factor where written: the pooling kernel, 4 for Gemma 3 otherwise) and the
projector type (`clip.projector_type` or `clip.vision.projector_type`); the tensors `v.*` (the
SigLIP encoder) and `mm.*` (the projector). Two conventions of the converters are undone here:
`mm.soft_emb_norm.weight` is stored as 1 + weight (llama.cpp multiplies by it directly), and
older files swap the names of the encoder's two MLP matrices, so fc1/fc2 are told apart by
shape. The image tokens are the text vocabulary's `<start_of_image>`, `<image_soft_token>`,
`<end_of_image>`, and the processor is transformers' Gemma3Processor around the GGUF's own
tokenizer and chat template, with the file's image size, mean and std. Only Gemma 3's
projector type loads; another is refused by name.
"""

from __future__ import annotations

import glob
import logging
import os
import re

import torch
from transformers import Gemma3Config, Gemma3ImageProcessorPil, Gemma3Processor, PretrainedConfig

from localpaged.models.vision import VisionTower
from localpaged.quant.gguf import float_tensor
from localpaged.quant.gguf_file import GgufFile
from localpaged.runner.gguf_metadata import read_metadata
from localpaged.runner.vision_loader import build_tower

logger = logging.getLogger(__name__)

GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>",
                 "eoi_token": "<end_of_image>"}
DEFAULT_SCALE = 4                 # llama.cpp's Gemma 3 pooling kernel where the file has none
# v.blk.N.<ours> -> vision_tower.encoder.layers.N.<transformers'> (the MLP by shape, below)
LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_out": "self_attn.out_proj",
               "ln1": "layer_norm1", "ln2": "layer_norm2"}
NAMES = {"v.patch_embd": "vision_tower.embeddings.patch_embedding",
         "v.position_embd": "vision_tower.embeddings.position_embedding",
         "v.post_ln": "vision_tower.post_layernorm",
         "mm.soft_emb_norm": "multi_modal_projector.mm_soft_emb_norm"}
BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)$")


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
    if kind != "gemma3":
        raise ValueError(f"{path}: vision projector type {kind!r} is not supported "
                         f"(supported: 'gemma3')")
    if text_config.model_type != "gemma3_text":
        raise ValueError(f"{path}: a Gemma 3 vision projector beside a {text_config.model_type} "
                         f"text model")
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in GEMMA3_TOKENS.items()}
    if any(i is None or i == tokenizer.unk_token_id for i in ids.values()):
        raise ValueError(f"{path}: the text model's vocabulary lacks Gemma 3's image tokens "
                         f"({', '.join(GEMMA3_TOKENS.values())})")
    config = _config(meta, text_config, ids)
    tower = build_tower(config, _weights(GgufFile(path)), device, dtype)
    return config, tower, _processor(meta, config, tokenizer)


def _config(meta: dict, text_config: PretrainedConfig, ids: dict[str, int]) -> PretrainedConfig:
    def need(key: str):
        value = meta.get(f"clip.vision.{key}")
        if value is None:
            raise ValueError(f"the vision projector file has no clip.vision.{key}")
        return value
    size, patch = int(need("image_size")), int(need("patch_size"))
    scale = int(meta.get("clip.vision.projector.scale_factor", DEFAULT_SCALE))
    vision = dict(hidden_size=int(need("embedding_length")),
                  intermediate_size=int(need("feed_forward_length")),
                  num_hidden_layers=int(need("block_count")),
                  num_attention_heads=int(need("attention.head_count")),
                  layer_norm_eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
                  image_size=size, patch_size=patch, vision_use_head=False)
    return Gemma3Config(text_config=text_config.to_dict(), vision_config=vision,
                        mm_tokens_per_image=(size // patch // scale) ** 2,
                        image_token_index=ids["image_token"], boi_token_index=ids["boi_token"],
                        eoi_token_index=ids["eoi_token"],
                        tie_word_embeddings=text_config.tie_word_embeddings)


def _weights(file: GgufFile) -> dict[str, torch.Tensor]:
    """The file's tensors under Gemma3Vision's names, the converters' conventions undone."""
    out: dict[str, torch.Tensor] = {}
    for t in file.tensors:
        value = float_tensor(file, t)
        base, _, suffix = t.name.rpartition(".")
        m = BLOCK.match(t.name)
        if t.name == "mm.input_projection.weight":
            out["multi_modal_projector.mm_input_projection_weight"] = value
        elif base in NAMES:
            out[f"{NAMES[base]}.{suffix}"] = value - 1 if base == "mm.soft_emb_norm" else value
        elif m and m.group(2) in LAYER_NAMES:
            out[f"vision_tower.encoder.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}.{suffix}"] = value
        elif m and m.group(2) in ("ffn_up", "ffn_down"):
            out[f"mlp:{m.group(1)}:{m.group(2)}:{suffix}"] = value
        else:
            raise ValueError(f"{file.path}: tensor {t.name} is not one of Gemma 3's vision tower")
    for key in [k for k in out if k.startswith("mlp:") and k.endswith(":weight")]:
        _, layer, _, _ = key.split(":")
        w, b = out.pop(key), out.pop(key.replace(":weight", ":bias"))
        # fc1 widens (hidden -> intermediate), fc2 narrows: one of each per layer
        fc = "fc1" if w.shape[0] > w.shape[1] else "fc2"
        out[f"vision_tower.encoder.layers.{layer}.mlp.{fc}.weight"] = w
        out[f"vision_tower.encoder.layers.{layer}.mlp.{fc}.bias"] = b
    return out


def _processor(meta: dict, config: PretrainedConfig, tokenizer) -> Gemma3Processor:
    """Gemma3Processor over the GGUF's tokenizer, whose image tokens are named on it first
    (boi_token, image_token, eoi_token), as transformers names them when it loads Gemma 3's
    own tokenizer_config.json (the same call, which has no public form)."""
    size = config.vision_config.image_size
    images = Gemma3ImageProcessorPil(size={"height": size, "width": size},
                                     image_mean=list(meta.get("clip.vision.image_mean", [0.5] * 3)),
                                     image_std=list(meta.get("clip.vision.image_std", [0.5] * 3)))
    tokenizer._set_model_specific_special_tokens(special_tokens=dict(GEMMA3_TOKENS))
    return Gemma3Processor(images, tokenizer, image_seq_length=config.mm_tokens_per_image,
                           chat_template=getattr(tokenizer, "chat_template", None))
