"""models/llama.py MLP on CPU: a long prefill's rows go through in passes whose gate/up
activations stay under CPU_ACTIVATION_BYTES, and the result equals one pass over all rows
(what the passes save is measured by bench/real_model.py: docs/benchmarks.md, "Activations in
passes")."""

import pytest
import torch
from transformers import LlamaConfig

from localpaged.models import llama
from localpaged.models.gemma3 import GemmaMLP

ROWS = 1000


def mlp(cls=llama.MLP, **kw):
    config = LlamaConfig(hidden_size=64, intermediate_size=8960, **kw)   # gate/up: 72 MB at 1,000 rows
    torch.manual_seed(0)
    module = cls(config)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return module.eval()


@pytest.mark.parametrize("cls", [llama.MLP, GemmaMLP])
def test_passes_give_the_rows_of_one_pass(cls, monkeypatch):
    kw = {"hidden_activation": "gelu_pytorch_tanh"} if cls is GemmaMLP else {}
    module, x = mlp(cls, **kw), torch.randn(ROWS, 64)
    assert ROWS * module.gate_up_width * 4 > 2 * llama.CPU_ACTIVATION_BYTES       # three passes or more
    with torch.no_grad():
        passes = module(x)
        monkeypatch.setattr(llama, "CPU_ACTIVATION_BYTES", 1 << 40)
        whole = module(x)
    torch.testing.assert_close(passes, whole)
