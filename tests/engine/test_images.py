"""Prompts with images on a tiny random Idefics3 (and SmolVLM) model: greedy tokens and the
chosen tokens' logprobs equal transformers' generate on the same image and text (float32),
and the paged machinery (prefix cache keyed by the image, encoder cache, chunked prefill,
batching with text-only requests, preemption by recompute and swap) changes none of them.

Oracle: transformers' Idefics3ForConditionalGeneration / SmolVLMForConditionalGeneration
`generate` (helpers/tiny_vlm.py: hf_greedy) on its own processor's output, whose token ids
must also equal the engine's prompt.
"""

import pytest
from helpers import tiny_vlm
from helpers.engine_helpers import greedy

from localpaged import LLM, SamplingParams

LOGPROB_TOL = tiny_vlm.LOGPROB_TOL
chat, conversation = tiny_vlm.chat, tiny_vlm.conversation


@pytest.fixture(scope="module")
def vlm(tiny_root):
    return tiny_vlm.build(tiny_root, "idefics3")


def check_equal(path: str, llm: LLM, prompt, out, images, max_tokens: int) -> None:
    """out (the engine's) equals transformers' greedy tokens and logprobs on prompt.text."""
    inputs = tiny_vlm.hf_inputs(path, prompt.text, images)
    assert inputs["input_ids"][0].tolist() == prompt.token_ids
    tiny_vlm.check_greedy(path, inputs, out, max_tokens)


def params(max_tokens: int = 10) -> SamplingParams:
    return greedy(max_tokens, logprobs=1)


def test_image_in_a_conversation_equals_transformers(vlm):
    llm = LLM(vlm, num_kv_blocks=64)
    images = [tiny_vlm.image(1)]
    prompt = llm.image_prompt(conversation("What is it?"), images)
    assert prompt.images[0].offset > 20 and prompt.images[0].end < len(prompt.token_ids) - 5
    out = llm.generate([prompt], params())[0]
    check_equal(vlm, llm, prompt, out, images, 10)
    assert llm.stats().encoder_runs == 1


def test_each_request_reports_its_own_encoder_runs_and_hits(vlm):
    """RequestMetrics: the first request runs the tower; after the prefix cache is emptied the
    same image comes from the encoder cache (its prefill recomputed, the same tokens); once the
    prefix cache holds the image's blocks, neither is asked."""
    llm = LLM(vlm, num_kv_blocks=64)
    prompt = llm.image_prompt(conversation("What is it?"), [tiny_vlm.image(30)])
    first = llm.generate([prompt], params())[0]
    assert (first.metrics.num_encoder_runs, first.metrics.num_encoder_hits) == (1, 0)
    llm.reset_prefix_cache()
    again = llm.generate([prompt], params())[0]
    assert (again.metrics.num_encoder_runs, again.metrics.num_encoder_hits) == (0, 1)
    assert again.metrics.num_cached_tokens == 0
    cached = llm.generate([prompt], params())[0]
    assert cached.metrics.num_cached_tokens >= prompt.images[0].end
    assert (cached.metrics.num_encoder_runs, cached.metrics.num_encoder_hits) == (0, 0)
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == cached.outputs[0].token_ids
    assert llm.stats().encoder_runs == 1 and llm.stats().encoder_cache_hits == 1



def test_previews_count_the_image_blocks(vlm):
    """The engine's previews (the edit preview, the KV map, the disk prefetch) take the
    ImagePrompt: they find the image's blocks by its hash as a request does; token ids alone
    stop at the first image."""
    llm = LLM(vlm, num_kv_blocks=64)
    prompt = llm.image_prompt(conversation("What is it?"), [tiny_vlm.image(31)])
    llm.generate([prompt], params(4))
    span, block = prompt.images[0], llm.engine.block_manager.block_size
    preview = llm.engine.cached_prefix_tokens(prompt)
    assert preview >= span.end
    assert llm.engine.cached_prefix_tokens(prompt.token_ids) <= span.offset
    assert len(llm.engine.cached_prefix_blocks(prompt)) >= span.end // block
    assert len(llm.engine.cached_prefix_blocks(prompt.token_ids)) <= span.offset // block + 1
    again = llm.generate([prompt], params(4))[0]
    assert again.metrics.num_cached_tokens == preview


