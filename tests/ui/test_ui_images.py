"""Images in the chat app through ChatController, on the tiny random Idefics3 model
(helpers/tiny_vlm.py; SmolVLM shares its design and processor) and a tiny text-only Llama:

- a send with an attached PNG: the reply's tokens equal the engine's own request for the
  ImagePrompt the model's processor makes of the same chat (whose ids equal transformers'
  processor output), the image is stored once with the message;
- a regenerate reuses the image's blocks (prefix_tokens_reused covers its span), the vision
  encoder ran once for both, and the reply says 'image from cache'; an edit keeps the image
  (or drops it when told);
- the context gauge counts the image tokens; a text-only model refuses the send by name and
  stores nothing; a remote backend refuses images;
- the chat shows the thumbnails from the app's own route, which serves only stored images.
"""

from __future__ import annotations

import io

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from helpers import tiny_vlm
from helpers.tiny_models import build
from helpers.ui_helpers import TinyBackend, run, tiny_backend
from PIL import Image

from localpaged import LLM, SamplingParams
from localpaged.chat.images import REMOTE_REFUSAL, ImageWindow
from localpaged.chat.remote import RemoteChatBackend
from localpaged.ui import render
from localpaged.ui.controller import ChatController
from localpaged.ui.engine_panel import KvMap
from localpaged.ui.images.events import image_router
from localpaged.ui.images.logic import CACHE_NOTE, ENCODER_NOTE, footer_note
from localpaged.ui.store import Store
from localpaged.ui.tools.messages import read_attachment

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 8}


def png_file(tmp_path, seed: int, name: str = "photo.png", size=(40, 70)):
    path = tmp_path / name
    tiny_vlm.image(seed, *size).save(path, format="PNG")
    return path


@pytest.fixture(scope="module")
def vlm(tiny_root):
    return tiny_vlm.build(tiny_root, "idefics3")


@pytest.fixture(scope="module")
def vlm_backend(vlm):
    backend = TinyBackend(LLM(vlm, num_kv_blocks=128).engine)
    yield backend
    backend.engine.shutdown()


@pytest.fixture(scope="module")
def text_backend(tiny_root):
    yield from tiny_backend(build("llama-gqa", tiny_root), num_kv_blocks=64)


def make_ctl(backend, tmp_path):
    store = Store(tmp_path / "conversations.db")
    return ChatController(store, lambda: backend, GREEDY, tmp_path / "ui_state.json")


@pytest.fixture
def ctl(vlm_backend, tmp_path):
    c = make_ctl(vlm_backend, tmp_path)
    yield c
    c.stop_all(wait=10)
    c.store.close()


def engine_reply(backend, prompt, max_tokens: int = 8) -> list[int]:
    """The engine's own greedy tokens for `prompt` (an ImagePrompt), as the chat asks."""
    outs = list(backend.engine.submit(prompt, SamplingParams(temperature=0.0,
                                                             max_tokens=max_tokens)))
    return outs[-1].outputs[0].token_ids


