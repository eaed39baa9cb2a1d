"""One table of GGML block formats: ggml_reference.FORMATS (what the Python side reads) equals
gguf-py's own numbers and sizes, the C++ kernels' table (cpu_ggml.cpp kTypes, through the built
extension) and the type numbers the Triton kernel compiles in (triton_ggml.py)."""

import gguf

from localpaged.kernels import triton_ggml
from localpaged.kernels.ggml_reference import FORMATS


def test_the_formats_are_gguf_py_s():
    for name, fmt in FORMATS.items():
        qtype = gguf.GGMLQuantizationType[name]
        assert fmt.type_id == qtype.value, name
        assert (fmt.block_elems, fmt.block_bytes) == gguf.GGML_QUANT_SIZES[qtype], name


def test_the_cpp_kernels_table_is_the_same(cpu_ext):
    flat = cpu_ext.ggml_type_table()
    cpp = sorted(tuple(flat[i:i + 3]) for i in range(0, len(flat), 3))
    assert cpp == sorted((f.type_id, f.block_elems, f.block_bytes) for f in FORMATS.values())


def test_the_triton_kernels_type_numbers_are_the_same():
    for name, fmt in FORMATS.items():
        assert getattr(triton_ggml, name).value == fmt.type_id, name
