"""The models on the machine (runner/model_catalog.py), the Hub client (runner/hub_client.py,
with a fake HfApi and a fake snapshot_download: no network) and the loader's progress hooks
(runner/load_progress.py `reporting_progress`).

The truths compared against: transformers' own parameter count of the same weights, the
engine's own KV bytes a block (runner/kv_cache.bytes_per_block), the GGUF writer's tensors
(tests/helpers/ggml_models.py), huggingface_hub's own cache scan and the loader's own resolution of a
Hub id from that cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch

from helpers import ggml_models
from helpers import tiny_models
from helpers.hub_fakes import fake_snapshot_download
from localpaged.runner import hub_client, load_progress, loader, model_source
from localpaged.runner.kv_cache import bytes_per_block
from localpaged.runner.model_catalog import human_bytes, scan, scan_folder, scan_hub_cache

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(cache: Path, repo_id: str, folder: str) -> Path:
    """`folder`'s files laid out as huggingface_hub caches a download: blobs named by their
    hash, a snapshot of symlinks to them, refs/main naming the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for file in sorted(Path(folder).iterdir()):
        if file.is_file():
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            shutil.copyfile(file, repo / "blobs" / digest)
            (snap / file.name).symlink_to(Path("..", "..", "blobs", digest))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return tiny_models.build("llama-gqa", str(tmp_path_factory.mktemp("hf")))


def test_hub_cache_scan_lists_a_cached_model_with_true_counts(tiny_hf, tmp_path, monkeypatch):
    from huggingface_hub import constants
    from transformers import AutoConfig, AutoModelForCausalLM
    cache = tmp_path / "hub"
    snap = fake_hub_cache(cache, "owner/tiny-llama", tiny_hf)
    (entry,) = scan_hub_cache(str(cache))
    assert entry.name == "owner/tiny-llama" and entry.source == "hub cache"
    assert Path(entry.path) == snap
    files = [f for f in Path(tiny_hf).iterdir() if f.is_file()]
    assert entry.size_bytes == sum(f.stat().st_size for f in files)
    model = AutoModelForCausalLM.from_pretrained(tiny_hf)
    assert entry.parameters == model.num_parameters()
    assert entry.format == "safetensors F32"
    # KV bytes of k blocks of 16 tokens, as the engine sizes its cache (float32 on CPU)
    c = AutoConfig.from_pretrained(tiny_hf)
    per_block = bytes_per_block(c.num_hidden_layers, 16, c.num_key_value_heads,
                                c.hidden_size // c.num_attention_heads, torch.float32)
    weights = os.path.getsize(os.path.join(tiny_hf, "model.safetensors"))
    assert entry.memory_at(64) == weights + 4 * per_block
    # the name loads: the loader resolves it from this cache, offline
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert Path(model_source.resolve(entry.name).path).resolve() == snap.resolve()


def test_watched_folder_lists_ggufs_with_size_params_and_format(tmp_path):
    folder = tmp_path / "models"
    (folder / "sub").mkdir(parents=True)
    (folder / ".hidden").mkdir()
    f32 = ggml_models.write_tiny_gguf(str(folder / "sub"), tensor_type="F32")
    q8 = ggml_models.write_tiny_gguf(str(folder), tensor_type="Q8_0")
    shutil.copyfile(q8, folder / ".hidden" / "skipped.gguf")
    (folder / "notes.txt").write_text("not a model")
    entries = {e.name: e for e in scan_folder(str(folder))}
    assert set(entries) == {f32, q8}
    want_params = sum(t.numel() for t in ggml_models.hf_state_dict().values())
    for path, kind in ((f32, "F32"), (q8, "Q8_0")):
        e = entries[path]
        assert e.size_bytes == os.path.getsize(path) and e.source == str(folder)
        assert e.parameters == want_params
        assert e.format == f"GGUF {kind}"
        width = ggml_models.KV_HEADS * ggml_models.HEAD_DIM
        assert e.kv.widths == (width,) * ggml_models.LAYERS
        assert e.memory_at(100) == e.size_bytes + ggml_models.LAYERS * 2 * width * 4 * 100
    assert entries[q8].size_bytes < entries[f32].size_bytes
    assert scan_folder(str(tmp_path / "missing")) == []


def test_a_damaged_gguf_is_listed_with_its_reason(tmp_path):
    good = ggml_models.write_tiny_gguf(str(tmp_path), tensor_type="F32")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(good).read_bytes()[:5000])
    (entry,) = [e for e in scan_folder(str(tmp_path)) if e.name == str(cut)]
    assert entry.error and "truncated" in entry.error and entry.size_bytes == 5000
    assert entry.memory_at(100) is None and entry.parameters is None


