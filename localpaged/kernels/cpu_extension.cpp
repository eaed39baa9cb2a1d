// Python bindings of the CPU extension (cpu_extension.py builds it).

#include "batch1_cpu.h"
#include "cpu_decode.h"
#include "cpu_ggml.h"
#include "cpu_int4.h"
#include "cpu_mask.h"
#include "cpu_norm.h"
#include "cpu_read.h"

#include <torch/extension.h>   // pybind11 and torch's type casters: only this file pays for them

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // None needs the GIL: the server's threads (streaming, HTTP) run while a step computes.
  m.def("paged_decode_attention", &paged_decode_attention,
        "paged decode attention over float32, bf16, fp16 or int8 caches (kernels/cpu_decode.cpp)", py::arg("q"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("seq_lens"),
        py::arg("scale"), py::arg("window") = 0, py::call_guard<py::gil_scoped_release>());
  m.def("kv_rows", &kv_rows, "rows as a cache of that dtype stores them (kernels/kv_quant.py)",
        py::call_guard<py::gil_scoped_release>());
  m.def("int4_matmul", &int4_matmul, "int4 weight-only matmul, tiles layout (kernels/cpu_int4.cpp)",
        py::call_guard<py::gil_scoped_release>());
  m.def("int4_vectorized", &int4_vectorized);
  m.def("ggml_matmul", &ggml_matmul,
        "x @ dequantize(w).T over GGUF quantized-block bytes (kernels/cpu_ggml.cpp)",
        py::call_guard<py::gil_scoped_release>());
  m.def("ggml_kernel_path", &ggml_kernel_path);
  m.def("ggml_supported", &ggml_supported);
  m.def("ggml_interleave", &ggml_interleave, "GGUF rows -> the interleaved layout of 8 rows (x8), into out",
        py::call_guard<py::gil_scoped_release>());
  m.def("ggml_interleaved_types", &ggml_interleaved_types);
  m.def("ggml_interleaved_flag", &ggml_interleaved_flag);
  m.def("ggml_type_table", &ggml_type_table);
  m.def("rms_norm", &rms_norm, "RMSNorm over float32 rows (kernels/cpu_norm.cpp)",
        py::call_guard<py::gil_scoped_release>());
  m.def("mask_logits_", &mask_logits_,
        "refused tokens' logits to -inf under packed grammar masks (kernels/cpu_mask.cpp)",
        py::call_guard<py::gil_scoped_release>());
  m.def("read_sum", &read_sum, "a tensor's bytes summed as int64: a memory read (kernels/cpu_read.cpp)",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_layers", &decode_layers,
        "decoder layers of a batch-1 CPU decode step (kernels/batch1_cpu.cpp)",
        py::call_guard<py::gil_scoped_release>());
}