def test_two_images_batched_with_text_only_requests(vlm, tiny_root):
    llm = LLM(vlm, num_kv_blocks=96, record_steps=True)
    two = [tiny_vlm.image(2), tiny_vlm.image(3, 20, 20)]
    one = [tiny_vlm.image(4, 64, 30)]
    p_two = llm.image_prompt(chat(("user", ["First ", 0, " then ", 1, " compare."])), two)
    p_one = llm.image_prompt(chat(("user", [0, "Describe."])), one)
    texts = [llm.tokenizer.encode("user:plain text one"), llm.tokenizer.encode("user:two!")]
    outs = llm.generate([p_two, texts[0], p_one, texts[1]], params(8))
    steps = llm.engine.step_records
    assert any(len({s.request_id for s in r.seqs}) == 4 for r in steps)     # one batch, all four
    check_equal(vlm, llm, p_two, outs[0], two, 8)
    check_equal(vlm, llm, p_one, outs[2], one, 8)
    for ids, out in zip(texts, (outs[1], outs[3])):
        tokens, _ = tiny_vlm.hf_greedy(vlm, {"input_ids": __import__("torch").tensor([ids])}, 8)
        assert out.outputs[0].token_ids == tokens
    assert len(p_two.images) == 2 and llm.stats().encoder_runs == 3


def test_regenerate_shares_the_image_blocks_and_runs_the_encoder_once(vlm):
    llm = LLM(vlm, num_kv_blocks=64)
    images = [tiny_vlm.image(5)]
    prompt = llm.image_prompt(conversation("Again?"), images)
    first = llm.generate([prompt], params())[0]
    computed = llm.engine.num_tokens_computed
    second = llm.generate([prompt], params())[0]          # a regenerate: same prompt, same image
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    B = llm.stats().block_size
    assert second.metrics.num_cached_tokens == len(prompt.token_ids) - 1
    assert second.metrics.num_cached_tokens >= prompt.images[0].end // B * B
    assert llm.engine.num_tokens_computed - computed == 1 + 9      # last prompt token + decodes
    stats = llm.stats()
    assert stats.encoder_runs == 1                                 # the prefill of the image skipped
    check_equal(vlm, llm, prompt, second, images, 10)


def test_another_image_with_the_same_text_shares_no_image_block(vlm):
    """Same token ids, other pixels: the blocks (and tail hits) holding the image differ."""
    llm = LLM(vlm, num_kv_blocks=64, block_size=8)
    question = conversation("Same words?")
    a, b = [tiny_vlm.image(6)], [tiny_vlm.image(7)]
    pa, pb = llm.image_prompt(question, a), llm.image_prompt(question, b)
    assert pa.token_ids == pb.token_ids and pa.images[0].content_hash != pb.images[0].content_hash
    llm.generate([pa], params())
    out = llm.generate([pb], params())[0]
    assert out.metrics.num_cached_tokens <= pb.images[0].offset
    check_equal(vlm, llm, pb, out, b, 10)
    assert llm.stats().encoder_runs == 2


def test_branch_after_an_image_reuses_it(vlm):
    """An edited question after the image: a new branch sharing the image's blocks."""
    llm = LLM(vlm, num_kv_blocks=64)
    images = [tiny_vlm.image(8)]
    first = llm.image_prompt(conversation("What colour?"), images)
    branch = llm.image_prompt(conversation("How big is it?"), images)
    llm.generate([first], params())
    out = llm.generate([branch], params())[0]
    B = llm.stats().block_size
    assert out.metrics.num_cached_tokens >= branch.images[0].end // B * B
    assert llm.stats().encoder_runs == 1
    check_equal(vlm, llm, branch, out, images, 10)


def test_chunked_prefill_splits_images_anywhere(vlm):
    """Chunks of 8 tokens end inside every image's placeholders: each chunk gets its slice of
    the embeddings, and the tower runs once per image."""
    llm = LLM(vlm, num_kv_blocks=64, max_num_batched_tokens=8, max_num_seqs=2)
    images = [tiny_vlm.image(9), tiny_vlm.image(10, 30, 30)]
    prompt = llm.image_prompt(chat(("user", ["A ", 0, " and ", 1, "?"])), images)
    out = llm.generate([prompt], params(6))[0]
    check_equal(vlm, llm, prompt, out, images, 6)
    assert llm.stats().encoder_runs == 2


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_outputs(vlm, mode):
    llm = LLM(vlm, num_kv_blocks=13, block_size=8, preemption_mode=mode, swap_space_gb=0.01,
              debug_checks=True)
    images = [[tiny_vlm.image(20 + i)] for i in range(3)]
    prompts = [llm.image_prompt(f"<image>Q{i}?", im) for i, im in enumerate(images)]
    outs = llm.generate(prompts, params(16))
    stats = llm.stats()
    assert stats.num_preemptions > 0
    if mode == "swap":
        assert stats.num_swapped_out > 0
    for prompt, out, im in zip(prompts, outs, images):
        check_equal(vlm, llm, prompt, out, im, 16)
    assert stats.encoder_runs == 3          # a recomputed prefill takes the cached embeddings


