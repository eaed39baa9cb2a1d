"""Vision towers and image preprocessing against transformers, on tiny random models.

Oracles: transformers' `get_image_features` (SigLIP, pixel shuffle, projection) on the same
pixels, a crop with padding included; transformers' processor output (token ids, pixel values,
masks, the number of image tokens) for the engine's ImagePrompt.
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


def test_preprocessing_equals_the_processor(tiny_root):
    path = tiny_vlm.build(tiny_root, "idefics3")
    loaded = loader.load(path, torch.device("cpu"), torch.float32)
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