def test_scan_lists_each_file_once(tiny_hf, tmp_path):
    cache = tmp_path / "hub"
    snap = fake_hub_cache(cache, "owner/tiny-llama", tiny_hf)
    gguf = ggml_models.write_tiny_gguf(str(snap), tensor_type="F32")   # a GGUF in a snapshot
    entries = scan([str(snap), str(tmp_path / "nowhere")], str(cache))
    names = [e.name for e in entries]
    assert names.count("owner/tiny-llama") == 1 and len(names) == 2
    assert any(e.path == gguf or Path(e.path).resolve() == Path(gguf).resolve() for e in entries)
    assert scan([], str(tmp_path / "no-cache")) == []


def test_human_sizes():
    assert [human_bytes(n) for n in (999, 1500, 95_000_000, 2_500_000_000)] == \
        ["999 B", "1.5 KB", "95.0 MB", "2.5 GB"]


# ---- the Hub, without a network -------------------------------------------------------------
class FakeModel:
    def __init__(self, repo_id, downloads):
        self.id, self.downloads, self.likes, self.pipeline_tag = repo_id, downloads, 3, "x"


class FakeApi:
    def __init__(self, models=(), fail=None):
        self.models, self.fail, self.calls = list(models), fail, []

    def list_models(self, **kwargs):
        self.calls.append(kwargs)
        if self.fail:
            raise self.fail
        return iter(self.models)


def test_hub_search_through_the_api(monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    api = FakeApi([FakeModel("a/SmolLM2-135M", 900), FakeModel("b/SmolLM2-1.7B", 40)])
    found = hub_client.search("  SmolLM2 ", api=api)
    assert [(m.repo_id, m.downloads) for m in found] == [("a/SmolLM2-135M", 900),
                                                          ("b/SmolLM2-1.7B", 40)]
    assert api.calls[0]["search"] == "SmolLM2" and api.calls[0]["limit"] == hub_client.SEARCH_LIMIT
    with pytest.raises(ValueError, match="type part of a model's name"):
        hub_client.search("   ", api=api)
    with pytest.raises(hub_client.HubUnavailable, match="cannot be reached \\(ConnectionError\\)"):
        hub_client.search("x", api=FakeApi(fail=ConnectionError("no route")))


def test_hub_offline_says_so_and_calls_nothing(monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    api = FakeApi([FakeModel("a/b", 1)])
    with pytest.raises(hub_client.HubUnavailable, match="offline mode is on"):
        hub_client.search("smol", api=api)
    assert api.calls == []
    progress = hub_client.DownloadProgress("a/b")
    with pytest.raises(hub_client.HubUnavailable, match="offline"):
        hub_client.download("a/b", progress, snapshot_download=lambda *a, **k: pytest.fail())
    assert progress.done.is_set() and "offline" in progress.error


def test_download_progress_counts_written_bytes_and_files(monkeypatch, tmp_path):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    sizes = [400, 4000, 40]
    progress = hub_client.DownloadProgress("a/b")
    path = hub_client.download("a/b", progress,
                               snapshot_download=fake_snapshot_download(sizes, str(tmp_path)))
    assert path == str(tmp_path) == progress.path and progress.error is None
    assert (progress.bytes_done, progress.bytes_total) == (sum(sizes), sum(sizes))
    assert (progress.files_done, progress.files_total) == (3, 3) and progress.fraction == 1.0
    failed = hub_client.start_download(
        "a/b", snapshot_download=fake_snapshot_download(sizes, str(tmp_path), fail_after=1))
    assert failed.done.wait(10)
    assert "cannot be reached (ConnectionError)" in failed.error
    assert failed.bytes_done == 4400 and failed.files_done == 1


# ---- the loader's progress -------------------------------------------------------------------
def test_loader_reports_progress_tensor_by_tensor(tmp_path):
    path = ggml_models.write_tiny_gguf(str(tmp_path), tensor_type="Q8_0")
    n_tensors = len(ggml_models.gguf_tensors())
    seen: list[tuple[float, str]] = []
    with load_progress.reporting_progress(lambda f, what: seen.append((f, what))):
        loaded = loader.load(path, torch.device("cpu"), torch.float32)
    assert loaded.model is not None
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and 0.0 <= fractions[0] and fractions[-1] < 1.0
    assert fractions[-1] == load_progress.LOAD_STEPS["finish"]
    reading = [what for _, what in seen if what.startswith("reading tensors")]
    assert reading == [f"reading tensors ({i}/{n_tensors})" for i in range(n_tensors)]
    assert any(what.startswith("installing layers") for _, what in seen)
    count = len(seen)
    loader.load(path, torch.device("cpu"), torch.float32)       # outside: nothing reported
    assert len(seen) == count
