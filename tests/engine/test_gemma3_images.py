"""Prompts with images on a tiny random Gemma 3 (Gemma3ForConditionalGeneration): greedy tokens
and the chosen tokens' logprobs equal transformers' generate on the same image and text
(float32), with an image's tokens attending to each other both ways (transformers'
token_type_ids mask), and the paged machinery (prefix cache keyed by the image, encoder cache,
chunked prefill that keeps an image whole, batching with text-only requests, preemption by
recompute) changes none of them.

Oracle: transformers' Gemma3ForConditionalGeneration `generate` on its own processor's output
(apply_chat_template, tokenized), whose token ids must also equal the engine's prompt. The
tiny model's text layers slide over 8 tokens, fewer than an image's 16 tokens.
"""

import os

import pytest
import torch
from helpers import tiny_vlm
from helpers.engine_helpers import greedy

from localpaged import LLM

chat = tiny_vlm.chat


@pytest.fixture(scope="module")
def gemma(tiny_root):
    return tiny_vlm.build_gemma3(tiny_root)


def conversation(question: str) -> list[dict]:
    return tiny_vlm.conversation(question, reply_role="model")


def check_equal(path: str, messages: list[dict], prompt, out, images, max_tokens: int) -> dict:
    """out (the engine's) equals transformers' greedy tokens and logprobs on transformers' own
    tokenized chat template; returns those inputs."""
    inputs = dict(tiny_vlm.hf_processor(path).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True,
        return_tensors="pt", images=images or None))
    assert inputs["input_ids"][0].tolist() == prompt.token_ids
    tiny_vlm.check_greedy(path, inputs, out, max_tokens)
    return inputs


def test_image_in_a_conversation_equals_transformers(gemma):
    llm = LLM(gemma, num_kv_blocks=64)
    images = [tiny_vlm.image(1)]
    messages = conversation("What is it?")
    prompt = llm.image_prompt(messages, images)
    span = prompt.images[0]
    assert span.whole and span.num_embeddings == 16 and prompt.token_ids.count(1) == 1  # one BOS
    assert span.offset > 20 and span.end < len(prompt.token_ids) - 5
    out = llm.generate([prompt], greedy(10, logprobs=1))[0]
    inputs = check_equal(gemma, messages, prompt, out, images, 10)
    assert llm.stats().encoder_runs == 1
    # the two-way attention matters: transformers with a causal image gives other logprobs
    causal = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    _, causal_lps = tiny_vlm.hf_greedy(gemma, causal, 10)
    assert max(abs(a.logprob - b) for a, b in zip(out.outputs[0].logprobs, causal_lps)) > 1e-2


def test_two_images_batched_with_text_only_requests(gemma):
    llm = LLM(gemma, num_kv_blocks=128, record_steps=True)
    two = [tiny_vlm.image(2), tiny_vlm.image(3, 20, 20)]
    one = [tiny_vlm.image(4, 64, 30)]
    m_two = chat(("user", ["First ", 0, " then ", 1, " compare."]))
    m_one = chat(("user", [0, "Describe."]))
    p_two, p_one = llm.image_prompt(m_two, two), llm.image_prompt(m_one, one)
    texts = [llm.tokenizer.encode("user:plain text one"), llm.tokenizer.encode("user:two!")]
    outs = llm.generate([p_two, texts[0], p_one, texts[1]], greedy(8, logprobs=1))
    steps = llm.engine.step_records
    assert any(len({s.request_id for s in r.seqs}) == 4 for r in steps)     # one batch, all four
    check_equal(gemma, m_two, p_two, outs[0], two, 8)
    check_equal(gemma, m_one, p_one, outs[2], one, 8)
    for ids, out in zip(texts, (outs[1], outs[3])):
        tokens, _ = tiny_vlm.hf_greedy(gemma, {"input_ids": torch.tensor([ids])}, 8)
        assert out.outputs[0].token_ids == tokens
    assert len(p_two.images) == 2 and llm.stats().encoder_runs == 3


