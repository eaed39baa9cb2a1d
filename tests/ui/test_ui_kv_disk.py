"""The KV disk tier from the chat page, at the controller level (ui/kv_disk/logic.py): a
conversation, the app "restarted" (a new engine and controller on the same store and disk
tier), the tab opened (prefetch) and one more message: the reply is token-identical to the one
an app without the tier gives from the same store, and its footer says how much of the prefill
came from disk. Clear empties the tier; a remote backend or a tier that is off is a no-op."""

from __future__ import annotations

import shutil
import time

import pytest
from helpers.tiny_models import build
from helpers.ui_helpers import controller, run, tiny_backend

from localpaged.ui import render
from localpaged.ui.kv_disk.logic import KVDiskActions

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 16}
# The tiny tokenizer knows U+0100..U+02FC, one token a character.
LONG = "".join(chr(0x100 + (i * 7) % 0x1F0) for i in range(300))
MORE = "ȀȁȂȃȄȅȆȇȈȉȊȋ"


@pytest.fixture(scope="module")
def model(tiny_root):
    return build("llama-gqa", tiny_root)


def session(model, data, kv_dir):
    """One life of the app: a backend (with the disk tier when kv_dir) and a controller."""
    kw = {"num_kv_blocks": 128} | ({"kv_disk_dir": str(kv_dir)} if kv_dir else {})
    backends = tiny_backend(model, **kw)
    backend = next(backends)
    ctls = controller(backend, data, GREEDY)
    return backend, next(ctls), (ctls, backends)


def end(lives) -> None:
    for gen in lives:
        gen.close()


def wait_for(cond, timeout: float = 30.0) -> None:
    end_at = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end_at, "timed out"
        time.sleep(0.02)


def test_the_first_reply_after_a_restart_reads_back_from_disk(model, tmp_path):
    data, kv = tmp_path / "data", tmp_path / "kv"
    data.mkdir()
    backend, ctl, lives = session(model, data, kv)
    cid = ctl.new_conversation().id
    run(ctl.send(cid, LONG))
    backend.llm_engine.kv_disk.flush()
    stored = backend.llm_engine.kv_disk.stats().num_blocks
    assert stored > 0
    end(lives)                                            # the app stops
    plain = tmp_path / "plain"
    shutil.copytree(data, plain)                          # the same store, for an app without the tier

    backend, ctl, lives = session(model, data, kv)        # the app starts again
    try:
        actions = KVDiskActions(ctl.store, ctl.backend)
        assert actions.prefetch(cid)                      # the tab is shown
        wait_for(lambda: backend.stats().kv_disk.hits > 0
                 and ctl.backend().cached_prefix_tokens(ctl.prompt_messages(
                     cid, ctl.store.active_path(cid)[-1].id))[0] > 0)
        run(ctl.send(cid, MORE))
        reply = ctl.store.active_path(cid)[-1]
        stats = reply.stats
        assert stats["prefix_tokens_from_disk"] == stats["prefix_tokens_reused"] > 0
        assert f"({stats['prefix_tokens_from_disk']} from disk)" in render.fmt_stats(stats)

        assert "Clearing the KV disk tier" in actions.clear()
        wait_for(lambda: backend.stats().kv_disk.num_blocks == 0)
    finally:
        end(lives)

    backend, ctl, lives = session(model, plain, None)
    try:
        run(ctl.send(cid, MORE))
        want = ctl.store.active_path(cid)[-1]
        assert want.stats.get("prefix_tokens_from_disk") in (0, None)
        assert want.token_ids == reply.token_ids and want.content == reply.content
        assert "off" in KVDiskActions(ctl.store, ctl.backend).clear()
    finally:
        end(lives)


def test_without_a_local_engine_nothing_happens():
    actions = KVDiskActions(store=None, backend=lambda: None)      # no model loaded yet
    assert not actions.prefetch(1)
    assert "no local engine" in actions.clear()
