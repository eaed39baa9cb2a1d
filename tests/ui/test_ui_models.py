"""The model manager without a browser: a load's progress as the header and the panel show it
(the loader's own fractions, rising to 100%), what the store remembers (the last model, its
weights format and context length, its sampling as the new chats' default), the start's choice
and its fallback, the panel's handlers (a watched folder, a chosen row, Hub search offline, a
download), and the model each reply stores and shows."""

from __future__ import annotations

import dataclasses
import os
import re
from types import SimpleNamespace

import pytest
from helpers.tiny_models import build
from helpers.ui_helpers import run, tiny_backend

from helpers import ggml_models
from localpaged.runner.model_catalog import human_bytes
from localpaged.ui import render
from localpaged.ui.controller import ChatController
from localpaged.ui.models import ModelManager, local_factory
from localpaged.ui.models.events import ModelEvents
from localpaged.ui.models.logic import LocalFactory
from localpaged.ui.models.memory import LAST_KEY, MemoryStore, ModelMemory
from localpaged.ui.models.view import header
from localpaged.ui.store import Store

GREEDY = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture
def gguf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ggufs")
    return ggml_models.write_tiny_gguf(str(folder), tensor_type="Q8_0")


@pytest.fixture
def app(tmp_path):
    """(store, controller, model manager with the store's memory), as the CLI wires them."""
    store = Store(tmp_path / "c.db")
    ctl = ChatController(store, lambda: None, GREEDY)          # no chat here: loads only
    yield store, ctl, lambda factory: _manager(factory, store, ctl)
    ctl.stop_all(wait=10)
    store.close()


def _manager(factory, store, ctl) -> ModelManager:
    mm = ModelManager(factory)
    mm.memory = ModelMemory(store, ctl.presets)
    return mm


class Watched(LocalFactory):
    """The local factory, keeping what the header and the status said at each fraction."""

    def __call__(self, name, progress, fraction=None, **options):
        def seen(f):
            fraction(f)
            self.views.append((self.mm.job.percent(), header(self.mm), self.mm.status()))
        return super().__call__(name, progress, fraction=seen, **options)


def test_load_progress_reaches_100_and_the_store_remembers(app, gguf, tmp_path):
    store, ctl, manager = app
    factory = Watched(num_kv_blocks=64)
    factory.views = []
    mm = factory.mm = manager(factory)
    job = mm.load(gguf, max_model_len=256)
    assert job.done.wait(120) and job.error is None, job.error
    percents = [p for p, _, _ in factory.views]
    assert percents == sorted(percents) and any(0 < p < 100 for p in percents)
    for pct, head, status in factory.views:
        if pct < 100:                           # while loading: the bar at the job's percentage
            assert f"<progress id='lp-load-bar' max='100' value='{pct}'>" in head
            assert f"<b id='lp-load-pct'>{pct}%</b>" in head
            assert "Loading **" in status and re.search(r"\d+\\%", status)   # literal() escapes %
    assert job.fraction == 1.0 and "(100%)" in mm.status()
    assert "<progress" not in header(mm)        # done: the badge alone
    assert mm.context_length == 256             # the chosen context reached the engine
    assert store.app_setting(LAST_KEY) == gguf
    memory = ModelMemory(store)
    assert memory.defaults(gguf) == {"quantization": "auto", "max_model_len": 256}
    assert memory.start_model(None, "fallback") == (gguf, {"quantization": "auto",
                                                          "max_model_len": 256})
    assert memory.start_model(None, "fallback", max_model_len=128)[1]["max_model_len"] == 128
    assert memory.start_model("given", "fallback") == ("given", {})
    mm.backend.engine.shutdown()
    again = Store(tmp_path / "c.db")            # another process: the same answer
    assert ModelMemory(again).last_model() == gguf
    again.close()


def test_a_models_saved_sampling_becomes_the_new_chats_default(app, gguf):
    store, ctl, manager = app
    mm = manager(local_factory(num_kv_blocks=64))
    d = ctl.presets.defaults()
    ctl.presets.save_defaults(d.system_prompt, {**d.sampling, "temperature": 0.3}, d.context_policy)
    assert mm.memory.save_sampling(gguf)["temperature"] == 0.3
    ctl.presets.save_defaults(d.system_prompt, {**d.sampling, "temperature": 0.9}, d.context_policy)
    assert ctl.new_conversation().sampling["temperature"] == 0.9
    job = mm.load(gguf)
    assert job.done.wait(120) and job.error is None, job.error
    assert ctl.presets.defaults().sampling["temperature"] == 0.3
    assert ctl.new_conversation().sampling["temperature"] == 0.3
    mm.backend.engine.shutdown()


