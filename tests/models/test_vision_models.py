"""Vision towers and image preprocessing against transformers, on tiny random models.

Oracles: transformers' `get_image_features` (SigLIP, pixel shuffle, projection) on the same
pixels, a crop with padding included; transformers' processor output (token ids, pixel values,
masks, the number of image tokens) for the engine's ImagePrompt (SmolVLM's: SmolVLMProcessor's
images path, which transformers builds only with torchvision, made without it).
"""

import pytest
import torch
from helpers import tiny_vlm

from localpaged.engine.multimodal import ImagePreprocessor, content_hash
from localpaged.models.vision import ImagePixels
from localpaged.runner import loader


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_tower_equals_transformers_image_features(tiny_root, family):
    path = tiny_vlm.build(tiny_root, family, seed=1 if family == "smolvlm" else 0)
    loaded = loader.load(path, torch.device("cpu"), torch.float32)
    assert loaded.vision is not None and type(loaded.model).__name__ == "LlamaForCausalLM"
    g = torch.Generator().manual_seed(3)
    values = torch.randn(1, 3, 3, 32, 32, generator=g)
    mask = torch.ones(1, 3, 32, 32, dtype=torch.long)
    mask[0, 1, :, 20:] = 0                       # a crop padded on the right
    values[0, 1, :, :, 20:] = 0
    with torch.inference_mode():
        ref = tiny_vlm.hf_model(path).model.get_image_features(values, mask).pooler_output[0]
        ours = loaded.vision.encode(ImagePixels(values[0], mask[0].bool()))
    assert ours.shape == ref.shape == (12, 64)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_preprocessing_equals_the_processor(tiny_root, family):
    """Idefics3's processor, and SmolVLM's (Idefics3Processor from SmolVLM's files, held
    against SmolVLMProcessor's own images path, helpers/tiny_vlm.py smolvlm_processor)."""
    path = tiny_vlm.build(tiny_root, family, seed=1 if family == "smolvlm" else 0)
    loaded = loader.load(path, torch.device("cpu"), torch.float32)
    assert type(tiny_vlm.hf_processor(path)).__name__ == ("SmolVLMProcessor" if family == "smolvlm"
                                                          else "Idefics3Processor")
    assert type(loaded.processor.image_processor).__name__ == \
        ("SmolVLMImageProcessorPil" if family == "smolvlm" else "Idefics3ImageProcessorPil")
    pre = ImagePreprocessor(loaded.processor, loaded.vision)
    images = [tiny_vlm.image(1), tiny_vlm.image(2, 20, 20), tiny_vlm.image(3, 64, 12)]
    text = "a<image>b<image><image>c"
    prompt = pre.prompt(text, images)
    ref = tiny_vlm.hf_inputs(path, text, images)
    ids = ref["input_ids"][0].tolist()
    assert prompt.token_ids == ids
    image_id = loaded.vision.image_token_id
    assert sum(s.num_embeddings for s in prompt.images) == ids.count(image_id)
    crops = torch.cat([s.pixels.values for s in prompt.images])
    n = crops.shape[0]
    assert torch.equal(crops, ref["pixel_values"][0][:n])
    assert torch.equal(torch.cat([s.pixels.mask for s in prompt.images]),
                       ref["pixel_attention_mask"][0][:n].bool())
    assert not ref["pixel_values"][0][n:].any()          # the rest: the processor's empty padding
    fake = loaded.processor.fake_image_token_id
    for span in prompt.images:           # each span: its expansion, fake tokens around it
        assert ids[span.offset] == fake and ids[span.end - 1] == fake
        assert ids[span.offset:span.end].count(image_id) == span.num_embeddings
        assert loaded.vision.num_embeddings(span.pixels) == span.num_embeddings
    assert len({s.content_hash for s in prompt.images}) == 3
    again = pre.prompt("<image>", [tiny_vlm.image(2, 20, 20)])
    assert again.images[0].content_hash == prompt.images[1].content_hash
    assert content_hash(prompt.images[1].pixels) == prompt.images[1].content_hash


def test_quantized_vision_language_model_is_refused(tiny_root):
    path = tiny_vlm.build(tiny_root, "idefics3")
    with pytest.raises(ValueError, match="Idefics3ForConditionalGeneration: vision-language "
                                         "models load from float safetensors only"):
        loader.load(path, torch.device("cpu"), torch.float32, quantization="int8")


