"""The GGUF tensor directory (quant/gguf_file.py) and the on-disk config/tokenizer cache
(runner/gguf_meta.py), on the bundled SmolLM2 file and on damaged copies of a tiny one.

The oracle for the directory is gguf-py's own GGUFReader; for the cache, transformers' fresh
conversion of the same file.
"""

import os
import shutil

import gguf
import numpy as np
import pytest

from helpers.ggml_models import write_tiny_gguf

from localpaged.quant.gguf_file import GgufFile
from localpaged.runner import gguf_meta


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """Two tensors: a Q8_0 matrix and an F32 vector."""
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.name", "x" * 1000)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(300)])
    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    writer.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", np.arange(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf_model(tmp_path_factory):
    return write_tiny_gguf(str(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))


def test_directory_equals_gguf_reader(smollm2_gguf):
    ours = GgufFile(smollm2_gguf).tensors
    theirs = gguf.GGUFReader(smollm2_gguf).tensors
    assert [(t.name, t.shape, t.type_id, t.offset, t.n_bytes) for t in ours] == [
        (t.name, tuple(int(d) for d in reversed(t.shape)), int(t.tensor_type), int(t.data_offset),
         int(t.n_bytes)) for t in theirs]


def test_tensor_bytes_are_views_of_the_file(small_gguf):
    f = GgufFile(str(small_gguf))
    q, norm = f.tensors
    assert f.array(q).shape == (8, 2 * 34)
    assert np.array_equal(f.array(norm).view(np.float32), np.arange(64, dtype=np.float32))
    reader = gguf.GGUFReader(str(small_gguf))
    assert np.array_equal(f.array(q), reader.tensors[0].data)


def test_truncated_file_names_the_tensor(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"blk.0.attn_norm.weight \(F32, 64\).*truncated"):
        GgufFile(str(cut))
    cut.write_bytes(data[:200])               # inside the metadata
    with pytest.raises(ValueError, match="truncated GGUF header"):
        GgufFile(str(cut))


def test_not_a_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GgufFile(str(path))


def test_cached_config_and_tokenizer_equal_a_fresh_conversion(smollm2_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_meta.CACHE_ENV, str(tmp_path / "cache"))
    folder, name = os.path.split(smollm2_gguf)
    fresh_config, fresh_tok = gguf_meta.config_and_tokenizer(folder, name)     # converts, stores
    entry = gguf_meta.entry_folder(smollm2_gguf)
    assert (entry / gguf_meta.DONE).exists()
    config, tok = gguf_meta.config_and_tokenizer(folder, name)                 # from the cache
    drop = ("_name_or_path", "transformers_version")
    assert {k: v for k, v in config.to_dict().items() if k not in drop} == \
        {k: v for k, v in fresh_config.to_dict().items() if k not in drop}
    text = "Hello, world! Ünïcode and   spaces\n\tand <|im_start|> tokens."
    assert tok(text).input_ids == fresh_tok(text).input_ids
    chat = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        fresh_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert (tok.eos_token_id, tok.bos_token_id) == (fresh_tok.eos_token_id, fresh_tok.bos_token_id)


def test_damaged_or_unwritable_cache_costs_only_a_conversion(small_gguf, tiny_gguf_model, tmp_path,
                                                             monkeypatch, caplog):
    monkeypatch.setenv(gguf_meta.CACHE_ENV, str(tmp_path / "cache"))
    folder, name = os.path.split(tiny_gguf_model)
    gguf_meta.config_and_tokenizer(folder, name)
    entry = gguf_meta.entry_folder(tiny_gguf_model)
    (entry / "config.json").write_text("{not json")
    config, _ = gguf_meta.config_and_tokenizer(folder, name)
    assert "converting again" in caplog.text and config.model_type == "llama"
    assert (entry / "config.json").read_text().startswith("{\n")               # replaced
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(gguf_meta.CACHE_ENV, str(blocked / "cache"))            # under a file
    config, tok = gguf_meta.config_and_tokenizer(folder, name)
    assert config.model_type == "llama" and tok("ab").input_ids
    assert "could not cache" in caplog.text
    shutil.rmtree(tmp_path / "cache")


def _with_dims(path, tmp_path, name: str, dims: tuple[int, int]) -> str:
    """A copy of the file whose tensor `name` claims other dims (innermost first) in its info."""
    data = bytearray(open(path, "rb").read())
    key = name.encode()
    at = data.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    assert int.from_bytes(data[at:at + 4], "little") == 2
    for i, d in enumerate(dims):
        data[at + 4 + 8 * i:at + 12 + 8 * i] = d.to_bytes(8, "little")
    out = tmp_path / f"bad-{dims[0]}.gguf"
    out.write_bytes(bytes(data))
    return str(out)


def test_a_shape_that_does_not_match_the_data_names_the_tensor(tiny_gguf_model, tmp_path):
    from localpaged import LLM
    grown = _with_dims(tiny_gguf_model, tmp_path, "blk.0.ffn_down.weight", (1024, 256))
    with pytest.raises(ValueError, match=r"tensor blk.0.ffn_down.weight \(F32, 256x1024\) needs "
                                         r"1048576 bytes, but tensor .* starts 524288 bytes after"):
        GgufFile(grown)
    shrunk = _with_dims(tiny_gguf_model, tmp_path, "blk.0.ffn_down.weight", (256, 256))
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.down_proj.weight: shape 256x256 does "
                                         r"not match the model's 256x512"):
        LLM(shrunk, num_kv_blocks=4)
