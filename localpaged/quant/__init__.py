"""Weight-only quantization: packed layouts, quantized modules, GGUF and safetensors conversion."""

from localpaged.quant.layout import PackedWeight, cat_rows, quantize_int4, quantize_int8

__all__ = ["PackedWeight", "cat_rows", "quantize_int4", "quantize_int8"]