def test_smolvlm_equals_transformers(tiny_root, caplog):
    """SmolVLM takes images without torchvision: its prompt (two images in a conversation) is
    SmolVLMProcessor's, and its greedy tokens and logprobs are transformers' SmolVLM's."""
    path = tiny_vlm.build(tiny_root, "smolvlm", seed=1)
    with caplog.at_level("WARNING", logger="localpaged"):
        llm = LLM(path, num_kv_blocks=64)
    assert not [r for r in caplog.records if "processor" in r.getMessage()]
    images = [tiny_vlm.image(11), tiny_vlm.image(12, 64, 12)]
    messages = chat(("user", ["Hi."]), ("assistant", ["Hello."]),
                    ("user", ["First ", 0, " then ", 1, " compare them."]))
    prompt = llm.image_prompt(messages, images)
    assert [s.num_embeddings for s in prompt.images] == [20, 12]   # 2x2 and 2x1 crops + global
    out = llm.generate([prompt], params())[0]
    check_equal(path, llm, prompt, out, images, 10)
    assert llm.stats().encoder_runs == 2


def test_bad_image_prompts_are_refused(vlm, tiny_llama):
    llm = LLM(vlm, num_kv_blocks=32)
    image_id = llm.engine.encoder.tower.image_token_id
    with pytest.raises(ValueError, match="placeholder tokens that no image fills"):
        llm.generate([[5, 6, image_id, 7]], params(2))
    with pytest.raises(ValueError, match="could not be prepared"):
        llm.image_prompt("one <image> only", [tiny_vlm.image(1), tiny_vlm.image(2)])
    prompt = llm.image_prompt("<image>x", [tiny_vlm.image(1)])
    text_only = LLM(tiny_llama, num_kv_blocks=32)
    with pytest.raises(ValueError, match="takes no images"):
        text_only.generate([prompt], params(2))
    with pytest.raises(ValueError, match="takes no images"):
        text_only.image_prompt("<image>", [tiny_vlm.image(1)])
    assert not llm.engine.groups and not text_only.engine.groups


def test_the_disk_tier_finds_an_image_again_after_a_restart(vlm, tmp_path):
    """A new engine on the same disk tier (a restart) reads the image's blocks back: its prompt
    computes only what follows its last whole block and the tower does not run; another image behind the same text reads
    nothing past the text before it."""
    images = [tiny_vlm.image(7)]
    first = LLM(vlm, num_kv_blocks=64, kv_disk_dir=str(tmp_path))
    prompt = first.image_prompt(conversation("Still there?"), images)
    want = first.generate([prompt], params())[0]
    del first
    again = LLM(vlm, num_kv_blocks=64, kv_disk_dir=str(tmp_path), debug_checks=True)
    out = again.generate([again.image_prompt(conversation("Still there?"), images)], params())[0]
    assert out.outputs[0].token_ids == want.outputs[0].token_ids
    B = again.stats().block_size                      # the disk tier holds whole blocks
    assert out.metrics.num_cached_tokens == (len(prompt.token_ids) - 1) // B * B
    assert out.metrics.num_disk_tokens == out.metrics.num_cached_tokens
    assert prompt.images[0].end <= out.metrics.num_cached_tokens
    assert again.stats().encoder_runs == 0
    other = again.image_prompt(conversation("Still there?"), [tiny_vlm.image(8)])
    out = again.generate([other], params())[0]
    assert out.metrics.num_cached_tokens <= other.images[0].offset
    check_equal(vlm, again, other, out, [tiny_vlm.image(8)], 10)


def test_speculation_keeps_image_outputs(vlm):
    """n-gram speculation drafts over prompts with images: the same tokens as without."""
    images = [tiny_vlm.image(9)]
    plain = LLM(vlm, num_kv_blocks=64)
    prompt = plain.image_prompt(conversation("Repeat it?"), images)
    want = plain.generate([prompt], params(24))[0]
    spec = LLM(vlm, num_kv_blocks=64, speculation="ngram", debug_checks=True)
    out = spec.generate([prompt], params(24))[0]
    assert out.outputs[0].token_ids == want.outputs[0].token_ids
    check_equal(vlm, spec, prompt, out, images, 24)