def test_gemma3_tower_equals_transformers_image_features(tiny_root):
    path = tiny_vlm.build_gemma3(tiny_root)
    loaded = loader.load(path, torch.device("cpu"), torch.float32)
    assert type(loaded.model).__name__ == "Gemma3ForCausalLM" and loaded.vision.bidirectional
    values = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        ref = tiny_vlm.hf_model(path).model.get_image_features(values).pooler_output
        ours = loaded.vision.encode(ImagePixels(values))
    assert ref.shape == (3, 16, 64) and ref.abs().max() > 0.1
    torch.testing.assert_close(ours, ref.reshape(48, 64), rtol=0, atol=1e-6)


def test_gemma3_loads_from_googles_checkpoint_names(tiny_root, tmp_path):
    """Google's files nest the tower as vision_tower.vision_model.* and the text model under
    language_model.model.*; transformers 5 saves vision_tower.* (the tiny model's)."""
    import shutil

    from safetensors.torch import load_file, save_file
    path = tiny_vlm.build_gemma3(tiny_root)
    google = tmp_path / "google-names"
    shutil.copytree(path, google)
    state = load_file(str(google / "model.safetensors"))
    assert any(k.startswith("vision_tower.embeddings.") for k in state)
    renamed = {k.replace("vision_tower.", "vision_tower.vision_model.", 1): v for k, v in state.items()}
    save_file(renamed, str(google / "model.safetensors"), metadata={"format": "pt"})
    values = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    towers = [loader.load(p, torch.device("cpu"), torch.float32).vision for p in (path, str(google))]
    with torch.inference_mode():
        a, b = (t.encode(ImagePixels(values)) for t in towers)
    assert torch.equal(a, b)


def test_gemma3_preprocessing_equals_the_processor(tiny_root):
    """Token ids (one BOS though the template writes it), pixels, and each image's span: its
    markers around the 16 soft tokens, which are the processor's token_type_ids == 1."""
    path = tiny_vlm.build_gemma3(tiny_root)
    loaded = loader.load(path, torch.device("cpu"), torch.float32)
    pre = ImagePreprocessor(loaded.processor, loaded.vision)
    images = [tiny_vlm.image(1), tiny_vlm.image(2, 20, 20)]
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"},
                                             {"type": "text", "text": "b"}, {"type": "image"}]}]
    prompt = pre.chat(messages, images)
    ref = dict(loaded.processor.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                    return_dict=True, return_tensors="pt", images=images))
    ids = ref["input_ids"][0].tolist()
    assert prompt.token_ids == ids and ids.count(loaded.tokenizer.bos_token_id) == 1
    assert torch.equal(torch.cat([s.pixels.values for s in prompt.images]), ref["pixel_values"])
    boi, eoi = loaded.processor.tokenizer.boi_token_id, loaded.processor.tokenizer.eoi_token_id
    soft = [i for i, t in enumerate(ref["token_type_ids"][0].tolist()) if t == 1]
    inside = []
    for span in prompt.images:
        assert span.whole and span.num_embeddings == 16
        body = ids[span.offset:span.end]
        assert body.count(boi) == body.count(eoi) == 1
        inside += [p for p in range(span.offset, span.end) if ids[p] == loaded.vision.image_token_id]
    assert inside == soft and len(soft) == 32


def test_a_smolvlm_tokenizer_naming_other_image_tokens_gets_no_processor(tiny_root, tmp_path, caplog):
    """SmolVLMProcessor takes its image tokens from the tokenizer where it names them;
    Idefics3Processor writes its own, so a tokenizer naming others is refused images."""
    import json
    import shutil

    from localpaged.runner import vision_loader
    path = tiny_vlm.build(tiny_root, "smolvlm", seed=1)
    assert vision_loader.load_processor(path, "smolvlm") is not None
    other = tmp_path / "other-tokens"
    shutil.copytree(path, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["extra_special_tokens"] = {"image_token": "<global-img>"}
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="localpaged"):
        assert vision_loader.load_processor(str(other), "smolvlm") is None
    assert "names other image tokens" in caplog.text
