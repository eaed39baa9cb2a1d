"""Idefics3 / SmolVLM GGUF files written with gguf-py's GGUFWriter as llama.cpp's
convert_hf_to_gguf.py writes them: the Llama text model (`write_text`: tensor names from gguf-py's
own table, q/k rows permuted as its LlamaModel.permute does, `output.weight` where untied) and
the vision projector (`write_mmproj`: an `mmproj` file of projector type "idefics3", the SigLIP
encoder's `v.*` tensors and the connector as `mm.model.fc.weight`, with the keys its
SmolVLMModel adds: projector.scale_factor, use_gelu, preproc_image_size, the processor's
longest edge).

    write_text(path, config, state, vocab, bos_eos, chat_template=None, tensor_type="F32") -> path
    write_mmproj(path, config, state, longest_edge, tensor_type="F32") -> path
`vocab`: (tokens, token types, merges) of a byte-level ("gpt2") vocabulary; the tokenizer does
not add a BOS (the tiny models' does not).
"""

from __future__ import annotations

import gguf
from helpers.ggml_models import permute
from helpers.gguf_writing import add_siglip, add_sizes, add_tensor, add_vocab, clip_writer, finish


def write_text(path: str, config, state: dict, vocab: tuple[list, list, list],
               bos_eos: tuple[int, int], chat_template: str | None = None,
               tensor_type: str = "F32") -> str:
    """The Llama text model of an Idefics3ForConditionalGeneration (`config`: its text_config;
    `state`: transformers' names, model.* and lm_head.*), 2-D weights in `tensor_type`."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    writer = gguf.GGUFWriter(path, "llama")
    add_sizes(writer, "tiny-idefics3", config)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    add_vocab(writer, vocab, bos_eos, chat_template, "default", add_bos=False)
    for name, t in state.items():
        w = t.float().numpy()
        if ".self_attn.q_proj." in name:
            w = permute(w, config.num_attention_heads)
        elif ".self_attn.k_proj." in name:
            w = permute(w, config.num_key_value_heads)
        add_tensor(writer, names.get_name(name, try_suffixes=(".weight", ".bias")), w, tensor_type)
    return finish(writer, path)


def write_mmproj(path: str, config, state: dict, longest_edge: int | None,
                 tensor_type: str = "F32") -> str:
    """The vision tower and connector of an Idefics3ForConditionalGeneration (`config`: its
    Idefics3Config; `state`: `vision_model.*` and `connector.*`, transformers' names without
    `model.`); `longest_edge`: its image processor's size["longest_edge"] (None: not
    written, as by converters older than that key)."""
    keys = {"preproc_image_size": longest_edge} if longest_edge is not None else {}
    writer = clip_writer(path, "idefics3", config.vision_config, config.text_config.hidden_size,
                         config.scale_factor, keys)
    writer.add_bool("clip.use_gelu", True)
    add_tensor(writer, "mm.model.fc.weight",
               state["connector.modality_projection.proj.weight"].float().numpy(), tensor_type)
    add_siglip(writer, {k.removeprefix("vision_model."): v for k, v in state.items()
                        if k.startswith("vision_model.")}, tensor_type)
    return finish(writer, path)
