"""Anthropic `image` content blocks in /v1/messages, over a real server on the tiny Idefics3 model
(helpers/tiny_vlm.py): a base64 image equals transformers on the processor's own rendering of
the same chat (and the same request through /v1/chat/completions), count_tokens counts the
image's tokens, a repeat reuses the image's blocks and its encoder output; url sources follow the
server's image policy; refusals name the block (a text-only model, an assistant's image, a bad
image, too many, tools with images)."""

import base64

import httpx
import pytest
from helpers import tiny_vlm
from helpers.api_server import MODEL, make_engine, start_server, stop_server
from test_images_api import data_url, encoded, expected

from localpaged import LLM
from localpaged.api.images import ImagePolicy
from localpaged.api.server import build_app
from localpaged.engine.async_engine import AsyncEngine

QUESTION = "What is this?"


@pytest.fixture(scope="module")
def vlm(tiny_root):
    return tiny_vlm.build(tiny_root, "idefics3")


@pytest.fixture(scope="module")
def served(vlm, tmp_path_factory):
    allowed = tmp_path_factory.mktemp("anthropic-images")
    engine = AsyncEngine(LLM(vlm, num_kv_blocks=96).engine)
    app = build_app(engine, MODEL, None, ImagePolicy(allowed_dirs=(allowed.resolve(),),
                                                     max_images=2))
    url, server = start_server(engine, app=app)
    yield url, engine, allowed
    stop_server(server)
    engine.shutdown()


def base64_block(image, fmt: str = "PNG") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": f"image/{fmt.lower()}",
                                        "data": base64.b64encode(encoded(image, fmt)).decode()}}


def messages(*blocks) -> list[dict]:
    return [{"role": "user", "content": list(blocks)}]


def post(url: str, msgs: list[dict], path: str = "/v1/messages", **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": msgs, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(url + path, json=body, timeout=60)


def test_a_base64_image_equals_transformers_and_the_openai_route(served, vlm):
    url, engine, _ = served
    image = tiny_vlm.image(41)
    prompt_ids, tokens = expected(vlm, image, QUESTION)
    msgs = messages({"type": "text", "text": QUESTION}, base64_block(image))
    counted = post(url, msgs, "/v1/messages/count_tokens")
    assert counted.status_code == 200 and counted.json()["input_tokens"] == len(prompt_ids)
    r = post(url, msgs)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["input_tokens"] == len(prompt_ids)
    text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
    n = body["usage"]["output_tokens"]
    assert text == engine.tokenizer.decode(tokens[:n], skip_special_tokens=True)
    openai = httpx.post(url + "/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "text", "text": QUESTION},
            {"type": "image_url", "image_url": {"url": data_url(image)}}]}]}, timeout=60).json()
    assert text == openai["choices"][0]["message"]["content"]
    before = engine.stats()
    again = post(url, msgs).json()
    after = engine.stats()
    assert again["content"] == body["content"]
    assert after.prefix_cache_hits - before.prefix_cache_hits == len(prompt_ids) - 1
    assert after.encoder_runs == before.encoder_runs              # the image's KV was cached


def test_url_sources_follow_the_policy(served):
    url, _, allowed = served
    image = tiny_vlm.image(42)
    path = allowed / "a.png"
    path.write_bytes(encoded(image))
    ok = post(url, messages({"type": "image", "source": {"type": "url", "url": str(path)}},
                            {"type": "text", "text": QUESTION}))
    assert ok.status_code == 200, ok.text
    for where in ("https://example.com/a.png", "/etc/passwd"):
        r = post(url, messages({"type": "image", "source": {"type": "url", "url": where}}))
        assert r.status_code == 400
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert "messages[0].content[0]" in r.json()["error"]["message"] \
            or "not" in r.json()["error"]["message"]


@pytest.mark.parametrize("blocks, where", [
    ([{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                   "data": "bm90IGFuIGltYWdl"}}], "messages[0].content[0]"),
    ([base64_block(tiny_vlm.image(1)), base64_block(tiny_vlm.image(2)),
      base64_block(tiny_vlm.image(3))], "messages[0].content[2]"),
])
def test_bad_images_and_too_many_are_refused_naming_the_block(served, blocks, where):
    url, _, _ = served
    r = post(url, messages(*blocks, {"type": "text", "text": QUESTION}))
    assert r.status_code == 400 and where in r.text


def test_images_only_in_user_messages_and_not_with_tools(served):
    url, _, _ = served
    image = base64_block(tiny_vlm.image(43))
    r = post(url, [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [image]},
                   {"role": "user", "content": "and?"}])
    assert r.status_code == 400 and "messages[1].content[0]" in r.text
    tools = [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]
    r = post(url, messages(image, {"type": "text", "text": QUESTION}), tools=tools)
    assert r.status_code == 400 and "tools" in r.text


def test_an_image_for_a_text_only_model_is_refused(tiny_llama):
    engine = make_engine(tiny_llama)
    url, server = start_server(engine)
    try:
        r = post(url, messages({"type": "text", "text": "Look"}, base64_block(tiny_vlm.image(44))))
        assert r.status_code == 400
        assert "messages[0].content[1]" in r.text and "takes no images" in r.text
    finally:
        stop_server(server)
        engine.shutdown()