def test_the_start_falls_back_when_the_remembered_model_is_gone(tmp_path):
    memory = ModelMemory(MemoryStore())
    memory.loaded(str(tmp_path / "gone.gguf"), "int4", 512)
    calls = []

    def factory(name, progress, **options):
        calls.append((name, options))
        if name.endswith("gone.gguf"):
            raise FileNotFoundError(name)
        return SimpleNamespace(model_name=name)
    name, options = memory.start_model(None, "default/model")
    assert options == {"quantization": "int4", "max_model_len": 512}
    got, backend = memory.load_at_start(factory, name, options, None, "default/model",
                                        remembered=True)
    assert got == "default/model" == backend.model_name and memory.last_model() == got
    assert calls == [(name, options), ("default/model", {})]
    with pytest.raises(FileNotFoundError):                   # asked for by --model: its error
        memory.load_at_start(factory, name, {}, None, "default/model", remembered=False)


def test_panel_handlers_watch_a_folder_choose_a_row_and_search_offline(gguf, monkeypatch, tmp_path):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    mm = ModelManager(local_factory(num_kv_blocks=64))
    ev = ModelEvents(mm)
    folder = gguf.rsplit("/", 1)[0]
    box, note, rows = ev.add_folder(folder, 1000)
    assert box == "" and "1 GGUF file" in note
    (row,) = rows
    size = human_bytes(os.path.getsize(gguf))
    assert row[0] == gguf.rsplit("/", 1)[-1] and row[1] == "GGUF Q8_0" and row[2] == size
    assert row[-1] == gguf and "KV" in row[4]
    assert ev.rows(4000)[0][4] != row[4]                     # the memory column follows the context
    mm.memory.loaded(gguf, "int4", 300)
    assert ev.choose(SimpleNamespace(row_value=row)) == (gguf, "int4", 300)
    results, said = ev.search("smol")
    assert results == [] and "offline mode is on" in said
    assert "not a folder" in str(pytest.raises(ValueError, mm.catalog.add_folder,
                                               str(tmp_path / "nope")).value)


def test_a_download_reports_progress_then_the_list_has_it(monkeypatch, tmp_path):
    from huggingface_hub import constants
    from helpers.hub_fakes import fake_snapshot_download

    from localpaged.ui.models.catalog import download_status
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    mm = ModelManager(local_factory())
    with pytest.raises(ValueError, match="owner/name"):
        mm.catalog.start_download("not-an-id")
    job = mm.catalog.start_download("a/b", snapshot_download=fake_snapshot_download(
        [1000, 3000], str(tmp_path)))
    assert job.done.wait(10) and job.path == str(tmp_path)
    assert download_status(job).startswith("✓ Downloaded a/b (100%)")
    half = SimpleNamespace(error=None, done=SimpleNamespace(is_set=lambda: False), repo_id="a/b",
                           fraction=0.25, bytes_done=1000, bytes_total=4000, files_done=0,
                           files_total=2)
    assert download_status(half) == "Downloading a/b — 25% · 1.0 KB of 4.0 KB (25%), 0/2 files"


def test_each_reply_stores_and_shows_its_model(tiny_root, tmp_path):
    gen = tiny_backend(build("llama-gqa", tiny_root), num_kv_blocks=64)
    backend = next(gen)
    store = Store(tmp_path / "c.db")
    ctl = ChatController(store, lambda: backend, GREEDY)
    cid = ctl.new_conversation().id
    turn = run(ctl.send(cid, "hello"))
    msg = store.get_message(turn.replies[0].message_id)
    assert msg.stats["model"] == backend.model_name
    name = render.model_label(backend.model_name)
    assert name == backend.model_name.rsplit("/", 1)[-1] and name in render.footer(msg, (1, 1))
    assert render.model_label("HuggingFaceTB/SmolLM2-135M-Instruct") == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    hostile = dataclasses.replace(msg, stats={"model": "/m/<img src=x>.gguf"})
    assert "&lt;img src=x&gt;.gguf" in render.footer(hostile, (1, 1))
    ctl.stop_all(wait=10)
    store.close()
    gen.close()


def test_the_next_start_loads_the_last_model_unless_given(gguf, tiny_root, tmp_path):
    """localpaged.cli.build as `python app.py` runs it: a start with --model remembers it (and
    its --max-model-len); the next start without --model loads it with that context; a start
    with --model loads what it says."""
    from localpaged import cli
    other = build("llama-gqa", tiny_root)
    base = ["--data-dir", str(tmp_path / "data"), "--num-kv-blocks", "64", "--kv-disk-gb", "0"]

    def start(*extra):
        app, ctl, models, store = cli.build(cli.parse_args([*base, *extra]))
        name, ctx = models.model_name, models.context_length
        models.backend.engine.shutdown()
        store.close()
        app.state.instance_lock.release()
        return name, ctx
    assert start("--model", gguf, "--max-model-len", "200") == (gguf, 200)
    assert start() == (gguf, 200)                            # the last model, its context
    assert start("--model", other)[0] == other
    assert start()[0] == other
