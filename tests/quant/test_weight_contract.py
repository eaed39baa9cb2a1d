"""The weight-type contract (quant/weight.py): every form implements QuantWeight with its
parameters; a form's linear and embedding forms multiply and gather as the canonical weight does;
the batch-1 loop's layout of each form names the tensors its kernel reads."""

import pytest
import torch
from helpers.contracts import unmet

from localpaged.kernels import ggml_reference
from localpaged.quant.cpu import CpuInt4Weight
from localpaged.quant.cpu_tiles import CpuInt4Tiles
from localpaged.quant.ggml import GgmlWeight, PartsWeight
from localpaged.quant.layout import PackedWeight, quantize_int4, quantize_int8
from localpaged.quant.weight import Batch1Code, QuantWeight


def _ggml(kind: str, n: int, k: int, seed: int) -> GgmlWeight:
    data = ggml_reference.random_blocks(kind, n, k, torch.Generator().manual_seed(seed))
    return GgmlWeight(kind, data, (n, k))


def test_every_form_states_every_member():
    for form in (PackedWeight, CpuInt4Weight, CpuInt4Tiles, GgmlWeight, PartsWeight):
        assert unmet(QuantWeight, form) == []


FORMS = {
    "int8": lambda: quantize_int8(torch.randn(64, 96, generator=torch.Generator().manual_seed(1))),
    "int4": lambda: quantize_int4(torch.randn(64, 96, generator=torch.Generator().manual_seed(2)), 32),
    "Q4_K": lambda: _ggml("Q4_K", 32, 256, 3),
    "Q4_K+Q6_K": lambda: PartsWeight([_ggml("Q4_K", 32, 256, 4), _ggml("Q6_K", 16, 256, 5)]),
}


@pytest.mark.parametrize("kind", FORMS)
def test_forms_multiply_and_gather_as_the_weight(kind):
    w = FORMS[kind]()
    assert isinstance(w, QuantWeight)
    x = torch.randn(5, w.shape[1], generator=torch.Generator().manual_seed(6))
    ref = x @ w.dequantize().T
    for form in (w, w.linear_form()):
        y = form.matmul(x)
        assert y.shape == (5, w.shape[0]) and y.dtype == x.dtype
        # bf16 activations inside the CPU int4/int8 kernels: their rounding, not a layout error
        assert (y - ref).abs().max() <= 0.05 * ref.abs().max()
    rows = torch.tensor([3, 0, 7])
    assert torch.allclose(w.embedding_form().dequantize(torch.float32, rows),
                          w.dequantize(torch.float32)[rows], rtol=1e-2, atol=1e-2)
    assert sum(w.formats().values()) == w.shape[0] * w.shape[1]
    assert w.kernels() and all(isinstance(name, str) for name in w.kernels())   # stats() names them


def test_batch1_layouts_name_their_kernels_tensors():
    assert quantize_int8(torch.randn(16, 64)).batch1_layout() is None     # not on the C++ loop
    on_file = _ggml("Q4_K", 32, 256, 7)
    assert on_file.batch1_layout() is None                                 # no native kernel
    canonical = quantize_int4(torch.randn(64, 96, generator=torch.Generator().manual_seed(8)), 32)
    int4 = CpuInt4Weight.from_packed(canonical)
    (code, group), tensors = int4.batch1_layout()
    assert (code, group) == (Batch1Code.INT4_TORCH, 32)
    assert tensors[0] is int4.packed and tensors[1] is int4.scales_zeros
    assert PartsWeight([on_file, on_file]).batch1_layout() is None
