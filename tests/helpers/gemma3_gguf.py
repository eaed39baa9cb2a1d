"""Gemma 3 GGUF files written with gguf-py's GGUFWriter as llama.cpp's converters write them: the
text model (`write_text`: norms stored as 1 + weight, no q/k permutation, tied: no
output.weight) and the vision projector (`write_mmproj`: an `mmproj` file, architecture
"clip", `v.*` and `mm.*` tensors, soft_emb_norm stored as 1 + weight; the encoder's MLP as
convert_hf_to_gguf.py names it, or under the first converter's swapped names).

    gguf_name(transformers name) -> the text model's GGUF tensor name
    write_text(path, config, state, vocab, bos_eos, chat_template=None, tensor_type="F32",
               pre="gpt-2") -> path
    write_mmproj(path, config, state, tensor_type="F32", projector_type="gemma3",
                 swapped_mlp=False) -> path
`vocab`: (tokens, token types, merges) of a byte-level ("gpt2") vocabulary.
"""

from __future__ import annotations

import gguf
import numpy as np

GGUF_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
VISION_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out",
                "layer_norm1": "ln1", "layer_norm2": "ln2", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
SWAPPED = {"mlp.fc1": "ffn_down", "mlp.fc2": "ffn_up"}     # the first Gemma 3 mmproj converter's


def gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    i, rest = name.removeprefix("model.layers.").split(".", 1)
    return f"blk.{i}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def _add(writer: gguf.GGUFWriter, name: str, w: np.ndarray, tensor_type: str) -> None:
    qtype = gguf.GGMLQuantizationType[tensor_type]
    if qtype == gguf.GGMLQuantizationType.F32 or w.ndim != 2:
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))
    else:
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)


def _finish(writer: gguf.GGUFWriter, path: str) -> str:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_text(path: str, config, state: dict, vocab: tuple[list, list, list],
               bos_eos: tuple[int, int], chat_template: str | None = None,
               tensor_type: str = "F32", pre: str = "gpt-2") -> str:
    """A Gemma 3 text model (`config`: its Gemma3TextConfig; `state`: transformers' names under
    model.*), 2-D weights in `tensor_type`, with the byte-level vocabulary `vocab` and its BOS
    and EOS ids and its pre-tokenizer name `pre`; with a chat template the tokenizer also adds
    the BOS (as Gemma's files say)."""
    tokens, types, merges = vocab
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_name("tiny-gemma3")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["full_attention"]["rope_theta"])
    writer.add_sliding_window(config.sliding_window)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(bos_eos[0])
    writer.add_eos_token_id(bos_eos[1])
    if chat_template is not None:
        writer.add_add_bos_token(True)
        writer.add_chat_template(chat_template)
    for name, t in state.items():
        if name == "lm_head.weight":
            continue                                      # tied
        w = t.float().numpy()
        _add(writer, gguf_name(name), w + 1 if name.endswith("norm.weight") else w, tensor_type)
    return _finish(writer, path)


def write_mmproj(path: str, config, state: dict, tensor_type: str = "F32",
                 projector_type: str = "gemma3", swapped_mlp: bool = False) -> str:
    """The vision tower and projector of a Gemma3ForConditionalGeneration (`config`: its
    Gemma3Config; `state`: `vision_tower.*` and `multi_modal_projector.*` as transformers 5
    saves them) as llama.cpp's convert_hf_to_gguf.py writes them (`swapped_mlp`: as its first
    Gemma 3 converter did, fc1 named ffn_down and fc2 ffn_up)."""
    names = VISION_NAMES | (SWAPPED if swapped_mlp else {})
    vc = config.vision_config
    writer = gguf.GGUFWriter(path, "clip")
    writer.add_string("clip.projector_type", projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.image_size", vc.image_size)
    writer.add_uint32("clip.vision.patch_size", vc.patch_size)
    writer.add_uint32("clip.vision.embedding_length", vc.hidden_size)
    writer.add_uint32("clip.vision.feed_forward_length", vc.intermediate_size)
    writer.add_uint32("clip.vision.projection_dim", config.text_config.hidden_size)
    writer.add_uint32("clip.vision.block_count", vc.num_hidden_layers)
    writer.add_uint32("clip.vision.attention.head_count", vc.num_attention_heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", vc.layer_norm_eps)
    writer.add_uint32("clip.vision.projector.scale_factor",
                      vc.image_size // vc.patch_size // int(config.mm_tokens_per_image ** 0.5))
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for name, t in state.items():
        w = t.float().numpy()
        if name.startswith("multi_modal_projector."):
            short = name.removeprefix("multi_modal_projector.")
            if short == "mm_soft_emb_norm.weight":
                _add(writer, "mm.soft_emb_norm.weight", w + 1, tensor_type)
            else:
                _add(writer, "mm.input_projection.weight", w, tensor_type)
            continue
        name = name.removeprefix("vision_tower.")
        if name.startswith("encoder.layers."):
            i, rest = name.removeprefix("encoder.layers.").split(".", 1)
            part, suffix = rest.rsplit(".", 1)
            _add(writer, f"v.blk.{i}.{names[part]}.{suffix}", w, tensor_type)
        else:
            base, suffix = name.rsplit(".", 1)
            short = {"embeddings.patch_embedding": "v.patch_embd",
                     "embeddings.position_embedding": "v.position_embd",
                     "post_layernorm": "v.post_ln"}[base]
            _add(writer, f"{short}.{suffix}", w, tensor_type)
    return _finish(writer, path)