def test_send_regenerate_and_edit_with_an_image(ctl, vlm, vlm_backend, tmp_path):
    path = png_file(tmp_path, 11)
    cid = ctl.new_conversation().id
    runs0 = vlm_backend.stats().encoder_runs
    turn = run(ctl.send(cid, "What is it?", attachments=[read_attachment(path)]))
    user, reply = ctl.store.active_path(cid)
    ref = user.extra["images"][0]
    assert (ref["name"], ref["mime"], ref["width"], ref["height"]) == ("photo.png", "image/png",
                                                                       70, 40)
    assert ctl.store.image(ref["sha256"]).data == path.read_bytes()
    # the request the chat made is the processor's prompt for the same chat
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    prompt = vlm_backend.engine.image_prompt(chat, [Image.open(path).convert("RGB")])
    hf = tiny_vlm.hf_inputs(vlm, prompt.text, [Image.open(path).convert("RGB")])
    assert hf["input_ids"][0].tolist() == prompt.token_ids
    assert reply.stats["prompt_tokens"] == len(prompt.token_ids)
    assert reply.token_ids == turn.replies[0].token_ids
    assert reply.stats["images_from_cache"] is False and reply.stats["image_tower_runs"] == 1
    assert vlm_backend.stats().encoder_runs == runs0 + 1
    assert reply.token_ids == engine_reply(vlm_backend, prompt)

    regen = run(ctl.regenerate(reply.id))
    again = ctl.store.get_message(regen.replies[0].message_id)
    end = prompt.images[0].end
    assert again.stats["prefix_tokens_reused"] >= end             # the image's span reused
    assert again.stats["images_from_cache"] is True and again.stats["image_tower_runs"] == 0
    assert vlm_backend.stats().encoder_runs == runs0 + 1          # the encoder ran once
    assert again.token_ids == reply.token_ids
    assert CACHE_NOTE in render.footer(again, (2, 2))
    assert CACHE_NOTE not in render.footer(reply, (1, 2))
    assert ENCODER_NOTE not in render.footer(reply, (1, 2))
    # the image's blocks evicted but its embeddings cached: the footer says so instead
    assert footer_note({"images_from_cache": False, "image_tower_runs": 0}) == ENCODER_NOTE
    assert footer_note({"images_from_cache": False, "image_tower_runs": 1}) == ""
    assert footer_note({}) == ""

    edited = run(ctl.edit(user.id, "Describe it."))
    new_user = ctl.store.active_path(cid)[0]
    assert new_user.id != user.id and new_user.extra["images"] == user.extra["images"]
    new_reply = ctl.store.get_message(edited.replies[0].message_id)
    chat2 = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}]
    prompt2 = vlm_backend.engine.image_prompt(chat2, [Image.open(path).convert("RGB")])
    assert new_reply.stats["prompt_tokens"] == len(prompt2.token_ids)
    assert new_reply.stats["images_from_cache"] is True
    assert new_reply.token_ids == engine_reply(vlm_backend, prompt2)

    plain = run(ctl.edit(user.id, "No picture now.", images=[]))
    plain_user = ctl.store.active_path(cid)[0]
    assert "images" not in plain_user.extra
    assert "images_from_cache" not in ctl.store.get_message(plain.replies[0].message_id).stats
    assert ctl.store.image_count() == 1                          # kept once for all versions


def test_continue_keeps_the_images(ctl, vlm_backend, tmp_path):
    path = png_file(tmp_path, 13)
    cid = ctl.new_conversation().id
    reply = run(ctl.send(cid, "Go on", attachments=[read_attachment(path)])).replies[0]
    stored = ctl.store.get_message(reply.message_id)
    assert stored.stats["finish_detail"] == "max_tokens" and len(stored.token_ids) == 8
    run(ctl.continue_reply(stored.id))
    longer = ctl.store.get_message(stored.id)
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Go on"}]}]
    prompt = vlm_backend.engine.image_prompt(chat, [Image.open(path).convert("RGB")])
    assert longer.token_ids == engine_reply(vlm_backend, prompt, 16)


def test_an_exported_and_imported_chat_keeps_its_image(ctl, vlm_backend, tmp_path):
    path = png_file(tmp_path, 14)
    cid = ctl.new_conversation().id
    first = run(ctl.send(cid, "Seen before?", attachments=[read_attachment(path)])).replies[0]
    first_text = ctl.store.get_message(first.message_id).content
    export = tmp_path / "chat.json"
    export.write_text(ctl.export(cid, "json"))
    ctl.delete(cid)
    assert ctl.store.image_count() == 0
    new = ctl.organise.import_file(export)
    user, reply = ctl.store.active_path(new.id)
    assert ctl.store.image(user.extra["images"][0]["sha256"]).data == path.read_bytes()
    # the same picture, so the same image blocks: a regenerate of the imported reply finds them
    again = ctl.store.get_message(run(ctl.regenerate(reply.id)).replies[0].message_id)
    assert again.stats["images_from_cache"] is True
    assert again.content == reply.content == first_text


def test_the_gauge_counts_image_tokens(ctl, vlm_backend, tmp_path):
    path = png_file(tmp_path, 12, size=(64, 64))
    cid = ctl.new_conversation().id
    run(ctl.send(cid, "Hi", attachments=[read_attachment(path)]))
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    prompt = vlm_backend.engine.image_prompt(chat, [Image.open(path).convert("RGB")])
    ids = prompt.token_ids
    assert prompt.images[0].length > 16                  # a 2x2 grid and the global view
    reply = ctl.store.active_path(cid)[-1]
    usage = ctl.context_usage(cid)
    window = vlm_backend.context_window()
    msgs = ctl.prompt_messages(cid, reply.id)
    assert usage.tokens == len(window.token_ids(msgs)) > len(ids)
    assert ctl.context_usage(cid, draft="more").tokens > usage.tokens


