"""Idefics3 / SmolVLM from GGUF with llama.cpp's mmproj file beside it: the tiny Idefics3
(helpers/tiny_vlm.py) written as llama.cpp's converter writes it (helpers/idefics3_gguf.py:
the Llama text model with the vocabulary and chat template, and an mmproj of projector type
"idefics3") loads as the vision-language model, by its folder or its text model's file.

Oracles: the safetensors checkpoint of the same weights (prompt token ids, each image's pixels
and mask through its content hash, greedy tokens and logprobs) and transformers'
Idefics3ForConditionalGeneration on its own processor's output.
"""

import os
import shutil

import pytest
import torch
from helpers import tiny_vlm
from helpers.engine_helpers import greedy

from localpaged import LLM
from localpaged.runner import loader

CPU = torch.device("cpu")

chat = tiny_vlm.chat


@pytest.fixture(scope="module")
def files(tiny_root):
    return tiny_vlm.write_idefics3_gguf(tiny_root)


def check_transformers(path: str, prompt, out, images, max_tokens: int) -> None:
    inputs = tiny_vlm.hf_inputs(path, prompt.text, images)
    assert inputs["input_ids"][0].tolist() == prompt.token_ids
    tiny_vlm.check_greedy(path, inputs, out, max_tokens)


def test_gguf_with_its_mmproj_equals_the_safetensors_model(files):
    """Two images in a conversation (a 2x2 grid of crops with row/column tags, and a 2x1):
    the same prompt from the GGUF's tokenizer and template and the same outputs."""
    st_path, folder = files
    st = LLM(st_path, num_kv_blocks=64)
    images = [tiny_vlm.image(13), tiny_vlm.image(14, 64, 12)]
    messages = chat(("user", ["Hello there."]), ("assistant", ["Hi!"]),
                    ("user", ["Look: ", 0, " and ", 1, " from GGUF?"]))
    st_prompt = st.image_prompt(messages, images)
    expected = st.generate([st_prompt], greedy(8, logprobs=1))[0]
    for source in (folder, os.path.join(folder, "model-F32.gguf")):     # the folder or the file
        gg = LLM(source, num_kv_blocks=64)
        assert type(gg.engine.encoder.tower).__name__ == "Idefics3Vision"
        prompt = gg.image_prompt(messages, images)
        assert prompt.token_ids == st_prompt.token_ids and prompt.text == st_prompt.text
        assert [(s.offset, s.length, s.num_embeddings, s.content_hash) for s in prompt.images] == \
            [(s.offset, s.length, s.num_embeddings, s.content_hash) for s in st_prompt.images]
        assert [s.num_embeddings for s in prompt.images] == [20, 12]
        out = gg.generate([prompt], greedy(8, logprobs=1))[0]
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids
        assert [lp.logprob for lp in out.outputs[0].logprobs] == \
            pytest.approx([lp.logprob for lp in expected.outputs[0].logprobs], abs=1e-5)
        check_transformers(st_path, prompt, out, images, 8)
        assert gg.stats().encoder_runs == 2


def test_processor_settings_from_the_mmproj_and_a_vocabulary_without_image_tokens(files, tmp_path):
    """The image processor's settings are the safetensors model's (its longest edge from
    clip.vision.preproc_image_size; without it, 4 crops a side); a text model whose vocabulary
    lacks an image token is refused by name."""
    import gguf
    from helpers import idefics3_gguf
    st_path, folder = files
    want = tiny_vlm.hf_processor(st_path)
    model = tiny_vlm.hf_model(st_path)
    state = model.state_dict()
    old, lacking = tmp_path / "old", tmp_path / "lacking"
    for where in (old, lacking):
        where.mkdir()
    shutil.copy(os.path.join(folder, "model-F32.gguf"), old)
    idefics3_gguf.write_mmproj(str(old / "mmproj.gguf"), model.config,
                               {k.removeprefix("model."): v for k, v in state.items()
                                if k.startswith(("model.vision_model.", "model.connector."))},
                               longest_edge=None)
    for source, edge in ((folder, 64), (str(old), 4 * 32)):
        processor = loader.load(source, CPU, torch.float32).processor
        assert processor.image_seq_len == want.image_seq_len == 4
        assert processor.image_processor.size == {"longest_edge": edge}
        for key in ("max_image_size", "image_mean", "image_std", "resample", "do_image_splitting",
                    "do_pad"):
            assert getattr(processor.image_processor, key) == getattr(want.image_processor, key)

    tokens, types, merges = tiny_vlm.byte_level(tiny_vlm.tokenizer(), tiny_vlm.VOCAB)
    at = tokens.index("<global-img>")
    tokens[at], types[at] = f"[PAD{at}]", int(gguf.TokenType.UNUSED)
    text = {k.replace("model.text_model.", "model."): v for k, v in state.items()
            if k.startswith(("model.text_model.", "lm_head."))}
    idefics3_gguf.write_text(str(lacking / "model-F32.gguf"), model.config.text_config, text,
                             (tokens, types, merges), (1, 2), chat_template=tiny_vlm.CHAT_TEMPLATE)
    shutil.copy(os.path.join(folder, "mmproj-model-f32.gguf"), lacking)
    with pytest.raises(ValueError, match="lacks the image tokens of vision projector type "
                                         r"'idefics3' \(<global-img>\)"):
        LLM(str(lacking), num_kv_blocks=16)


@pytest.mark.parametrize("tensor_type", ["F16", "Q8_0"])
def test_a_quantized_mmproj_gives_the_tower_within_its_rounding(files, tmp_path, tensor_type):
    """Projectors ship as f16 and q8_0 files: the tower dequantizes them (the embeddings stay
    F32, as the converter writes them) and stays near transformers' get_image_features."""
    from helpers import idefics3_gguf

    from localpaged.models.vision import ImagePixels
    st_path, folder = files
    model = tiny_vlm.hf_model(st_path)
    shutil.copy(os.path.join(folder, "model-F32.gguf"), tmp_path)
    idefics3_gguf.write_mmproj(str(tmp_path / f"mmproj-{tensor_type}.gguf"), model.config,
                               {k.removeprefix("model."): v for k, v in model.state_dict().items()
                                if k.startswith(("model.vision_model.", "model.connector."))},
                               longest_edge=64, tensor_type=tensor_type)
    tower = loader.load(str(tmp_path), CPU, torch.float32).vision
    values = torch.randn(1, 3, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    mask = torch.ones(1, 3, 32, 32, dtype=torch.long)
    with torch.inference_mode():
        ref = model.model.get_image_features(values, mask).pooler_output[0]
        ours = tower.encode(ImagePixels(values[0], mask[0].bool()))
    error = float((ours - ref).abs().max() / ref.abs().max())
    assert 0 < error < {"F16": 1e-3, "Q8_0": 2e-2}[tensor_type]
