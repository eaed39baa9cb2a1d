// cpu_ggml.cpp on its own, as torch ops (torch.ops.<extension name>.ggml_matmul, ...): a build of
// just that file, for another instruction set (tests/kernels/test_cpu_ggml.py builds it with
// -march=x86-64, the plain C++ path) or while working on it. torch/library.h instead of
// torch/extension.h: without pybind's headers this file compiles in a fraction of the time
// (docs/benchmarks.md, 'Start-up', has the build times). The app uses the bindings in
// cpu_extension.cpp.

#include "cpu_ggml.h"

#include <torch/library.h>

TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("ggml_matmul", &ggml_matmul);
  m.def("ggml_kernel_path", &ggml_kernel_path);
  m.def("ggml_supported", &ggml_supported);
  m.def("ggml_interleave", &ggml_interleave);
  m.def("ggml_interleaved_types", &ggml_interleaved_types);
  m.def("ggml_interleaved_flag", &ggml_interleaved_flag);
  m.def("ggml_type_table", &ggml_type_table);
}