def test_regenerate_shares_the_image_blocks_and_runs_the_encoder_once(gemma):
    llm = LLM(gemma, num_kv_blocks=64)
    images = [tiny_vlm.image(5)]
    messages = conversation("Again?")
    prompt = llm.image_prompt(messages, images)
    first = llm.generate([prompt], greedy(10, logprobs=1))[0]
    computed = llm.engine.num_tokens_computed
    second = llm.generate([prompt], greedy(10, logprobs=1))[0]     # a regenerate
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    B = llm.stats().block_size
    cached = second.metrics.num_cached_tokens
    assert cached >= prompt.images[0].end and cached == (len(prompt.token_ids) - 1) // B * B
    assert llm.engine.num_tokens_computed - computed == len(prompt.token_ids) - cached + 9
    assert llm.stats().encoder_runs == 1                           # the image's prefill skipped
    check_equal(gemma, messages, prompt, second, images, 10)


def test_branch_after_an_image_reuses_it(gemma):
    """An edited question after the image: a new branch sharing the image's blocks. Its hit
    ends inside the image (whole blocks only: the model's sliding layers): the rest of the
    image is one chunk attending both ways to the cached part and to itself."""
    llm = LLM(gemma, num_kv_blocks=64)
    images = [tiny_vlm.image(8)]
    llm.generate([llm.image_prompt(conversation("What colour?"), images)], greedy(10))
    messages = conversation("How big is it?")
    branch = llm.image_prompt(messages, images)
    out = llm.generate([branch], greedy(10, logprobs=1))[0]
    span = branch.images[0]
    B = llm.stats().block_size
    assert span.offset < out.metrics.num_cached_tokens == span.end // B * B < span.end
    assert llm.stats().encoder_runs == 1
    check_equal(gemma, messages, branch, out, images, 10)


def test_chunks_smaller_than_an_image_keep_it_whole(gemma):
    """A budget of 6 tokens a step: chunks stop before each image, and the image (22 tokens
    with its markers) is one chunk of its own, past the budget; outputs equal transformers'."""
    llm = LLM(gemma, num_kv_blocks=64, max_num_batched_tokens=6, max_num_seqs=2, record_steps=True)
    images = [tiny_vlm.image(9), tiny_vlm.image(10, 30, 30)]
    messages = chat(("user", ["A ", 0, " and ", 1, "?"]))
    prompt = llm.image_prompt(messages, images)
    out = llm.generate([prompt], greedy(6, logprobs=1))[0]
    check_equal(gemma, messages, prompt, out, images, 6)
    ends, done = [], 0
    for record in llm.engine.step_records:
        done += record.seqs[0].num_tokens
        ends.append(done)
    prompt_ends = [e for e in ends if e <= len(prompt.token_ids)]
    for span in prompt.images:
        assert span.offset in prompt_ends and span.end in prompt_ends      # one chunk each
        assert not any(span.offset < e < span.end for e in prompt_ends)
    assert max(r.seqs[0].num_tokens for r in llm.engine.step_records) == prompt.images[0].length > 6
    assert llm.stats().encoder_runs == 2


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_outputs(gemma, mode):
    llm = LLM(gemma, num_kv_blocks=14, block_size=8, preemption_mode=mode, swap_space_gb=0.01,
              debug_checks=True)
    images = [[tiny_vlm.image(20 + i)] for i in range(3)]
    messages = [chat(("user", [0, f"Q{i}?"])) for i in range(3)]
    prompts = [llm.image_prompt(m, im) for m, im in zip(messages, images)]
    outs = llm.generate(prompts, greedy(24, logprobs=1))
    stats = llm.stats()
    assert stats.num_preemptions > 0
    if mode == "swap":
        assert stats.num_swapped_out > 0
    for m, prompt, out, im in zip(messages, prompts, outs, images):
        check_equal(gemma, m, prompt, out, im, 24)
    assert stats.encoder_runs == 3          # a recomputed prefill takes the cached embeddings