def test_the_image_window_keeps_counts_not_pixels(vlm_backend):
    """Counting a draft after an image runs the processor once per new text; a count asked
    again is remembered; only the last two prompts (their pixels) are kept."""
    calls = []

    def processor(msgs, images, **kw):
        calls.append(len(images))
        return vlm_backend.engine.image_prompt(msgs, images, **kw)

    window = ImageWindow(vlm_backend.engine.tokenizer, 1024, processor)
    image = tiny_vlm.image(15)
    msgs = [{"role": "user", "content": [{"type": "image", "sha256": "a" * 64, "image": image},
                                         {"type": "text", "text": "What?"}]}]
    counts = [window.count_tokens(msgs, draft="more " * i) for i in range(1, 6)]
    assert calls == [1] * 5 and counts == sorted(counts) and len(set(counts)) == 5
    assert window.count_tokens(msgs, draft="more ") == counts[0] and len(calls) == 5
    last = [*msgs, {"role": "user", "content": "more " * 5}]
    assert len(window.image_prompt(last).token_ids) == counts[4] and len(calls) == 5
    first = [*msgs, {"role": "user", "content": "more "}]
    assert len(window.image_prompt(first).token_ids) == counts[0] and len(calls) == 6


def test_a_text_only_model_refuses_and_stores_nothing(text_backend, tmp_path):
    ctl = make_ctl(text_backend, tmp_path)
    try:
        cid = ctl.new_conversation().id
        run(ctl.send(cid, "hello"))
        before = [m.id for m in ctl.store.messages(cid)]
        with pytest.raises(ValueError, match="takes no images: load a vision-language model"):
            ctl.send(cid, "and this?", attachments=[read_attachment(png_file(tmp_path, 3))])
        assert [m.id for m in ctl.store.messages(cid)] == before
        assert ctl.store.image_count() == 0
        assert ctl.context_usage(cid).tokens > 0                 # no image on the path: counted
        # a conversation that has an image (made with another model): the gauge, the KV map and
        # the edit preview say nothing rather than fail; a regenerate is refused by name
        last = ctl.store.active_path(cid)[-1]
        user = ctl.store.add_message(cid, last.id, "user", "old picture",
                                     images=[read_attachment(png_file(tmp_path, 4))["image"]])
        assert ctl.context_usage(cid) is None
        assert ctl.edit_cost(user.id, "other text") is None
        snap = KvMap(ctl).collect([cid])
        assert snap.available and len(snap.rows) == 1
        with pytest.raises(ValueError, match="takes no images"):
            ctl.regenerate(user.id)
        assert len(ctl.store.messages(cid)) == len(before) + 1
    finally:
        ctl.stop_all(wait=10)
        ctl.store.close()


def test_a_remote_backend_never_sends_images():
    remote = RemoteChatBackend("http://127.0.0.1:9/v1", model="m")   # nothing listens there
    msgs = [{"role": "user", "content": [{"type": "image", "sha256": "0" * 64, "image": None},
                                         {"type": "text", "text": "hi"}]}]
    with pytest.raises(ValueError, match="never sent to a remote server"):
        remote.chat(msgs, [SamplingParams(max_tokens=4)])
    assert "never sent" in REMOTE_REFUSAL


def test_thumbnails_and_the_image_route(ctl, tmp_path):
    big = tmp_path / "big.jpg"
    Image.new("RGB", (640, 320), (10, 200, 30)).save(big, format="JPEG")
    cid = ctl.new_conversation().id
    att = read_attachment(big)
    user = ctl.store.add_message(cid, None, "user", "![x](http://example.com/a.png) <img src=x>",
                                 images=[att["image"]])
    sha = user.extra["images"][0]["sha256"]
    html = render.chat_messages(ctl.view(cid))[0]["content"]
    assert f'<a class="lp-thumb" href="/lp/image/{sha}" target="_blank"' in html
    assert f'<img src="/lp/image/{sha}?thumb=1" alt="big.jpg"' in html
    assert html.count("<img") == 1                   # the text stays image-free (a link)
    app = FastAPI()
    app.include_router(image_router(ctl))
    client = TestClient(app)
    full = client.get(f"/lp/image/{sha}")
    assert full.status_code == 200 and full.headers["content-type"] == "image/jpeg"
    assert full.content == big.read_bytes()
    thumb = client.get(f"/lp/image/{sha}?thumb=1")
    assert thumb.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(thumb.content)).size == (160, 80)
    for bad in ("0" * 64, "../conversations.db", sha.upper(), sha[:-1]):
        assert client.get(f"/lp/image/{bad}").status_code == 404
