"""What the tiny models' GGUF writers share (helpers/gemma3_gguf.py, helpers/idefics3_gguf.py),
written with gguf-py's GGUFWriter as llama.cpp's convert_hf_to_gguf.py writes it:

    add_tensor(writer, name, array, tensor_type)   # 2-D weights in tensor_type, the rest F32
    add_sizes(writer, name, config)                # a text model's sizes every file has
    finish(writer, path) -> path
    add_vocab(writer, vocab, bos_eos, chat_template, pre, add_bos)  # a byte-level vocabulary
    clip_writer(path, projector_type, vision_config, projection_dim, scale_factor, keys)
        -> a GGUFWriter of an mmproj file with its clip.* keys written
    add_siglip(writer, state, tensor_type, swapped_mlp)  # the SigLIP encoder's v.* tensors

`vocab`: (tokens, token types, merges) of a byte-level ("gpt2") vocabulary. `add_siglip`'s
`state` is the encoder's under its own names (embeddings.*, encoder.layers.*, post_layernorm.*);
its MLP as convert_hf_to_gguf.py names it (fc1 ffn_up) or, `swapped_mlp`, as the first Gemma 3
mmproj converter did (fc1 ffn_down, fc2 ffn_up).
"""

from __future__ import annotations

import gguf
import numpy as np

SIGLIP_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out",
                "layer_norm1": "ln1", "layer_norm2": "ln2", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
SWAPPED = {"mlp.fc1": "ffn_down", "mlp.fc2": "ffn_up"}
SIGLIP_OUTER = {"embeddings.patch_embedding": "v.patch_embd",
                "embeddings.position_embedding": "v.position_embd", "post_layernorm": "v.post_ln"}


def add_tensor(writer: gguf.GGUFWriter, name: str, w: np.ndarray, tensor_type: str) -> None:
    qtype = gguf.GGMLQuantizationType[tensor_type]
    if qtype == gguf.GGMLQuantizationType.F32 or w.ndim != 2:
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))
    else:
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)


def add_sizes(writer: gguf.GGUFWriter, name: str, config) -> None:
    """The model's name and the sizes of its text `config` that every architecture writes."""
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)


def finish(writer: gguf.GGUFWriter, path: str) -> str:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_vocab(writer: gguf.GGUFWriter, vocab: tuple[list, list, list], bos_eos: tuple[int, int],
              chat_template: str | None, pre: str, add_bos: bool | None) -> None:
    """The byte-level vocabulary, its BOS and EOS ids, its pre-tokenizer name, whether the
    tokenizer adds the BOS (None: the file does not say) and the chat template."""
    tokens, types, merges = vocab
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(bos_eos[0])
    writer.add_eos_token_id(bos_eos[1])
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def clip_writer(path: str, projector_type: str, vision_config, projection_dim: int,
                scale_factor: int, keys: dict | None = None) -> gguf.GGUFWriter:
    """An mmproj file's writer with the keys every vision projector has (sizes of the SigLIP
    `vision_config`, the text model's hidden size, the projector's scale factor, mean and
    std 0.5) and `keys` ({clip.vision.<name>: uint32 value}) besides."""
    vc = vision_config
    writer = gguf.GGUFWriter(path, "clip")
    writer.add_string("clip.projector_type", projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    for name, value in {"image_size": vc.image_size, "patch_size": vc.patch_size,
                        "embedding_length": vc.hidden_size,
                        "feed_forward_length": vc.intermediate_size,
                        "projection_dim": projection_dim, "block_count": vc.num_hidden_layers,
                        "attention.head_count": vc.num_attention_heads,
                        "projector.scale_factor": scale_factor, **(keys or {})}.items():
        writer.add_uint32(f"clip.vision.{name}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", vc.layer_norm_eps)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return writer


def add_siglip(writer: gguf.GGUFWriter, state: dict, tensor_type: str,
               swapped_mlp: bool = False) -> None:
    """The encoder's tensors, the embeddings F32 whatever `tensor_type` (as the converters
    force them)."""
    names = SIGLIP_NAMES | (SWAPPED if swapped_mlp else {})
    for name, t in state.items():
        w = t.float().numpy()
        if name.startswith("encoder.layers."):
            i, rest = name.removeprefix("encoder.layers.").split(".", 1)
            part, suffix = rest.rsplit(".", 1)
            add_tensor(writer, f"v.blk.{i}.{names[part]}.{suffix}", w, tensor_type)
        else:
            base, suffix = name.rsplit(".", 1)
            kind = "F32" if base.startswith("embeddings.") else tensor_type
            add_tensor(writer, f"{SIGLIP_OUTER[base]}.{suffix}", w, kind)