@pytest.mark.parametrize("backend", ["cpu", "torch", "triton"])
def test_attention_backends_give_the_same_tokens(gemma, backend):
    """Every backend's prefill opens the image both ways (the reference's on "cpu" and "torch",
    the Triton kernel's on "triton": under TRITON_INTERPRET=1 on CPU, natively on CUDA) and
    gives transformers' tokens."""
    device = "cuda" if torch.cuda.is_available() and backend != "cpu" else "cpu"
    llm = LLM(gemma, num_kv_blocks=64, attention_backend=backend, device=device)
    images = [tiny_vlm.image(12)]
    messages = conversation("Backend?")
    prompt = llm.image_prompt(messages, images)
    check_equal(gemma, messages, prompt, llm.generate([prompt], greedy(8, logprobs=1))[0], images, 8)


def test_gguf_with_its_mmproj_equals_the_safetensors_model(tiny_root):
    """llama.cpp's two files (the text model, the vision projector beside it) load as one
    vision-language model: the same prompt (token ids, pixels, image hash) from the GGUF's own
    tokenizer and chat template, the same outputs as the safetensors checkpoint's and as
    transformers'."""
    st_path, folder = tiny_vlm.write_gemma3_gguf(tiny_root)
    st = LLM(st_path, num_kv_blocks=64)
    images, messages = [tiny_vlm.image(13)], conversation("From GGUF?")
    expected = st.generate([st.image_prompt(messages, images)], greedy(8, logprobs=1))[0]
    for source in (folder, os.path.join(folder, "model-F32.gguf")):     # the folder or the file
        gg = LLM(source, num_kv_blocks=64)
        assert type(gg.engine.encoder.tower).__name__ == "Gemma3Vision"
        prompt = gg.image_prompt(messages, images)
        out = gg.generate([prompt], greedy(8, logprobs=1))[0]
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids
        assert [lp.logprob for lp in out.outputs[0].logprobs] == \
            pytest.approx([lp.logprob for lp in expected.outputs[0].logprobs], abs=1e-5)
        check_equal(st_path, messages, prompt, out, images, 8)
        assert gg.stats().encoder_runs == 1


def test_mmproj_variants_and_refusals(tiny_root, tmp_path):
    """The first converter's swapped MLP names load the same tower; the projector file alone
    is not a model; a projector type not read here, and one meant for another text model, are
    refused by name."""
    import shutil

    from helpers import gemma3_gguf

    from localpaged.models.vision import ImagePixels
    from localpaged.runner import loader
    st_path, folder = tiny_vlm.write_gemma3_gguf(tiny_root)
    model = tiny_vlm.hf_model(st_path)
    state = {k.removeprefix("model."): v for k, v in model.state_dict().items()
             if k.startswith(("model.vision_tower.", "model.multi_modal_projector."))}
    pixels = ImagePixels(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(6)))
    encoded = []
    refusals = {"pixtral": "vision projector type 'pixtral' is not supported",
                "idefics3": "type 'idefics3' goes beside a llama text model, not gemma3_text"}
    for kind, swapped in (("pixtral", False), ("idefics3", False), ("gemma3", True)):
        other = tmp_path / f"{kind}-{swapped}"
        other.mkdir()
        shutil.copy(os.path.join(folder, "model-F32.gguf"), other)
        gemma3_gguf.write_mmproj(str(other / "mmproj.gguf"), model.config, state,
                                 projector_type=kind, swapped_mlp=swapped)
        if kind != "gemma3":
            with pytest.raises(ValueError, match=refusals[kind]):
                LLM(str(other), num_kv_blocks=16)
            continue
        for source in (folder, str(other)):
            tower = loader.load(source, torch.device("cpu"), torch.float32).vision
            with torch.inference_mode():
                encoded.append(tower.encode(pixels))
    with torch.inference_mode():
        expected = model.model.get_image_features(pixels.values).pooler_output.reshape(32, -1)
    for out in encoded:
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="is a vision projector"):
        LLM(os.path.join(folder, "mmproj-model-f32.gguf"), num_kv_blocks=16)
