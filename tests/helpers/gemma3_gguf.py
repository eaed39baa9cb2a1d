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
`vocab`: (tokens, token types, merges) of a byte-level ("gpt2") vocabulary. What the writers
share with others is in helpers/gguf_writing.py.
"""

from __future__ import annotations

import gguf
from helpers.gguf_writing import add_siglip, add_sizes, add_tensor, add_vocab, clip_writer, finish

GGUF_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    i, rest = name.removeprefix("model.layers.").split(".", 1)
    return f"blk.{i}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def write_text(path: str, config, state: dict, vocab: tuple[list, list, list],
               bos_eos: tuple[int, int], chat_template: str | None = None,
               tensor_type: str = "F32", pre: str = "gpt-2") -> str:
    """A Gemma 3 text model (`config`: its Gemma3TextConfig; `state`: transformers' names under
    model.*), 2-D weights in `tensor_type`, with the byte-level vocabulary `vocab` and its BOS
    and EOS ids and its pre-tokenizer name `pre`; with a chat template the tokenizer also adds
    the BOS (as Gemma's files say)."""
    writer = gguf.GGUFWriter(path, "gemma3")
    add_sizes(writer, "tiny-gemma3", config)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["full_attention"]["rope_theta"])
    writer.add_sliding_window(config.sliding_window)
    add_vocab(writer, vocab, bos_eos, chat_template, pre,
              add_bos=True if chat_template is not None else None)
    for name, t in state.items():
        if name == "lm_head.weight":
            continue                                      # tied
        w = t.float().numpy()
        add_tensor(writer, gguf_name(name), w + 1 if name.endswith("norm.weight") else w, tensor_type)
    return finish(writer, path)


def write_mmproj(path: str, config, state: dict, tensor_type: str = "F32",
                 projector_type: str = "gemma3", swapped_mlp: bool = False) -> str:
    """The vision tower and projector of a Gemma3ForConditionalGeneration (`config`: its
    Gemma3Config; `state`: `vision_tower.*` and `multi_modal_projector.*` as transformers 5
    saves them) as llama.cpp's convert_hf_to_gguf.py writes them (`swapped_mlp`: as its first
    Gemma 3 converter did, fc1 named ffn_down and fc2 ffn_up)."""
    vc = config.vision_config
    scale = vc.image_size // vc.patch_size // int(config.mm_tokens_per_image ** 0.5)
    writer = clip_writer(path, projector_type, vc, config.text_config.hidden_size, scale)
    projector = {k.removeprefix("multi_modal_projector."): v for k, v in state.items()
                 if k.startswith("multi_modal_projector.")}
    norm = projector["mm_soft_emb_norm.weight"].float().numpy()
    add_tensor(writer, "mm.soft_emb_norm.weight", norm + 1, tensor_type)
    add_tensor(writer, "mm.input_projection.weight",
               projector["mm_input_projection_weight"].float().numpy(), tensor_type)
    add_siglip(writer, {k.removeprefix("vision_tower."): v for k, v in state.items()
                        if k.startswith("vision_tower.")}, tensor_type, swapped_mlp)
    return finish(writer, path)
