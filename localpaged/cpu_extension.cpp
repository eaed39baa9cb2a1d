// Python bindings of the CPU extension (cpu_extension.py builds it).

#include "batch1_cpu.h"
#include "cpu_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Neither needs the GIL: the server's threads (streaming, HTTP) run while a step computes.
  m.def("paged_decode_attention", &paged_decode_attention,
        "paged decode attention over float32 caches (kernels/cpu_decode.cpp)",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_layers", &decode_layers,
        "decoder layers of a batch-1 CPU decode step (models/batch1_cpu.cpp)",
        py::call_guard<py::gil_scoped_release>());
}
