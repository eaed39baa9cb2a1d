"""The GGUF tensor directory (quant/gguf_file.py), on the bundled SmolLM2 file and on damaged
copies of a tiny one. The oracle is gguf-py's own GGUFReader."""

import gguf
import numpy as np
import pytest

from helpers.ggml_models import write_tiny_gguf

from localpaged.quant.gguf_file import GgufFile


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
