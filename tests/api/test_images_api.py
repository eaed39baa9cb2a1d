"""OpenAI image_url content parts in /v1/chat/completions, over a real server on the tiny
Idefics3 model (helpers/tiny_vlm.py).

Oracle: transformers' generate on its own processor's output for the same chat (rendered by
the processor's chat template with an image part where the request has one). Refusals are
400s naming the part; the server reads local files only from folders it allows and fetches
no URL unless told to.
"""

import base64
import io

import httpx
import pytest
from helpers import tiny_vlm
from helpers.api_server import MODEL, make_engine, start_server, stop_server

from localpaged import LLM
from localpaged.api.images import ImagePolicy
from localpaged.api.server import build_app
from localpaged.engine.async_engine import AsyncEngine


def encoded(image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def data_url(image, fmt: str = "PNG") -> str:
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(encoded(image, fmt)).decode()


@pytest.fixture(scope="module")
def vlm(tiny_root):
    return tiny_vlm.build(tiny_root, "idefics3")


@pytest.fixture(scope="module")
def allowed(tmp_path_factory):
    return tmp_path_factory.mktemp("allowed-images")


@pytest.fixture(scope="module")
def served(vlm, allowed):
    engine = AsyncEngine(LLM(vlm, num_kv_blocks=96).engine)
    app = build_app(engine, MODEL, None, ImagePolicy(allowed_dirs=(allowed.resolve(),),
                                                     max_images=2))
    url, server = start_server(engine, app=app)
    yield url, engine
    stop_server(server)
    engine.shutdown()


def post(url: str, messages: list[dict], **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def expected(vlm: str, image, question: str) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy tokens) of transformers for user: question + image."""
    proc = tiny_vlm.hf_processor(vlm)
    rendered = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": question}, {"type": "image"}]}],
        tokenize=False, add_generation_prompt=True)
    inputs = tiny_vlm.hf_inputs(vlm, rendered, [image])
    return inputs["input_ids"][0].tolist(), tiny_vlm.hf_greedy(vlm, inputs, 8)[0]


def check_reply(response: httpx.Response, want: tuple[list[int], list[int]]) -> dict:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["prompt_token_ids"] == want[0]
    assert body["choices"][0]["token_ids"] == want[1]
    return body


def test_data_url_image_equals_transformers_and_a_repeat_reuses_it(served, vlm):
    url, engine = served
    image = tiny_vlm.image(31)
    # PNG is lossless: the decoded image is the one transformers sees
    want = expected(vlm, image, "What is this?")
    first = check_reply(post(url, user(text("What is this?"), image_part(data_url(image)))), want)
    runs = engine.stats().encoder_runs
    again = check_reply(post(url, user(text("What is this?"), image_part(data_url(image)))), want)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(want[0]) - 1
    assert engine.stats().encoder_runs == runs
    assert first["usage"]["prompt_tokens"] == len(want[0])


def test_local_files_only_from_allowed_folders(served, vlm, allowed, tmp_path):
    url, _ = served
    image = tiny_vlm.image(32)
    inside = allowed / "cat.png"
    inside.write_bytes(encoded(image))
    check_reply(post(url, user(text("File?"), image_part(str(inside)))), expected(vlm, image, "File?"))
    check_reply(post(url, user(text("File?"), image_part(f"file://{inside}"))),
                expected(vlm, image, "File?"))
    outside = tmp_path / "secret.png"
    outside.write_bytes(encoded(image))
    link = allowed / "link.png"
    link.symlink_to(outside)
    for path in (str(outside), str(link), f"{allowed}/../{tmp_path.name}/secret.png"):
        r = post(url, user(text("File?"), image_part(path)))
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "messages[0].content[1]" and err["code"] == "image_url_not_allowed"


@pytest.mark.parametrize("url, code", [
    ("https://example.com/cat.png", "image_url_not_allowed"),
    ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB", "invalid_image"),
    ("data:image/png;base64,@@@", "invalid_image_url"),
    ("data:text/plain;base64,aGVsbG8=", "invalid_image_url"),
    ("cat.png", "invalid_image_url"),
])
def test_bad_images_are_refused_naming_the_part(served, url, code):
    base, engine = served
    r = post(base, [{"role": "user", "content": "Hi"}] + user(text("Look"), image_part(url)))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[1].content[1]" and err["code"] == code
    assert not engine.stats().num_running


def test_other_formats_and_too_many_images(served):
    url, _ = served
    gif = data_url(tiny_vlm.image(33), "GIF").replace("image/gif", "image/png")
    r = post(url, user(image_part(gif)))
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_image"
    png = data_url(tiny_vlm.image(34))
    r = post(url, user(image_part(png), image_part(png), text("and"), image_part(png)))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content[3]"
    assert r.json()["error"]["code"] == "too_many_images"


def test_an_image_for_a_text_only_model_is_refused(tiny_llama):
    engine = make_engine(tiny_llama)
    url, server = start_server(engine)
    try:
        r = post(url, user(text("Look"), image_part(data_url(tiny_vlm.image(35)))))
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "messages[0].content[1]" and "takes no images" in err["message"]
    finally:
        stop_server(server)
        engine.shutdown()
