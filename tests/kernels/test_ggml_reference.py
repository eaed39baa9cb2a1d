"""kernels/ggml_reference.py: GGUF block bytes dequantize bit for bit as gguf-py's numpy
dequantizer (the spec), for every format, on random blocks whose fp16 scale fields are finite."""

import glob
import os

import gguf
import numpy as np
import pytest
import torch

from localpaged.kernels import ggml_reference as ref

Q = gguf.GGMLQuantizationType

# byte offsets of each format's fp16 fields (d, and dmin / m where there is one)
FP16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,),
}
SHAPES = [(1, 1), (3, 2), (7, 5)]     # (rows N, blocks per row)


def random_blocks(kind: str, N: int, blocks: int, seed: int = 0) -> torch.Tensor:
    """uint8 [N, blocks * block_bytes] of random bytes, the fp16 fields set to +-[1e-3, 1e-1]."""
    fmt = ref.FORMATS[kind]
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (N, blocks, fmt.block_bytes), dtype=torch.uint8, generator=g)
    for at in FP16_FIELDS[kind]:
        mag = 10 ** (torch.rand(N, blocks, generator=g) * 2 - 3)
        sign = torch.randint(0, 2, (N, blocks), generator=g) * 2 - 1
        half = (mag * sign).to(torch.float16).view(N, blocks, 1)
        data[:, :, at:at + 2] = half.view(torch.uint8)
    return data.reshape(N, blocks * fmt.block_bytes)


def oracle(data: torch.Tensor, kind: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(data.numpy(), Q[kind])))


def test_registry_matches_gguf():
    for name, fmt in {**ref.FORMATS, **ref.PLAIN_FORMATS}.items():
        assert fmt.name == name
        assert fmt.type_id == int(Q[name])
        assert (fmt.block_elems, fmt.block_bytes) == gguf.GGML_QUANT_SIZES[Q[name]]
        assert ref.format_for_type_id(fmt.type_id) is fmt
    assert set(ref.FORMATS) == set(FP16_FIELDS)


@pytest.mark.parametrize("kind", sorted(ref.FORMATS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_bit_exact(kind, shape):
    N, blocks = shape
    data = random_blocks(kind, N, blocks, seed=sum(map(ord, kind)) * 100 + 10 * N + blocks)
    got = ref.dequantize(data, kind)
    want = oracle(data, kind)
    assert got.dtype == torch.float32 and got.shape == (N, blocks * ref.FORMATS[kind].block_elems)
    assert torch.isfinite(want).all()
    assert torch.equal(got, want), f"{kind}: {(got != want).sum()} of {got.numel()} differ"
    # and the bits, not just the values (+0.0 vs -0.0)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_plain_types(kind):
    g = torch.Generator().manual_seed(1)
    dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[kind]
    values = torch.randn(4, 64, generator=g).to(dtype)
    data = values.view(torch.uint8)
    got = ref.dequantize(data, kind)
    assert torch.equal(got, values.to(torch.float32))
    assert torch.equal(got, oracle(data, kind))


def test_row_bytes():
    assert ref.row_bytes("Q4_K", 512) == 2 * 144
    assert ref.row_bytes("Q8_0", 64) == 2 * 34
    assert ref.row_bytes("F16", 3) == 6
    for kind, fmt in ref.FORMATS.items():
        assert ref.row_bytes(kind, 3 * fmt.block_elems) == 3 * fmt.block_bytes
    with pytest.raises(ValueError, match=r"Q4_K.*K=100\b"):
        ref.row_bytes("Q4_K", 100)
    with pytest.raises(ValueError, match=r"Q4_0.*K=48\b"):
        ref.row_bytes("Q4_0", 48)
    with pytest.raises(ValueError, match="Q7_X"):
        ref.row_bytes("Q7_X", 256)


def test_bad_input():
    data = random_blocks("Q4_0", 2, 2)
    with pytest.raises(ValueError, match="multiple of 18"):
        ref.dequantize(data[:, :-1], "Q4_0")
    with pytest.raises(TypeError, match="uint8"):
        ref.dequantize(data.to(torch.int16), "Q4_0")
    with pytest.raises(ValueError, match="NOPE"):
        ref.dequantize(data, "NOPE")


@pytest.mark.parametrize("kind", ["Q4_0", "Q6_K"])
def test_shapes_1d_and_leading(kind):
    data = random_blocks(kind, 6, 2, seed=3)
    whole = ref.dequantize(data, kind)
    one = ref.dequantize(data[2], kind)
    assert one.shape == (whole.shape[1],) and torch.equal(one, whole[2])
    lead = ref.dequantize(data.view(2, 3, -1), kind)
    assert lead.shape == (2, 3, whole.shape[1]) and torch.equal(lead.reshape(whole.shape), whole)
    empty = ref.dequantize(data[:0], kind)
    assert empty.shape == (0, whole.shape[1])


@pytest.mark.parametrize("kind", sorted(ref.FORMATS))
def test_row_slice_equals_whole(kind, monkeypatch):
    data = random_blocks(kind, 9, 3, seed=5)
    whole = ref.dequantize(data, kind)
    assert torch.equal(ref.dequantize(data[3:7], kind), whole[3:7])
    assert torch.equal(ref.dequantize(data[::2], kind), whole[::2])     # non-contiguous rows
    # chunking over blocks (CHUNK_ELEMS) does not change the result
    monkeypatch.setattr(ref, "CHUNK_ELEMS", 2 * ref.FORMATS[kind].block_elems)
    assert torch.equal(ref.dequantize(data, kind), whole)


GGML_FILES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "data", "ggml", "*.gguf")))


def test_llama_cpp_files_are_there():
    """tests/data/ggml holds the files llama.cpp's quantizer made (tests/data/make_ggml_models.py)
    with every K-quant and both IQ4 formats among their tensors."""
    assert len(GGML_FILES) >= 8
    types = {t.tensor_type.name for p in GGML_FILES for t in gguf.GGUFReader(p).tensors}
    assert {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL"} <= types


@pytest.mark.parametrize("path", GGML_FILES, ids=os.path.basename)
def test_bit_exact_on_llama_cpp_files(path):
    """Blocks as llama.cpp's quantizer writes them (real scales and mins): rows of every
    tensor."""
    for t in gguf.GGUFReader(path).tensors:
        if t.tensor_type.name not in ref.FORMATS:
            continue
        rows = np.array(t.data[::7], dtype=np.uint8)                    # [N / 7, row bytes]
        data = torch.from_numpy(rows)
        want = torch.from_numpy(gguf.quants.dequantize(rows, t.tensor_type))
        assert torch.equal(ref.dequantize(data, t.tensor_type.name), want), t.name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", sorted(ref.FORMATS))
def test_cuda_equals_cpu(kind):
    data = random_blocks(kind, 5, 4, seed=7)
    assert torch.equal(ref.dequantize(data.cuda(), kind).cpu(), oracle(data, kind))
